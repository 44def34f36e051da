"""`pita plan`: the plan a run would make, for this machine or a described inventory, with no hub,
no weights and no run folder; shipped architectures; fit problems one line per job kind."""

from __future__ import annotations

import json
import os

import pytest

from pita.cli.plan import plan_main
from pita.core.errors import ConfigError

LORA = ["algos.DPO.lora_r=16", "algos.GRPO.lora_r=16", "algos.GRPO-HF.lora_r=16",
        "algos.GRPO.ref_policy=previous", "algos.GRPO-HF.ref_policy=previous"]
VALUE_GUIDED = ["experiment.algos=[PITA,QSharp,QSharp-HF]"]
FAMILIES = ["smollm2", "qwen3-sm", "llama", "llama-old", "gemma", "qwen3", "phi"]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outputs/ and .cache/ of a plan would land here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _plan(capsys, *args) -> tuple[int, dict | str, str]:
    rc = plan_main(["--json", *args])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else out), err


@pytest.mark.parametrize("experiment", ["paper_math", "paper_reward"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_paper_grids_plan_on_8x80gb_with_lora_or_value_guided_only(capsys, tmp_path, experiment, family):
    for extra in (LORA, VALUE_GUIDED):
        rc, plan, err = _plan(capsys, f"experiment={experiment}", "gpu=auto", f"model={family}",
                              "system.inventory=8x80GB", *extra)
        assert rc == 0, err
        assert [d["total_gb"] for d in plan["inventory"]] == [80.0] * 8
        assert plan["makespan_s"] > 0 and plan["makespan_s"] >= plan["critical_path_s"] - 1e-6
        usable = 80 * (1 - plan["memory_margin"])
        for j in plan["jobs"]:
            assert {"id", "kind", "algorithm", "devices", "reserved_gb_per_device"} <= set(j)
            assert j["devices"] <= 8
            assert j["reserved_gb_per_device"] <= usable, j
            if j["devices"] > 0:  # no estimate is 0: every model was read
                assert j["reserved_gb_per_device"] > 0.1, j
        algos = {j["algorithm"] for j in plan["jobs"]}
        wanted = {"PITA", "QSharp", "QSharp-HF"} | ({"DPO", "GRPO", "GRPO-HF"} if extra is LORA else set())
        assert wanted <= algos
    assert not (tmp_path / "outputs").exists()  # a plan makes no run folder


@pytest.mark.parametrize("family", ["qwen3", "phi"])
def test_full_fine_tuning_of_a_policy_one_gpu_cannot_hold_is_planned_sharded(capsys, family):
    """gpu=auto: the fewest devices whose FSDP shards fit, written into the plan (and config.yaml)."""
    rc, plan, err = _plan(capsys, "experiment=paper_math", "gpu=auto", f"model={family}", "system.inventory=8x80GB")
    assert rc == 0, err
    usable = 80 * (1 - plan["memory_margin"])
    for algo in ("DPO", "GRPO", "GRPO-HF"):
        t = plan["training"][algo]
        assert t["sharding"] == "fsdp" and 2 <= t["devices"] <= 8, t
        train = [j for j in plan["jobs"] if j["algorithm"] == algo and j["kind"] in ("algo.dpo_train", "algo.grpo_train")]
        assert train and all(j["devices"] == t["devices"] and j["reserved_gb_per_device"] <= usable for j in train)


def test_sharding_divides_weights_gradients_and_adam_state_and_adds_the_gathered_layers():
    from pita.core.memory import ModelShape, fsdp_gather_bytes, training_bytes

    shape = ModelShape(8_000_000_000, 36, 4096, 8, 128, 151_936, 32, 12288)
    one, four = training_bytes(shape, "float32", 2, 768), training_bytes(shape, "float32", 2, 768, shards=4)
    state = 16 * shape.n_params  # fp32 weights + gradients + AdamW's two moments
    assert abs((one - four) - 1.10 * (state * 3 / 4 - fsdp_gather_bytes(shape))) < 16
    # what stays whole: the embeddings and output head, two layers in flight and one layer's gradient
    assert fsdp_gather_bytes(shape) == 4 * (shape.root_params + 3 * shape.layer_params)
    assert 0 < shape.root_params < shape.n_params / 4


def test_full_fine_tuning_that_no_sharding_can_fit_is_refused_one_line_per_kind(capsys):
    rc, _, err = _plan(capsys, "experiment=paper_math", "gpu=auto", "model=qwen3", "system.inventory=1x80GB",
                       "experiment.algos=[DPO,GRPO,GRPO-HF]")
    assert rc == 2
    lines = [x for x in err.splitlines() if x.strip().startswith("- ")]
    assert len(lines) == 3  # DPO, GRPO, GRPO-HF training: one line each
    for algo in ("DPO", "GRPO", "GRPO-HF"):
        line = next(x for x in lines if f" of {algo} " in x)
        assert f"algos.{algo}.lora_r=16" in line and "GB per device" in line


def test_the_text_plan_names_kinds_devices_memory_and_the_makespan(capsys):
    rc = plan_main(["experiment=paper_math", "gpu=auto", "model=llama", "system.inventory=8xH100", *LORA])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "8 x H100-SXM (85.52 GB); durations for H100-SXM (989 TFLOP/s bf16, 3.35 TB/s)" in out
    for kind in ("algo.dpo_train", "algo.value_train", "eval.shard (guided)", "gen.shard (value_rollouts, reference)"):
        assert kind in out
    assert "makespan" in out and "durations assumed" in out
    assert "note: datasets.gsm8k: train split not cached here; sized at its hub size (7473 examples)" in out


def test_the_embedded_default_plans_on_this_machine_and_creates_nothing(capsys, tmp_path):
    rc, plan, err = _plan(capsys, "experiment.datasets=[arith]", "experiment.rounds=1",
                          f"system.cache_dir={os.environ.get('PITA_TEST_CACHE', str(tmp_path / 'cache'))}")
    assert rc == 0, err
    assert plan["device_kind"] == "cpu" and plan["jobs"]
    assert not (tmp_path / "outputs").exists()
    # on CPU the roofline is a GPU's: the makespan line says so until measured runs correct it
    from pita.cli.plan import render

    gpu_speed = dict(plan, duration_corrections={},
                     durations="durations assumed: a GPU's (pita/plans/durations.py), though this plan is for CPU devices")
    makespan = next(x for x in render(gpu_speed).splitlines() if " makespan " in x)
    assert "these are a GPU's seconds, not this CPU's" in makespan and "--calibrate RUN" in makespan
    corrected = dict(gpu_speed, duration_corrections={"algo.dpo_train": {"jobs": 1, "measured_over_planned": 600.0}})
    assert "not this CPU's" not in render(corrected)


@pytest.mark.parametrize("value, needle", [
    ("8x80XB", "'8x80XB' is neither a size nor a GPU"),
    ("0x80GB", "describes no memory"),
    ("8xB9000", "known GPUs: H100"),
])
def test_a_bad_inventory_is_exit_2_naming_the_key_the_value_and_the_fix(capsys, value, needle):
    rc, _, err = _plan(capsys, "experiment=paper_math", "model=llama", f"system.inventory={value}")
    assert rc == 2
    assert "system.inventory=" in err and needle in err and "e.g. system.inventory=8x80GB" in err


def test_a_model_whose_config_cannot_be_read_is_exit_2_with_the_fix(capsys, tmp_path):
    rc, _, err = _plan(capsys, "experiment=paper_math", "model=llama", "model.reference=someorg/NoSuchModel-7B",
                       "model.guidance=someorg/NoSuchModel-7B", "system.inventory=8x80GB")
    assert rc == 2
    assert "model.reference='someorg/NoSuchModel-7B'" in err and "hf download someorg/NoSuchModel-7B config.json" in err
    empty = tmp_path / "empty-model"
    empty.mkdir()
    rc, _, err = _plan(capsys, "experiment=paper_math", "model=llama", f"model.reference={empty}",
                       f"model.guidance={empty}", "system.inventory=8x80GB")
    assert rc == 2 and "no config.json in that folder" in err


def test_a_job_larger_than_every_device_is_exit_2(capsys):
    rc, _, err = _plan(capsys, "experiment=paper_math", "model=qwen3", "system.inventory=2x16GB",
                       "experiment.algos=[PITA]")
    assert rc == 2
    assert "GB usable on one device" in err and "eval.batch_size" in err


def test_a_run_refuses_an_inventory_and_creates_nothing(tmp_path):
    from pita.cli.run import run_main

    assert run_main(["experiment.name=x", "system.inventory=8x80GB", f"system.output_dir={tmp_path / 'out'}"]) == 2
    assert not (tmp_path / "out").exists()


def test_run_parallel_dash_dash_plan_is_pita_plan(capsys):
    from pita.cli.run import run_main

    rc = run_main(["--plan", "--json", "experiment=paper_math", "model=qwen3-sm", "gpu=auto",
                   "system.inventory=[80GB,80GB,40GB]", *VALUE_GUIDED])
    out, err = capsys.readouterr()
    assert rc == 0, err
    plan = json.loads(out)
    assert [d["total_gb"] for d in plan["inventory"]] == [80.0, 80.0, 40.0]


# ---------------------------------------------------------------- architectures without weights
def test_every_preset_model_has_a_shipped_architecture():
    from pathlib import Path

    from omegaconf import OmegaConf

    from pita.models.shapes import shipped_ids
    from pita.models.smollm2 import HUB_ID

    ids = set(shipped_ids())
    for f in sorted((Path(__file__).resolve().parents[1] / "pita" / "conf" / "model").glob("*.yaml")):
        fam = OmegaConf.load(f)
        for ref in [fam.reference, fam.guidance, *fam.reward_models.values()]:
            if ref.startswith("builtin:smollm2"):
                assert HUB_ID in ids
            elif not ref.startswith("builtin:"):
                assert ref in ids, f"{f.name}: {ref} has no config.json under pita/models/architectures/"


@pytest.mark.parametrize("ref, hidden, layers, billions", [
    ("google/gemma-3-4b-it", 2560, 34, 4.30),  # a multimodal config: sizes in its text config
    ("google/gemma-3-1b-it", 1152, 26, 1.00),
    ("meta-llama/Llama-3.1-8B-Instruct", 4096, 32, 8.03),
    ("Qwen/Qwen3-8B", 4096, 36, 8.19),
    ("microsoft/Phi-4-mini-reasoning", 3072, 32, 3.84),
    ("microsoft/Phi-4-reasoning-plus", 5120, 40, 14.66),
])
def test_shapes_are_read_through_the_text_config_with_exact_parameter_counts(ref, hidden, layers, billions):
    from pita.models.shapes import model_shape

    s = model_shape(ref, "model.reference")
    assert (s.hidden, s.n_layers) == (hidden, layers)
    assert s.n_params / 1e9 == pytest.approx(billions, abs=0.01)  # the published sizes


def test_a_local_folders_own_config_wins(tmp_path, tiny):
    from pita.models.shapes import model_shape

    s = model_shape(tiny["reference"], "model.reference")
    assert s.n_params < 10**7 and s.hidden < 512


def test_fused_projections_stand_for_the_separate_lora_targets():
    from pita.models.shapes import lora_targets

    assert lora_targets("microsoft/Phi-4-mini-reasoning", ["q_proj", "v_proj"]) == ["qkv_proj"]
    assert lora_targets("Qwen/Qwen3-8B", ["q_proj", "v_proj"]) == ["q_proj", "v_proj"]


def test_an_unknown_hub_id_is_a_config_error_not_a_zero_estimate():
    from pita.models.shapes import model_shape

    with pytest.raises(ConfigError, match="its memory cannot be planned"):
        model_shape("someorg/Unknown-3B", "model.guidance")


def test_host_memory_is_planned_per_job_and_a_job_the_node_cannot_hold_is_exit_2(capsys):
    """A sharded job's rank 0 reads the fp32 policy and TRL's bf16 reference (the other ranks get
    their shards from it): an 8B DPO job needs about 6 x 8.2 GB of host memory at load, whatever
    its devices, and each of its mid-training checkpoints stages every rank's AdamW shards on the
    host (8 x 8.2 GB over the node); data-parallel ranks each read their own copy."""
    base = ["experiment=paper_math", "gpu=auto", "model=qwen3", "system.inventory=8x80GB"]
    rc, plan, err = _plan(capsys, *base, "system.host_ram=1TB")
    assert rc == 0, err
    assert plan["host_ram_gb"] == 1000
    dpo = next(j for j in plan["jobs"] if j["id"] == "DPO.qwen3.gsm8k.r0.train")
    assert dpo["devices"] >= 2 and 8 * 8.19 <= dpo["host_gb"] <= 8 * 8.19 + 4 * dpo["devices"], dpo
    shard = next(j for j in plan["jobs"] if j["id"] == "base.qwen3.gsm8k.eval.s0")
    assert 16 <= shard["host_gb"] <= 25, shard  # the bf16 reference and the process
    assert all(j["host_gb"] > 0 for j in plan["jobs"])
    rc, out, err = _plan(capsys, *base, "system.host_ram=40GB")
    assert rc == 2
    assert "algo.dpo_train" in err and "system.host_ram=40 GB" in err, err
    # data-parallel LoRA over 4 devices: four copies of the bf16 base (4 x (16.4 + 3) GB)
    rc, out, err = _plan(capsys, "experiment=paper_math", "model=qwen3", "system.inventory=8x80GB",
                         "experiment.algos=[DPO]", "algos.DPO.devices=4", "algos.DPO.lora_r=16",
                         "system.host_ram=60GB")
    assert rc == 2 and "4 data-parallel ranks" in err and "lower algos.DPO.devices" in err, err
    assert "sharding=fsdp" not in err  # LoRA jobs are not sharded
    # planning another machine without its RAM: shown, not checked, and said
    rc, plan, err = _plan(capsys, *base)
    assert rc == 0 and plan["host_ram_gb"] is None
    assert any("system.host_ram" in n for n in plan["notes"])


@pytest.mark.parametrize("value", ["lots", "-1", "0GB", "12XB"])
def test_a_bad_host_ram_is_exit_2_naming_the_key(capsys, value):
    rc, out, err = _plan(capsys, "experiment=paper_math", "gpu=auto", "model=qwen3", "system.inventory=8x80GB",
                         f"system.host_ram={value}")
    assert rc == 2 and "system.host_ram" in err and "1TB" in err, err


def test_vllm_colocated_with_a_sharded_policy_whose_weights_exceed_its_share_is_exit_2(capsys, monkeypatch):
    """vLLM colocated holds the whole policy in its share of each device even when training is
    sharded; a share smaller than the weights fails at vLLM's start-up, not as an OOM."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    base = ["experiment=paper_math", "gpu=auto", "model=qwen3", "system.inventory=8x80GB",
            "experiment.algos=[GRPO]", "algos.GRPO.use_vllm=true"]
    rc, plan, err = _plan(capsys, *base)
    assert rc == 0, err  # 16.4 GB of bf16 weights in 0.3 x 80 GB
    rc, out, err = _plan(capsys, *base, "algos.GRPO.vllm_gpu_memory_utilization=0.15")
    assert rc == 2 and "vllm_gpu_memory_utilization=0.15" in err and "vllm_mode=server" in err, err


@pytest.mark.parametrize("experiment, family", [("paper_math", "qwen3"), ("paper_math", "llama-old"),
                                                ("paper_math", "llama"), ("paper_reward", "qwen3")])
def test_the_paper_grids_end_near_their_lower_bound_and_the_plan_says_what_makes_them_long(capsys, experiment, family):
    """Full fine-tuning defaults on 8x80GB: the simulated makespan is within 5% of
    max(critical path, device-seconds / devices), or, where jobs hold the whole node (nothing runs
    beside them), of the whole-node hours plus the longest chain of the other jobs; the plan
    names its critical path, where the device-hours go and how idle the devices are."""
    rc, plan, err = _plan(capsys, f"experiment={experiment}", "gpu=auto", f"model={family}", "system.inventory=8x80GB")
    assert rc == 0, err
    n = len(plan["inventory"])
    device_s = sum(j["seconds"] * j["devices"] for j in plan["jobs"])
    bound = max(plan["critical_path_s"], device_s / n)
    if plan["whole_node_hours"] > 0.1 * plan["makespan_s"] / 3600:
        bound = max(bound, plan["lower_bound_s"])
    assert plan["makespan_s"] <= 1.05 * bound, (plan["makespan_s"] / 3600, bound / 3600)
    assert plan["makespan_s"] >= plan["lower_bound_s"] - 1
    assert sum(s["hours"] for s in plan["critical_path"]) == pytest.approx(plan["critical_path_s"] / 3600, rel=0.01)
    assert 0 <= plan["idle_fraction"] < 1 and len(plan["device_hours"]) == 3 and plan["levers"]


def test_the_text_plan_explains_a_critical_path_bound_run_and_names_its_longest_job(capsys):
    rc = plan_main(["experiment=paper_math", "gpu=auto", "model=llama", "system.inventory=8x80GB"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    import re

    path = next(line for line in out.splitlines() if line.startswith("critical path: "))
    assert "devices idle: " in out and "device time: " in out
    lever = next(line for line in out.splitlines() if line.startswith("lever: the critical path bounds the run: "))
    # the lever names the longest job on the critical path (Q#-HF's proxy here) and what shortens it
    job, kind = re.search(r"its longest job, (\S+) \(([^,]+), \d+ device", lever).groups()
    assert kind in path and job.startswith(kind.split()[0] + ".llama.gsm8k.")
    hours = [float(h) for h in re.findall(r" ([\d.]+)h", path)]
    assert re.search(rf"{re.escape(kind)} {max(hours):g}h", path), (kind, path)
    assert "shortens it only by " in lever and "algos." in lever


def test_use_vllm_is_planned_without_vllm_here_and_shortens_grpos_sampling(capsys, monkeypatch):
    """A plan is for another node: vllm need not be installed on the planning machine. Its GRPO
    jobs sample each step's completions in one batch (pita/plans/durations.py): shorter."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    base = ["experiment=paper_math", "gpu=auto", "model=llama", "system.inventory=8x80GB", "experiment.algos=[GRPO]"]
    rc, plain, err = _plan(capsys, *base)
    assert rc == 0, err
    rc, vllm, err = _plan(capsys, *base, "algos.GRPO.use_vllm=true")
    assert rc == 0, err
    seconds = lambda plan: {j["id"]: j["seconds"] for j in plan["jobs"] if j["kind"] == "algo.grpo_train"}  # noqa: E731
    assert all(vllm_s < plain_s / 2 for vllm_s, plain_s in zip(seconds(vllm).values(), seconds(plain).values()))


def test_a_run_refuses_use_vllm_where_vllm_is_not_installed(monkeypatch):
    import importlib.util

    from pita.cli.plan import compose
    from pita.core.errors import ConfigError
    from pita.plans.experiment import experiment_plan

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    cfg = compose(["experiment=paper_math", "model=llama", "experiment.algos=[GRPO]", "algos.GRPO.use_vllm=true"])
    with pytest.raises(ConfigError, match=r"algos.GRPO.use_vllm=true but vllm is not installed"):
        experiment_plan(cfg, [int(80e9)] * 8, cuda=True)


def test_durations_learn_the_median_ratio_per_kind_and_keep_each_family_and_device_class_apart(tmp_path):
    from types import SimpleNamespace

    from pita.core.errors import ConfigError
    from pita.plans.durations import DurationLearner

    d = DurationLearner.load(tmp_path, "tiny", cuda=False)
    assert d.factor("algo.dpo_train") is None
    for measured in (30.0, 10.0, 20.0):
        d.observe("algo.dpo_train", 10.0, measured)
    assert d.factor("algo.dpo_train") == 2.0  # the median of 3, 1, 2
    d.save()
    DurationLearner.load(tmp_path, "tiny", cuda=True).save()  # another scope: kept apart, nothing lost
    again = DurationLearner.load(tmp_path, "tiny", cuda=False)
    assert again.factor("algo.dpo_train") == 2.0
    assert DurationLearner.load(tmp_path, "llama", cuda=False).factor("algo.dpo_train") is None
    job = SimpleNamespace(kind="algo.dpo_train", params={}, planned_s=50.0, duration_hint=50.0)
    assert again.expected(job) == 100.0
    again.apply = False  # executor.learn_durations=false: measured seconds recorded, never applied
    assert again.expected(job) == 50.0
    with pytest.raises(ConfigError, match="no readable state.json"):
        DurationLearner.from_runs([tmp_path / "nope"])


# paper_math at its earlier 512 new tokens: SmolLM2's GRPO-HF at the whole batch fits an L4 then
SMALL = ("experiment=paper_math", "model=smollm2", "data_collection.max_new_tokens=512", "eval.max_new_tokens=512")


def test_a_gpu_name_is_one_card_with_its_own_memory_and_speed(capsys):
    """A100 alone is two cards: refused, naming both. A100-80GB plans at the A100's speed (its
    training jobs slower, by up to 989 / 312) and says so; sizes alone assume an H100 and say that
    the card was not named; a mixed inventory is timed at its slowest card."""
    rc, _, err = _plan(capsys, *SMALL, "system.inventory=4xA100")
    assert rc == 2 and "A100 is 2 cards with different memory; write A100-40GB or A100-80GB" in err
    speeds = {}
    for inv in ("4xA100-80GB", "4xH100"):
        rc, plan, err = _plan(capsys, "--json", *SMALL, f"system.inventory={inv}")
        assert rc == 0, err
        speeds[inv] = {j["id"]: j["seconds"] for j in plan["jobs"] if j["kind"] in ("algo.value_train", "algo.dpo_train")}
        assert plan["card"]["name"] == ("A100-80GB" if "A100" in inv else "H100-SXM")
        assert f"for {plan['card']['name']}:" in plan["durations"]
    ratios = [speeds["4xA100-80GB"][j] / speeds["4xH100"][j] for j in speeds["4xH100"] if speeds["4xH100"][j] > 5]
    # training's FLOPs at 989 / 312 TFLOP/s; its loading, saving and kernel launches take a card's
    # time whatever its FLOP/s, and on a 135M model they are a good part of it
    assert ratios and all(1.5 < r < 989 / 312 for r in ratios), ratios
    rc, plan, err = _plan(capsys, "--json", *SMALL, "system.inventory=4x80GB")
    assert plan["card"]["name"] == "H100-SXM" and "do not name a GPU pita knows" in plan["card"]["note"]
    rc, plan, err = _plan(capsys, "--json", *SMALL,
                          "system.inventory=[2xA100-80GB,2xL4]")
    assert plan["card"]["name"] == "L4" and "slowest" in plan["card"]["note"]


def test_nvml_names_map_to_their_cards():
    from pita.core.gpu_manager import card_of

    assert card_of("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert card_of("NVIDIA H100 PCIe").name == "H100-PCIE"
    assert card_of("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert card_of("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert card_of("NVIDIA L4").name == "L4" and card_of("Tesla T4").name == "T4"
    assert card_of("node 1.2.3.4 (abc) GPU 0") is None


def test_gpu_auto_weighs_the_device_counts_that_fit_by_makespan_and_says_when_it_raised_yours(capsys):
    """Qwen3 1.7B's full GRPO fits FSDP over 4 or 8 devices: both are planned and simulated, the
    shorter makespan is kept and both are printed. A count the user set that fits no micro-batch
    is raised, and the notes (text and --json) say so and why; one that fits is kept."""
    base = ["experiment=paper_math", "gpu=auto", "model=qwen3", "system.inventory=8x80GB", "experiment.algos=[GRPO]"]
    rc, plan, err = _plan(capsys, *base)
    assert rc == 0, err
    weighed = plan["devices_weighed"]["GRPO"]
    assert [t["devices"] for t in weighed] == [4, 8]
    chosen = [t for t in weighed if t["chosen"]]
    assert len(chosen) == 1 and chosen[0]["makespan_s"] <= min(t["makespan_s"] for t in weighed) * 1.01
    assert plan["training"]["GRPO"]["devices"] == chosen[0]["devices"]
    assert plan["makespan_s"] == pytest.approx(chosen[0]["makespan_s"], rel=0.01)
    assert any(n.startswith("gpu=auto weighed GRPO's training by the simulated makespan: 4 devices") for n in plan["notes"])
    rc, plan, err = _plan(capsys, *base, "algos.GRPO.devices=2", "algos.GRPO.sharding=fsdp")
    assert rc == 0, err
    raised = plan["training"]["GRPO"]["devices"]
    assert raised in (4, 8)
    assert any(n.startswith(f"algos.GRPO.devices=2 raised to {raised}: its training does not fit 2 devices at any "
                            f"micro-batch")
               for n in plan["notes"]), plan["notes"]
    rc, plan, err = _plan(capsys, *base, "algos.GRPO.devices=8", "algos.GRPO.sharding=fsdp")
    assert rc == 0, err
    assert plan["training"]["GRPO"]["devices"] == 8 and not plan["devices_weighed"]
    assert not any("raised" in n for n in plan["notes"])


def test_vllm_server_mode_sets_the_servers_gpus_aside(capsys, monkeypatch):
    """TRL's server mode needs a vLLM server on GPUs of its own: the plan runs its jobs on the
    others and says so; a server that would take every GPU is exit 2 naming the key."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    base = ["experiment=paper_math", "gpu=auto", "model=llama", "experiment.algos=[GRPO]", "algos.GRPO.use_vllm=true",
            "algos.GRPO.vllm_mode=server", "algos.GRPO.lora_r=16", "algos.GRPO.ref_policy=previous"]
    rc, plan, err = _plan(capsys, *base, "system.inventory=8x80GB", "algos.GRPO.vllm_server_devices=2")
    assert rc == 0, err
    assert len(plan["inventory"]) == 6
    assert any(n.startswith("vllm_mode=server: 2 GPU(s) set aside for the vLLM server") for n in plan["notes"])
    rc, _, err = _plan(capsys, *base, "system.inventory=1x80GB")
    assert rc == 2 and "algos.<A>.vllm_server_devices" in err and "nothing is left to train on" in err
