"""A diagnostic k-device job kind: the multi-device path (torchrun, rank-local devices, an OOM
on one rank) without a model."""

from __future__ import annotations

import os

from pita.algos.distributed import run_distributed, world_size
from pita.core.job import add_kind_module, job_kind

add_kind_module("pita.algos.rank_check")


def ctx_attempt(ctx) -> int:
    """The attempt number: the worker's context has it; a rank reads it from its job folder's
    launch file."""
    if getattr(ctx, "attempt", None):
        return int(ctx.attempt)
    import json

    try:
        return int(json.loads((ctx.paths.dir / "launch.json").read_text())["attempt"])
    except (OSError, ValueError, KeyError):
        return 1


@job_kind("synthetic.ranks")
def ranks(ctx):
    """A k-device job (``devices`` > 1) whose ranks report the device they use; with
    ``oom_rank`` set, that rank runs out of memory while ``micro_batch_size`` > ``fits``; with
    ``nccl_abort_rank`` set, that rank is ended the way torch's NCCL watchdog ends a rank whose
    collective ran out of device memory (its message, then SIGABRT); with ``save_on_signal``, each
    rank "trains" (up to ``steps`` tenths of a second) until USR1 or TERM asks it to save, on the
    first ``save_attempts`` attempts."""
    from pita.models.lm import default_device

    p = ctx.params
    if int(p.get("devices", 1)) > 1 and world_size() == 1:
        return run_distributed(ctx, "synthetic.ranks", int(p["devices"]))
    rank = int(os.environ.get("RANK", "0"))
    if p.get("nccl_abort_rank") == rank and int(p.get("micro_batch_size", 1)) > int(p.get("fits", 0)):
        import sys

        # what torch's NCCL watchdog thread writes before it terminates the process: no Python
        # exception, no out-of-memory marker
        print(f"[rank{rank}]:[E ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group "
              f"watchdog thread terminated with exception: NCCL error in: ProcessGroupNCCL.cpp:3101, unhandled cuda "
              f"error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\nncclUnhandledCudaError: Call to "
              f"CUDA function failed.\nLast error:\nCuda failure 'out of memory'\nterminate called after throwing an "
              f"instance of 'c10::DistBackendError'", file=sys.stderr, flush=True)
        os.abort()
    if p.get("save_on_signal") and ctx_attempt(ctx) <= int(p.get("save_attempts", 1)):
        import time

        from pita.core import preempt

        (ctx.paths.dir / f"rank{rank}.training").write_text("")
        with preempt.saving():  # "training" until a signal asks this rank to save and stop
            for step in range(int(p.get("steps", 600))):
                if preempt.requested():
                    raise preempt.Requeue(f"{preempt.requested()} received: rank {rank} saved at step {step}")
                time.sleep(0.1)
    if p.get("oom_rank") == rank and int(p.get("micro_batch_size", 1)) > int(p.get("fits", 0)):
        import torch

        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB on rank {rank} "
                                          f"(micro_batch_size={p.get('micro_batch_size')})")
    return {"rank": rank, "world": world_size(), "device": default_device(),
            "micro_batch_size": p.get("micro_batch_size")}

