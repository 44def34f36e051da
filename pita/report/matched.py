"""Methods compared at equal KL: each method's metric at common KL budgets, read off a frontier
chosen on the validation prompts and read on the test prompts.

    cells = matched_cells([(rows, val, store)], budgets)                  one run
    cells = matched_cells([(rows0, val0, store0), (rows1, val1, store1)])  one run per seed, pooled
    diffs = differences(cells_with_draws)                                 method minus method

**Points.** A method's points, per evaluation dataset, family and training dataset, are its rows:
every round, η and variant (a learning rate of a grid, a control's setting) it ran, each
evaluated on the test prompts and on the training dataset's validation prompts (rows of split
``validation``). η = 0 rows are the base model's own evaluation, reused: they are the base point,
not a point of the method. The base model is the point (KL 0, its metric).

**Frontier, chosen on validation.** The rows on the upper envelope of the *validation* points
(sorted by validation KL, a row stays when its validation metric beats every point of smaller
KL, the base model's included) form the method's frontier. Their *test* values are then read:
the test curve runs from the base model through the frontier rows, sorted by test KL. No test
metric chooses a point, so a method that hurts on test shows a negative gain, and a method with
many points (one per η) gains nothing from their number. Without validation rows the frontier is
the envelope of the test points (``selected_on: test``, the optimistic reading, labelled so).

**What each cell is** (``kind``), at budget b, read as "at KL = b":

    measured         a frontier row's test KL is within 10% of b: the row's own test value
                     and interval
    interpolated     b falls between two frontier rows: the line between their test values
                     (``bracket``: their test KLs)
    wide interpolation  the same between rows whose KLs are more than ``WIDE_RATIO`` (4x) apart:
                     a line across a stretch no row measured (a baseline's arms that jump from
                     near 0 to far past the budget), shown with its bracket and no interval
    chord from base  b falls between the base model (KL 0) and the first frontier row: a line
                     assumed from the base, never measured; no interval
    base only        no row of the method beats the base model on validation: the base's value,
                     gain 0, no interval
    not reached      b is above the frontier's largest test KL; nothing is extrapolated

``from`` names the row(s) a value comes from (``base .. r0 η=1``, ``r0 η=1 .. r1 η=2``, ``r1 η=2``).

**How often the frontier holds** (``frontier_stays``). The validation prompts are resampled too
(every validation row and the base model on the same draws, metric and KL recomputed), the
envelope redrawn per draw, and each budget gets the share of draws in which the rows it is read
from (``from``) all stay on it; over seeds, the mean. A low share says the choice of rows, not
only their test values, is uncertain.

**Intervals.** The test prompts are resampled (the same draws for every row of a dataset, so
methods and the base move together), every frontier row's metric and KL recomputed per draw and
the curve read at b: the interval covers the metric's and the KL's noise. A draw whose curve ends
below b does not count; ``draws_reaching`` says what share did (shown when under 1). Over several
seeds the value is the mean of the seeds' values (a budget counts as reached only when every seed
reaches it; the pooled kind is the weakest of the seeds'). Its interval is seed-level
(``pita.eval.metrics.seed_interval``): the seeds' spread with k - 1 degrees of freedom, plus the
part of the test prompts, which every seed shares (the covariance of two seeds' values over the
same prompt draws). Resampling three seeds as a bootstrap does reads their [min, max] and covers
~75%; this interval covers 95% in simulation at k = 3 and 5. The gain over base is paired: method
minus the base model of the same seed; the difference of two methods is paired by seed id, a seed
one of them lacks left out (:func:`differences`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pita.eval.metrics import KL_BUDGETS as BUDGETS, bootstrap_ratios, seed_interval
from pita.report.intervals import RESAMPLES, SEED, RecordStore, columns_of, metric_of

KINDS = ("measured", "interpolated", "wide interpolation", "chord from base", "base only", "not reached")  # weakest last
WITH_INTERVAL = ("measured", "interpolated")
MEASURED_TOLERANCE = 0.1  # a row whose test KL is within 10% of b is the measured value at b
WIDE_RATIO = 4.0  # an interpolation between rows whose KLs differ by more than this factor is "wide"


def envelope(points: Sequence[tuple]) -> list[tuple]:
    """The upper-left frontier of (kl, value, ...) points: by KL (ties: best value first), each
    point whose value beats every point of smaller KL. nan points are left out."""
    out: list[tuple] = []
    for p in sorted((p for p in points if not (math.isnan(float(p[0])) or math.isnan(float(p[1])))),
                    key=lambda p: (float(p[0]), -float(p[1]))):
        if not out or float(p[1]) > float(out[-1][1]):
            out.append(p)
    return out


def value_at(points: Sequence[tuple[float, float]], budget: float) -> float | None:
    """The upper envelope of test points at ``budget`` (the test-selected reading, kept as a
    labelled secondary table): interpolated between the envelope points around it, the best
    value below it past the last one; None when no point has KL >= ``budget``."""
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


def curve_at(curve: Sequence[tuple[float, float]], budget: float) -> float:
    """The test curve (base first at KL 0, then the frontier rows by test KL) at ``budget``: the
    line between the two points around it; nan past its last point."""
    pts = sorted((float(k), float(v)) for k, v in curve)
    if not pts or math.isnan(pts[-1][0]) or budget > pts[-1][0]:
        return math.nan
    for (k0, v0), (k1, v1) in zip(pts, pts[1:]):
        if k0 <= budget <= k1:
            return v0 + (v1 - v0) * (budget - k0) / (k1 - k0) if k1 > k0 else v1
    return pts[0][1] if budget <= pts[0][0] else math.nan


def label(r: dict) -> str:
    """How a row is named in a cell's ``from``: ``r1``, ``r1 η=2``, ``r0 lr=1e-05``, ``T=0.7``."""
    if r["algorithm"] == "base":
        return "base"
    eta = float(r.get("eta") or 0.0)
    variant = r.get("variant") or ""
    parts = [] if r.get("control") else [f"r{r['round']}"]
    parts += [variant] if variant else []
    parts += [f"η={eta:g}"] if eta and not r.get("control") else []  # a control's eta holds its setting
    return " ".join(parts)


def _key(r: dict) -> tuple:
    return int(r.get("round") or 0), r.get("variant") or "", float(r.get("eta") or 0.0)


def classify(curve: list[tuple[float, float, str]], budget: float,
             any_point_beyond: bool, wide_ratio: float = WIDE_RATIO) -> tuple[str, float | None, str, int | None]:
    """(kind, value, from, index of the measured point among the frontier rows by KL) of a test
    curve at ``budget``. ``curve``: [(test kl, test value, name)], the base model first;
    ``any_point_beyond``: whether some row of the method (chosen or not) has a test KL of at
    least ``budget`` (a method none of whose rows beats the base on validation is then "base only");
    an interpolation between rows more than ``wide_ratio`` apart in KL is "wide interpolation"."""
    base = curve[0]
    rest = sorted(curve[1:], key=lambda p: p[0])
    if not rest:
        return ("base only", base[1], "base", None) if any_point_beyond else ("not reached", None, "", None)
    close = [(abs(k - budget), i) for i, (k, _v, _n) in enumerate(rest) if abs(k - budget) <= MEASURED_TOLERANCE * budget]
    if close:
        i = min(close)[1]
        return "measured", rest[i][1], rest[i][2], i
    if budget > rest[-1][0]:
        return "not reached", None, "", None
    pts = [base] + rest
    for a, b in zip(pts, pts[1:]):
        if a[0] <= budget <= b[0]:
            v = a[1] + (b[1] - a[1]) * (budget - a[0]) / (b[0] - a[0]) if b[0] > a[0] else b[1]
            kind = "chord from base" if a is base else \
                "wide interpolation" if b[0] > wide_ratio * a[0] else "interpolated"
            return kind, v, f"{a[2]} .. {b[2]}", None
    return "not reached", None, "", None


def seed_cells(rows: list[dict], val: list[dict], store: RecordStore | None, budgets: Sequence[float],
               resamples: int = RESAMPLES, seed: int = SEED, wide_ratio: float = WIDE_RATIO) -> dict[tuple, dict]:
    """One run: {(eval dataset, family, training dataset, algorithm): cell}. A cell holds per
    budget ``kinds``, ``values``, ``from`` and (with per-sample records) ``draws`` [resamples x
    budgets] (nan where a draw does not reach, or the kind has no interval), the base's value and
    draws, ``max_kl`` (the frontier's largest test KL), ``selected_on`` and ``frontier`` (the
    chosen rows' names); and the test-selected reading in ``test_values`` / ``test_draws``."""
    budgets = [float(b) for b in budgets]
    out: dict[tuple, dict] = {}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("split", "test") == "test":
            groups.setdefault((r["eval_dataset"], r["family"]), []).append(r)
    vals: dict[tuple, dict] = {}
    base_val: dict[tuple, dict] = {}
    for v in val or []:
        if v["algorithm"] == "base":
            base_val[(v["family"], v["train_dataset"])] = v
        elif float(v.get("eta") or 0.0) != 0.0 or not v.get("reused_from"):
            vals.setdefault((v["family"], v["train_dataset"], v["algorithm"]), {})[_key(v)] = v
    for (eds, fam), rs in groups.items():
        base = next((r for r in rs if r["algorithm"] == "base"), None)
        if base is None:
            continue
        m = metric_of(base)
        methods: dict[tuple, list[dict]] = {}
        for r in rs:
            if r["algorithm"] == "base" or r.get(m) is None or r.get("kl") is None:
                continue
            if r.get("reused_from") and float(r.get("eta") or 0.0) == 0.0:
                continue  # η 0: the base model's own evaluation, the base point
            methods.setdefault((r["train_dataset"], r["algorithm"]), []).append(r)
        flat = [base] + [r for ms in methods.values() for r in ms]
        draws, prompts = _draws(flat, m, store, resamples, seed)
        index = {id(r): j for j, r in enumerate(flat)}
        base_draws = draws[0][0] if draws is not None else None
        for (train, algo), ms in methods.items():
            cell = _cell(base, ms, m, budgets, vals.get((fam, train, algo), {}), base_val.get((fam, train)),
                         draws, index, base_draws, resamples, wide_ratio)
            if cell["selected_on"] == "validation":
                cell["stays"] = _stays(cell, base_val[(fam, train)], vals.get((fam, train, algo), {}), store,
                                       resamples, seed)
            cell["prompts"] = prompts
            out[(eds, fam, train, algo)] = cell
    return out


def _cell(base: dict, ms: list[dict], m: str, budgets: list[float], val_of: dict, base_val: dict | None,
          draws, index: dict, base_draws, resamples: int, wide_ratio: float = WIDE_RATIO) -> dict:
    vm = metric_of(base_val) if base_val is not None else m
    paired = [(r, val_of.get(_key(r))) for r in ms]
    if base_val is not None and any(v is not None and v.get(vm) is not None and v.get("kl") is not None
                                    for _, v in paired):
        pts = [(0.0, float(base_val[vm]), None)] + [(float(v["kl"]), float(v[vm]), r) for r, v in paired
                                                     if v is not None and v.get(vm) is not None and v.get("kl") is not None]
        chosen = [p[2] for p in envelope(pts) if p[2] is not None]
        selected_on = "validation"
    else:  # no validation rows: the envelope of the test points (optimistic)
        chosen = [p[2] for p in envelope([(0.0, float(base[m]), None)] + [(float(r["kl"]), float(r[m]), r) for r in ms])
                  if p[2] is not None]
        selected_on = "test"
    curve = [(0.0, float(base[m]), "base")] + [(float(r["kl"]), float(r[m]), label(r)) for r in chosen]
    chosen_by_kl = sorted(chosen, key=lambda r: float(r["kl"]))
    top = max(float(r["kl"]) for r in ms)
    used: list = []  # per budget, the frontier rows its value is read from
    cell = {"metric": m, "base": float(base[m]), "base_draws": base_draws, "selected_on": selected_on,
            "frontier": [label(r) for r in chosen_by_kl], "max_kl": max([0.0] + [float(r["kl"]) for r in chosen]),
            "method_max_kl": top, "kinds": [], "values": [], "from": [], "brackets": [], "used": used}
    # a best-of-n control: how well its scorer ranks the validation pool (the test pool's without one)
    on_val = [v for _, v in paired if v is not None and v.get("scorer_agreement") is not None]
    on, ranked = ("validation", on_val) if on_val else ("test", [r for r in ms if r.get("scorer_agreement") is not None])
    if ranked:
        cell["scorer"] = {"agreement": float(ranked[0]["scorer_agreement"]),
                          "se": ranked[0].get("scorer_agreement_se"), "pairs": ranked[0].get("scorer_pairs"),
                          "chance": bool(ranked[0].get("scorer_chance")), "on": on,
                          "prompts": ranked[0].get("scorer_prompt_agreement")}
    # which limit stopped a guided method's eta search short of a budget (its latest round's search)
    stops = [r["eta_search_stopped"] for r in sorted(ms, key=lambda r: int(r.get("round") or 0))
             if r.get("eta_search_stopped")]
    cell["stopped"] = [(stops[-1].get(f"{b:g}") if stops else None) for b in budgets]
    test_pts = [(0.0, float(base[m]))] + [(float(r["kl"]), float(r[m])) for r in ms]
    cell["test_values"] = [value_at(test_pts, b) for b in budgets]
    for b in budgets:
        kind, v, src, idx = classify(curve, b, top >= b, wide_ratio)
        used.append(_used(chosen_by_kl, b, kind, idx))
        cell["kinds"].append(kind)
        cell["values"].append(v)
        cell["from"].append(src)
        cell["brackets"].append(_bracket(curve, b) if kind in ("interpolated", "wide interpolation",
                                                                "chord from base") else None)
    if draws is not None:
        kd = {id(r): draws[index[id(r)]][1] for r in ms}
        vd = {id(r): draws[index[id(r)]][0] for r in ms}
        d = np.full((resamples, len(budgets)), np.nan)
        for bi, b in enumerate(budgets):
            kind = cell["kinds"][bi]
            if kind not in WITH_INTERVAL:
                continue
            if kind == "measured":
                r = chosen_by_kl[classify(curve, b, True)[3]]
                d[:, bi] = vd[id(r)]
                continue
            for j in range(resamples):
                d[j, bi] = curve_at([(0.0, base_draws[j])] + [(kd[id(r)][j], vd[id(r)][j]) for r in chosen], b)
        cell["draws"] = d
        td = np.full((resamples, len(budgets)), np.nan)
        for j in range(resamples):
            pts_j = [(0.0, base_draws[j])] + [(kd[id(r)][j], vd[id(r)][j]) for r in ms]
            for bi, b in enumerate(budgets):
                td[j, bi] = _nan(value_at(pts_j, b))
        cell["test_draws"] = td
    return cell


def _used(chosen_by_kl: list[dict], budget: float, kind: str, idx: int | None) -> list[dict] | None:
    """The frontier rows a budget's value is read from (by test KL, as :func:`classify` reads the
    curve): the measured row, or the one or two rows of the stretch it interpolates; None where no
    row is read (base only, not reached)."""
    if kind == "measured":
        return [chosen_by_kl[idx]]
    if kind not in ("interpolated", "wide interpolation", "chord from base"):
        return None
    kls = [float(r["kl"]) for r in chosen_by_kl]
    after = next((i for i, k in enumerate(kls) if k >= budget), None)
    if after is None:
        return None
    return chosen_by_kl[max(0, after - 1):after + 1] if after else [chosen_by_kl[0]]


def _stays(cell: dict, base_val: dict, val_of: dict, store: RecordStore | None, resamples: int,
           seed: int) -> list[float | None] | None:
    """How often, per budget, the frontier rows the value is read from stay on the validation
    envelope when the validation prompts are resampled (every row and the base model on the same
    draws, the metric and KL recomputed): 1.0 is a choice no other validation draw would change;
    None where no row is read or the per-sample records are missing."""
    used = cell.get("used") or []
    keys = sorted({_key(r) for rows in used if rows for r in rows})
    if not keys or store is None:
        return None
    rows = [v for _, v in sorted(val_of.items()) if v.get("kl") is not None]
    vm = metric_of(base_val)
    draws, _ = _draws([base_val] + rows, vm, store, resamples, seed)
    if draws is None:
        return None
    on = {k: np.zeros(resamples, dtype=bool) for k in keys}
    for j in range(resamples):
        pts = [(0.0, float(draws[0][0][j]), None)] + [(float(draws[i + 1][1][j]), float(draws[i + 1][0][j]), _key(r))
                                                      for i, r in enumerate(rows)]
        front = {p[2] for p in envelope(pts)}
        for k in keys:
            on[k][j] = k in front
    out: list[float | None] = []
    for rows_b in used:
        if not rows_b:
            out.append(None)
            continue
        both = np.ones(resamples, dtype=bool)
        for r in rows_b:
            both &= on[_key(r)]
        out.append(float(both.mean()))
    return out


def _bracket(curve: list[tuple[float, float, str]], budget: float) -> list[float] | None:
    """The test KLs of the two curve points around ``budget`` (the base's is 0)."""
    pts = sorted(float(p[0]) for p in curve)
    for a, b in zip(pts, pts[1:]):
        if a <= budget <= b:
            return [round(a, 6), round(b, 6)]
    return None


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def _draws(rows: list[dict], m: str, store: RecordStore | None, resamples: int, seed: int):
    """(per row (metric draws, KL draws), the number of test prompts resampled), all rows on the
    same resampled prompts; (None, None) when a row
    has no per-sample records (a run made before they were saved) or covers other prompts. A row
    whose KL is a bound (``kl_estimator`` starting with "bound": best-of-n) keeps it in every draw."""
    if store is None:
        return None, None
    cols = [columns_of(r, store) for r in rows]
    if any(c is None or m not in c for c in cols):
        return None, None
    fixed = [j for j, r in enumerate(rows) if j and str(r.get("kl_estimator") or "").startswith("bound")]
    if any("kl" not in c for j, c in enumerate(cols) if j and j not in fixed):
        return None, None
    ids = sorted(cols[0][m])
    if any(set(ids) - set(c[m]) or (j not in fixed and set(ids) - set(c.get("kl", c[m])))
           for j, c in enumerate(cols) if j):
        return None, None
    columns = {}
    for j, c in enumerate(cols):
        columns[f"{j}:m"] = ([c[m][i][0] for i in ids], [c[m][i][1] for i in ids])
        if j and j not in fixed:
            columns[f"{j}:kl"] = ([c["kl"][i][0] for i in ids], [c["kl"][i][1] for i in ids])
    d = bootstrap_ratios(columns, resamples, seed)
    out = []
    for j, r in enumerate(rows):
        kl = (np.full(resamples, float(r["kl"])) if j in fixed else np.asarray(d[f"{j}:kl"])) if j else np.zeros(resamples)
        out.append((np.asarray(d[f"{j}:m"]), kl))
    return out, len(ids)


def _worst(kinds: Sequence[str]) -> str:
    return max(kinds, key=KINDS.index)


def matched_cells(runs: Sequence[tuple], budgets: Sequence[float] = BUDGETS, resamples: int = RESAMPLES,
                  seed: int = SEED, keep_draws: bool = False, wide_ratio: float = WIDE_RATIO) -> list[dict]:
    """One entry per (evaluation dataset, family, training dataset, algorithm, budget), pooled over
    ``runs``: (test rows, validation rows, record store[, seed id]) per seed (a method missing from
    a seed is left out of the pool; the seed id, ``system.seed`` of the run, pairs seeds across
    methods, default the run's position); see the module. ``keep_draws``: each entry keeps its
    seeds' values and prompt draws (``_seeds``, ``_seed_values``, ``_seed_draws``) for
    :func:`differences`."""
    budgets = sorted({float(b) for b in budgets})
    ids = [r[3] if len(r) > 3 and r[3] is not None else f"run {i}" for i, r in enumerate(runs)]
    if len(set(map(str, ids))) != len(ids):
        raise ValueError(f"matched_cells: seed ids {ids} repeat; one run per seed")
    per_run = [(sid, seed_cells(r[0], r[1], r[2], budgets, resamples, seed, wide_ratio)) for sid, r in zip(ids, runs)]
    keys = sorted({k for _, cells in per_run for k in cells})
    out = []
    for key in keys:
        pairs = [(sid, c[key]) for sid, c in per_run if key in c]
        sids, cells = [p[0] for p in pairs], [p[1] for p in pairs]
        k = len(cells)
        prompts = cells[0].get("prompts")
        have_draws = all("draws" in c for c in cells)
        for bi, b in enumerate(budgets):
            kinds = [c["kinds"][bi] for c in cells]
            kind = _worst(kinds)
            vals = [c["values"][bi] for c in cells]
            reached = sum(kd != "not reached" for kd in kinds)
            e = {"eval_dataset": key[0], "family": key[1], "train_dataset": key[2], "algorithm": key[3],
                 "metric": cells[0]["metric"], "kl_budget": b, "kind": kind, "kinds": kinds,
                 "selected_on": _worst_selection([c["selected_on"] for c in cells]),
                 "seeds": k, "seed_ids": sids, "seeds_reaching": reached, "reached": kind != "not reached",
                 "max_kl": [round(c["max_kl"], 6) for c in cells],
                 "method_max_kl": [round(c["method_max_kl"], 6) for c in cells],
                 "frontier": [c["frontier"] for c in cells],
                 "value": None, "ci_lo": None, "ci_hi": None, "gain": None, "gain_ci_lo": None, "gain_ci_hi": None,
                 "base": float(np.mean([c["base"] for c in cells])), "from": [c["from"][bi] for c in cells],
                 "bracket": [c.get("brackets", [None] * len(budgets))[bi] for c in cells],
                 "stopped_by": sorted({s for c in cells for s in [(c.get("stopped") or [None] * len(budgets))[bi]]
                                       if s})}
            stays = [c["stays"][bi] for c in cells if c.get("stays") and c["stays"][bi] is not None]
            if stays:  # over the seeds that read a row here: the mean share
                e["frontier_stays"] = float(np.mean(stays))
            scorers = [c["scorer"] for c in cells if c.get("scorer")]
            if scorers:  # the worst seed's scorer speaks for the cell
                e["scorer"] = min(scorers, key=lambda x: x["agreement"])
            tv = [c["test_values"][bi] for c in cells]
            e["test_selected"] = {"value": None}
            if all(v is not None for v in tv):
                e["test_selected"] = {"value": float(np.mean(tv)),
                                      "gain": float(np.mean([v - c["base"] for v, c in zip(tv, cells)]))}
            if kind != "not reached":
                e["value"] = float(np.mean(vals))
                # a pooled "base only" cell may hold other seeds' chords: its gain is still the mean of the seeds'
                e["gain"] = float(np.mean([v - c["base"] for v, c in zip(vals, cells)]))
            if have_draws:
                base_d = np.stack([c["base_draws"] for c in cells], 1)
                if e["test_selected"]["value"] is not None:
                    tvd = np.stack([c["test_draws"][:, bi] for c in cells], 1)
                    ts = e["test_selected"]
                    ts["ci_lo"], ts["ci_hi"] = _interval(tv, tvd, prompts)
                    ts["gain_ci_lo"], ts["gain_ci_hi"] = _interval([v - c["base"] for v, c in zip(tv, cells)],
                                                                   tvd - base_d, prompts)
            if kind in WITH_INTERVAL and have_draws:
                v = np.stack([c["draws"][:, bi] for c in cells], 1)        # [resamples x seeds]
                gains = [x - c["base"] for x, c in zip(vals, cells)]
                e["ci_lo"], e["ci_hi"] = _interval(vals, v, prompts)
                e["gain_ci_lo"], e["gain_ci_hi"] = _interval(gains, v - base_d, prompts)
                e["interval"] = interval_method(k)
                e["draws_reaching"] = float(np.mean(~np.isnan(v).any(1)))
                if keep_draws:
                    e["_seeds"], e["_seed_values"], e["_seed_draws"], e["_prompts"] = sids, vals, v, prompts
            out.append(e)
    return out


def interval_method(k: int) -> str:
    """How a cell's interval over ``k`` seeds is made (the report says it)."""
    if k == 1:
        return "test prompts resampled (one seed)"
    return f"seed-level over {k} seeds ({k - 1} df) and the shared test prompts"


def _interval(points: Sequence[float], draws: np.ndarray, prompts: int | None) -> tuple[float | None, float | None]:
    """A 95% interval for the mean over seeds of ``points`` (one per seed) from each seed's prompt
    draws [resamples x seeds] (``pita.eval.metrics.seed_interval``: one seed, the draws'
    percentiles; several, the seeds' spread with k - 1 degrees of freedom plus the prompts' shared
    part). None where it cannot be said."""
    ci = seed_interval(points, draws, prompts=prompts)
    return (None, None) if math.isnan(ci["lo"]) or math.isnan(ci["hi"]) else (ci["lo"], ci["hi"])


def _worst_selection(sel: Sequence[str]) -> str:
    return "test" if "test" in sel else "validation"


def differences(cells: list[dict], order: Sequence[str] = ()) -> list[dict]:
    """Paired differences of two methods at each budget, per (evaluation dataset, family,
    training dataset): method a minus method b where both cells were measured or interpolated
    (``matched_cells(..., keep_draws=True)``), with a 95% interval from the same draws."""
    rank = {a: i for i, a in enumerate(order)}
    groups: dict[tuple, dict] = {}
    for e in cells:
        groups.setdefault((e["eval_dataset"], e["family"], e["train_dataset"], e["kl_budget"]), {})[e["algorithm"]] = e
    out = []
    for (eds, fam, train, b), by_algo in sorted(groups.items()):
        algos = sorted(by_algo, key=lambda a: (rank.get(a, len(rank)), a))
        for i, a in enumerate(algos):
            for bb in algos[i + 1:]:
                ea, eb = by_algo[a], by_algo[bb]
                d = {"eval_dataset": eds, "family": fam, "train_dataset": train, "kl_budget": b, "a": a, "b": bb,
                     "diff": None, "ci_lo": None, "ci_hi": None}
                if ea["kind"] in WITH_INTERVAL and eb["kind"] in WITH_INTERVAL:
                    d["diff"] = ea["value"] - eb["value"]
                    if "_seed_draws" in ea and "_seed_draws" in eb:
                        # paired by seed id: a seed one of the two methods lacks is left out of both
                        common = [sd for sd in ea["_seeds"] if sd in eb["_seeds"]]
                        ia = [ea["_seeds"].index(sd) for sd in common]
                        ib = [eb["_seeds"].index(sd) for sd in common]
                        if common:
                            pts = [ea["_seed_values"][x] - eb["_seed_values"][y] for x, y in zip(ia, ib)]
                            d["diff"] = float(np.mean(pts))
                            d["ci_lo"], d["ci_hi"] = _interval(
                                pts, ea["_seed_draws"][:, ia] - eb["_seed_draws"][:, ib], ea.get("_prompts"))
                        d["seeds"] = len(common)
                        left = sorted(set(map(str, ea["_seeds"])) ^ set(map(str, eb["_seeds"])))
                        if left:
                            d["seeds_left_out"] = left
                out.append(d)
    return out


# ---------------------------------------------------------------- markdown
class Notes:
    """The numbered notes under a headline table: a cell keeps its value, interval and a short mark,
    and why it is what it is (its bracket, where the frontier ends, what stopped the η search) is a
    note, numbered in the order first cited; two cells with the same reason share its number."""

    def __init__(self):
        self.texts: list[str] = []

    def cite(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"({self.texts.index(text) + 1})"

    def lines(self) -> list[str]:
        return [f"({i}) {text}" for i, text in enumerate(self.texts, 1)]


MARKS = {"interpolated": "interp.", "wide interpolation": "wide", "chord from base": "chord",
         "base only": "base only", "not reached": "not reached"}


def cell_reason(e: dict) -> str:
    """Why a headline cell is what it is, in words (the cell itself shows its value and a mark)."""
    kind = e.get("kind") or ("measured" if e["reached"] else "not reached")
    who = f"{e['algorithm']}: "  # no budget: the cells a reason holds for share its note
    searched = "temperature" if e["algorithm"] == "control: temperature" else "η"
    stopped = f"; {searched} search stopped by {' / '.join(e['stopped_by'])}" if e.get("stopped_by") else ""
    spans = [x for x in e.get("bracket") or [] if x]
    span = f"KL {min(x[0] for x in spans):.3g} and {max(x[1] for x in spans):.3g}" if spans else ""
    if kind == "not reached":
        top = max(e["max_kl"])
        most = max(e.get("method_max_kl") or e["max_kl"])
        seeds = f"; {e['seeds_reaching']} of {e['seeds']} seeds reach it" if e["seeds"] > 1 and e["seeds_reaching"] else ""
        beyond = f"; its rows reach {most:.3g}, none chosen there" if most > top + 1e-12 else ""
        return f"{who}not reached: the frontier ends at KL {top:.3g}{beyond}{seeds}{stopped}"
    if kind == "chord from base":
        first = f" (KL {min(x[1] for x in spans):.3g})" if spans else ""
        return (f"{who}chord from base: a line from the base model to the first frontier row{first}, never "
                f"measured, no interval{stopped}")
    if kind == "wide interpolation":
        return (f"{who}wide interpolation" + (f" between rows at {span}" if span else "")
                + ", further apart than eval.wide_ratio: a line no row measured, no interval")
    if kind == "interpolated":
        return f"{who}interpolated" + (f" between frontier rows at {span}" if span else " between two frontier rows")
    return ""


def _cell_text(e: dict, what: str = "value", notes: Notes | None = None) -> str:
    """A headline cell: its value, its interval where it has one, and a short mark with the number
    of its note (``notes``); without a collector the reason follows the mark in parentheses."""
    kind = e.get("kind") or ("measured" if e["reached"] else "not reached")
    signed = what == "gain"
    f = (lambda x: f"{x:+.3f}") if signed else (lambda x: f"{x:.3f}")
    reasons = [cell_reason(e)] if kind != "base only" else []
    share = e.get("draws_reaching")
    if kind in ("measured", "interpolated") and share is not None and share < 1:
        pct = f"{share:.1%}" if share >= 0.995 else f"{share:.0%}"
        reasons.append(f"{e['algorithm']} at KL {e['kl_budget']:g}: reached in {pct} of the bootstrap draws")
    sc = e.get("scorer")
    if sc and sc.get("chance"):
        se = f" ± {sc['se']:.3f}" if _finite(sc.get("se")) else ""
        reasons.append(f"{e['algorithm']}: its scorer ranks the {sc.get('on', 'validation')} pool no better than chance "
                       f"(agreement with the outcome {sc['agreement']:.3f}{se} over {sc.get('pairs')} pairs): a best-of-n "
                       f"that loses by construction, not a bar to beat"
                       + (f"; it orders the prompts by pass rate ({sc['prompts']:.3f}): it learned which prompts are "
                          f"hard, not which completion is right" if _finite(sc.get("prompts")) and sc["prompts"] > 0.6
                          else ""))
    reasons = [r for r in reasons if r]
    mark = MARKS.get(kind, "") + (" chance scorer" if sc and sc.get("chance") and kind != "not reached" else "")
    mark = mark.strip()
    if kind == "not reached":
        text = mark
    else:
        text = f(e[what])
        if kind in ("measured", "interpolated"):
            lo, hi = e[f"{'gain_' if signed else ''}ci_lo"], e[f"{'gain_' if signed else ''}ci_hi"]
            text += f" [{f(lo)}, {f(hi)}]" if _finite(lo) and _finite(hi) else ""
        text += f" {mark}" if mark else ""
    if reasons:
        if notes is not None:
            text += " " + "".join(notes.cite(r) for r in reasons)
        else:
            why = [r.split(": ", 1)[1] for r in reasons]
            why = [w[len("not reached: "):] if w.startswith("not reached: ") else w for w in why]
            text += " (" + "; ".join(why) + ")"
    return text.strip()


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def matched_tables(cells: list[dict], order: Sequence[str] = (), diffs: list[dict] | None = None) -> list[str]:
    """Markdown: per evaluation dataset (and family, training dataset when several), one table of
    value [95% CI] per algorithm at each KL, base first, one of the gains over base, the paired
    differences of two methods where given, and the test-selected reading, labelled as such."""
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
        head = ["algorithm"] + [f"at KL = {b:g}" for b in budgets]
        base = es[0]["base"]
        tab = [["base (KL 0)"] + [f"{base:.3f}"] * len(budgets)]
        # a method some seeds lack (a run not finished, or its jobs failed) averages fewer seeds: said on its row
        of = {a: min(e["seeds"] for e in es if e["algorithm"] == a) for a in algos}
        name = {a: a + (f" ({of[a]} of {seeds} seeds)" if of[a] < seeds else "") for a in algos}
        notes = Notes()
        tab += [[name[a]] + [_cell_text(at[(a, b)], notes=notes) if (a, b) in at else "" for b in budgets]
                for a in algos]
        gains = [[name[a]] + [_cell_text(at[(a, b)], "gain", notes) if (a, b) in at else "" for b in budgets]
                 for a in algos]
        on = sorted({e.get("selected_on", "test") for e in es})
        lines += [f"#### {title}: {es[0]['metric']} at equal KL" + (f", mean of {seeds} seeds" if seeds > 1 else ""),
                  "", f"Frontier points chosen on: {', '.join(on)}.", "", _md(head, tab), "",
                  f"Gain over base at equal KL ({title}):", "", _md(head, gains), ""]
        if notes.texts:
            lines += [f"Notes ({title}):", ""] + [f"- {n}" for n in notes.lines()] + [""]
        ds = [d for d in diffs or [] if (d["eval_dataset"], d["family"], d["train_dataset"]) == (eds, fam, train)]
        pairs = sorted({(d["a"], d["b"]) for d in ds if d["diff"] is not None},
                       key=lambda p: (rank.get(p[0], len(rank)), rank.get(p[1], len(rank)), p))
        if pairs:
            by = {(d["a"], d["b"], d["kl_budget"]): d for d in ds}
            dtab = [[f"{name.get(a, a)} − {name.get(b, b)}"] + [_diff_text(by.get((a, b, kb))) for kb in budgets]
                     for a, b in pairs]
            lines += [f"Difference of two methods at equal KL ({title}; both measured or interpolated, paired "
                      f"on the same draws):", "", _md(["methods"] + head[1:], dtab), ""]
        if any(e.get("selected_on") == "validation" for e in es):
            ttab = [[name[a]] + [_test_text(at[(a, b)]) if (a, b) in at else "" for b in budgets] for a in algos]
            lines += [f"For comparison only, the frontier picked on the test split ({title}: every row's test "
                      f"point, the upper envelope; optimistic, never below base): gain over base", "",
                      _md(head, ttab), ""]
    return lines


def _diff_text(d: dict | None) -> str:
    if d is None or d["diff"] is None:
        return "—"
    lo, hi = d.get("ci_lo"), d.get("ci_hi")
    return f"{d['diff']:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if _finite(lo) and _finite(hi) else "")


def _test_text(e: dict) -> str:
    t = e.get("test_selected") or {}
    if t.get("value") is None:
        return "not reached"
    lo, hi = t.get("gain_ci_lo"), t.get("gain_ci_hi")
    return f"{t['gain']:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if _finite(lo) and _finite(hi) else "")


def _md(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def public(cells: list[dict]) -> list[dict]:
    """The cells as saved in final_results.json (rounded, no draws)."""
    keep = ("eval_dataset", "family", "train_dataset", "algorithm", "metric", "kl_budget", "kind", "kinds",
            "selected_on", "value", "ci_lo", "ci_hi", "gain", "gain_ci_lo", "gain_ci_hi", "base", "reached", "seeds",
            "seeds_reaching", "seed_ids", "interval", "max_kl", "method_max_kl", "frontier", "from", "draws_reaching",
            "test_selected", "bracket", "stopped_by", "scorer", "frontier_stays")
    return [{k: e[k] for k in keep if k in e} for e in cells]
