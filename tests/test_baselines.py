"""DPO / GRPO / GRPO-HF: the plan, the checks before launch, KL of a trained policy, one short round of each."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from helpers import cli
from pita.core.errors import ConfigError, JobError

pytestmark = pytest.mark.integration


def compose(tiny_cache, *overrides):
    from hydra import compose as hc, initialize_config_dir

    from pita.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hc(config_name="config", overrides=["experiment.workload=experiment", "experiment.datasets=[arith]",
                                                    "experiment.algos=[DPO,GRPO,GRPO-HF]",
                                                    f"system.cache_dir={tiny_cache}", "datasets.arith.toy_train_size=40",
                                                    "datasets.arith.toy_test_size=16", *overrides])


def test_rounds_chain_policies_and_evaluate_the_trained_model(tiny_cache):
    from pita.core.graph import JobGraph
    from pita.plans import build_plan

    jobs = build_plan(compose(tiny_cache, "experiment.rounds=2", "algos.GRPO.devices=2"), [int(8e9)] * 2)
    by = JobGraph(jobs).validate([int(8e9)] * 2).by_id
    for algo in ("DPO", "GRPO", "GRPO-HF"):
        p = f"{algo}.tiny.arith"
        assert by[f"{p}.r0.train"].params["policy_from"] is None
        assert by[f"{p}.r1.train"].params["policy_from"] == f"{p}.r0.train"
        assert f"{p}.r0.train" in by[f"{p}.r1.train"].deps
        ev = by[f"{p}.r1.eval.s0"].params["request"]["policy"]
        assert ev["model_from_job"] == f"{p}.r1.train" and ev["reference"].endswith("reference")
        assert by[f"{p}.r1.eval.merge"].params["labels"]["algorithm"] == algo
    assert by["DPO.tiny.arith.r1.gen.s0"].params["request"]["policy"]["model_from_job"] == "DPO.tiny.arith.r0.train"
    assert by["DPO.tiny.arith.r1.gen.s0"].params["request"]["recipe"] == "preference_pairs"
    assert by["DPO.tiny.arith.r1.train"].params["data"] == "DPO.tiny.arith.r1.gen.merge"
    [PP] = {j.rsplit(".", 1)[0] for j in by if j.startswith("data.tiny.arith.r0.preference_pairs-")}
    assert by["GRPO-HF.tiny.arith.r1.proxy"].params["data"] == [PP + ".merge",
                                                               "GRPO-HF.tiny.arith.r1.gen.merge"]
    assert by["GRPO-HF.tiny.arith.r1.train"].params["proxy"] == "GRPO-HF.tiny.arith.r1.proxy"
    assert by["GRPO.tiny.arith.r0.train"].resources.devices == 2  # a k-device training job
    assert not any(j.startswith("GRPO.tiny.arith.r0.gen") for j in by)  # GRPO generates online


@pytest.mark.parametrize("override,needle", [
    ("algos.GRPO.batch_size=10", "algos.GRPO.batch_size=10 must be divisible by algos.GRPO.num_generations=8"),
    ("algos.GRPO.num_generations=1", "algos.GRPO.num_generations=1 must be >= 2"),
    ("algos.DPO.beta=-0.5", "algos.DPO.beta=-0.5 must be >= 0"),
    ("algos.DPO.gradient_accumulation_steps=3", "algos.DPO.batch_size=16 must be divisible by algos.DPO.devices x "
                                                "algos.DPO.gradient_accumulation_steps = 1 x 3 = 3"),
    ("algos.GRPO-HF.devices=4", "algos.GRPO-HF.devices=4 but this machine has 2 device"),
    ("data_collection.pairs_per_prompt=0", "data_collection.pairs_per_prompt=0 must be >= 1"),
    ("algos.DPO.ref_policy=orignal", "did you mean 'original'"),
    ("algos.DPO.lora_r=-1", "algos.DPO.lora_r=-1 must be >= 0"),
    ("algos.GRPO.epochs=0", "algos.GRPO.epochs=0.0 must be > 0"),
    ("algos.GRPO-HF.max_steps=0", "algos.GRPO-HF.max_steps=0 must be >= 1, or null"),
])
def test_bad_baseline_settings_are_refused_before_work(tiny_cache, override, needle):
    from pita.plans import build_plan

    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, override), [int(8e9)] * 2)
    assert needle in str(e.value)


def test_lora_on_modules_the_model_does_not_have_is_refused_with_the_ones_it_has(tiny_cache):
    from pita.plans import build_plan

    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, "algos.DPO.lora_r=4", "algos.DPO.lora_target_modules=[c_attn]"), [int(8e9)])
    msg = str(e.value)
    assert "algos.DPO.lora_target_modules: c_attn not found" in msg and "q_proj" in msg


def test_an_all_tied_preference_set_fails_dpo_before_training(tmp_path, monkeypatch):
    from datasets import Dataset

    from pita.algos import dpo

    data = tmp_path / "pairs"
    Dataset.from_list([{"id": "a", "prompt": "p", "chosen": "x", "rejected": "y", "chosen_reward": 1.0,
                        "rejected_reward": 1.0, "p_chosen": 0.5}]).save_to_disk(str(data))
    ctx = SimpleNamespace(params={"data": "m"}, dep_result=lambda j: {"path": str(data)})
    with pytest.raises(JobError, match="none of the 1 preference pairs has different rewards"):
        dpo.dpo_train(ctx)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_reference_log_probs_of_samples_match_the_sampler_under_temperature_and_top_p(tiny, top_p):
    """A trained policy's KL is estimated with the reference's log-probs of its samples at the same
    temperature; with the reference itself as the policy the estimate is 0 to float precision at
    top_p 1. Under a nucleus the policy is the truncated, renormalised distribution: each kept
    token's probability is divided by the kept mass (<= 1), so logp >= logp_ref and the exact KL
    is the sampled policy's, > 0 (it used to be reported as 0)."""
    from pita.generation.recipes import Scorer, run_eval
    from pita.datasets.config import dataset_config
    from pita.datasets.loading import load_examples
    from pita.models.lm import LM

    lm = LM.load(tiny["reference"])
    ex = load_examples(dataset_config("arith", toy_test_size=6), "test")
    req = {"sampling": {"max_new_tokens": 32, "temperature": 0.7, "top_p": top_p, "top_k": 0, "batch_size": 4},
           "policy": {}, "n": 3, "seed": 0, "_ref_lm": lm}
    recs = run_eval(lm, ex, req, Scorer("math"))
    assert len(recs) == 18 and any(r["finish"] == "eos" for r in recs)
    for r in recs:
        assert r["logp"] <= 0
        if top_p == 1.0:
            assert r["logp_ref"] == pytest.approx(r["logp"], abs=1e-3) and r["kl_path"] == pytest.approx(0, abs=1e-3)
        else:  # the two forwards (cached sampling, teacher-forced scoring) agree to float32 rounding
            assert r["logp"] >= r["logp_ref"] - 1e-3 and r["kl_path"] >= 0
    if top_p < 1:
        assert sum(r["kl_path"] for r in recs) > 0.01


@pytest.mark.slow  # default tier: the smoke preset trains DPO, GRPO and GRPO-HF end to end (tests/test_cli_runs.py)
def test_one_short_round_of_each_trainer_end_to_end(tmp_path, tiny_cache):
    r = cli(["experiment.name=bl", "experiment.workload=experiment", "experiment.datasets=[arith]",
             "experiment.algos=[DPO,GRPO,GRPO-HF]", "experiment.rounds=1", f"system.cache_dir={tiny_cache}",
             "datasets.arith.toy_train_size=24", "datasets.arith.toy_test_size=8", "eval.n=2",
             "algos.DPO.epochs=1", "algos.DPO.batch_size=8", "algos.GRPO.max_steps=2", "algos.GRPO.batch_size=8",
             "algos.GRPO-HF.max_steps=2", "algos.GRPO-HF.batch_size=8", "algos.GRPO-HF.proxy_epochs=1",
             "algos.GRPO.lora_r=4", "data_collection.max_new_tokens=24", "eval.controls=[]"], tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    [run] = list((tmp_path / "bl").iterdir())
    from pita.report.results import read_results

    rows = read_results(run / "results" / "final_results.json")[0]
    assert {x["algorithm"] for x in rows} == {"base", "DPO", "GRPO", "GRPO-HF"}
    for x in rows:
        assert 0.0 <= x["pass@1"] <= 1.0 and x["prompts"] == 8 and x["n"] == 2
        assert x["kl"] is not None and torch.isfinite(torch.tensor(x["kl"]))
    for algo, key in (("DPO", "loss"), ("GRPO", "reward"), ("GRPO-HF", "reward")):
        job = run / "jobs" / f"{algo}.tiny.arith.r0.train"
        res = json.loads((job / "result.json").read_text())
        assert (job / "artifacts" / "policy" / "config.json").exists()
        hist = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        assert any(key in h for h in hist), (algo, hist[:2])
        assert res["steps"] >= 1
    # GRPO trained LoRA adapters (merged into the saved policy, which loads as a plain model)
    log = (run / "jobs" / "GRPO.tiny.arith.r0.train" / "job.log").read_text()
    assert "LoRA r=4" in log
    saved = sorted(p.name for p in (run / "jobs" / "GRPO.tiny.arith.r0.train" / "artifacts" / "policy").iterdir())
    assert not any("adapter" in n for n in saved), saved


@pytest.mark.slow  # default tier: two-rank FSDP training (tests/test_sharding.py) and k-device jobs (tests/test_multi_device.py)
def test_a_two_device_training_job_runs_data_parallel_with_the_configured_effective_batch(tmp_path, tiny_cache):
    """algos.DPO.devices=2 on CPU: the job holds both logical devices and runs two gloo DDP
    processes; 8 sequences per optimizer step in all (4 per process)."""
    import math

    r = cli(["experiment.name=ddp", "experiment.workload=experiment", "experiment.datasets=[arith]",
             "experiment.algos=[DPO]", "experiment.rounds=1", f"system.cache_dir={tiny_cache}",
             "system.cpu_devices=2", "datasets.arith.toy_train_size=24", "datasets.arith.toy_test_size=8",
             "eval.n=2", "algos.DPO.epochs=1", "algos.DPO.batch_size=8", "algos.DPO.devices=2",
             "data_collection.max_new_tokens=24"], tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    [run] = list((tmp_path / "ddp").iterdir())
    job = run / "jobs" / "DPO.tiny.arith.r0.train"
    log = (job / "job.log").read_text()
    assert "data-parallel over 2 processes" in log and "[rank 0]" in log and "[rank 1]" in log
    res = json.loads((job / "result.json").read_text())
    assert res["steps"] == math.ceil(res["pairs"] / 8)
    state = json.loads((run / "state.json").read_text())
    assert len(state["jobs"]["DPO.tiny.arith.r0.train"]["devices"]) == 2


@pytest.mark.parametrize("ref_policy", ["original", "previous"])
def test_grpo_in_a_later_round_takes_its_kl_reference_from_ref_policy(tmp_path, tiny_cache, ref_policy):
    """TRL builds GRPO's reference from the path the policy was loaded from; in round 1 that is
    round 0's checkpoint. With ref_policy=original the KL must point at the original model."""
    import logging

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pita.algos.grpo import grpo_trainer
    from pita.core.paths import JobPaths
    from pita.plans import build_plan

    jobs = build_plan(compose(tiny_cache, "experiment.algos=[GRPO]", "experiment.rounds=2",
                              f"algos.GRPO.ref_policy={ref_policy}"), [int(8e9)])
    params = next(j for j in jobs if j.id == "GRPO.tiny.arith.r1.train").params
    ref = AutoModelForCausalLM.from_pretrained(params["reference"])
    prev = tmp_path / "round0-policy"
    with torch.no_grad():
        for w in ref.parameters():
            w.add_(0.5)  # a policy that moved away from the reference
    ref.save_pretrained(prev)
    AutoTokenizer.from_pretrained(params["reference"]).save_pretrained(prev)
    ctx = SimpleNamespace(params=params, dep_result=lambda j: {"checkpoint": str(prev)},
                          paths=JobPaths(tmp_path / "job"), log=logging.getLogger("test"))
    trainer, _ = grpo_trainer(ctx, params)
    original = AutoModelForCausalLM.from_pretrained(params["reference"])
    name = "model.layers.0.self_attn.q_proj.weight"
    got = dict(trainer.ref_model.named_parameters())[name]
    want = dict(original.named_parameters())[name] if ref_policy == "original" else dict(ref.named_parameters())[name]
    assert torch.equal(got.detach().cpu(), want.detach().cpu())  # the same stored weights: no arithmetic
    assert dict(trainer.model.named_parameters())[name].dtype == torch.float32  # fp32 master weights


def test_null_learning_rates_follow_the_scale_and_the_kind_of_fine_tuning(tiny_cache):
    from pita.plans import build_plan

    def lr(*o):
        jobs = build_plan(compose(tiny_cache, "experiment.algos=[DPO,GRPO]", *o), [int(8e9)])
        return {j.id.split(".")[0]: j.params["lr"] for j in jobs if j.id.endswith(".r0.train")}

    assert lr() == {"DPO": 1e-5, "GRPO": 5e-5}  # the tiny family is a toy model
    assert lr("algos.DPO.lr=3e-6") == {"DPO": 3e-6, "GRPO": 5e-5}
    from pita.algos.post_training import LEARNING_RATES

    assert LEARNING_RATES[("dpo", "full")] == 5e-7 and LEARNING_RATES[("grpo", "full")] == 1e-6


def test_grpo_rounds_are_passes_over_the_training_prompts_unless_max_steps_is_set():
    from pita.algos.grpo import grpo_steps

    p = {"max_steps": None, "epochs": 2.0, "batch_size": 64, "num_generations": 8}  # 8 prompts a step
    assert grpo_steps(p, 1000) == 250  # the budget measured at 1000 prompts
    assert grpo_steps(p, 96) == 24  # the demo's 96 prompts get 2 passes too, not 250 steps of overfitting
    assert grpo_steps({**p, "epochs": 0.24, "batch_size": 16, "num_generations": 4}, 1000) == 60
    assert grpo_steps({**p, "epochs": 0.01}, 10) == 1  # never zero steps
    assert grpo_steps({**p, "max_steps": 7}, 1000) == 7


def test_dpo_trains_a_cut_off_completion_without_an_end_of_turn(tiny, tmp_path):
    """A completion stopped by the length limit did not end: DPO must not learn its end of turn."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig

    from pita.algos.dpo import cut_aware_dpo_trainer, strip_turn_end
    from pita.algos.post_training import assistant, user

    tok = AutoTokenizer.from_pretrained(tiny["reference"])
    model = AutoModelForCausalLM.from_pretrained(tiny["reference"])
    rows = [{"prompt": user("What is 2 + 3?"), "chosen": assistant("2 + 3 = 5 #### 5"),
             "rejected": assistant("2 + 3 = 6 and then"), "chosen_finish": "eos", "rejected_finish": "length"},
            {"prompt": user("What is 4 + 1?"), "chosen": assistant("4 + 1 = 5 and"),
             "rejected": assistant("4 + 1 = 3 #### 3"), "chosen_finish": "length", "rejected_finish": "eos"}]
    args = DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, report_to=[],
                     use_cpu=True, logging_steps=1, save_strategy="no")
    trainer = cut_aware_dpo_trainer()(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                      processing_class=tok)
    ds = trainer.train_dataset
    key = "{}_ids" if "chosen_ids" in ds.column_names else "{}_input_ids"
    eos = tok.eos_token_id
    first, second = ds[0], ds[1]
    assert eos in first[key.format("chosen")] and eos not in first[key.format("rejected")]
    assert eos not in second[key.format("chosen")] and eos in second[key.format("rejected")]
    # the cut-off side keeps every token of its text
    cut = tok.decode(first[key.format("rejected")], skip_special_tokens=False)
    assert cut.strip().endswith("and then"), cut
    trainer.train()  # the extra columns do not reach the collator
    assert strip_turn_end([5, 6, eos, 9], eos) == [5, 6] and strip_turn_end([5, 6], eos) == [5, 6]


def test_preference_pairs_carry_whether_each_side_ended_and_the_proxy_reads_it(tiny):
    from transformers import AutoTokenizer

    from pita.guidance.proxy import text_ids
    from pita.rewards.preferences import make_pairs

    [rec] = make_pairs([{"id": "q", "prompt": "p", "completions": ["a", "b"], "rewards": [1.0, 0.0],
                         "finishes": ["length", "eos"]}], seed=0, beta=1.0, sampling=False, per_group=1)
    assert (rec["chosen"], rec["chosen_finish"], rec["rejected_finish"]) == ("a", "length", "eos")
    [old] = make_pairs([{"id": "q", "prompt": "p", "completions": ["a", "b"], "rewards": [1.0, 0.0]}], seed=0,
                       beta=1.0, sampling=False, per_group=1)
    assert "chosen_finish" not in old  # records of earlier runs keep their shape
    tok = AutoTokenizer.from_pretrained(tiny["reference"])
    ended, cut = text_ids(tok, "What is 2 + 3?", "5"), text_ids(tok, "What is 2 + 3?", "5", finished=False)
    assert ended == cut + [tok.eos_token_id]


def test_grpo_hf_scores_a_cut_off_completion_without_eos(tiny, monkeypatch):
    import pita.guidance.proxy as proxy
    from pita.algos.grpo import Rewards

    seen = []
    monkeypatch.setattr(proxy, "score_sequences",
                        lambda vm, seqs, dev, batch=64: seen.extend(seqs) or [0.0] * len(seqs))
    r = Rewards.__new__(Rewards)
    r.p, r.device, r.proxy = {"reference": tiny["reference"]}, "cpu", object()

    class Ex:
        prompt = "What is 2 + 3?"

    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tiny["reference"]).eos_token_id
    ids = [[7, 8, eos], [7, 8]]
    r._proxy_scores([Ex(), Ex()], ["5", "5"], completion_ids=ids)
    assert seen[0][-1] == eos and seen[1][-1] != eos and seen[0][:-1] == seen[1]


@pytest.mark.parametrize("on", [False, True])
def test_trl_arguments_take_checkpointing_under_the_current_name(tmp_path, on, recwarn):
    """transformers 5.x renamed ``gradient_checkpointing`` (a FutureWarning per job in run.log);
    the setting still arrives, under whichever name the installed release reads."""
    import dataclasses

    from trl import DPOConfig, GRPOConfig

    from pita.training.arguments import training_args

    p = {"dtype": "float32", "batch_size": 4, "devices": 1, "gradient_accumulation_steps": 1, "tf32": False,
         "compile": False, "lr": 1e-4, "beta": 0.1, "gradient_checkpointing": on, "seed": 0}
    for cls in (DPOConfig, GRPOConfig):
        extra = {"num_generations": 2} if cls is GRPOConfig else {}
        args = training_args(cls, p, str(tmp_path / cls.__name__), False, **extra)
        assert args.gradient_checkpointing is on
        if "activation_checkpointing" in {f.name for f in dataclasses.fields(cls)}:
            assert args.activation_checkpointing is on
    assert not [str(w.message) for w in recwarn if "checkpointing" in str(w.message)]


def test_grpo_samples_in_as_many_generate_calls_as_the_plan_prices(tmp_path, tiny_cache, monkeypatch):
    """GRPO's rows per generate call come from the sampling phase's memory (the gathered policy,
    the KV cache, the step's logits), one function for the plan and the job. On a device where
    half of a device's generation batch fits, the plan says 2 calls per step, prices 2 calls, and
    the job's trainer calls TRL's generate exactly that often (before, once per micro-batch: 16
    calls of 1 row here); a halved micro-batch (an OOM retry) halves the rows a call."""
    import logging

    from trl import GRPOTrainer

    from pita.algos import algorithm
    from pita.algos.grpo import grpo_trainer
    from pita.core.memory import generate_calls
    from pita.core.paths import JobPaths
    from pita.plans import build_plan
    from pita.plans.durations import Durations
    from pita.plans.memory import JobMemory

    cfg = compose(tiny_cache, "experiment.algos=[GRPO]", "algos.GRPO.batch_size=16", "algos.GRPO.num_generations=4",
                  "algos.GRPO.micro_batch_size=1", "algos.GRPO.max_steps=1")
    jobs = build_plan(cfg, [int(8e9)], cuda=True)
    reference = next(j for j in jobs if j.id.endswith("r0.train")).params["reference"]
    # the budget that holds 8 of the 16 rows a call and not 9
    est = JobMemory(cfg, {"reference": reference, "guidance": reference, "reward_models": {}}, True, [int(8e9)])
    a = algorithm("GRPO", cfg.algos.GRPO)
    at = [est.policy_phases(a, sample_rows=r)["sampling"] for r in (8, 9)]
    assert at[1] > at[0]
    total = int((at[0] + at[1]) / 2 / (1 - cfg.executor.memory_margin))
    jobs = build_plan(cfg, [total], cuda=True)
    job = next(j for j in jobs if j.id == "GRPO.tiny.arith.r0.train")
    p = job.params
    assert (p["rows_per_generate"], generate_calls(16, p["rows_per_generate"])) == (8, 2)
    from pita.cli.plan import _generate_fields

    assert _generate_fields(job) == {"rows_per_generate": 8, "generate_calls_per_step": 2}
    # the plan's seconds: two calls of 8 rows cost more than one of 16 and less than 16 of one
    from pita.models.shapes import model_shape

    d = Durations(jobs, lambda part: model_shape(reference, "model.reference"), cfg.model.dtype, 64)
    secs = {r: d.policy_training(SimpleNamespace(kind=job.kind, deps=job.deps, params={**p, "rows_per_generate": r}))
            for r in (16, 8, 1)}
    assert secs[16] < secs[8] < secs[1]

    calls = []

    def fake_generate(self, prompt_ids, images, multimodal_fields, *args, **kw):
        calls.append(len(prompt_ids))
        return [[1, 2]] * len(prompt_ids), None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", fake_generate)
    ctx = SimpleNamespace(params=p, dep_result=lambda j: {}, paths=JobPaths(tmp_path / "job"),
                          log=logging.getLogger("test"))
    trainer, _ = grpo_trainer(ctx, p)
    batch = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    assert batch == 16
    out, _ = trainer._generate_single_turn([[5, 6, 7]] * batch, None, None)
    assert calls == [8, 8] and len(out) == 16
    calls.clear()
    trainer.rows_per_generate_micro = 2  # as if planned at micro 2 and retried at 1: half the rows a call
    trainer._generate_single_turn([[5, 6, 7]] * batch, None, None)
    assert calls == [4, 4, 4, 4]
