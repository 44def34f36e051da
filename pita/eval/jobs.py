"""``eval.merge``: the last job of every evaluation, base model and algorithms alike.

It gathers the evaluation shards' samples, saves them, and summarises them per eta into the rows
of the results table (pita/report/results.py collects every ``eval.merge`` result of a run). A
guided evaluation's eta-0 row is the base model's row on the same dataset (``base_eval``): at
eta 0 the guided policy is the reference itself.
"""

from __future__ import annotations

from pita.core.errors import JobError
from pita.core.job import add_kind_module, job_kind

add_kind_module("pita.eval.jobs")


@job_kind("eval.merge")
def eval_merge(ctx):
    from pita.generation.jobs import gather, save_records

    labels = ctx.params["labels"]
    records = gather(ctx)
    results = []
    base = ctx.params.get("base_eval")
    if base:  # eta 0 is the reference itself: the base model's row, relabelled
        results += [{**row, **labels, "eta": 0.0, "reused_from": base} for row in ctx.dep_result(base)["results"]
                    if float(row["eta"]) == 0.0]
    if not records and not results:
        if ctx.params.get("may_be_empty"):  # the eta search's test rows when it added no eta
            return {"labels": labels, "results": []}
        raise JobError("evaluation produced no samples")
    if records:
        save_records(ctx, records)
    variant = ctx.params.get("variant")  # a sweep other than eta's: e.g. "T={:g}" of the temperature control
    for row in rows_by_eta(records, labels, ctx.params.get("kl_fraction", 1.0)):
        results.append({**row, **({"variant": variant.format(row["eta"])} if variant else {})})
    return {"labels": labels, "results": sorted(results, key=lambda x: float(x["eta"]))}


def rows_by_eta(records: list[dict], labels: dict, kl_fraction: float = 1.0) -> list[dict]:
    """One results row per eta of ``records`` (each prompt's samples in order): ``labels`` and
    the metrics of pita.eval.metrics.summarize."""
    from pita.eval.metrics import summarize

    by_eta: dict[float, dict[str, list]] = {}
    for r in records:
        by_eta.setdefault(r["eta"], {}).setdefault(r["id"], []).append(r)
    rows = []
    for eta in sorted(by_eta):
        groups = [sorted(g, key=lambda x: x["sample"]) for _, g in sorted(by_eta[eta].items())]
        rows.append({**labels, "eta": eta, **summarize(groups, labels["task"], kl_fraction=kl_fraction)})
    return rows
