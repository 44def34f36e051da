"""The algorithms' house: the registry, one typed config per algorithm, plug-in algorithms, and an
orchestrator that plans without torch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from helpers import ROOT, cli
from pita.core.errors import ConfigError

BUILTIN = ["PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"]


def compose(*overrides):
    from hydra import compose as hc, initialize_config_dir

    from pita.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hc(config_name="config", overrides=list(overrides))


def keys(name):
    from pita.algos import ALGORITHMS

    return {f.name for f in dataclasses.fields(ALGORITHMS.get(name).Config)}


def test_every_builtin_algorithm_is_registered_in_order_with_its_own_config():
    from pita.algos import ALGORITHMS, default_configs

    assert ALGORITHMS.names(ordered=True) == BUILTIN
    assert list(default_configs()) == BUILTIN
    assert list(compose().algos) == BUILTIN
    # each config holds only the keys its algorithm reads
    assert not keys("DPO") & {"eta", "etas", "top_k", "num_atoms", "continuations", "max_steps", "use_vllm"}
    assert not keys("GRPO") & {"continuations", "eta", "max_length", "proxy_lr"}
    assert not keys("PITA") & {"use_vllm", "beta", "lora_r", "max_steps", "proxy_lr"}
    assert not keys("QSharp") & {"bt_beta", "proxy_epochs", "use_vllm"}
    assert {"proxy_epochs", "proxy_lr"} <= keys("QSharp-HF")
    # one Bradley-Terry key for every method that draws preferences: data_collection.bt_beta
    assert not any("bt_beta" in keys(a) for a in BUILTIN)
    assert {"proxy_epochs", "proxy_lr", "num_generations"} <= keys("GRPO-HF")
    # the user guide's keys exist where it puts them
    assert {"enabled", "batch_size", "num_workers"} <= keys("PITA")


def test_a_key_set_on_the_wrong_algorithm_is_refused_naming_the_algorithm_and_its_keys():
    from pita.cli import check_overrides

    with pytest.raises(ConfigError) as e:
        check_overrides(["algos.DPO.eta=1", "algos.GRPO.continuations=2", "algos.PITA.use_vllm=true"])
    msg = str(e.value)
    assert "algos.DPO.eta: DPO has no key 'eta'" in msg and "ref_policy" in msg
    assert "algos.GRPO.continuations: GRPO has no key 'continuations'" in msg
    assert "algos.PITA.use_vllm: PITA has no key 'use_vllm'" in msg
    with pytest.raises(ConfigError, match="did you mean 'ref_policy'"):
        check_overrides(["algos.DPO.ref_polcy=previous"])


def test_the_command_line_exits_2_for_a_key_of_another_algorithm(tmp_path):
    r = cli(["experiment.name=x", "algos.DPO.eta=1"], tmp_path)
    assert r.returncode == 2
    assert "DPO has no key 'eta'" in r.stderr and "the keys of DPO are:" in r.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("override,needle", [
    ("experiment.algos=[pita]", "experiment.algos='pita' is not known (did you mean 'PITA'?)"),
    ("experiment.algos=[GRPOHF]", "did you mean 'GRPO-HF'"),
    ("+algos.Qsharp.lr=1", "algos='Qsharp' is not known (did you mean 'QSharp'?)"),
])
def test_unknown_algorithm_names_say_what_to_type(override, needle):
    from pita.cli import check_overrides
    from pita.config.validate import validate_config
    from pita.plans import build_plan

    with pytest.raises(ConfigError) as e:
        check_overrides([override])
        cfg = compose(override, "experiment.workload=experiment")
        validate_config(cfg)
        build_plan(cfg, [int(8e9)])
    assert needle in str(e.value)


def test_an_old_config_file_with_foreign_algorithm_keys_is_explained(tmp_path):
    """A YAML written when every algorithm carried every key: composing it fails on the first key
    the algorithm lacks, with a sentence naming the key and the algorithm."""
    from pita.cli.overrides import _explain, _schema

    old = tmp_path / "old.yaml"
    old.write_text("algos:\n  DPO:\n    lr: 1.0e-06\n    etas: [0.0, 1.0]\n")
    with pytest.raises(Exception) as e:
        OmegaConf.merge(_schema(), OmegaConf.load(old))
    assert _explain(e.value).startswith("algos.DPO.etas: DPO has no key 'etas'")


def test_resuming_a_run_saved_with_every_key_under_every_algorithm_drops_the_unread_ones(tmp_path, capsys):
    from pita.cli.resume import _drop_foreign_algo_keys

    saved = OmegaConf.create({"algos": {"DPO": {"lr": 1e-4, "eta": 2.0, "top_k": 20}, "PITA": {"eta": 2.0, "beta": 0.1}}})
    _drop_foreign_algo_keys(saved, "config.yaml")
    assert dict(saved.algos.DPO) == {"lr": 1e-4} and dict(saved.algos.PITA) == {"eta": 2.0}
    err = capsys.readouterr().err
    assert "algos.DPO.eta" in err and "algos.DPO.top_k" in err and "algos.PITA.beta" in err


def test_the_orchestrator_plans_and_starts_without_torch_or_transformers():
    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "import pita.cli\n"
        "from pita.config.validate import validate_config\n"
        "from pita.core.gpu_manager import GPUManager\n"
        "from pita.core.executor import Executor\n"
        "from pita.core.backends import make_backend\n"
        "from pita.plans import build_plan\n"
        "with initialize_config_dir(config_dir=str(pita.cli.CONF_DIR), version_base=None):\n"
        "    cfg = compose(config_name='config', overrides=['experiment.workload=synthetic'])\n"
        "validate_config(cfg)\n"
        "GPUManager.detect('auto', cpu_devices=2)\n"
        "jobs = build_plan(cfg, [8 * 10**9] * 2)\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets') if m in sys.modules]\n"
        "print(len(jobs), heavy)\n"
        "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# ---------------------------------------------------------------- every key is read
def _changed(name, key, value):
    """A different valid value of ``algos.<name>.<key>``."""
    if key == "continuations":
        return value + 2 if name == "PITA" else value + 1
    if key in ("rollin", "continue_from"):  # null: the algorithm's own, so the other one
        own = {"rollin": ("greedy", "sampled"), "continue_from": ("policy", "reference")}[key]
        return own[1] if name == "PITA" else own[0]
    special = {"lr": 1e-3, "max_length": 64, "max_steps": 7, "loss": "mse", "mode": "expectation",
               "ref_policy": "previous", "vllm_mode": "server", "v_min": -5.0, "v_max": 5.0, "loss_type": "dapo",
               "scale_rewards": "none",
               "max_completion_length": 8, "gradient_accumulation_steps": 2, "devices": 2, "lora_r": 4, "num_workers": 2,
               "gradient_checkpointing": True, "lora_target_modules": ["q_proj"], "micro_batch_size": 2,
               "sharding": "fsdp", "offset_shift": "none", "offset_temperature": "after",
               "normalize_targets": "none", "pair_mode": "sampled", "head": "embedding", "lr_grid": [1e-3, 1e-2],
               "beta_grid": [0.05, 0.2], "loss_weighting": "sequence"}
    if key in special:
        return special[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2
    if isinstance(value, float):
        return value * 2 if value else 0.5
    if isinstance(value, list):
        return [*value, 3.0]
    raise AssertionError(f"no changed value for {name}.{key}={value!r}")


# keys that by design change no job: documented as such in the config reference
NOT_READ = {("*", "enabled"), ("PITA", "num_workers"), ("QSharp", "num_workers"), ("QSharp-HF", "num_workers"),
            ("GRPO", "use_vllm"), ("GRPO-HF", "use_vllm"),  # use_vllm needs vllm installed to plan
            # the GPUs a vLLM server holds: pita plan sets them aside (use_vllm with vllm_mode=server)
            ("GRPO", "vllm_server_devices"), ("GRPO-HF", "vllm_server_devices"),
            ("PITA", "normalize_targets")}  # PITA's only valid value is its default, none


@pytest.mark.integration
@pytest.mark.parametrize("name", BUILTIN)  # one test each: the first also carries the tiny family build (130 s idle)
def test_every_key_of_every_algorithm_changes_its_jobs(tiny_cache, name):
    """The config holds only keys the algorithm reads: changing any of them changes that
    algorithm's planned jobs (and no other algorithm's)."""
    from pita.plans import build_plan

    base_cfg = compose("experiment.workload=experiment", "experiment.datasets=[arith]", "experiment.rounds=2",
                       f"system.cache_dir={tiny_cache}", "datasets.arith.toy_train_size=16",
                       "datasets.arith.toy_test_size=8")
    totals = [int(8e9)] * 2

    def prints(cfg):
        return {j.id: json.dumps(j.fingerprint(), sort_keys=True) + str(j.resources) for j in build_plan(cfg, totals)}

    before = prints(base_cfg)
    unread = []
    for key, value in OmegaConf.to_container(base_cfg.algos[name]).items():
        if ("*", key) in NOT_READ or (name, key) in NOT_READ:
            continue
        start, before_key = base_cfg, before
        if name == "QSharp-HF" and key == "mode":  # its default loss (mle) guides only in mode mle
            start = base_cfg.copy()
            start.algos[name].loss = "bce"
            before_key = prints(start)
        if key == "sharding":  # FSDP splits the model over a job's devices: two of them
            start = base_cfg.copy()
            start.algos[name].devices = 2
            before_key = prints(start)
        if key in ("lora_r", "lora_target_modules"):
            start = base_cfg.copy()
            if name.startswith("GRPO"):  # LoRA over rounds: TRL's KL reference is the previous policy
                start.algos[name].ref_policy = "previous"
            if key == "lora_target_modules":
                start.algos[name].lora_r = 4
            before_key = prints(start)
        cfg = start.copy()
        cfg.algos[name][key] = _changed(name, key, value)
        after = prints(cfg)
        # a learned scorer's check on the validation pool (control.*.scorer.<its job>) belongs to its algorithm
        moved = {(j.split(".scorer.", 1)[1] if ".scorer." in j else j).split(".", 1)[0]
                 for j in set(before_key) | set(after) if before_key.get(j) != after.get(j)}
        if name not in moved:
            unread.append(f"{name}.{key}")
        # "data": round 0's shared collection, which a change of the request gives its own
        assert moved <= {name, "data"}, f"{name}.{key} changed jobs of {moved - {name}}"
    assert not unread, f"keys no job reads: {unread}"


# ---------------------------------------------------------------- a plug-in algorithm
@pytest.fixture
def copycat():
    import importlib

    from pita.algos import unregister_algorithm

    mod = importlib.import_module("plugins.copycat")
    if "Copycat" not in __import__("pita.algos", fromlist=["ALGORITHMS"]).ALGORITHMS:
        mod = importlib.reload(mod)
    yield mod
    unregister_algorithm("Copycat")


@pytest.mark.integration
def test_an_algorithm_from_another_file_plans_runs_and_reaches_the_results_table(copycat, tiny_cache, tmp_path, capsys):
    from pita.cli import run_experiment

    assert list(compose().algos)[-1] == "Copycat"  # the schema grew its algos.Copycat node
    with pytest.raises(ConfigError, match="Copycat has no key 'lr_typo'"):
        from pita.cli import check_overrides

        check_overrides(["algos.Copycat.lr_typo=1"])
    cfg = compose("experiment.name=plug", "experiment.workload=experiment", "experiment.datasets=[arith]",
                  "experiment.algos=[Copycat]", "experiment.rounds=2", "algos.Copycat.note=hello",
                  f"system.cache_dir={tiny_cache}", "datasets.arith.toy_train_size=8", "datasets.arith.toy_test_size=6",
                  "eval.n=2", "executor.backend=inline", "executor.progress=off", f"system.output_dir={tmp_path}",
                  "eval.controls=[]")
    assert run_experiment(cfg, overrides=[]) == 0
    out = capsys.readouterr().out
    [run] = list((tmp_path / "plug").iterdir())
    from pita.report.results import read_results

    rows = read_results(run / "results" / "final_results.json")[0]
    by = {(x["algorithm"], x["round"]): x for x in rows}
    assert set(by) == {("base", 0), ("Copycat", 0), ("Copycat", 1)}
    csv_rows = (run / "results" / "results.csv").read_text().splitlines()
    assert "Copycat" in out and sum(line.startswith("Copycat,") for line in csv_rows) == 2
    assert json.loads((run / "jobs" / "Copycat.tiny.arith.r1.train" / "result.json").read_text())["note"] == "hello"
    for r in (0, 1):  # the reference handed on: the base model's samples, scores and KL 0
        assert by[("Copycat", r)]["pass@1"] == by[("base", 0)]["pass@1"]
        # sampled log-probs (KV cache) against a full forward of the same model: fp32 noise only
        assert abs(by[("Copycat", r)]["kl"]) < 1e-4
