"""The GPU check: what only a GPU can confirm, in under 10 minutes on one H100, offline.

    make gpu-check                      # on the GPU machine, from the repository's root
    python -m bench.gpu_check --json    # the same, and a JSON summary on the last line

Prints one line per check, PASS / FAIL / SKIP with what was measured, and exits 1 when any check
fails. Needs no network: the models are built from configs with random weights, the tiny family
comes from ``PITA_TEST_CACHE`` when set (else it is built, about two minutes). The packages the
GPU machine lacks (hydra-core, omegaconf, trl, datasets, math-verify ...) are installed by
``make gpu-check`` from ``.whl/`` when that folder exists (``make gpu-wheels`` fills it here).

    setup          python test_parallel_setup.py: CUDA devices found, one worker per GPU, each
                   seeing only its own device
    isolation      two jobs on two devices (or one, where there is one) each see one GPU
    memory         pita.core.memory.training_bytes for a random-weight 1B Llama (fp32 master
                   weights, fused AdamW, bf16 autocast, 4 x 512 tokens) against torch's measured peak
                   plus the CUDA context: within [1.0, 1.5]
    oom_retry      a job that allocates more than the device raises CUDA's own OOM, is retried at
                   half its batch and finishes
    reference      TRL's frozen reference built with the training job's kwargs lands whole on one
                   device (no accelerate dispatch hooks, no split over GPUs)
    fsdp_1gpu      FSDP2 over one GPU (a process group of one): a sharded DPO step of the tiny
                   family runs, gathers and saves a whole policy

    The training runtime's (bench/gpu_training.py; each through the job's own function, a
    random-weight 1B Llama, one NCCL rank where sharded):
    fsdp_accumulation  a sharded DPO job's peak at accumulation 1 and 2, and at 2 under the
                   trainer's default no_sync; the same job on fake tensors beside it
    logprob_dtype  the log-probabilities TRL sums are fp32, sharded and unsharded
    grpo_sampling  GRPO samples in the generate calls its plan priced (rows per call from the sampling
                   phase's memory), their seconds beside the plan's; its peak within 1.0-1.5x the plan's
    checkpoint_host  host RSS while a sharded job writes a checkpoint and a re-run resumes from it
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def check_setup() -> str:
    r = subprocess.run([sys.executable, str(ROOT / "test_parallel_setup.py")], capture_output=True, text=True,
                       timeout=240, cwd=ROOT)
    if r.returncode != 0:
        raise AssertionError(f"exit {r.returncode}: {(r.stdout + r.stderr)[-600:]}")
    return (r.stdout.strip().splitlines() or ["ok"])[-1][:160]


def check_isolation(tmp: Path) -> str:
    import torch

    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.job import Job, Resources
    from pita.core.paths import RunPaths

    gpus = GPUManager.detect("auto")
    n = min(2, torch.cuda.device_count())
    jobs = [Job(f"e{i}", "synthetic.env", resources=Resources(1, 1.0)) for i in range(n)]
    run = RunPaths.create(tmp, "isolation")
    s = ExecutorSettings(progress="off", poll_interval_s=0.05, max_jobs_per_device=1)
    summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus, make_backend("local"),
                       run, s).run()
    assert summary.exit_code == 0, summary.failures
    seen = [run.job(j.id).read_result() for j in jobs]
    counts = [r.get("device_count") for r in seen]
    state = json.loads(run.state.read_text())["jobs"]
    assert all(c == 1 for c in counts), seen
    assert all(s.get("uuid") == state[j.id]["devices"][0]["uuid"] for s, j in zip(seen, jobs)), (seen, state)
    return f"{n} job(s), each saw {counts} device(s), the one NVML assigned"


# a 1B Llama trained as the memory check trains it: fp32 master weights, AdamW, bf16 autocast
LLAMA_1B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16,
                num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024)
MEMORY_BATCH, MEMORY_SEQ = 4, 512


def memory_estimate(cfg, n_params: int) -> int:
    """What ``pita.core.memory.training_bytes`` plans for the memory check's training step."""
    from pita.core.memory import ModelShape, training_bytes

    shape = ModelShape.from_hf_config(cfg, n_params=int(n_params))
    return int(training_bytes(shape, "float32", MEMORY_BATCH, MEMORY_SEQ, act_dtype="bfloat16", cuda=True))


def check_memory() -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pita.core.memory import CUDA_CONTEXT_BYTES
    from pita.guidance.train import optimizer_kwargs

    cfg = LlamaConfig(**LLAMA_1B)
    torch.cuda.reset_peak_memory_stats()
    model = LlamaForCausalLM(cfg).cuda().train()
    n = sum(p.numel() for p in model.parameters())
    # the optimizer the training jobs use on CUDA: fused AdamW (TRL's default, and
    # pita.guidance.train's); torch's own default there (foreach) peaks 4 bytes per parameter higher
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **optimizer_kwargs("cuda"))
    for _ in range(2):  # the second step runs beside AdamW's state
        ids = torch.randint(0, cfg.vocab_size, (MEMORY_BATCH, MEMORY_SEQ), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_reserved() + CUDA_CONTEXT_BYTES
    est = memory_estimate(cfg, n)
    ratio = est / peak
    del model, opt
    torch.cuda.empty_cache()
    assert 1.0 <= ratio <= 1.5, f"estimate {est / 1e9:.2f} GB vs peak {peak / 1e9:.2f} GB: ratio {ratio:.2f}"
    return f"{n / 1e9:.2f}B params: estimate {est / 1e9:.2f} GB, peak {peak / 1e9:.2f} GB, ratio {ratio:.2f}"


def check_oom_retry(tmp: Path) -> str:
    import torch

    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.job import Job, Resources, RetryPolicy
    from pita.core.paths import RunPaths

    gpus = GPUManager.detect("auto").restrict([0])
    total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    per_item = total_gb / 3  # 4 items do not fit, 2 do
    jobs = [Job("big", "synthetic.alloc", params={"batch_size": 4, "gb_per_item": per_item, "seconds": 0.5},
                resources=Resources(1, 1.0), retry=RetryPolicy(batch_param="batch_size"))]
    run = RunPaths.create(tmp, "oom")
    s = ExecutorSettings(progress="off", poll_interval_s=0.05, oom_retries=3, learn_memory=False)
    summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus, make_backend("local"),
                       run, s).run()
    state = json.loads(run.state.read_text())["jobs"]["big"]
    statuses = [a["status"] for a in state["attempts"]]
    assert summary.exit_code == 0 and statuses[0] == "oom", statuses
    return f"attempts {statuses} (batch 4 -> {state.get('params', {}).get('batch_size', '2 or 1')})"


def _tiny_family(tmp: Path) -> dict:
    from pita.models.tiny import build_tiny_family

    cache = os.environ.get("PITA_TEST_CACHE") or str(tmp / "cache")
    return {**build_tiny_family(cache, 0), "cache": cache}


def check_reference(tmp: Path) -> str:
    import torch
    from trl.trainer.utils import create_model_from_path

    from pita.training.arguments import reference_init_kwargs

    fam = _tiny_family(tmp)
    kw = reference_init_kwargs({"dtype": "bfloat16"}, cuda=True)
    ref = create_model_from_path(fam["reference"], **kw)
    devices = {str(p.device) for p in ref.parameters()}
    assert not getattr(ref, "hf_device_map", None), f"dispatched by accelerate: {ref.hf_device_map}"
    assert devices == {"cpu"} and ref.dtype == torch.bfloat16, (devices, ref.dtype)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    ref.to(device)
    with torch.no_grad():
        out = ref(torch.tensor([[5, 6, 7]], device=device)).logits
    assert out.device.type == device.split(":")[0]
    return f"kwargs {kw}: loaded whole on the CPU in {ref.dtype}, one forward on {device}"


def check_fsdp_1gpu(tmp: Path) -> str:
    """A sharded DPO job's code on a process group of one (torchrun, one rank)."""
    import logging
    from types import SimpleNamespace

    from datasets import Dataset

    from pita.core.paths import JobPaths
    from pita.core.ranks import run_ranks

    fam = _tiny_family(tmp)
    rows = [{"id": f"p{i}", "prompt": f"What is {i} + {i}?", "chosen": f"The answer is {2 * i}.",
             "rejected": f"It is {2 * i + 1}.", "chosen_reward": 1.0, "rejected_reward": 0.0, "p_chosen": 0.7}
            for i in range(16)]
    Dataset.from_list(rows).save_to_disk(str(tmp / "pairs"))
    # the round-0 DPO job as a plan writes it (sharded over 2), then given one device
    from pita.cli.plan import compose
    from pita.plans import build_plan

    cache = fam["cache"]
    cfg = compose(["experiment.workload=experiment", "experiment.algos=[DPO]", "experiment.datasets=[arith]",
                   f"system.cache_dir={cache}", "algos.DPO.batch_size=8", "algos.DPO.epochs=1",
                   "training.micro_batch_size=4", "algos.DPO.devices=2", "algos.DPO.sharding=fsdp",
                   "model.dtype=bfloat16", "training.save_steps=0"])
    job_ = next(j for j in build_plan(cfg, [int(80e9)] * 2, cuda=True) if j.kind == "algo.dpo_train")
    p = {**job_.params, "devices": 1, "data": "pairs"}
    job = tmp / "fsdp"
    job.mkdir()
    ctx = SimpleNamespace(params=p, paths=JobPaths(job), log=logging.getLogger("gpu_check"),
                          dep_result=lambda j: {"path": str(tmp / "pairs")})
    res = run_ranks(ctx, "algo.dpo_train", 1, deps={"pairs": {"path": str(tmp / "pairs")}}, how="sharded")
    assert res["steps"] >= 1 and Path(res["checkpoint"]).is_dir(), res
    units = res.get("policy_units")
    how = (f"sharded: FSDP units policy {units}, reference {res.get('reference_units')}" if units else
           "accelerate trained the group of one unsharded")
    return f"{res['steps']} steps, {how}; the policy saved whole"


def _training(name: str):
    def check(tmp: Path) -> str:
        from bench import gpu_training

        return json.dumps(gpu_training.CHECKS[name](tmp))

    check.__name__ = f"check_{name}"
    return check


CHECKS = {"setup": check_setup, "isolation": check_isolation, "memory": check_memory, "oom_retry": check_oom_retry,
          "reference": check_reference, "fsdp_1gpu": check_fsdp_1gpu,
          **{name: _training(name) for name in ("fsdp_accumulation", "logprob_dtype", "grpo_sampling", "checkpoint_host")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="run the checks that can run without CUDA here too "
                    "(reference, fsdp_1gpu): the script's own test")
    a = ap.parse_args(argv)
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    results = []
    names = [n for n in (a.only.split(",") if a.only else CHECKS) if n]
    with tempfile.TemporaryDirectory(prefix="pita-gpu-check-") as tmp:
        for name in names:
            t = time.time()
            if not cuda and not (a.cpu and name in ("reference", "fsdp_1gpu")):
                status, detail = "SKIP", "no CUDA device on this machine"
            else:
                try:
                    where = Path(tmp) / name
                    where.mkdir()
                    fn = CHECKS[name]
                    detail = fn() if fn.__code__.co_argcount == 0 else fn(where)
                    status = "PASS"
                except Exception as e:  # noqa: BLE001 - every check reports, none stops the others
                    status, detail = "FAIL", f"{type(e).__name__}: {e}"[:1500]
                    traceback.print_exc(file=sys.stderr)
            results.append({"check": name, "status": status, "detail": detail, "seconds": round(time.time() - t, 1)})
            print(f"{status:4s} {name:10s} {results[-1]['seconds']:6.1f}s  {detail}", flush=True)
    if a.json:
        print(json.dumps({"results": results}))
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
