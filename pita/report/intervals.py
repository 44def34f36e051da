"""95% confidence intervals of every results row, from the per-sample records its evaluation saved.

    add_intervals(rows, run)      # rows of results.collect; adds <metric>_ci_lo/_ci_hi, kl_ci_*, gain*

The unit of resampling is the prompt (a prompt's samples are correlated): 1000 seeded draws of
the test prompts with replacement (``pita.eval.metrics.bootstrap_ratios``), percentile
intervals. Per prompt: pass@1 is the share of its samples that are correct, mean_reward the sum
and count of its rewards, KL the sum and count of each sample's KL term (``kl_path``, or
``logp - logp_ref`` for older records) over the samples the row's estimate used
(``kl_fraction``), so each statistic on the original prompts is the row's value.

The gain over the reference is paired: row minus the base model's row of the same family and
evaluation dataset, both computed on the same drawn prompts in every resample (the base
evaluation and every algorithm's evaluation sample the same test prompts, matched by id).
Value-guided rows at eta 0 are the base model's evaluation (``reused_from``) and use its records.

Rows whose records are missing (runs made before they were saved) get value +- 1.96 stderr and
``ci_method`` says so; their gain interval treats row and base as independent.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from pita.core.paths import RunPaths
from pita.eval.metrics import bootstrap_ratios, exact_kl_of, kl_window, percentile_interval, sample_kl

log = logging.getLogger(__name__)

RESAMPLES = 1000
SEED = 0
Z95 = 1.96
BOOTSTRAP = f"bootstrap over prompts ({RESAMPLES} resamples)"
NORMAL = "value +- 1.96 stderr (no per-sample records)"
CI_COLUMNS = ["pass@1_ci_lo", "pass@1_ci_hi", "mean_reward_ci_lo", "mean_reward_ci_hi", "kl_ci_lo", "kl_ci_hi",
              "gain", "gain_ci_lo", "gain_ci_hi", "ci_method"]


def metric_of(row: dict) -> str:
    return "pass@1" if row.get("pass@1") is not None else "mean_reward"


def _usable(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def prompt_columns(records: list[dict], kl_fraction: float = 1.0) -> dict[str, dict]:
    """{statistic: {prompt id: (num, den)}} for pass@1, mean_reward and kl, as far as the records
    carry what each needs. ``records``: one evaluation at one eta."""
    by_id: dict = {}
    for r in records:
        by_id.setdefault(r["id"], []).append(r)
    groups = [(i, sorted(g, key=lambda s: s["sample"])) for i, g in sorted(by_id.items())]
    out: dict[str, dict] = {}
    flat = [s for _, g in groups for s in g]
    if flat and all(s.get("correct") is not None for s in flat):
        # correct is a bool, or (best-of-n control) the expected correctness of the prompt's best of n
        out["pass@1"] = {i: (math.fsum(float(s["correct"]) for s in g) / len(g), 1.0) for i, g in groups}
    if flat and all(_usable(s.get("reward")) for s in flat):
        out["mean_reward"] = {i: (math.fsum(float(s["reward"]) for s in g), float(len(g))) for i, g in groups}
    if any("logp" in s for s in flat):
        # the same window and estimator as pita.eval.metrics.kl_metrics
        window = kl_window(flat, kl_fraction)
        exact, inside = exact_kl_of(window), {id(s) for s in window}
        kl = {}
        for i, g in groups:
            terms = [sample_kl(s, exact) for s in g if id(s) in inside]
            terms = [t for t in terms if t is not None]
            kl[i] = (math.fsum(terms), float(len(terms)))
        out["kl"] = kl
    return out


class RecordStore:
    """The per-sample records of a run's evaluation merges (``jobs/<id>/artifacts/data``), read once each."""

    FIELDS = ("id", "eta", "sample", "correct", "reward", "logp", "logp_ref", "kl_path", "n_tokens", "finish")

    def __init__(self, run: RunPaths):
        self.run = run
        self._cache: dict[str, list[dict] | None] = {}

    def records(self, job_id: str | None, eta: float) -> list[dict] | None:
        if not job_id:
            return None
        if job_id not in self._cache:
            self._cache[job_id] = self._load(self.run.job(job_id).artifacts / "data")
        recs = self._cache[job_id]
        if recs is None:
            return None
        picked = [r for r in recs if float(r["eta"]) == float(eta)]
        return picked or None

    def _load(self, path: Path) -> list[dict] | None:
        if not path.exists():
            return None
        try:
            from datasets import load_from_disk

            ds = load_from_disk(str(path))
            ds = ds.select_columns([c for c in self.FIELDS if c in ds.column_names])
            cols = ds.to_dict()
        except Exception as e:  # noqa: BLE001 - an unreadable folder falls back to the normal interval
            log.warning("per-sample records at %s unreadable (%s: %s); intervals from stderr", path,
                        type(e).__name__, e)
            return None
        n = len(next(iter(cols.values()), []))
        return [{k: cols[k][j] for k in cols} for j in range(n)]


def columns_of(row: dict, store: RecordStore) -> dict[str, dict] | None:
    recs = store.records(row.get("reused_from") or row.get("eval_job"), 0.0 if row.get("reused_from") else row["eta"])
    return prompt_columns(recs, float(row.get("kl_fraction") or 1.0)) if recs else None


def _normal(row: dict, key: str) -> tuple:
    v, se = row.get(key), row.get(f"{key}_stderr")
    if not (_usable(v) and _usable(se)):
        return None, None
    return v - Z95 * se, v + Z95 * se


def add_intervals(rows: list[dict], run: RunPaths, resamples: int = RESAMPLES, seed: int = SEED) -> None:
    """Add ``<stat>_ci_lo`` / ``_ci_hi`` (pass@1, mean_reward, kl: those the row has), ``gain``
    (row minus its base row, on the row's metric) with ``gain_ci_lo`` / ``gain_ci_hi``, and
    ``ci_method``, to every row in place."""
    store = RecordStore(run)
    base = {(r["family"], r["eval_dataset"]): r for r in rows if r["algorithm"] == "base"}
    base_cols = {k: columns_of(b, store) for k, b in base.items()}
    for r in rows:
        m = metric_of(r)
        b = base.get((r["family"], r["eval_dataset"]))
        cols = columns_of(r, store)
        bcols = base_cols.get((r["family"], r["eval_dataset"])) if b is not None and b is not r else None
        stats = [s for s in ("pass@1", "mean_reward", "kl") if r.get(s) is not None]
        if cols and all(s in cols for s in stats):
            ids = sorted(cols[stats[0]]) if stats else []
            paired = bcols is not None and m in bcols and set(ids) <= set(bcols[m])
            columns = {s: ([cols[s][i][0] for i in ids], [cols[s][i][1] for i in ids]) for s in stats}
            if paired:
                columns["base"] = ([bcols[m][i][0] for i in ids], [bcols[m][i][1] for i in ids])
            draws = bootstrap_ratios(columns, resamples, seed)
            for s in stats:
                r[f"{s}_ci_lo"], r[f"{s}_ci_hi"] = percentile_interval(draws[s])
            r["ci_method"] = BOOTSTRAP
            if b is not None and b is not r:
                r["gain"] = r[m] - b[m]
                if paired:
                    r["gain_ci_lo"], r["gain_ci_hi"] = percentile_interval(
                        [x - y for x, y in zip(draws[m], draws["base"])])
                else:
                    r["gain_ci_lo"], r["gain_ci_hi"] = _normal_gain(r, b, m)
            continue
        for s in stats:
            r[f"{s}_ci_lo"], r[f"{s}_ci_hi"] = _normal(r, s)
        r["ci_method"] = NORMAL
        if b is not None and b is not r:
            r["gain"] = r[m] - b[m]
            r["gain_ci_lo"], r["gain_ci_hi"] = _normal_gain(r, b, m)


def _normal_gain(r: dict, b: dict, m: str) -> tuple:
    se_r, se_b = r.get(f"{m}_stderr"), b.get(f"{m}_stderr")
    if not (_usable(se_r) and _usable(se_b)):
        return None, None
    g, se = r[m] - b[m], math.sqrt(se_r ** 2 + se_b ** 2)
    return g - Z95 * se, g + Z95 * se
