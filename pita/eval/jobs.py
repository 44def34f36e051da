"""``eval.merge``: the last job of every evaluation, base model and algorithms alike.

It gathers the evaluation shards' samples, saves them, and summarises them per eta into the rows
of the results table (pita/report/results.py collects every ``eval.merge`` result of a run).
"""

from __future__ import annotations

from pita.core.errors import JobError
from pita.core.job import add_kind_module, job_kind

add_kind_module("pita.eval.jobs")


@job_kind("eval.merge")
def eval_merge(ctx):
    from pita.eval.metrics import summarize
    from pita.generation.jobs import gather, save_records

    records = gather(ctx)
    if not records:
        raise JobError("evaluation produced no samples")
    save_records(ctx, records)
    labels = ctx.params["labels"]
    by_eta: dict[float, dict[str, list]] = {}
    for r in records:
        by_eta.setdefault(r["eta"], {}).setdefault(r["id"], []).append(r)
    results = []
    for eta in sorted(by_eta):
        groups = [sorted(g, key=lambda x: x["sample"]) for _, g in sorted(by_eta[eta].items())]
        m = summarize(groups, labels["task"], kl_fraction=ctx.params.get("kl_fraction", 1.0))
        results.append({**labels, "eta": eta, **m})
    return {"labels": labels, "results": results}
