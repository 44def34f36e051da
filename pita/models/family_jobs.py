"""``model.build_tiny``: train one part of the tiny family into the cache (a no-op when it is
already there). Planned by :func:`pita.models.families.family_build_jobs`.

A pretrained part (the reference, the guidance backbone) built by a job holding two CPU devices
is trained by two processes at one thread each, which share every step's two micro-batches and
sum their gradients: the same weights, bit for bit, as one process at one thread
(:mod:`pita.models.tiny`), in about 60% of its time. The job holds the part's lock while its
ranks train; rank 0 saves."""

from __future__ import annotations

from pita.core.job import add_kind_module, job_kind

add_kind_module("pita.models.family_jobs")


def build_ranks(ctx, part: str) -> int:
    """How many processes build ``part``: two for a pretrained part when the job holds two or more
    CPU devices, else one."""
    import os

    from pita.models.tiny import PRETRAINED

    cpu = not os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return 2 if part in PRETRAINED and cpu and len(getattr(ctx, "devices", None) or []) >= 2 else 1


@job_kind("model.build_tiny")
def build_tiny(ctx):
    from pita.core.ranks import run_ranks, world_size
    from pita.models.tiny import build_part, train_part

    p = ctx.params

    def progress(step: int, steps: int, loss: float) -> None:
        ctx.log.info("%s: step %d/%d, loss %.3f", p["part"], step, steps, loss)

    if world_size() > 1:  # one rank of the job's build (below)
        import torch.distributed as dist

        dist.init_process_group("gloo")
        return train_part(p["cache_dir"], p["seed"], p["part"], progress=progress, steps=p.get("steps"))
    k = build_ranks(ctx, p["part"])
    train = (lambda: run_ranks(ctx, "model.build_tiny", k, how="data-parallel")) if k > 1 else None
    res = build_part(p["cache_dir"], p["seed"], p["part"], progress=progress, train=train, steps=p.get("steps"))
    if res["cached"]:
        ctx.log.info("%s: already in the cache (%s)", p["part"], p["path"])
    else:
        res["processes"] = k
    return res
