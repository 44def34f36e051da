"""What one GPU shows about the training runtime (pita/training): the checks ``bench.gpu_check`` runs
for training memory, each through the job's own function (``pita.algos.dpo.dpo_train``,
``pita.algos.grpo.grpo_train``) on a random-weight 1B Llama, in this process, on one rank of a real
NCCL process group where the job is sharded.

    fsdp_accumulation  a sharded DPO job's peak at accumulation 1 and 2 (the runtime's every-micro-step
                       reduce-scatter) and at 2 under the trainer's default no_sync (what the runtime
                       fixed), and the same job measured on fake tensors (bench.trainer_memory) beside
                       its CUDA peak
    logprob_dtype      the per-token log-probabilities TRL sums, sharded and unsharded: fp32 in both,
                       and the logged sums of the two runs side by side
    grpo_sampling      a GRPO job's peak while it samples (in the generate calls its plan priced: rows per
                       call from the sampling phase's memory; their seconds beside the plan's) and in
                       all, against the plan's reservation for the job
    checkpoint_host    a sharded job's host memory (RSS, sampled) while it writes a mid-training
                       checkpoint and while a re-run attempt resumes from it, per parameter

``python -m bench.gpu_training --cpu`` runs them on this CPU (gloo instead of NCCL, the CUDA branch
driven as bench.cuda_branch does, a small model): a test of the script, not of memory.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

LLAMA_1B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
LLAMA_SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048)
PROMPT_WORDS, COMPLETION_WORDS = 200, 100
_MODEL = None


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def random_llama(tmp: Path) -> str:
    """A random-weight Llama saved in bf16 with the word-level stand-in tokenizer: 1B on a GPU, a
    small one on CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.trainer_memory import stand_in_tokenizer

    global _MODEL
    if _MODEL is not None and (Path(_MODEL) / "config.json").exists():  # one model for every check of a run
        return _MODEL
    d = tmp / "llama"
    torch.manual_seed(0)
    cfg = LlamaConfig(**(LLAMA_1B if cuda() else LLAMA_SMALL), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(d))
    stand_in_tokenizer(d)
    _MODEL = str(d)
    return _MODEL


def pairs(tmp: Path, n: int) -> str:
    from datasets import Dataset

    from bench.trainer_memory import words

    path = tmp / f"pairs{n}"
    if not path.exists():
        Dataset.from_list([{"prompt": words(PROMPT_WORDS), "chosen": words(COMPLETION_WORDS, "b"),
                            "rejected": words(COMPLETION_WORDS, "c"), "chosen_reward": 1.0, "rejected_reward": 0.0}
                           for _ in range(n)]).save_to_disk(str(path))
    return str(path)


def one_rank_group() -> None:
    """This process as rank 0 of a 1-process group (NCCL on a GPU, gloo on CPU), as torchrun starts
    a rank: accelerate finds the group through the environment."""
    if os.environ.get("WORLD_SIZE"):
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def dpo_params(model: str, data: str, **kw) -> dict:
    p = {"policy_from": None, "ref_policy": "original", "reference": model, "attn_impl": "sdpa", "data": data,
         "dtype": "bfloat16", "sharding": "fsdp", "lora_r": 0, "lora_alpha": 16, "lora_target_modules": ["q_proj"],
         "gradient_checkpointing": False, "tf32": True, "compile": False, "batch_size": 8, "devices": 1,
         "micro_batch_size": 8, "gradient_accumulation_steps": 1, "lr": 1e-6, "beta": 0.1, "seed": 0,
         "save_steps": 0, "epochs": 1, "max_length": None, "num_workers": 0}
    p.update(kw)
    return p


class Peak:
    """Device memory peaks (torch's reserved and allocated) over a stretch, and NVML's view of the
    process (what torch does not count: the context, NCCL), on CUDA; the resident set on CPU."""

    def __enter__(self):
        import gc

        import torch

        gc.collect()
        self.at_start = 0
        if cuda():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.at_start = torch.cuda.memory_allocated()  # what an earlier run left (should be ~0)
        return self

    def __exit__(self, *exc):
        import torch

        if cuda():
            torch.cuda.synchronize()
            self.reserved = torch.cuda.max_memory_reserved()
            self.allocated = torch.cuda.max_memory_allocated()
        else:
            import resource

            self.reserved = self.allocated = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return False


def nvml_used() -> int | None:
    """Bytes NVML sees this process hold on GPU 0 (None where it cannot say)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if proc.pid == os.getpid():
                return int(proc.usedGpuMemory or 0)
    except Exception:  # noqa: BLE001 - NVML missing or not attributing (containers)
        return None
    return None


def fresh_job_env() -> None:
    """What a job's own worker process starts without: the FSDP_* variables transformers' arguments
    export for accelerate's plugin (several jobs run in this one process)."""
    for k in [k for k in os.environ if k.startswith(("FSDP_", "ACCELERATE_USE_FSDP"))]:
        del os.environ[k]


def run_dpo(tmp: Path, name: str, p: dict, deps: dict, keep_sync: bool = True) -> dict:
    """The DPO job function on ``p``, its policy not saved; the run's peaks and logged rows.
    ``keep_sync=False``: the trainer's default accumulation (no_sync under FSDP2), what the runtime
    replaced."""
    from pita.algos import dpo
    from pita.core.paths import JobPaths

    seen: dict = {}
    real_args, real_tail = dpo.training_args, dpo.train_and_save

    def args(*a, **kw):
        out = real_args(*a, **kw)
        if not keep_sync:
            out.accelerator_config.gradient_accumulation_kwargs = None
        return out

    def tail(ctx, trainer, tok, p, key):
        out = trainer.train()
        seen["rows"] = [h for h in trainer.state.log_history if "loss" in h]
        seen["steps"] = out.global_step
        seen["accumulation"] = trainer.args.gradient_accumulation_steps
        seen["sync_each_batch"] = bool(trainer.accelerator.gradient_state.plugin_kwargs.get("sync_each_batch"))
        seen["nvml"] = nvml_used()
        trainer.accelerator.free_memory()
        return {"steps": out.global_step}, seen["rows"]

    dpo.training_args, dpo.train_and_save = args, tail
    ctx = SimpleNamespace(params=p, dep_result=deps.__getitem__, paths=JobPaths(tmp / name),
                          log=logging.getLogger(f"gpu.{name}"))
    ctx.paths.dir.mkdir(parents=True, exist_ok=True)
    fresh_job_env()
    try:
        with Peak() as peak:
            dpo.dpo_train(ctx)
    finally:
        dpo.training_args, dpo.train_and_save = real_args, real_tail
    return {**seen, "reserved_gb": round(peak.reserved / 1e9, 3), "allocated_gb": round(peak.allocated / 1e9, 3),
            "allocated_before_gb": round(peak.at_start / 1e9, 3)}


def check_fsdp_accumulation(tmp: Path) -> dict:
    """Peaks of one sharded DPO job at accumulation 1 and 2, and at 2 without the runtime's fix."""
    from pita.models.shapes import model_shape

    one_rank_group()
    model = random_llama(tmp)
    n = model_shape(model, "model.reference").n_params
    micro = 8 if cuda() else 2
    data = pairs(tmp, 4 * micro)
    deps = {"pairs": {"path": data}}
    spec_for_fake = dpo_params(model, "pairs", batch_size=2 * micro, micro_batch_size=micro)
    fake = _start_fake_measurement(tmp, spec_for_fake) if cuda() else None
    out = {"params": n, "micro_batch": micro}
    out["acc1"] = run_dpo(tmp, "acc1", dpo_params(model, "pairs", batch_size=micro, micro_batch_size=micro), deps)
    out["acc2"] = run_dpo(tmp, "acc2", spec_for_fake, deps)
    out["acc2_no_sync"] = run_dpo(tmp, "acc2ns", spec_for_fake, deps, keep_sync=False)
    for key in ("acc1", "acc2", "acc2_no_sync"):
        out[key].pop("rows", None)
    out["acc2_minus_acc1_bytes_per_param"] = round((out["acc2"]["reserved_gb"] - out["acc1"]["reserved_gb"]) * 1e9 / n, 2)
    out["no_sync_minus_sync_bytes_per_param"] = round(
        (out["acc2_no_sync"]["reserved_gb"] - out["acc2"]["reserved_gb"]) * 1e9 / n, 2)
    if fake is not None:
        out["fake_tensors"] = _finish_fake_measurement(fake)
        if "peak_bytes" in out["fake_tensors"]:
            out["fake_over_cuda_allocated"] = round(out["fake_tensors"]["peak_bytes"] / 1e9 /
                                                    out["acc2"]["allocated_gb"], 3)
    assert out["acc2"]["sync_each_batch"] and out["acc2"]["accumulation"] == 2, out
    return out


def _start_fake_measurement(tmp: Path, p: dict):
    """bench.trainer_memory on the same job, in a process of its own on the CPU, started now."""
    import subprocess
    import sys

    from bench.trainer_memory import ROOT

    job = {"id": "DPO.gpu.acc2.r0.train", "kind": "algo.dpo_train", "params": {**p, "data": "pairs"}, "deps": []}
    spec = {"job": job, "paths": {"reference": p["reference"], "guidance": p["reference"], "reward_models": {}},
            "steps": 2, "prompt_tokens": PROMPT_WORDS + 5, "max_new_tokens": COMPLETION_WORDS + 1}
    f = tmp / "fake_spec.json"
    f.write_text(json.dumps(spec))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return subprocess.Popen([sys.executable, "-m", "bench.trainer_memory", str(f)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)


def _finish_fake_measurement(proc) -> dict:
    try:
        out, err = proc.communicate(timeout=420)
    except Exception:  # noqa: BLE001 - a slow machine: say so, the CUDA figures stand
        proc.kill()
        return {"error": "timed out"}
    rows = [line for line in out.splitlines() if line.startswith("{")]
    if not rows:
        return {"error": "\n".join(err.strip().splitlines()[-3:])}
    row = json.loads(rows[-1])
    return {k: row[k] for k in ("peak_bytes", "accumulation", "sync_each_batch", "step_peaks_gb")}


def check_logprob_dtype(tmp: Path) -> dict:
    """TRL's summed log-probabilities of one DPO job, sharded and unsharded: the per-token values
    reach the sum in fp32 in both (FSDP's output cast is fp32), so the sums are not bf16 numbers."""
    import torch

    one_rank_group()
    model = random_llama(tmp)
    micro = 8 if cuda() else 2
    data = pairs(tmp, 2 * micro)
    deps = {"pairs": {"path": data}}
    dtypes: dict = {}
    import trl.trainer.utils as tu

    real = tu._ChunkedLogProbFunction.apply

    def traced(*a, **kw):
        out = real(*a, **kw)
        dtypes.setdefault("kernel", str(out[0].dtype))
        return out

    tu._ChunkedLogProbFunction.apply = traced
    try:
        rows = {}
        for sharding in ("fsdp", "none"):
            r = run_dpo(tmp, f"lp_{sharding}", dpo_params(model, "pairs", batch_size=2 * micro, micro_batch_size=micro,
                                                           sharding=sharding, lr=1e-5), deps)
            rows[sharding] = [{k: h.get(k) for k in ("loss", "logps/chosen", "logps/rejected", "rewards/margins")}
                              for h in r["rows"]]
    finally:
        tu._ChunkedLogProbFunction.apply = real

    def bf16_number(x) -> bool:
        return x is not None and float(torch.tensor(x, dtype=torch.bfloat16)) == x

    sums = [h["logps/chosen"] for h in rows["fsdp"]] + [h["logps/rejected"] for h in rows["fsdp"]]
    out = {"kernel_dtype": dtypes.get("kernel"), "sharded": rows["fsdp"], "unsharded": rows["none"],
           "sharded_sums_that_are_bf16_numbers": sum(bf16_number(x) for x in sums), "of": len(sums)}
    assert out["sharded_sums_that_are_bf16_numbers"] < len(sums), out
    return out


def check_grpo_sampling(tmp: Path) -> dict:
    """A GRPO job's peak while it samples and in all, against the plan's reservation for it."""
    import torch
    from transformers.generation.utils import GenerationMixin

    from pita.algos import grpo
    from pita.cli.plan import compose
    from pita.core.memory import CUDA_CONTEXT_BYTES, generate_calls
    from pita.core.paths import JobPaths
    from pita.plans import build_plan

    model = random_llama(tmp)
    new = 256 if cuda() else 16
    micro = 8 if cuda() else 2
    cache = os.environ.get("PITA_TEST_CACHE") or str(tmp / "cache")
    cfg = compose(["experiment.workload=experiment", "experiment.algos=[GRPO]", "experiment.datasets=[arith]",
                   f"system.cache_dir={cache}", f"model.reference={model}", f"model.guidance={model}",
                   "model.dtype=bfloat16", "algos.GRPO.batch_size=32", "algos.GRPO.num_generations=8",
                   "algos.GRPO.max_steps=1", f"data_collection.max_new_tokens={new}",
                   f"training.micro_batch_size={micro}", "training.save_steps=0", "training.gradient_checkpointing=false"])
    total = torch.cuda.get_device_properties(0).total_memory if cuda() else int(64e9)
    job = next(j for j in build_plan(cfg, [total], cuda=cuda()) if j.kind == "algo.grpo_train")
    calls: list = []
    real = GenerationMixin.generate

    def generate(self, *a, **kw):
        t0 = time.perf_counter()
        with Peak() as peak:
            out = real(self, *a, **kw)
        if cuda():
            torch.cuda.synchronize()
        rows = (kw.get("input_ids") if kw.get("input_ids") is not None else a[0]).shape[0]
        calls.append({"rows": int(rows), "new_tokens": int(out.shape[1] - (kw.get("input_ids") if kw.get(
            "input_ids") is not None else a[0]).shape[1]), "reserved_gb": round(peak.reserved / 1e9, 3),
            "seconds": time.perf_counter() - t0})
        return out

    GenerationMixin.generate = generate
    ctx = SimpleNamespace(params=dict(job.params), dep_result=lambda j: None, paths=JobPaths(tmp / "grpo"),
                          log=logging.getLogger("gpu.grpo"))
    ctx.paths.dir.mkdir(parents=True, exist_ok=True)
    fresh_job_env()
    try:
        with Peak() as whole:
            res = grpo.grpo_train(ctx)
    finally:
        GenerationMixin.generate = real
    peak = whole.reserved + (CUDA_CONTEXT_BYTES if cuda() else 0)
    p = job.params
    per_device = max(1, int(p["batch_size"]) // max(1, int(p.get("devices", 1))))
    planned_calls = res["steps"] * generate_calls(per_device, int(p["rows_per_generate"]))
    # the plan's seconds for the sampling alone: the job's own decode, priced as the plan prices it
    from pita.models.shapes import model_shape
    from pita.plans.durations import Durations

    from pita.plans.durations import prompt_tokens

    shape = model_shape(model, "model.reference")
    d = Durations([job], lambda part: shape, "bfloat16", 64, card=None)
    planned_sampling = res["steps"] * d.grpo_step_sampling(p, shape, int(p.get("devices", 1)),
                                                           prompt_tokens(p.get("dataset"), 64), new)
    out = {"micro_batch": micro, "accumulation": p.get("gradient_accumulation_steps"), "steps": res["steps"],
           "rows_per_generate": p["rows_per_generate"], "generate_calls": len(calls), "planned_calls": planned_calls,
           "rows_per_call": sorted({c["rows"] for c in calls}),
           "new_tokens": max(c["new_tokens"] for c in calls) if calls else None,
           "sampling_s": round(sum(c["seconds"] for c in calls), 2),
           "planned_sampling_s": round(planned_sampling, 2), "planned_job_s": round(job.duration_hint, 1),
           "sampling_peak_gb": max(c["reserved_gb"] for c in calls) if calls else None,
           "peak_gb": round(peak / 1e9, 3), "reserved_gb": round(job.resources.memory_gb, 3),
           "ratio": round(job.resources.memory_gb * 1e9 / peak, 3)}
    # GRPO samples in the calls the plan priced (pita.core.memory.generate_rows), never more rows a call
    assert calls and len(calls) == planned_calls and max(c["rows"] for c in calls) <= p["rows_per_generate"], out
    assert not cuda() or 1.0 <= out["ratio"] <= 1.5, out
    return out


def check_checkpoint_host(tmp: Path) -> dict:
    """Host RSS of a sharded DPO job while it writes a mid-training checkpoint, and while a re-run
    attempt resumes from it (sampled every 20 ms), in bytes per parameter over the RSS when its
    training began."""
    import psutil

    from pita.algos import dpo
    from pita.core.paths import JobPaths
    from pita.models.shapes import model_shape

    one_rank_group()
    model = random_llama(tmp)
    n = model_shape(model, "model.reference").n_params
    micro = 8 if cuda() else 2
    data = pairs(tmp, 2 * micro)
    p = dpo_params(model, "pairs", batch_size=micro, micro_batch_size=micro, save_steps=1)
    me = psutil.Process()
    marks: dict = {}

    class Sampler(threading.Thread):
        def __init__(self):
            super().__init__(daemon=True)
            self.stop, self.top = threading.Event(), 0

        def run(self):
            while not self.stop.is_set():
                self.top = max(self.top, me.memory_info().rss)
                time.sleep(0.02)

    from transformers import Trainer

    real_save, real_load = Trainer._save_checkpoint, Trainer._load_from_checkpoint

    def timed(real, key):
        def inner(self, *a, **kw):
            s = Sampler()
            before = me.memory_info().rss
            s.start()
            try:
                return real(self, *a, **kw)
            finally:
                s.stop.set()
                s.join()
                marks.setdefault(key, []).append({"rss_before_gb": round(before / 1e9, 2),
                                                  "rss_top_gb": round(max(s.top, before) / 1e9, 2)})
        return inner

    class Crash(Exception):
        pass

    def crash_after_first_save(self, *a, **kw):
        out = timed(real_save, "save")(self, *a, **kw)
        if marks.get("crash"):
            raise Crash
        return out

    Trainer._save_checkpoint = crash_after_first_save
    Trainer._load_from_checkpoint = timed(real_load, "load")
    ctx = SimpleNamespace(params=p, dep_result={"pairs": {"path": data}}.__getitem__, paths=JobPaths(tmp / "ckpt"),
                          log=logging.getLogger("gpu.ckpt"))
    ctx.paths.dir.mkdir(parents=True, exist_ok=True)
    try:
        marks["crash"] = True  # attempt 1 dies after writing its first checkpoint
        fresh_job_env()
        try:
            dpo.dpo_train(ctx)
        except Crash:
            pass
        marks["crash"] = False
        fresh_job_env()
        res = dpo.dpo_train(ctx)  # attempt 2 resumes from it
    finally:
        Trainer._save_checkpoint, Trainer._load_from_checkpoint = real_save, real_load
    per = {k: [round((m["rss_top_gb"] - m["rss_before_gb"]) * 1e9 / n, 2) for m in marks.get(k, [])]
           for k in ("save", "load")}
    out = {"params": n, "resumed_from_step": res.get("resumed_from_step"), "save": marks.get("save"),
           "load": marks.get("load"), "host_bytes_per_param_above_start": per}
    assert res.get("resumed_from_step") == 1 and marks.get("load"), out
    return out


CHECKS = {"fsdp_accumulation": check_fsdp_accumulation, "logprob_dtype": check_logprob_dtype,
          "grpo_sampling": check_grpo_sampling, "checkpoint_host": check_checkpoint_host}


def main(argv=None) -> int:
    import argparse
    import tempfile
    import traceback

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--cpu", action="store_true", help="on this CPU: the script's own test (gloo, a small model)")
    a = ap.parse_args(argv)
    if a.cpu:
        from bench.cuda_branch import drive_cuda_branch

        drive_cuda_branch()
    names = [x for x in (a.only.split(",") if a.only else CHECKS) if x]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="pita-gpu-training-") as tmp:
        for name in names:
            t = time.time()
            try:
                res, status = CHECKS[name](Path(tmp)), "PASS"
            except Exception as e:  # noqa: BLE001 - every check reports
                res, status = {"error": f"{type(e).__name__}: {e}"[:800]}, "FAIL"
                traceback.print_exc()
                failed += 1
            print(f"{status} {name} {time.time() - t:.1f}s {json.dumps(res)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
