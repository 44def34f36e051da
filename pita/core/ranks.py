"""One job, k processes: a job kind's function run on k ranks of one node (torchrun).

    result = run_ranks(ctx, "algo.dpo_train", k, deps={...})   # in the job's worker

The worker writes the job's spec (kind, params, its dependencies' results, what the ranks'
context carries) to ``distributed.json`` and starts ``torch.distributed.run --nproc_per_node k
-m pita.core.ranks distributed.json``; each process runs the same job function with RANK,
WORLD_SIZE and LOCAL_RANK set, and finds its peers through them (TRL / accelerate for training
jobs, ``torch.distributed.init_process_group`` for others). Rank 0 writes the result; the
worker streams every rank's output into the job log and returns rank 0's result. The ranks
meet through torchrun's standalone rendezvous, whose store binds port 0 and keeps the socket:
no port is chosen and released for someone else to take. A rank that runs out of device memory
leaves a marker, and the job fails as an out-of-memory (retried at half the micro-batch), not as
a plain error.

On CPU devices the job's thread budget (``OMP_NUM_THREADS``) is shared out between its ranks.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from pita.core.errors import DeviceOutOfMemory, JobError

SPEC, RESULT = "distributed.json", "distributed-result.json"
OOM_MARKER = "distributed-oom.rank{}.json"  # written by a rank that ran out of device memory
PEAK_FILE = "distributed-peak.rank{}.json"  # each rank's device-memory peak (CUDA ranks)
REQUEUE_MARKER = "distributed-requeue.rank{}.json"  # written by a rank that saved on a signal and stopped


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_rank0() -> bool:
    return rank() == 0


def launch_command(k: int, spec_file: Path) -> list[str]:
    """torchrun for k ranks on this node. ``--standalone``: the rendezvous store listens on a port
    the kernel gives it and holds it for the job's life, so jobs starting together never race for
    a port (a port found free and released could be taken before the ranks bind it).
    ``--local-addr 127.0.0.1``: the store and the process group meet on the loopback address
    (the ranks are all on this node); torchrun otherwise advertises this host's FQDN, which need
    not resolve (containers, cluster nodes)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr", "127.0.0.1",
            f"--nproc_per_node={k}", "-m", "pita.core.ranks", str(spec_file)]


def run_ranks(ctx, kind: str, k: int, deps: dict | None = None, extras: dict | None = None,
              how: str = "data-parallel") -> dict:
    """Run job kind ``kind`` on ``k`` ranks and return rank 0's result. ``deps``: the dependency
    results the ranks may read (``ctx.dep_result``); ``extras``: plain data set as attributes of
    each rank's context."""
    from pita.core.job import kind_target

    spec = {"kind": kind, "target": kind_target(kind), "params": ctx.params, "deps": deps or {},
            "dir": str(ctx.paths.dir), "extras": extras or {}}
    spec_file = ctx.paths.dir / SPEC
    spec_file.write_text(json.dumps(spec))
    result_file = ctx.paths.dir / RESULT
    result_file.unlink(missing_ok=True)
    for old in [*ctx.paths.dir.glob(OOM_MARKER.format("*")), *ctx.paths.dir.glob(PEAK_FILE.format("*"))]:
        old.unlink()
    cmd = launch_command(k, spec_file)
    ctx.log.info("%s over %d processes: %s", how, k, " ".join(cmd[2:]))
    env = dict(os.environ)
    if os.environ.get("OMP_NUM_THREADS"):  # CPU: the job's threads are shared out between its ranks
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, int(os.environ["OMP_NUM_THREADS"]) // k))
    for old in ctx.paths.dir.glob(REQUEUE_MARKER.format("*")):
        old.unlink()
    from pita.core import preempt

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    tail: collections.deque = collections.deque(maxlen=400)  # what a rank said last, for its cause of death
    # under Slurm, USR1 and TERM to the worker reach the ranks (they train, and save)
    with preempt.forwarding(lambda: preempt.rank_pids(proc.pid)) if preempt.enabled() else contextlib.nullcontext():
        for line in proc.stdout:  # every rank's output, into the job log
            ctx.log.info("%s", line.rstrip())
            tail.append(line)
        rc = proc.wait()
    requeued = sorted(ctx.paths.dir.glob(REQUEUE_MARKER.format("*")))
    if requeued:  # the ranks saved on a signal and stopped: the job runs again from the save
        raise preempt.Requeue(json.loads(requeued[0].read_text())["why"])
    ooms = sorted(ctx.paths.dir.glob(OOM_MARKER.format("*")))
    if ooms:  # one rank out of memory is the job out of memory (torchrun ended the others)
        first = json.loads(ooms[0].read_text())
        raise DeviceOutOfMemory(f"CUDA out of memory on rank {first['rank']} of {k} ({first['device']}): "
                                f"{first['error']}")
    from pita.core.worker import nccl_watchdog_oom

    said = nccl_watchdog_oom("".join(tail)) if rc != 0 else None
    if said:  # NCCL's watchdog thread aborted a rank: out of memory, though no Python exception said so
        raise DeviceOutOfMemory(f"NCCL out of device memory on one of {k} ranks (torch's watchdog aborted it): {said}")
    if rc != 0 or not result_file.exists():
        raise JobError(f"the {k}-process job exited with code {rc}; the ranks' output is in the job log above")
    report_rank_peaks(ctx, k)
    return json.loads(result_file.read_text())


def report_rank_peaks(ctx, k: int) -> None:
    """The job's device-memory peak is its largest rank's: torch's reserved bytes, the CUDA context
    and, over several ranks, NCCL's buffers, which torch does not count either (where NVML cannot
    attribute memory to processes, in most containers, this figure is all the run sees of the job):
    declared to the worker, so memory learning and the attempt record see a k-device job's peak as
    they see a one-device job's."""
    from pita.core.memory import CUDA_CONTEXT_BYTES, NCCL_RANK_BYTES

    peaks = [json.loads(f.read_text()) for f in sorted(ctx.paths.dir.glob(PEAK_FILE.format("*")))]
    if not peaks:
        return  # CPU ranks: their resident memory is what the worker's children report
    top = max(int(p.get("peak_gpu_reserved_bytes") or p.get("peak_gpu_bytes") or 0) for p in peaks)
    ctx.log.info("device memory peak per rank (GB, torch reserved): %s",
                 ", ".join(f"{int(p.get('peak_gpu_reserved_bytes') or 0) / 1e9:.2f}" for p in peaks))
    if top and hasattr(ctx, "report_peak"):
        ctx.report_peak(top + CUDA_CONTEXT_BYTES + (NCCL_RANK_BYTES if k > 1 else 0))


def main(spec_file: str) -> int:
    import importlib

    from pita.core import preempt

    if preempt.enabled():  # a Slurm attempt's rank: the warning stays held (it arrives blocked from the worker)
        preempt.hold()
    from pita.core.paths import JobPaths

    spec = json.loads(Path(spec_file).read_text())
    r = rank()
    logging.basicConfig(level=logging.INFO, format=f"[rank {r}] %(message)s")
    from pita.core.devinfo import describe_process, set_local_device
    from pita.core.worker import is_oom

    ctx = SimpleNamespace(params=spec["params"], dep_result=lambda j: spec["deps"][j],
                          paths=JobPaths(Path(spec["dir"])), log=logging.getLogger("pita.job"),
                          **spec.get("extras", {}))
    device = set_local_device()
    ctx.log.info("%s", describe_process(spec["params"].get("attn_impl")))
    mod, name = spec["target"].split(":")
    if preempt.enabled():  # the worker forwards Slurm's USR1 / TERM here: save, as a one-device job does

        def on_term(signum, frame):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        preempt.install(on_term)
    try:
        result = getattr(importlib.import_module(mod), name)(ctx)
    except BaseException as e:
        if isinstance(e, preempt.Requeue):
            (Path(spec["dir"]) / REQUEUE_MARKER.format(r)).write_text(json.dumps({"rank": r, "why": str(e)}))
        if is_oom(e):
            marker = Path(spec["dir"]) / OOM_MARKER.format(r)
            marker.write_text(json.dumps({"rank": r, "device": device, "error": f"{type(e).__name__}: {e}"[:2000]}))
        raise
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        (Path(spec["dir"]) / PEAK_FILE.format(r)).write_text(json.dumps({
            "rank": r, "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_gpu_reserved_bytes": int(torch.cuda.max_memory_reserved())}))
    if is_rank0():
        (Path(spec["dir"]) / RESULT).write_text(json.dumps(result))
    import torch.distributed as dist

    # every rank waits for rank 0's checkpoint and result, then the group is shut down before the
    # process exits: a rank leaving with the group alive can abort in the backend's threads
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
