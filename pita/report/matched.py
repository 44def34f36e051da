"""Methods compared at equal KL: each method's metric at common KL budgets, read off its own frontier.

    cells = matched_cells([(rows, store)], budgets)             one run
    cells = matched_cells([(rows0, store0), (rows1, store1)])   one run per seed, pooled

A method's points, per evaluation dataset, family and training dataset, are all of its test rows
(every round, every η) as (KL, metric), plus the base model at (0, its metric): η 0 and "no
training" are the reference itself. Its frontier is the upper envelope of those points: sorted
by KL, a point stays when its metric beats every point of smaller KL. At a budget b its value is
the frontier linearly interpolated at b (the best it reaches with KL ≤ b, where b falls between
two frontier points); a budget beyond the method's largest KL is not reached and has no value:
nothing is extrapolated. KL is the rows' ``kl``, per sequence, in nats (the exact per-step KL
summed along the sampled paths where the records carry it, pita/eval/metrics.py).

Intervals: the prompts are resampled as for the rows' own intervals (pita/report/intervals.py;
the same draws for every row of a dataset, so a method and the base move together), every row's
metric and KL recomputed per draw, the frontier rebuilt and read at each budget: the interval
covers both the metric's and the KL's noise. Over several seeds the value is the mean of the
seeds' values (a budget counts as reached only when every seed reaches it), and each draw also
resamples the seeds with replacement, so the interval covers seed-to-seed variation too. The gain
over base is paired: method minus the base model of the same seed, per draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pita.eval.metrics import KL_BUDGETS as BUDGETS, bootstrap_ratios, percentile_interval
from pita.report.intervals import RESAMPLES, SEED, RecordStore, columns_of, metric_of

def envelope(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The upper-left frontier of (kl, value) points: by KL (ties: best value first), each point
    whose value beats every point of smaller KL. nan points are left out."""
    out: list[tuple[float, float]] = []
    for k, v in sorted(((float(k), float(v)) for k, v in points if not (math.isnan(k) or math.isnan(v))),
                       key=lambda p: (p[0], -p[1])):
        if not out or v > out[-1][1]:
            out.append((k, v))
    return out


def value_at(points: Sequence[tuple[float, float]], budget: float) -> float | None:
    """The frontier's value at ``budget``: interpolated between the frontier points around it, the
    best value below it past the last frontier point; None when no point has KL ≥ ``budget``."""
    pts = [(float(k), float(v)) for k, v in points if not (math.isnan(k) or math.isnan(v))]
    if not pts or max(k for k, _ in pts) < budget:
        return None
    env = envelope(pts)
    best = None
    for (k0, v0), (k1, v1) in zip(env, env[1:]):
        if k0 <= budget <= k1:
            return v0 + (v1 - v0) * (budget - k0) / (k1 - k0) if k1 > k0 else max(v0, v1)
    for k, v in env:
        if k <= budget:
            best = v
    return best


def _label(r: dict) -> str:
    if r["algorithm"] == "base":
        return "base"
    eta = float(r.get("eta") or 0.0)
    return f"r{r['round']}" + (f" η={eta:g}" if eta else "")


def _bracket(points: list[tuple[float, float, str]], budget: float) -> str:
    """Which rows the value at ``budget`` comes from, for the reader: ``r1 η=2 .. r1 η=4``."""
    env = envelope([(k, v) for k, v, _ in points])
    names = {(float(k), float(v)): n for k, v, n in points}
    for (k0, v0), (k1, v1) in zip(env, env[1:]):
        if k0 <= budget <= k1:
            return f"{names[(k0, v0)]} .. {names[(k1, v1)]}"
    below = [(k, v) for k, v in env if k <= budget]
    return names[below[-1]] if below else ""


def seed_cells(rows: list[dict], store: RecordStore | None, budgets: Sequence[float],
               resamples: int = RESAMPLES, seed: int = SEED) -> dict[tuple, dict]:
    """One run: {(eval dataset, family, training dataset, algorithm): cell}; a cell holds the
    method's ``points`` [(kl, value, label)], ``values`` (one per budget, None when not reached),
    ``draws`` [resamples x budgets] (nan where a draw does not reach), the base's value and draws,
    and ``max_kl``. ``store``: the run's per-sample records (None: no intervals)."""
    budgets = [float(b) for b in budgets]
    out: dict[tuple, dict] = {}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("split", "test") == "test":
            groups.setdefault((r["eval_dataset"], r["family"]), []).append(r)
    for (eds, fam), rs in groups.items():
        base = next((r for r in rs if r["algorithm"] == "base"), None)
        if base is None:
            continue
        m = metric_of(base)
        methods: dict[tuple, list[dict]] = {}
        for r in rs:
            if r["algorithm"] != "base" and r.get(m) is not None and r.get("kl") is not None:
                methods.setdefault((r["train_dataset"], r["algorithm"]), []).append(r)
        draws = _draws([base] + [r for ms in methods.values() for r in ms], m, store, resamples, seed)
        base_draws = draws[0][0] if draws is not None else None
        i = 1
        for (train, algo), ms in methods.items():
            points = [(0.0, float(base[m]), "base")] + [(float(r["kl"]), float(r[m]), _label(r)) for r in ms]
            cell = {"metric": m, "points": points, "base": float(base[m]), "base_draws": base_draws,
                    "max_kl": max(k for k, _, _ in points),
                    "values": [value_at([(k, v) for k, v, _ in points], b) for b in budgets],
                    "from": [_bracket(points, b) for b in budgets]}
            if draws is not None:
                kd = np.stack([np.zeros(resamples)] + [draws[j][1] for j in range(i, i + len(ms))])
                vd = np.stack([base_draws] + [draws[j][0] for j in range(i, i + len(ms))])
                cell["draws"] = np.array([[_nan(value_at(list(zip(kd[:, d], vd[:, d])), b)) for b in budgets]
                                          for d in range(resamples)])
            i += len(ms)
            out[(eds, fam, train, algo)] = cell
    return out


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def _draws(rows: list[dict], m: str, store: RecordStore | None, resamples: int, seed: int):
    """Per row (metric draws, KL draws), all rows on the same resampled prompts; None when a row
    has no per-sample records (a run made before they were saved) or covers other prompts."""
    if store is None:
        return None
    cols = [columns_of(r, store) for r in rows]
    if any(c is None or m not in c for c in cols) or any("kl" not in c for c in cols[1:]):
        return None
    ids = sorted(cols[0][m])
    if any(set(ids) - set(c[m]) or set(ids) - set(c.get("kl", c[m])) for c in cols[1:]):
        return None
    columns = {}
    for j, c in enumerate(cols):
        columns[f"{j}:m"] = ([c[m][i][0] for i in ids], [c[m][i][1] for i in ids])
        if j:
            columns[f"{j}:kl"] = ([c["kl"][i][0] for i in ids], [c["kl"][i][1] for i in ids])
    d = bootstrap_ratios(columns, resamples, seed)
    return [(np.asarray(d[f"{j}:m"]), np.asarray(d[f"{j}:kl"]) if j else np.zeros(resamples))
            for j in range(len(cols))]


def matched_cells(runs: Sequence[tuple[list[dict], RecordStore | None]], budgets: Sequence[float] = BUDGETS,
                  resamples: int = RESAMPLES, seed: int = SEED) -> list[dict]:
    """One entry per (evaluation dataset, family, training dataset, algorithm, budget), pooled over
    ``runs`` (one per seed; a method missing from a seed is left out of the pool); see the module."""
    budgets = sorted({float(b) for b in budgets})
    per_run = [seed_cells(rows, store, budgets, resamples, seed) for rows, store in runs]
    keys = sorted({k for cells in per_run for k in cells})
    rng = np.random.default_rng(seed + 1)
    out = []
    for key in keys:
        cells = [c[key] for c in per_run if key in c]
        k = len(cells)
        pick = rng.integers(0, k, size=(resamples, k))
        have_draws = all("draws" in c for c in cells)
        for bi, b in enumerate(budgets):
            vals = [c["values"][bi] for c in cells]
            reached = sum(v is not None for v in vals)
            e = {"eval_dataset": key[0], "family": key[1], "train_dataset": key[2], "algorithm": key[3],
                 "metric": cells[0]["metric"], "kl_budget": b, "seeds": k, "seeds_reaching": reached,
                 "reached": reached == k, "max_kl": [round(c["max_kl"], 6) for c in cells],
                 "value": None, "ci_lo": None, "ci_hi": None, "gain": None, "gain_ci_lo": None, "gain_ci_hi": None,
                 "base": float(np.mean([c["base"] for c in cells])),
                 "from": [c["from"][bi] for c in cells]}
            if reached == k:
                e["value"] = float(np.mean(vals))
                e["gain"] = float(np.mean([v - c["base"] for v, c in zip(vals, cells)]))
                if have_draws:
                    v = np.stack([c["draws"][:, bi] for c in cells], 1)        # [resamples x seeds]
                    g = v - np.stack([c["base_draws"] for c in cells], 1)
                    rows_ = np.arange(resamples)[:, None]
                    with np.errstate(invalid="ignore"):
                        e["ci_lo"], e["ci_hi"] = percentile_interval(v[rows_, pick].mean(1).tolist())
                        e["gain_ci_lo"], e["gain_ci_hi"] = percentile_interval(g[rows_, pick].mean(1).tolist())
                    e["draws_reaching"] = float(np.mean(~np.isnan(v[rows_, pick].mean(1))))
            out.append(e)
    return out


def _cell_text(e: dict, what: str = "value") -> str:
    if not e["reached"]:
        top = max(e["max_kl"])
        seeds = f"; {e['seeds_reaching']}/{e['seeds']} seeds" if e["seeds"] > 1 and e["seeds_reaching"] else ""
        return f"not reached (max KL {top:.3g}{seeds})"
    signed = what == "gain"
    f = (lambda x: f"{x:+.3f}") if signed else (lambda x: f"{x:.3f}")
    v, lo, hi = e[what], e[f"{'gain_' if signed else ''}ci_lo"], e[f"{'gain_' if signed else ''}ci_hi"]
    return f(v) + (f" [{f(lo)}, {f(hi)}]" if lo is not None and hi is not None else "")


def matched_tables(cells: list[dict], order: Sequence[str] = ()) -> list[str]:
    """Markdown: per evaluation dataset (and family, training dataset when several), one table of
    value [95% CI] per algorithm and KL budget, base first, then one of the gains over base."""
    lines: list[str] = []
    groups: dict[tuple, list[dict]] = {}
    for e in cells:
        groups.setdefault((e["eval_dataset"], e["family"], e["train_dataset"]), []).append(e)
    many_fam = len({k[1] for k in groups}) > 1
    cross = any(k[0] != k[2] for k in groups)
    rank = {a: i for i, a in enumerate(order)}
    for (eds, fam, train), es in sorted(groups.items()):
        budgets = sorted({e["kl_budget"] for e in es})
        algos = sorted({e["algorithm"] for e in es}, key=lambda a: (rank.get(a, len(rank)), a))
        at = {(e["algorithm"], e["kl_budget"]): e for e in es}
        seeds = max(e["seeds"] for e in es)
        title = f"{eds}" + (f" [{fam}]" if many_fam else "") + (f" (trained on {train})" if cross else "")
        head = ["algorithm"] + [f"KL ≤ {b:g}" for b in budgets]
        base = es[0]["base"]
        tab = [["base (KL 0)"] + [f"{base:.3f}"] * len(budgets)]
        tab += [[a] + [_cell_text(at[(a, b)]) if (a, b) in at else "" for b in budgets] for a in algos]
        gains = [[a] + [_cell_text(at[(a, b)], "gain") if (a, b) in at else "" for b in budgets] for a in algos]
        lines += [f"#### {title}: {es[0]['metric']} at equal KL" + (f", mean of {seeds} seeds" if seeds > 1 else ""),
                  "", _md(head, tab), "", f"Gain over base at equal KL ({title}):", "", _md(head, gains), ""]
    return lines


def _md(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def public(cells: list[dict]) -> list[dict]:
    """The cells as saved in final_results.json (rounded, no draws)."""
    keep = ("eval_dataset", "family", "train_dataset", "algorithm", "metric", "kl_budget", "value", "ci_lo", "ci_hi",
            "gain", "gain_ci_lo", "gain_ci_hi", "base", "reached", "seeds", "seeds_reaching", "max_kl", "from",
            "draws_reaching")
    return [{k: e[k] for k in keep if k in e} for e in cells]
