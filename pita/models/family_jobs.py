"""``model.build_tiny``: train one part of the tiny family into the cache (a no-op when it is
already there). Planned by :func:`pita.models.families.family_build_jobs`."""

from __future__ import annotations

from pita.core.job import add_kind_module, job_kind

add_kind_module("pita.models.family_jobs")


@job_kind("model.build_tiny")
def build_tiny(ctx):
    from pita.models.tiny import build_part

    p = ctx.params

    def progress(step: int, steps: int, loss: float) -> None:
        ctx.log.info("%s: step %d/%d, loss %.3f", p["part"], step, steps, loss)

    from pita.core.threads import IdleCores

    # the threads of the devices it holds, while no other process wants those cores
    cores = IdleCores()
    res = build_part(p["cache_dir"], p["seed"], p["part"], progress=progress, on_step=cores.adjust)
    if cores.enabled:
        res["thread_changes"] = cores.changes
    if res["cached"]:
        ctx.log.info("%s: already in the cache (%s)", p["part"], p["path"])
    return res
