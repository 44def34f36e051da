"""The training runtime (pita/training) holds the memory its plan reserves and computes what an
unsharded run computes: one test per defect found by reading the installed transformers, TRL,
accelerate and torch as a GPU engineer would before booking a node (docs/decisions/training-runtime-fixes.md). A CUDA-only decision is driven on
this CPU (bench.cuda_branch); peaks are measured by running the job's own function on fake tensors
(bench.trainer_memory), which counts bytes exactly, whatever the CPU."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

import pita.algos.rank_check  # noqa: F401  (registers synthetic.ranks)
from helpers import run_graph
from pita.core.job import Job, Resources, RetryPolicy


@pytest.fixture
def cuda_args_factory(monkeypatch, tmp_path):
    """training_args(DPOConfig, params, ..., cuda=True) on this CPU: the job's GPU arguments."""
    from bench.cuda_branch import drive_cuda_branch

    drive_cuda_branch(monkeypatch)

    def make(**kw):
        import trl

        from pita.training.arguments import training_args

        p = {"dtype": "bfloat16", "gradient_checkpointing": True, "sharding": "fsdp", "tf32": False, "compile": False,
             "batch_size": 8, "devices": 2, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "lr": 1e-6,
             "beta": 0.1, "seed": 0, "save_steps": 2, **kw}
        return training_args(trl.DPOConfig, p, str(tmp_path / "out"), True)

    return make


def _paper_job(*overrides, algo="DPO", family="smollm2", experiment="paper_math", auto=True):
    """(cfg, round-0 training job, family paths) of a paper preset planned for 8x80GB (``auto``:
    with gpu=auto choosing devices, sharding and micro-batch where the overrides leave them)."""
    from pita.cli.plan import _offline, compose
    from pita.config.validate import validate_config
    from pita.models.families import resolve_family
    from pita.plans import build_plan

    _offline()
    cfg = compose([f"experiment={experiment}", *(["gpu=auto"] if auto else []), f"model={family}",
                   "system.inventory=8x80GB",
                   f"experiment.algos=[{algo}]", *overrides])
    validate_config(cfg, models=False)
    jobs = build_plan(cfg, [int(80e9)] * 8, cuda=True, plan_only=True)
    kind = "algo.dpo_train" if algo == "DPO" else "algo.grpo_train"
    job = next(j for j in jobs if j.kind == kind and j.id.startswith(f"{algo}.") and j.id.endswith(".r0.train"))
    return cfg, job, resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed, defer="plan")


# ------------------------------------------------------------------ 1. accumulation under FSDP2
@pytest.mark.timeout(1200)  # beside a load on 2 cores it ran past 400 s
def test_a_sharded_job_with_accumulation_holds_no_whole_gradients(monkeypatch, tmp_path):
    """SmolLM2's DPO job sharded over 2 devices, measured through its own trainer on fake tensors:
    at accumulation 2 (micro-batch 4 of a 16-pair batch) the trainer reduce-scatters every
    micro-step, so its peak is that of accumulation 1 at the same micro-batch plus the sharded
    fp32 gradient it accumulates (4 bytes x parameters / 2 ranks), exactly 2.0 bytes a parameter
    here. Under the trainer's default no_sync, FSDP2 kept every parameter's whole gradient until
    the last micro-step as well: 4.0 bytes a parameter above accumulation 1, on every rank whatever
    the world size. Both rows fit their reservations within 1.0-1.5x."""
    monkeypatch.chdir(tmp_path)
    from bench.memory_truth import row_ratio
    from bench.trainer_memory import measure_job
    from pita.models.shapes import model_shape

    sharded = ["algos.DPO.devices=2", "algos.DPO.sharding=fsdp", "training.micro_batch_size=4"]
    planned = [_paper_job(*sharded), _paper_job(*sharded, "algos.DPO.batch_size=8")]
    with ThreadPoolExecutor(2) as pool:  # one process each, one thread each
        rows = list(pool.map(lambda cjp: measure_job(cjp[1], cjp[0], cjp[2]), planned))
    two, one = rows
    assert (two["accumulation"], one["accumulation"]) == (2, 1) and two["micro_batch"] == one["micro_batch"] == 4
    assert two["sync_each_batch"] and two["world_size"] == 2 and two["fsdp_units"] > 30, two
    # accelerate's state says FSDP2 while the trainer runs (no_sync, clipping and saving ask it): a
    # CPU group is turned into FSDP as a GPU group is, in PartialState's record too
    assert two["fsdp2_while_training"], two
    assert two["built_by"] == "pita.algos.dpo.dpo_train" and two["optimizer"] == "adamw_torch_fused"
    n = model_shape(planned[0][2]["reference"], "model.reference").n_params
    sharded_grads = 4 * n / 2
    assert two["peak_bytes"] - one["peak_bytes"] < sharded_grads + 0.5 * n, (two["peak_bytes"] - one["peak_bytes"]) / n
    for (cfg, job, _), row in zip(planned, rows):
        assert 1.0 <= row_ratio(job, row["peak_bytes"]) <= 1.5, (job.resources.memory_gb, row["peak_bytes"] / 1e9)


def test_a_sharded_jobs_arguments_sync_every_micro_step(cuda_args_factory):
    """The keyword reaches accelerate: TrainingArguments' accelerator_config asks the gradient
    accumulation plugin for sync_each_batch, which transformers' loop reads to skip no_sync."""
    from accelerate.utils import GradientAccumulationPlugin

    args = cuda_args_factory(sharding="fsdp", devices=2, batch_size=16, micro_batch_size=4)
    kw = args.accelerator_config.gradient_accumulation_kwargs
    assert kw == {"sync_each_batch": True} and args.gradient_accumulation_steps == 2
    assert GradientAccumulationPlugin(**kw, num_steps=1).sync_each_batch
    whole = cuda_args_factory(sharding="none", devices=2, batch_size=16, micro_batch_size=4)
    assert whole.accelerator_config.gradient_accumulation_kwargs is None  # DDP's no_sync holds nothing more


# ------------------------------------------------------------------ 3. GRPO's generation batch
@pytest.mark.timeout(300)
def test_grpo_samples_in_the_plans_generate_calls(tiny_cache, tmp_path, monkeypatch):
    """TRL generates a whole generation batch (micro-batch x accumulation rows) in one call; the job
    samples it in the calls the plan priced (``rows_per_generate``, from the sampling phase's
    memory), through the real trainer and transformers' generate: all 8 rows at once where they
    fit, 4 + 4 where the plan said 4, and an OOM retry's halved micro-batch halves each call."""
    from transformers.generation.utils import GenerationMixin

    from pita.algos import grpo
    from pita.core.paths import JobPaths
    from pita.plans import build_plan
    from test_baselines import compose

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rows = []
    real = GenerationMixin.generate

    def counted(self, *a, **kw):
        rows.append(int((kw.get("input_ids") if kw.get("input_ids") is not None else a[0]).shape[0]))
        return real(self, *a, **kw)

    monkeypatch.setattr(GenerationMixin, "generate", counted)
    jobs = build_plan(compose(tiny_cache, "experiment.algos=[GRPO]", "algos.GRPO.batch_size=8",
                              "algos.GRPO.num_generations=4", "algos.GRPO.max_steps=1",
                              "data_collection.max_new_tokens=8", "training.micro_batch_size=2"), [int(8e9)])
    planned = next(j for j in jobs if j.id == "GRPO.tiny.arith.r0.train").params
    assert (planned["rows_per_generate"], planned["rows_per_generate_micro"]) == (8, 2)  # the tiny model: all fit
    for name, change, want in (("fits", {}, [8]), ("planned-4", {"rows_per_generate": 4}, [4, 4]),
                               ("retried", {"rows_per_generate": 4, "micro_batch_size": 1}, [2, 2, 2, 2])):
        params = {**planned, **change}
        ctx = SimpleNamespace(params=params, dep_result=lambda j: None, paths=JobPaths(tmp_path / name),
                              log=logging.getLogger("test.grpo"))
        ctx.paths.dir.mkdir(parents=True)
        rows.clear()
        res = grpo.grpo_train(ctx)
        assert res["steps"] == 1 and rows == want, (name, rows)


# ------------------------------------------------------------------ 4. vLLM's maximum length
def test_vllm_gets_the_jobs_longest_sequence_as_its_maximum_length(tiny, tmp_path, monkeypatch):
    """Without vllm_max_model_length vLLM sizes its KV cache for the model's whole context (131,072
    tokens for Llama 3.1, ~16 GB) and refuses to start in a colocated share; the job gives it the
    longest training prompt (chat template included) plus the completion limit."""
    from transformers import AutoTokenizer

    from pita.algos import grpo
    from pita.core.paths import JobPaths
    from pita.datasets.base import Example

    monkeypatch.setattr(grpo, "on_cuda", lambda: False)
    tok = AutoTokenizer.from_pretrained(tiny["reference"])
    examples = [Example(id=f"e{i}", prompt="What is 1 + 1? " * (i + 1), answer="2") for i in range(3)]
    longest = len(tok.apply_chat_template(grpo.user(examples[-1].prompt), add_generation_prompt=True, tokenize=True,
                                          return_dict=False))
    p = {"dtype": "float32", "gradient_checkpointing": False, "sharding": "none", "tf32": False, "compile": False,
         "batch_size": 8, "devices": 1, "micro_batch_size": 8, "gradient_accumulation_steps": 1, "lr": 1e-6,
         "beta": 0.04, "seed": 0, "save_steps": 0, "max_steps": 1, "num_generations": 4, "temperature": 1.0,
         "max_completion_length": 96, "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
         "loss_type": "grpo", "scale_rewards": "group"}
    ctx = SimpleNamespace(paths=JobPaths(tmp_path), params=p)
    args = grpo.grpo_arguments(ctx, p, examples, tok, cuda=False)
    assert args.use_vllm and args.vllm_max_model_length == longest + 96 < 1000, args.vllm_max_model_length


def test_a_colocated_vllm_share_without_room_for_one_sequence_is_refused():
    """vLLM needs its share to hold the weights, its profiling pass and the KV cache of one
    sequence at its maximum length; a share that holds the weights with 10% to spare (what the
    plan checked) but not a 16k-token sequence is refused, naming the key and the share needed."""
    from pita.core.memory import weights_bytes
    from pita.models.shapes import model_shape
    from pita.plans.fit import vllm_colocate_bytes, vllm_problems

    p = {"reference": "Qwen/Qwen3-8B", "dtype": "bfloat16", "use_vllm": True, "vllm_mode": "colocate",
         "max_completion_length": 16384}
    w, kv, act = vllm_colocate_bytes(p)
    assert w == weights_bytes(model_shape("Qwen/Qwen3-8B", "model.reference"), "bfloat16") and kv > 2e9
    total = int(80e9)
    tight = (w / 0.9 + (w + kv + act)) / 2 / total  # holds the weights with 10% to spare, not the sequence
    job = Job("GRPO.qwen3.gsm8k.r0.train", "algo.grpo_train",
              params={**p, "vllm_gpu_memory_utilization": round(tight, 4)})
    out = vllm_problems([job], [total] * 8)
    assert len(out) == 1 and f"vllm_gpu_memory_utilization={round(tight, 4)}" in out[0], out
    assert "KV cache of one sequence" in out[0] and "vllm_mode=server" in out[0]
    job.params["vllm_gpu_memory_utilization"] = 0.3
    assert vllm_problems([job], [total] * 8) == []


# ------------------------------------------------------------------ 6. NCCL's own memory
def test_a_multi_device_jobs_reservation_and_observed_peak_count_nccl(monkeypatch, tmp_path):
    """NCCL's buffers live outside torch's allocator: every rank of a k-device job reserves them,
    and the peak a k-rank job reports (all a container without per-process NVML sees) adds them."""
    from pita.core.memory import CUDA_CONTEXT_BYTES, NCCL_RANK_BYTES
    from pita.core.paths import JobPaths
    from pita.core.ranks import PEAK_FILE, report_rank_peaks

    _, one, _ = _paper_job("algos.DPO.devices=1", "training.micro_batch_size=4", auto=False)
    _, two, _ = _paper_job("algos.DPO.devices=2", "training.micro_batch_size=4", "algos.DPO.batch_size=32",
                           auto=False)  # data-parallel: every rank as the one above, and NCCL
    assert (one.params["sharding"], two.params["sharding"]) == ("none", "none")
    assert one.params["micro_batch_size"] == two.params["micro_batch_size"]  # the same rows per device
    assert two.resources.memory_bytes - one.resources.memory_bytes >= NCCL_RANK_BYTES, \
        (one.resources.memory_gb, two.resources.memory_gb)
    paths = JobPaths(tmp_path)
    paths.dir.mkdir(parents=True, exist_ok=True)
    for r, gb in enumerate((10, 12)):
        (paths.dir / PEAK_FILE.format(r)).write_text(json.dumps({"rank": r, "peak_gpu_reserved_bytes": gb * 10 ** 9}))
    seen = []
    report_rank_peaks(SimpleNamespace(paths=paths, log=logging.getLogger("t"), report_peak=seen.append), 2)
    assert seen == [12 * 10 ** 9 + CUDA_CONTEXT_BYTES + NCCL_RANK_BYTES]


# ------------------------------------------------------------------ 8. NCCL's watchdog
@pytest.mark.timeout(120)
def test_an_nccl_out_of_memory_in_the_watchdog_is_retried_at_half_the_batch(tmp_path):
    """NCCL's errors in torch's watchdog thread never reach Python: the watchdog logs them and aborts
    the rank. One that says out of memory is the job's OOM (retried at half the micro-batch), not a
    crash."""
    retry = RetryPolicy(batch_param="micro_batch_size")
    jobs = [Job("nccl", "synthetic.ranks", params={"devices": 2, "nccl_abort_rank": 1, "micro_batch_size": 4,
                                                   "fits": 2}, resources=Resources(2, 0.5), retry=retry)]
    summary, state, run = run_graph(jobs, tmp_path, devices=2, worker_start="exec")
    a = state["jobs"]["nccl"]
    assert [x["status"] for x in a["attempts"]] == ["oom", "ok"], a["attempts"]
    assert "NCCL out of device memory" in a["attempts"][0]["error"] and "watchdog" in a["attempts"][0]["error"]
    assert [x["micro_batch_size"] for x in a["attempts"]] == [4, 2]


# ------------------------------------------------------------------ 9. DPO's explicit reference
def test_dpos_explicit_reference_runs_on_the_policys_attention(tiny, tmp_path, monkeypatch):
    """From round 1 with ref_policy=original the job loads the reference itself; it must take the
    policy's attention implementation (under FlashAttention a reference on SDPA differs from the
    policy at step 0)."""
    from datasets import Dataset

    from pita.algos import dpo
    from pita.core.paths import JobPaths

    Dataset.from_list([{"prompt": "1 + 1?", "chosen": "2", "rejected": "3", "chosen_reward": 1.0,
                        "rejected_reward": 0.0}]).save_to_disk(str(tmp_path / "pairs"))
    seen = {}

    class Stop(Exception):
        pass

    def trainer(cls):
        def build(model, ref_model, **kw):
            seen.update(policy=model.config._attn_implementation, reference=ref_model.config._attn_implementation)
            raise Stop
        return build

    monkeypatch.setattr(dpo, "job_trainer", trainer)
    p = {"policy_from": "DPO.r0.train", "ref_policy": "original", "reference": tiny["reference"], "attn_impl": "eager",
         "data": "pairs", "dtype": "float32", "sharding": "none", "lora_r": 0, "gradient_checkpointing": False,
         "tf32": False, "compile": False, "batch_size": 1, "devices": 1, "micro_batch_size": 1,
         "gradient_accumulation_steps": 1, "lr": 1e-6, "beta": 0.1, "seed": 0, "save_steps": 0, "epochs": 1,
         "max_length": None}
    deps = {"DPO.r0.train": {"checkpoint": tiny["reference"]}, "pairs": {"path": str(tmp_path / "pairs")}}
    ctx = SimpleNamespace(params=p, dep_result=deps.__getitem__, paths=JobPaths(tmp_path / "job"),
                          log=logging.getLogger("test.dpo"))
    with pytest.raises(Stop):
        dpo.dpo_train(ctx)
    assert seen == {"policy": "eager", "reference": "eager"}


# ------------------------------------------------------------------ 10. LoRA's frozen base
def test_a_lora_job_holds_its_frozen_base_in_the_models_dtype_on_cuda(tiny, monkeypatch):
    """On CUDA the base LoRA adapts is frozen: held in model.dtype (bf16), not fp32 (which doubled
    its memory and its decoding bandwidth); the adapters peft adds, which train, stay fp32; and the
    plan counts the base at 2 bytes a parameter."""
    import torch
    from peft import get_peft_model

    from pita.training.models import load_policy, peft_config

    ctx = SimpleNamespace(log=logging.getLogger("t"), dep_result=lambda j: {})
    p = {"policy_from": None, "reference": tiny["reference"], "attn_impl": "sdpa", "sharding": "none", "lora_r": 4,
         "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"], "dtype": "bfloat16"}
    _, model, _ = load_policy(ctx, p, cuda=True)
    assert model.dtype == torch.bfloat16
    wrapped = get_peft_model(model, peft_config(p, ctx.log))  # as TRL wraps it (autocast_adapter_dtype)
    trainable = [w for w in wrapped.parameters() if w.requires_grad]
    assert trainable and all(w.dtype == torch.float32 for w in trainable)
    assert load_policy(ctx, {**p, "lora_r": 0}, cuda=True)[1].dtype == torch.float32  # full fine-tuning: fp32 masters
    assert load_policy(ctx, p, cuda=False)[1].dtype == torch.float32

    from pita.models.shapes import model_shape

    _, lora, paths = _paper_job("algos.GRPO.lora_r=16", "algos.GRPO.ref_policy=previous", "algos.GRPO.devices=1",
                                algo="GRPO", family="qwen3")
    n = model_shape(paths["reference"], "model.reference").n_params
    from pita.core.memory import weights_bytes

    assert lora.resources.memory_bytes < 70e9  # was 75.2 GB with vLLM colocate; here without it
    assert lora.resources.memory_bytes >= weights_bytes(model_shape(paths["reference"], "model.reference"), "bfloat16")
    assert n * 2 < lora.resources.memory_bytes


# ------------------------------------------------------------------ 5. host memory at a checkpoint
def test_a_sharded_jobs_host_memory_counts_its_checkpoints():
    """Each mid-training checkpoint of a sharded job copies every rank's shards to host memory,
    AdamW's two moments at once (8 bytes a parameter over the node), and resuming reads them back so:
    the plan counted 4 (the final policy gathered on rank 0). Without mid-training checkpoints
    (training.save_steps=0) the gather is what remains."""
    from pita.models.shapes import model_shape
    from pita.plans.host import HOST_PROCESS_BYTES

    sharded = ["algos.DPO.devices=4", "algos.DPO.sharding=fsdp"]
    _, job, paths = _paper_job(*sharded, family="llama-old")
    n = model_shape(paths["reference"], "model.reference").n_params
    assert job.resources.host_gb * 1e9 >= 4 * HOST_PROCESS_BYTES + 8 * n - 1e6  # host_gb is rounded to MB
    _, bare, _ = _paper_job(*sharded, "training.save_steps=0", family="llama-old")
    assert bare.resources.host_gb * 1e9 < 4 * HOST_PROCESS_BYTES + 7 * n


# ------------------------------------------------------------------ 11. rows of work a job does not do
def test_memory_truth_has_no_row_for_a_best_of_n_merge_that_loads_no_model():
    """On a reward task the best-of-n merge reads the rewards its samples already carry (no proxy,
    a reservation of 0): the bench measured it as if it ran the proxy, false rows of up to 20 GB.
    On a verifier task it scores with the proxy, and that row stays."""
    from bench.memory_truth import _plan, _representatives

    cfg, jobs, paths = _plan("paper_reward", "smollm2")
    assert any(j.kind == "control.best_of_n" for j in jobs)
    assert "control.best_of_n" not in _representatives(jobs)
    cfg, jobs, paths = _plan("paper_math", "smollm2")
    assert _representatives(jobs)["control.best_of_n"].params["proxy"]


def test_a_sharded_multimodal_policy_is_wrapped_by_the_layers_it_has(cuda_args_factory):
    """accelerate wraps the classes the model's _no_split_modules names and refuses one the model
    lacks; Gemma 3 4B names its vision tower's SiglipMultiheadAttentionPoolingHead, which its config
    leaves out, so a sharded gemma job failed before its first step (found by measuring the job
    through its own trainer). The job names the classes its policy has."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import AutoModelForCausalLM

    from pita.models.shapes import model_config
    from pita.training.arguments import training_args

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config("google/gemma-3-4b-it", "model.reference"))
    assert "SiglipMultiheadAttentionPoolingHead" in model._no_split_modules
    import trl

    p = {"dtype": "bfloat16", "gradient_checkpointing": False, "sharding": "fsdp", "tf32": False, "compile": False,
         "batch_size": 8, "devices": 2, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "lr": 1e-6,
         "beta": 0.1, "seed": 0, "save_steps": 0}
    cuda_args_factory()  # the CUDA branch (the factory's own args are not used here)
    args = training_args(trl.DPOConfig, p, "out", True, model=model)
    names = args.fsdp_plugin_args["transformer_cls_names_to_wrap"].split(",")
    assert "Gemma3DecoderLayer" in names and "SiglipMultiheadAttentionPoolingHead" not in names, names
    FullyShardedDataParallelPlugin(**args.fsdp_plugin_args).set_auto_wrap_policy(model)  # raised ValueError


# ------------------------------------------------------------------ 11. a GRPO step's phases
_LORA_GRPO_HF = ["algos.GRPO-HF.lora_r=16", "algos.GRPO-HF.ref_policy=previous", "training.micro_batch_size=64"]


def test_a_grpo_step_reserves_its_largest_phase_not_their_sum():
    """A GRPO step samples (KV cache), then scores (the proxy's pass), then trains (activations),
    each phase's working memory freed before the next. phi's GRPO-HF with LoRA at micro-batch 64
    (a row of bench.memory_truth) reserved the three summed: 63.4 GB against a peak of 41.4 GB
    measured through its own trainer (1.53x). Its reservation is the largest phase, and each
    phase holds the same resident part."""
    from pita.algos import algorithm
    from pita.core.memory import kv_cache_bytes
    from pita.models.shapes import model_shape
    from pita.plans.memory import PROMPT_TOKENS, JobMemory

    cfg, job, paths = _paper_job(*_LORA_GRPO_HF, algo="GRPO-HF", family="phi")
    assert job.params["micro_batch_size"] == 64 and job.params["devices"] == 1
    est = JobMemory(cfg, paths, True, [int(80e9)] * 8)
    phases = est.policy_phases(algorithm("GRPO-HF", cfg.algos["GRPO-HF"]), datasets=list(cfg.experiment.datasets))
    assert set(phases) == {"sampling", "scoring", "training"}
    assert job.resources.memory_bytes == pytest.approx(max(phases.values()), rel=1e-3)
    shape = model_shape(paths["reference"], "model.reference")
    kv = kv_cache_bytes(shape, "bfloat16", 64, PROMPT_TOKENS + int(job.params["max_completion_length"]))
    # the KV cache is in sampling alone: training holds its activations without it
    assert phases["sampling"] > kv
    assert job.resources.memory_bytes < phases["training"] + 0.5 * kv
    assert job.resources.memory_gb < 1.5 * 41.35  # the peak measured through the job's trainer


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_grpo_jobs_reservation_holds_its_measured_peak_within_target(monkeypatch, tmp_path):
    """phi's GRPO-HF with LoRA at micro-batch 64, measured through its own trainer on fake tensors
    (about 2.5 minutes on 2 cores): reserved within 1.0-1.5x of its peak."""
    monkeypatch.chdir(tmp_path)
    from bench.memory_truth import row_ratio
    from bench.trainer_memory import measure_job

    cfg, job, paths = _paper_job(*_LORA_GRPO_HF, algo="GRPO-HF", family="phi")
    row = measure_job(job, cfg, paths)
    assert row["built_by"].endswith("grpo_train"), row
    assert 1.0 <= row_ratio(job, row["peak_bytes"]) <= 1.5, (job.resources.memory_gb, row["peak_bytes"] / 1e9)


def test_memory_truth_measures_the_eta_search_as_the_guided_sampling_it_runs():
    """The eta search samples the validation prompts with the guided policy: bench.memory_truth
    measures it as it does a guided shard (a row within 1.0-1.5x), never 'not measured'."""
    from bench.memory_truth import Fake, _plan, _representatives, measure, measured_peak

    cfg, jobs, paths = _plan("paper_math", "smollm2")
    job = _representatives(jobs)["eval.eta_search"]
    peak = measured_peak(job, measure(Fake(), cfg, paths, job))
    assert 1.0 <= job.resources.memory_bytes / peak <= 1.5, (job.resources.memory_gb, peak / 1e9)


def test_a_sharded_job_with_accumulation_is_refused_on_a_trainer_without_sync_each_batch(cuda_args_factory,
                                                                                       monkeypatch, tiny_cache):
    """transformers' Trainer reads sync_each_batch since 5.2 (the floor in pyproject.toml); on an
    older one every micro-step but the last keeps whole gradients. A run's plan refuses an FSDP job
    with accumulation before any job starts (exit 2 material, naming the fix), and the job itself
    refuses an attempt whose retried micro-batch brought accumulation on; the installed release
    passes, and one micro-step, or no sharding, needs nothing."""
    from pita.core.errors import ConfigError, JobError
    from pita.plans import build_plan
    from pita.training import arguments
    from test_baselines import compose

    assert arguments.trainer_syncs_each_batch()  # the installed transformers (>= 5.2)
    monkeypatch.setattr(arguments, "trainer_syncs_each_batch", lambda: False)
    with pytest.raises(JobError, match=r"algos\.DPO: FSDP over 2 devices with 2 micro-steps .* pip install -U "
                                       r"'transformers>=5\.2'"):
        cuda_args_factory(sharding="fsdp", devices=2, batch_size=16, micro_batch_size=4, algo="DPO")
    cuda_args_factory(sharding="fsdp", devices=2, batch_size=16, micro_batch_size=8)  # one micro-step
    cuda_args_factory(sharding="none", devices=2, batch_size=16, micro_batch_size=4)  # DDP
    over = ["experiment.algos=[DPO]", "algos.DPO.devices=2", "algos.DPO.sharding=fsdp", "algos.DPO.batch_size=8",
            "training.micro_batch_size=1"]
    with pytest.raises(ConfigError, match="sync_each_batch"):
        build_plan(compose(tiny_cache, *over), [int(8e9)] * 2)
    build_plan(compose(tiny_cache, *over), [int(8e9)] * 2, plan_only=True)  # a plan for another node: not asked


def test_the_memory_plan_counts_full_logits_where_the_installed_trl_has_no_fused_head(monkeypatch, tiny):
    """TRL 1.16's fused head (trl.kernels.chunked_logprob) never holds the whole vocabulary at every
    position; an older admitted TRL does, and the plan then counts the fp32 logits of a micro-batch."""
    from pita.algos import algorithm
    from pita.plans.memory import JobMemory
    from pita.training import arguments
    from test_config import _compose

    assert arguments.trl_fused_head()  # the installed TRL
    cfg = _compose("experiment.algos=[DPO]")
    paths = {"reference": tiny["reference"], "guidance": tiny["guidance"], "reward_models": {}}
    dpo = algorithm("DPO", cfg.algos.DPO)
    fused = JobMemory(cfg, paths, True, []).policy_training(dpo, micro=4, gradient_checkpointing=False)
    monkeypatch.setattr(arguments, "trl_fused_head", lambda: False)
    full = JobMemory(cfg, paths, True, []).policy_training(dpo, micro=4, gradient_checkpointing=False)
    assert full > fused
