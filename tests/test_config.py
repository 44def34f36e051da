"""Configuration checks: command-line overrides (pita.cli.check_overrides), the checks on a
composed config (pita.config.validate.validate_config), and run_experiment's exit code 2."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from pita.cli import check_overrides, run_experiment
from pita.config.schema import PitaConfig
from pita.config.validate import validate_config
from pita.core.errors import ConfigError


def make_cfg(**groups):
    return OmegaConf.merge(OmegaConf.structured(PitaConfig), groups)


# ---------------------------------------------------------------- check_overrides
def test_unknown_top_level_key():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["foo=1"])
    msg = str(ei.value)
    assert "unknown key 'foo'" in msg
    assert "keys at top level" in msg and "executor" in msg


def test_typo_in_nested_key_suggests_the_right_one():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["executor.backnd=local"])
    msg = str(ei.value)
    assert "'executor.backnd'" in msg
    assert "(did you mean 'backend'?)" in msg


def test_every_unknown_key_reported_at_once():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["foo=1", "system.devcies=[0]", "executor.oom_retries=1"])
    assert len(ei.value.problems) == 2
    assert "(did you mean 'devices'?)" in str(ei.value)


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError) as ei:
        check_overrides(["executor.oom_retries=abc"])
    assert "executor.oom_retries" in str(ei.value)
    assert "abc" in str(ei.value)


@pytest.mark.parametrize("overrides", [
    [],
    ["executor.oom_retries=3", "experiment.name=my_run"],
    ["system.devices=[0,1]", "executor.backend=inline", "executor.memory_margin=0.1"],
    ["executor.job_timeout_s=null", "synthetic.families=[tiny,small]"],
])
def test_valid_overrides_pass(overrides):
    check_overrides(overrides)  # must not raise


# ---------------------------------------------------------------- validate_config
def test_default_config_is_valid():
    validate_config(make_cfg())


@pytest.mark.parametrize("groups,fragment", [
    ({"executor": {"backend": "nope"}}, "executor.backend='nope' is not known; choose one of: inline, local"),
    ({"executor": {"backend": "locl"}}, "(did you mean 'local'?)"),
    ({"executor": {"oom_retries": -1}}, "executor.oom_retries=-1: must be >= 0"),
    ({"executor": {"memory_margin": 1.5}}, "executor.memory_margin=1.5: must be a fraction in [0, 1)"),
    ({"executor": {"max_jobs_per_device": 0}}, "executor.max_jobs_per_device=0"),
    ({"executor": {"slurm": {"max_share": 0}}}, "executor.slurm.max_share=0"),
    ({"executor": {"slurm": {"max_share": 1.5}}}, "executor.slurm.max_share=1.5: must be in (0, 1]"),
    ({"executor": {"progress": "fancy"}}, "executor.progress='fancy' is not known"),
    ({"system": {"devices": [-1]}}, "system.devices=[-1]"),
    ({"system": {"devices": []}}, "system.devices=[]"),
    ({"system": {"devices": "gpu"}}, "system.devices='gpu'"),
    ({"system": {"cpu_devices": 0}}, "system.cpu_devices=0"),
    ({"experiment": {"name": "a/b"}}, "experiment.name='a/b'"),
    ({"experiment": {"workload": "real"}}, "experiment.workload='real' is not known"),
    ({"synthetic": {"memory_gb": -1}}, "synthetic.memory_gb=-1.0: must be >= 0"),
    ({"synthetic": {"rounds": 0}}, "synthetic.rounds=0"),
    ({"synthetic": {"algos": []}}, "synthetic.algos=[]"),
    ({"system": {"attn_impl": "flash_attn"}},
     "system.attn_impl='flash_attn' is not known (did you mean 'flash_attention_2'?); choose one of: eager, "
     "flash_attention_2, sdpa"),
])
def test_each_problem_is_reported(groups, fragment):
    with pytest.raises(ConfigError) as ei:
        validate_config(make_cfg(**groups))
    assert len(ei.value.problems) == 1, ei.value.problems
    assert fragment in ei.value.problems[0]


@pytest.mark.parametrize("devices", ["auto", "cpu", [0], [0, 3]])
def test_valid_device_selections(devices):
    validate_config(make_cfg(system={"devices": devices}))


def test_all_problems_in_one_error():
    cfg = make_cfg(
        executor={"backend": "nope", "oom_retries": -1, "memory_margin": 1.5},
        system={"devices": [-1]},
        experiment={"name": "a/b"},
        synthetic={"memory_gb": -1},
    )
    with pytest.raises(ConfigError) as ei:
        validate_config(cfg)
    probs = ei.value.problems
    assert len(probs) == 6, probs
    for key in ("executor.backend", "executor.oom_retries", "executor.memory_margin", "system.devices",
                "experiment.name", "synthetic.memory_gb"):
        assert sum(p.startswith(key) for p in probs) == 1, (key, probs)
    assert str(ei.value).startswith("invalid configuration (6 problems):")


# ---------------------------------------------------------------- run_experiment
def test_run_experiment_bad_config_exits_2_and_creates_nothing(tmp_path, capsys):
    cfg = make_cfg(executor={"backend": "nope"}, system={"output_dir": str(tmp_path)},
                   experiment={"name": "t"})
    assert run_experiment(cfg) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "executor.backend" in err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the user guide's keys, presets
GUIDE_KEYS = ["system.attn_impl=eager", "system.clear_cache_interval=10", "system.use_parallel_execution=true",
              "training.micro_batch_size=4", "training.gradient_checkpointing=true",
              "data_collection.reward_batch_size=32", "algos.PITA.batch_size=24", "algos.PITA.num_workers=4",
              "generation.batch_size=8"]


def test_the_user_guide_keys_are_accepted():
    check_overrides(GUIDE_KEYS)


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from pita.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("preset, batch, micro, gc", [("a100_40gb", 16, 2, True), ("a100_80gb", 32, 4, False),
                                                      ("h100_80gb", 32, 4, False)])
def test_gpu_presets_set_batches_micro_batches_and_checkpointing(preset, batch, micro, gc):
    cfg = _compose(f"gpu={preset}")
    assert cfg.algos.PITA.batch_size == cfg.algos.QSharp.batch_size == batch
    assert cfg.training.micro_batch_size == micro and cfg.training.gradient_checkpointing is gc
    assert _compose(f"gpu={preset}", "training.micro_batch_size=1").training.micro_batch_size == 1  # overrides win


def test_the_smoke_preset_is_the_whole_pipeline_at_its_smallest_and_keeps_a_chosen_name():
    cfg = _compose("experiment=smoke", "experiment.name=mine")
    assert cfg.experiment.name == "mine" and cfg.experiment.workload == "experiment"
    assert list(cfg.experiment.algos) == ["PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"]
    assert cfg.experiment.rounds == 1 and list(cfg.experiment.datasets) == ["arith"]


@pytest.mark.parametrize("override, needle", [("gpu=a100", "did you mean 'a100_80gb'"),
                                              ("experiment=smok", "did you mean 'smoke'"),
                                              ("trainng.micro_batch_size=2", "did you mean 'training'")])
def test_preset_typos_say_what_to_type(override, needle):
    with pytest.raises(ConfigError, match=needle):
        check_overrides([override])


def test_gpu_auto_picks_each_algorithms_largest_micro_batch_the_memory_estimate_fits(tiny):
    """Per algorithm: the chosen micro-batch divides its per-device batch and fits the smallest
    device, and the next larger divisor does not; checkpointing only where nothing fits without it."""
    from pita.algos import algorithm
    from pita.plans.experiment import resolve_auto_training
    from pita.plans.memory import JobMemory

    cfg = _compose("gpu=auto", "experiment.algos=[PITA,DPO]", "algos.DPO.batch_size=16")
    paths = {"reference": tiny["reference"], "guidance": tiny["guidance"], "reward_models": {}}
    est = JobMemory(cfg, paths, True, [])
    dpo = algorithm("DPO", cfg.algos.DPO)
    need4, need8 = (est.policy_training(dpo, micro=m, gradient_checkpointing=False) * 1e9 for m in (4, 8))
    total = int((need4 + need8) / 2 / (1 - cfg.executor.memory_margin))  # DPO: 4 fits, 8 does not
    resolve_auto_training(cfg, paths, [total, 2 * total], cuda=True)
    assert cfg.algos.DPO.micro_batch_size == 4 and cfg.algos.DPO.gradient_checkpointing is False
    budget = total * (1 - cfg.executor.memory_margin)
    pita = algorithm("PITA", cfg.algos.PITA)
    m = cfg.algos.PITA.micro_batch_size
    assert 32 % m == 0 and est.value_training(pita, micro=m, gradient_checkpointing=False) * 1e9 <= budget
    bigger = [d for d in (2 * m, 4 * m, 8 * m) if d <= 32 and 32 % d == 0]
    assert all(est.value_training(pita, micro=d, gradient_checkpointing=False) * 1e9 > budget for d in bigger[:1])
    assert cfg.training.micro_batch_size == min(4, m)  # training.* shows the smallest choice


def test_a_training_job_that_fits_no_device_is_one_line_per_kind_with_the_fix(tiny):
    """Nothing fits 1 kB: every kind is named once with its count and its fix; exit 2 material."""
    from pita.plans import build_plan
    from pita.plans.fit import fit_problems

    cfg = _compose("gpu=auto", "experiment.algos=[PITA,DPO]", "experiment.datasets=[arith]", "experiment.rounds=1")
    jobs = build_plan(cfg, [1000], cuda=True)  # gpu=auto finds nothing that fits: micro-batch 1, checkpointing
    problems = fit_problems(jobs, [1000], 0.05)
    kinds = [p.split(" job(s)")[0].split(" ", 1)[1] for p in problems]
    assert len(kinds) == len(set(zip(kinds, [p.split(" of ")[1].split(" ")[0] for p in problems])))
    dpo = [p for p in problems if "algo.dpo_train" in p]
    assert len(dpo) == 1 and "algos.DPO.lora_r=16" in dpo[0] and "micro-batch of 1" in dpo[0]
    assert any("eval.shard" in p and "eval.batch_size" in p for p in problems)


def test_a_job_that_just_misses_says_by_how_much_and_on_cpu_what_holds_the_memory(tiny):
    """Need and room print with the decimals that tell them apart; CPU devices, which share the
    memory available now, say so and name the key that gives one device all of it."""
    from pita.plans import build_plan
    from pita.plans.fit import fit_problems

    cfg = _compose("experiment.algos=[DPO]", "experiment.datasets=[arith]", "experiment.rounds=1")
    jobs = build_plan(cfg, [int(64e9)], cuda=False)
    need = max(j.resources.memory_bytes for j in jobs if j.kind == "algo.dpo_train")
    cap = need - int(0.01e9)  # 10 MB short: the same figure at one decimal
    [line] = [p for p in fit_problems(jobs, [int(cap / 0.95)] * 2, 0.05, cpu=True) if "algo.dpo_train" in p]
    need_s, room_s = line.split(" need ")[1].split(" GB")[0], line.split("than the ")[1].split(" GB")[0]
    assert need_s != room_s and float(need_s) > float(room_s), line
    assert "the devices share the memory available now" in line and "system.cpu_devices=1" in line
    assert "CPU" not in fit_problems(jobs, [int(cap / 0.95)] * 2, 0.05)[0]


def test_a_run_refuses_to_start_without_disk_space_and_creates_nothing(tmp_path):
    from pita.core.paths import RunPaths

    with pytest.raises(ConfigError, match=r"system.min_free_gb"):
        RunPaths.create(tmp_path / "out", "x", min_free_bytes=1e18)
    assert not (tmp_path / "out").exists()


def test_the_readme_configuration_reference_matches_the_schema():
    from pathlib import Path

    from pita.config.reference import block_of, render

    readme = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert block_of(readme.read_text()) == render().strip(), \
        "docs/configuration.md's reference is stale: python -m pita.config.reference --write docs/configuration.md"


@pytest.mark.parametrize("preset", ["paper_math", "paper_reward"])
def test_paper_grid_presets_compose_and_validate(preset):
    cfg = _compose(f"experiment={preset}", "model=qwen3-sm")
    validate_config(cfg)
    assert cfg.experiment.workload == "experiment" and len(cfg.experiment.algos) == 6
    for d in list(cfg.experiment.datasets) + [x for v in cfg.eval.datasets_by_train.values() for x in v]:
        assert d in cfg.datasets


def test_the_guides_generation_batch_size_sets_the_data_generation_batch():
    cfg = _compose("generation.batch_size=8")
    validate_config(cfg)
    assert cfg.data_collection.batch_size == 8
    cfg = _compose()
    validate_config(cfg)
    assert cfg.data_collection.batch_size == 64  # unset: data_collection's own value
    with pytest.raises(ConfigError, match=r"generation.batch_size=0: must be a positive integer"):
        validate_config(_compose("generation.batch_size=0"))


def test_a_disabled_algorithm_leaves_the_plan_and_config_yaml_shows_what_ran(capsys):
    """algos.<A>.enabled=false (the user guide's switch) drops A as leaving it out of
    experiment.algos would; with every listed algorithm disabled there is nothing to run: exit 2."""
    cfg = _compose("experiment.algos=[PITA,DPO,GRPO]", "algos.PITA.enabled=false", "algos.GRPO.enabled=false")
    validate_config(cfg)
    assert list(cfg.experiment.algos) == ["DPO"]
    assert "left out PITA, GRPO (algos.<name>.enabled=false); running DPO" in capsys.readouterr().err
    validate_config(cfg)  # a config already applied (a resume) stays as it is
    assert list(cfg.experiment.algos) == ["DPO"]
    with pytest.raises(ConfigError, match=r"experiment.algos=\['PITA'\]: every one of them has enabled=false "
                                          r"\(algos.PITA.enabled\); set one to true"):
        validate_config(_compose("experiment.algos=[PITA]", "algos.PITA.enabled=false"))


def test_the_plan_leaves_a_disabled_algorithm_out(tiny_cache):
    from pita.plans import build_plan

    cfg = _compose("experiment.datasets=[arith]", "algos.QSharp.enabled=false", f"system.cache_dir={tiny_cache}")
    validate_config(cfg)
    algos = {j.id.split(".")[0] for j in build_plan(cfg, [int(8e9)])}
    assert "QSharp" not in algos and {"PITA", "DPO", "GRPO"} <= algos


@pytest.mark.parametrize("env, refused", [
    ({}, False), ({"WORLD_SIZE": "1", "RANK": "0"}, False), ({"WORLD_SIZE": "4", "RANK": "0"}, True),
    ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3"}, True), ({"WORLD_SIZE": "x"}, False)])
def test_an_orchestrator_started_as_one_of_several_ranks_is_refused(env, refused):
    from pita.cli.run import launcher_problem

    problem = launcher_problem(env)
    assert bool(problem) == refused
    if refused:
        assert f"rank {env['RANK']} of WORLD_SIZE=4" in problem and "algos.<DPO|GRPO|GRPO-HF>.devices" in problem


def test_torchrun_style_launch_exits_2_before_anything_starts(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, WORLD_SIZE="4", RANK="2", LOCAL_RANK="2")
    r = subprocess.run([sys.executable, os.path.join(root, "run_parallel.py"), f"system.output_dir={tmp_path}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "distributed launcher" in r.stderr
    assert not any(tmp_path.iterdir())  # no run folder


def test_the_help_page_says_what_micro_batch_auto_does():
    from pita.cli import help_text

    text = " ".join(help_text().split())
    assert "training.micro_batch_size=0" in text and "pita plan shows the choice without running" in text


def test_a_new_runs_paths_are_made_absolute_against_the_folder_it_started_from(tmp_path, monkeypatch):
    """Workers on other nodes start elsewhere: output, cache and local dataset paths are absolute
    in a new run's config (and in its config.yaml), a hub dataset keeps no path."""
    from pita.cli.run import absolute_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    cfg = _compose("experiment=smoke", "system.output_dir=outs", "system.cache_dir=.cache/pita",
                   "datasets.gsm8k.path=mine.jsonl")
    absolute_paths(cfg)
    assert cfg.system.output_dir == str(tmp_path / "outs") and cfg.system.cache_dir == str(tmp_path / ".cache/pita")
    assert cfg.datasets.gsm8k.path == str(tmp_path / "mine.jsonl")
    assert cfg.datasets.math500.get("path") is None


def test_a_q_head_reserves_its_vocabulary_wide_table_in_training_and_beside_the_guided_sampler(tiny):
    """algos.QSharp.head=q adds vocabulary x hidden x n_out parameters: 16 bytes each in training
    (fp32 weight, gradient, AdamW's two moments) and 4 beside a guided sampler; the other heads
    add nothing."""
    from pita.algos import algorithm
    from pita.models.shapes import model_shape
    from pita.plans.memory import JobMemory

    paths = {"reference": tiny["reference"], "guidance": tiny["guidance"], "reward_models": {}}
    base = _compose("experiment.algos=[QSharp]", "algos.QSharp.loss=bce")
    q = _compose("experiment.algos=[QSharp]", "algos.QSharp.loss=bce", "algos.QSharp.head=q")
    e0, e1 = JobMemory(base, paths, True, []), JobMemory(q, paths, True, [])
    sh = model_shape(tiny["guidance"], "model.guidance")
    table = sh.vocab * sh.hidden
    a0, a1 = algorithm("QSharp", base.algos.QSharp), algorithm("QSharp", q.algos.QSharp)
    assert e0.q_head_params(a0) == 0 and e1.q_head_params(a1) == table
    grown = (e1.value_training(a1, micro=4, gradient_checkpointing=False)
             - e0.value_training(a0, micro=4, gradient_checkpointing=False)) * 1e9
    assert grown >= 16 * table
    beside = (e1.sampling("eval_guided", ["arith"], 8) - e0.sampling("eval_guided", ["arith"], 8)) * 1e9
    assert 4 * table <= beside <= 1.15 * 4 * table  # with the estimate's margin on weights
    mle = _compose("experiment.algos=[QSharp]", "algos.QSharp.loss=mle", "algos.QSharp.head=q", "algos.QSharp.num_atoms=7")
    assert JobMemory(mle, paths, True, []).q_head_params(algorithm("QSharp", mle.algos.QSharp)) == 7 * table
