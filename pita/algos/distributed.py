"""Multi-device training jobs: one job, k devices, k processes (DDP or FSDP through accelerate).

    result = run_distributed(ctx, "algo.dpo_train", k)     # in the job's worker

The executor gives a k-device job k devices at once (CUDA_VISIBLE_DEVICES lists them). The worker
then runs the job function on k ranks (:mod:`pita.core.ranks`: torchrun, every rank's output in
the job log, rank 0's result, an out-of-memory rank the job's OOM); the TRL / transformers
Trainer inside each rank finds the distributed environment (RANK, WORLD_SIZE, LOCAL_RANK) and
wraps the model in DDP through accelerate (NCCL on GPUs, gloo on CPU), or shards it
(``algos.<A>.sharding=fsdp``). Rank 0 writes the checkpoint and the result. The effective batch
stays as configured: the job divides it by k (pita/training/arguments.py, device_steps).

Rank r uses ``cuda:LOCAL_RANK`` (pita.models.lm.default_device) for everything it builds.
"""

from __future__ import annotations

from dataclasses import asdict

from pita.core.ranks import is_rank0, launch_command, run_ranks, world_size  # noqa: F401  (the algorithms' names)


def run_distributed(ctx, kind: str, k: int) -> dict:
    from pita.tracking import tracker_settings

    deps = {d: ctx.dep_result(d) for d in _dep_ids(ctx.params)}
    how = "sharded (FSDP)" if ctx.params.get("sharding") == "fsdp" else "data-parallel"
    return run_ranks(ctx, kind, k, deps=deps, extras={"tracker": asdict(tracker_settings(ctx))}, how=how)


def _dep_ids(params: dict) -> list[str]:
    return [v for k in ("policy_from", "data", "proxy") if isinstance(v := params.get(k), str)]
