"""Synthetic job kinds: the demo's stand-in work and the failure cases the tests exercise.

    synthetic.work   sleep params.seconds, write an artifact; params.fail=True raises instead;
                     params.peak_gb: the peak it declares (ctx.report_peak), what memory learning sees
    synthetic.merge  combine the results of its dependencies (deterministic order)
    synthetic.raise  raise an exception
    synthetic.exit   os._exit(params.code) without reporting (a worker that dies)
    synthetic.kill   SIGKILL itself (a worker killed from outside, or by the kernel's OOM killer);
                     with params.kill_attempts only on that many first attempts, then it
                     completes, reporting params.peak_gb as synthetic.work does
    synthetic.oom    raise a CUDA-style out-of-memory error while params.batch_size (or the param
                     params.size_param names) > params.fits, and
                     on the first params.oom_attempts attempts whatever the batch (a device that
                     filled up); params.peak_gb as for synthetic.work
    synthetic.hang   sleep for ever (timeouts, Ctrl-C)
    synthetic.stubborn  ignore SIGTERM and hang; params.stop=True stops itself (SIGSTOP) instead
    synthetic.spawn  start a child in a session of its own (setsid), write its pid, then
                     params.then: "return" | "hang" | "die" (SIGKILL itself after 1.5 s)
    synthetic.children  start params.children Python processes that each sleep params.seconds
                     (their pids in artifacts/children.pid), wait for them, and fail unless every
                     one exited 0 (a child that a signal ended says so)
    synthetic.env    report CUDA_VISIBLE_DEVICES and what torch sees (test_parallel_setup.py)
    synthetic.share  sum a slice of numbers (a small parallel work distribution)
    synthetic.alloc  hold batch_size * gb_per_item GB of GPU memory (real CUDA OOM when too big)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import signal
import time

from pita.core.errors import JobError
from pita.core.job import job_kind


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


@job_kind("synthetic.work")
def work(ctx):
    p = ctx.params
    ctx.log.info("working for %.2fs (stage %s)", p.get("seconds", 0.0), p.get("stage", "-"))
    time.sleep(float(p.get("seconds", 0.0)))
    if p.get("peak_gb") is not None:
        ctx.report_peak(float(p["peak_gb"]) * 1e9)
    if p.get("fail"):
        raise JobError(f"{ctx.job.id} was configured to fail (synthetic.fail)")
    deps = {}
    for d in sorted(ctx.job.deps):
        r = ctx.dep_result(d)
        if r.get("output"):  # read the dependency's artifact through the path its result gives
            with open(r["output"]) as f:
                if f.read().strip() != r.get("digest"):
                    raise JobError(f"{r['output']} does not hold {d}'s digest")
        deps[d] = r.get("digest")
    digest = _digest({"id": ctx.job.id, "params": {k: v for k, v in p.items() if k != "batch_size"}, "deps": deps})
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    out = ctx.paths.artifacts / "output.txt"
    out.write_text(digest + "\n")
    return {"digest": digest, "stage": p.get("stage"), "output": str(out),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


@job_kind("synthetic.merge")
def merge(ctx):
    time.sleep(float(ctx.params.get("seconds", 0.0)))
    parts = {d: ctx.dep_result(d).get("digest") for d in sorted(ctx.job.deps)}
    return {"digest": _digest({"id": ctx.job.id, "parts": parts}), "parts": len(parts)}


@job_kind("synthetic.raise")
def fail(ctx):
    raise ValueError(ctx.params.get("message", "synthetic failure"))


@job_kind("synthetic.exit")
def hard_exit(ctx):
    print("exiting without a report", flush=True)
    os._exit(int(ctx.params.get("code", 7)))


@job_kind("synthetic.kill")
def kill_self(ctx):
    limit = ctx.params.get("kill_attempts")
    if limit is not None and ctx.attempt > int(limit):
        if ctx.params.get("peak_gb") is not None:
            ctx.report_peak(float(ctx.params["peak_gb"]) * 1e9)
        return {"attempt": ctx.attempt}
    print("killing myself with SIGKILL", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


@job_kind("synthetic.oom")
def oom(ctx):
    size = ctx.params.get("size_param", "batch_size")  # micro_batch_size: a training job's retry
    bs, fits = int(ctx.params[size]), int(ctx.params.get("fits", 1))
    if ctx.params.get("peak_gb") is not None:
        ctx.report_peak(float(ctx.params["peak_gb"]) * 1e9)
    if bs > fits or ctx.attempt <= int(ctx.params.get("oom_attempts", 0)):
        raise RuntimeError(f"CUDA out of memory. Tried to allocate {bs * 2} GiB ({size}={bs})")
    return {size: bs}


@job_kind("synthetic.hang")
def hang(ctx):
    print("hanging", flush=True)
    while True:
        time.sleep(1)


@job_kind("synthetic.stubborn")
def stubborn(ctx):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"ignoring SIGTERM (pid {os.getpid()})", flush=True)
    if ctx.params.get("stop"):
        os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        time.sleep(1)


@job_kind("synthetic.children")
def children(ctx):
    import subprocess

    seconds = float(ctx.params.get("seconds", 1.0))
    procs = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
             for _ in range(int(ctx.params.get("children", 2)))]
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    (ctx.paths.artifacts / "children.pid").write_text(" ".join(str(c.pid) for c in procs))
    codes = [c.wait() for c in procs]
    if any(codes):
        raise JobError(f"children ended with {codes} (negative: the signal that ended them)")
    return {"children": len(procs), "codes": codes}


@job_kind("synthetic.spawn")
def spawn(ctx):
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    (ctx.paths.artifacts / "child.pid").write_text(str(child.pid))
    print(f"started {child.pid} in its own session", flush=True)
    then = ctx.params.get("then", "return")
    if then == "hang":
        while True:
            time.sleep(1)
    if then == "die":
        time.sleep(1.5)  # the orchestrator records the tree about once a second
        os.kill(os.getpid(), signal.SIGKILL)
    return {"child": child.pid}


@job_kind("synthetic.env")
def report_env(ctx):
    import torch

    from pita.core import worker

    out = {"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "device_count": torch.cuda.device_count(), "devices": ctx.devices,
           "start": worker.START,  # exec (a fresh interpreter) | forked (from the fork server)
           "threads": torch.get_num_threads(), "cwd": os.getcwd(), "PITA_TEST_VAR": os.environ.get("PITA_TEST_VAR"),
           "blocked_signals": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))}
    out["LOCAL_RANK"] = os.environ.get("LOCAL_RANK")
    if torch.cuda.is_available():
        from pita.core.devinfo import cuda_uuid, set_local_device

        out["names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["device"] = set_local_device()
        x = torch.ones(64, 1024, 1024, device=out["device"])  # 256 MiB
        torch.cuda.synchronize()
        out["allocated_bytes"] = int(torch.cuda.memory_allocated())
        out["current_device"] = torch.cuda.current_device()
        out["uuid"] = cuda_uuid()
        out["nvml_sees_bytes"] = _nvml_usage_of_this_process(out["uuid"])
        del x
    return out


def _nvml_usage_of_this_process(uuid: str | None) -> int | None:
    """Bytes NVML attributes to this process on the device ``uuid``; None where NVML does not say
    (no NVML, or a container whose pids NVML reports as the host's)."""
    try:
        import pynvml as nv

        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByUUID(uuid.encode() if uuid else b"")
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    except Exception:  # noqa: BLE001 - a check's figure: None says "not known"
        return None
    mine = [int(p.usedGpuMemory or 0) for p in procs if int(p.pid) == os.getpid()]
    return mine[0] if mine else None


@job_kind("synthetic.imports")
def import_stack(ctx):
    """What a real job imports before its first tensor (bench.dispatch --starts): free when forked
    from the fork server that imported it, seconds in a fresh interpreter."""
    from pita.core.preload import preload

    return {"missing": preload()}


@job_kind("synthetic.share")
def share(ctx):
    lo, hi = int(ctx.params["start"]), int(ctx.params["stop"])
    return {"start": lo, "stop": hi, "sum": sum(range(lo, hi)), "pid": os.getpid()}


@job_kind("synthetic.alloc")
def alloc(ctx):
    """Hold params.batch_size * params.gb_per_item GB on the job's GPU for params.seconds.

    Too large a batch raises torch's real CUDA out-of-memory error (the GPU test tier uses it).
    """
    import torch

    if not torch.cuda.is_available():
        raise JobError("synthetic.alloc needs a CUDA device")
    n = int(ctx.params["batch_size"] * ctx.params.get("gb_per_item", 1.0) * 1e9 / 4)
    x = torch.empty(n, dtype=torch.float32, device="cuda")
    x.fill_(1.0)
    time.sleep(float(ctx.params.get("seconds", 0.5)))
    return {"allocated_bytes": int(torch.cuda.max_memory_allocated()), "batch_size": ctx.params["batch_size"],
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}

