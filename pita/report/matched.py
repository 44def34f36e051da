"""Methods compared at equal KL: each method's metric at common KL budgets, each budget read on
the method's series where its validation KL reaches the budget, the value read on the test prompts.

    cells = matched_cells([(rows, val, store)], budgets)                  one run
    cells = matched_cells([(rows0, val0, store0), (rows1, val1, store1)])  one run per seed, pooled
    diffs = differences(cells_with_draws)                                 method minus method

**Points.** A method's points, per evaluation dataset, family and training dataset, are its rows:
every round, η, arm (a learning rate of a grid) and snapshot it ran, each evaluated on the test
prompts and on the training dataset's validation prompts (rows of split ``validation``). η = 0
rows are the base model's own evaluation, reused: they are the base point, not a point of the
method. The base model is the point (KL 0, its metric).

**Series, placed on validation KL** (:mod:`pita.report.series`). A method's rows fall into
series, one per round and arm, ordered by strength (η; the snapshots along training, the final
policy last; a colder temperature; a larger n), each starting at the base model. At budget b a
series is read where its *validation* KL first reaches b, between the two points around it at the
weight that puts their validation KLs at b, and the *test* value is read at that weight. KL, the
quantity matched, is what places a point; no metric, validation's or test's, chooses one: a noisy
validation metric cannot pick the luckiest row, and a method that hurts shows a negative gain.
Without validation rows the series are placed on their test KL (``selected_on: test``).

**Rounds and arms.** Where more than one series reaches b, the default is read: the latest round
(the method as its rounds make it), then the first arm in their stated order (a grid's smallest
rate). Another series replaces it only where its validation value at b beats the default's by
more than ``Z_CHOICE`` (1.96) standard errors of their difference, paired over the validation
prompts where their samples are saved (else the two rows' standard errors, as independent).
Each choice keeps the differences validation saw and its ``resolution``, the smallest difference
it could tell apart (1.96 x that standard error).

**What each cell is** (``kind``), at budget b, read as "at KL = b":

    measured         a point's validation KL is within 10% of b: that row's own test value
    interpolated     b falls between two points of the series (``bracket``: their validation KLs)
    wide interpolation  the same between points whose KLs are more than ``WIDE_RATIO`` (4x) apart:
                     a line across a stretch no point measured
    chord from base  b falls between the base model (KL 0) and the series' first point
    not reached      no series of the method reaches b (its end and, for a search, the limit that
                     stopped it, are in the cell's note); nothing is extrapolated

``from`` names the point(s) a value comes from (``base .. r0 η=1``, ``r1 η=1 .. r1 η=2``,
``r1 η=2``); ``validation`` is the validation value there with its standard error.

**Intervals.** The test prompts are resampled (the same draws for every row of a dataset, so
methods and the base move together) and each draw's value read at the same weight: the interval
covers the test prompts' noise at the point validation placed. Over several seeds the value is
the mean of the seeds' values (a budget counts as reached only when every seed reaches it; the
pooled kind is the weakest of the seeds'). Its interval is seed-level
(``pita.eval.metrics.seed_interval``): the seeds' spread with k - 1 degrees of freedom, plus the
part of the test prompts, which every seed shares (the covariance of two seeds' values over the
same prompt draws). Resampling three seeds as a bootstrap does reads their [min, max] and covers
~75%; this interval covers 95% in simulation at k = 3 and 5. The gain over base is paired: method
minus the base model of the same seed; the difference of two methods (measured or interpolated
cells only) is paired by seed id, a seed one of them lacks left out (:func:`differences`).

The test-selected reading (the upper envelope of every row's test point) is kept beside it, for
comparison only, labelled as the optimistic reading it is.
"""


from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pita.eval.metrics import KL_BUDGETS as BUDGETS, bootstrap_ratios, seed_interval
from pita.report.intervals import RESAMPLES, SEED, RecordStore, columns_of, metric_of
from pita.report.series import MEASURED_TOLERANCE, WIDE_RATIO, Reading, default_order, read, series_of

KINDS = ("measured", "interpolated", "wide interpolation", "chord from base", "not reached")  # weakest last
WITH_INTERVAL = ("measured", "interpolated", "wide interpolation", "chord from base")  # a value and its interval
COMPARED = ("measured", "interpolated")  # the kinds a difference of two methods is taken between


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


def seed_cells(rows: list[dict], val: list[dict], store: RecordStore | None, budgets: Sequence[float],
               resamples: int = RESAMPLES, seed: int = SEED, wide_ratio: float = WIDE_RATIO) -> dict[tuple, dict]:
    """One run: {(eval dataset, family, training dataset, algorithm): cell}. A cell holds per
    budget ``kinds``, ``values`` (test), ``from``, the validation reading (``val_values``,
    ``val_se``), the series it is read on and how that series was chosen (``choices``), and (with
    per-sample records) ``draws`` [resamples x budgets] (nan where the budget is not reached);
    the base's value and draws, ``max_kl`` (the largest placement KL of its series),
    ``selected_on`` (where the series were placed: validation, or test without validation rows);
    and the test-selected reading in ``test_values`` / ``test_draws``."""
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
        for (train, algo), ms in methods.items():
            vb = base_val.get((fam, train))
            val_of = vals.get((fam, train, algo), {})
            vdraws = None
            if vb is not None and val_of and store is not None:
                vrows = [vb] + list(val_of.values())
                d, _ = _draws(vrows, metric_of(vb), store, resamples, seed)
                vdraws = None if d is None else {id(r): d[j][0] for j, r in enumerate(vrows)}
            cell = _cell(base, ms, m, budgets, val_of, vb, draws, index, vdraws, wide_ratio)
            cell["prompts"] = prompts
            out[(eds, fam, train, algo)] = cell
    return out


class _Series:
    """One series of a method (its rows by strength, the base model first) with each point's test
    and placement (validation) figures."""

    def __init__(self, key, base: dict, rows: list[dict], m: str, val_of: dict, base_val: dict | None):
        self.key = key
        self.rows = rows
        vm = metric_of(base_val) if base_val is not None else m
        self.vals = [base_val] + [val_of.get(_key(r)) for r in rows] if base_val is not None else None
        self.test_kl = [0.0] + [float(r["kl"]) for r in rows]
        self.test = [float(base[m])] + [float(r[m]) for r in rows]
        self.stderr = [_f(base.get(f"{m}_stderr"))] + [_f(r.get(f"{m}_stderr")) for r in rows]
        if self.vals is not None:
            self.place_kl = [0.0] + [_f(v.get("kl")) if v is not None else math.nan for v in self.vals[1:]]
            self.val = [float(base_val[vm])] + [_f(v.get(vm)) if v is not None else math.nan for v in self.vals[1:]]
            self.val_se = [_f(base_val.get(f"{vm}_stderr"))] + [_f(v.get(f"{vm}_stderr")) if v is not None
                                                                 else math.nan for v in self.vals[1:]]
        else:
            self.place_kl, self.val, self.val_se = self.test_kl, self.test, self.stderr
        self.names = ["base"] + [label(r) for r in rows]

    def name(self) -> str:
        rnd, arm = self.key
        return " ".join(x for x in (None if self.rows and self.rows[0].get("control") else f"r{rnd}", arm) if x) \
            or self.rows[0]["algorithm"]

    def source(self, rd: Reading) -> str:
        if rd.lo == rd.hi:
            return self.names[rd.hi]
        return f"{self.names[rd.lo]} .. {self.names[rd.hi]}"

    def end(self) -> tuple[float, str]:
        """The series' largest placement KL and the point that has it."""
        i = max(range(len(self.place_kl)), key=lambda j: -1.0 if math.isnan(self.place_kl[j]) else self.place_kl[j])
        return float(self.place_kl[i]), self.names[i]

    def se_at(self, rd: Reading, draws: dict | None) -> float:
        """The validation value's standard error at ``rd``: from the validation draws, else the rows'
        stderr (the two points taken as independent)."""
        if draws is not None and self.vals is not None:
            d = self.draws_at(rd, draws)
            if d is not None:
                return float(np.nanstd(d, ddof=1))
        a, b = self.val_se[rd.lo], self.val_se[rd.hi]
        if rd.lo == rd.hi:
            return a
        return math.sqrt(((1 - rd.w) * a) ** 2 + (rd.w * b) ** 2)

    def draws_at(self, rd: Reading, draws: dict) -> np.ndarray | None:
        """The validation value at ``rd`` in every validation draw (the weight fixed)."""
        lo, hi = self.vals[rd.lo], self.vals[rd.hi]
        if id(lo) not in draws or id(hi) not in draws:
            return None
        return (1 - rd.w) * np.asarray(draws[id(lo)]) + rd.w * np.asarray(draws[id(hi)])


def _f(x) -> float:
    return math.nan if x is None else float(x)


def _cell(base: dict, ms: list[dict], m: str, budgets: list[float], val_of: dict, base_val: dict | None,
          draws, index: dict, vdraws: dict | None, wide_ratio: float = WIDE_RATIO) -> dict:
    placed = base_val is not None and any(v.get("kl") is not None for v in val_of.values())
    if placed:  # a row validation never evaluated cannot be placed: left out of its series
        ms = [r for r in ms if val_of.get(_key(r)) is not None and val_of[_key(r)].get("kl") is not None]
    series = {k: _Series(k, base, rs, m, val_of, base_val if placed else None) for k, rs in series_of(ms).items()}
    order = default_order(series)
    base_draws = draws[0][0] if draws is not None else None
    top = max((s.end()[0] for s in series.values()), default=0.0)
    cell = {"metric": m, "base": float(base[m]), "base_draws": base_draws, "selected_on": "validation" if placed else "test",
            "frontier": [label(r) for r in series[order[0]].rows] if order else [], "max_kl": top,
            "method_max_kl": max([0.0] + [float(r["kl"]) for r in ms]), "kinds": [], "values": [], "from": [],
            "brackets": [], "test_kls": [], "val_values": [], "val_se": [], "choices": [], "series": [],
            "ends": {s.name(): s.end() for s in series.values()}}
    # a best-of-n control: how well its scorer ranks the validation pool (the test pool's without one)
    on_val = [v for v in val_of.values() if v.get("scorer_agreement") is not None]
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
    chosen: list = []
    for b in budgets:
        readings = {k: read(s.place_kl, b, wide_ratio) for k, s in series.items()}
        pick, choice = _choose(series, readings, order, vdraws if placed else None)
        chosen.append(pick)
        cell["choices"].append(choice)
        if pick is None:
            for key in ("values", "from", "brackets", "test_kls", "val_values", "val_se", "series"):
                cell[key].append(None)
            cell["kinds"].append("not reached")
            continue
        s, rd = series[pick], readings[pick]
        cell["kinds"].append(rd.kind)
        cell["values"].append(rd.at(s.test))
        cell["test_kls"].append(rd.at(s.test_kl))
        cell["from"].append(s.source(rd))
        cell["series"].append(s.name())
        cell["brackets"].append(None if rd.lo == rd.hi else [round(s.place_kl[rd.lo], 6), round(s.place_kl[rd.hi], 6)])
        cell["val_values"].append(rd.at(s.val))
        cell["val_se"].append(s.se_at(rd, vdraws if placed else None))
    if draws is not None:
        d = np.full((len(base_draws), len(budgets)), np.nan)
        for bi, pick in enumerate(chosen):
            if pick is None:
                continue
            s, rd = series[pick], read(series[pick].place_kl, budgets[bi], wide_ratio)
            pts = [base_draws] + [draws[index[id(r)]][0] for r in s.rows]
            d[:, bi] = (1 - rd.w) * np.asarray(pts[rd.lo]) + rd.w * np.asarray(pts[rd.hi])
        cell["draws"] = d
        td = np.full(d.shape, np.nan)
        kd = {id(r): draws[index[id(r)]][1] for r in ms}
        vd = {id(r): draws[index[id(r)]][0] for r in ms}
        for j in range(d.shape[0]):
            pts_j = [(0.0, base_draws[j])] + [(kd[id(r)][j], vd[id(r)][j]) for r in ms]
            for bi, b in enumerate(budgets):
                td[j, bi] = _nan(value_at(pts_j, b))
        cell["test_draws"] = td
    return cell


Z_CHOICE = 1.96  # a series is preferred to the default only when it beats it by this many standard errors


def _choose(series: dict, readings: dict, order: list, vdraws: dict | None) -> tuple:
    """(the series a budget is read on, how it was chosen). The default is the first series in
    ``order`` (the latest round, then the arms in their stated order) that reaches the budget;
    another that reaches it replaces it only where its validation value at the budget beats the
    default's by more than ``Z_CHOICE`` standard errors of their difference (paired over the
    validation prompts where their samples are saved). ``resolution``: the smallest difference
    that validation could tell apart, Z_CHOICE x that standard error."""
    reach = [k for k in order if readings[k].reached]
    if not reach:
        return None, None
    default = reach[0]
    if len(reach) == 1:
        return default, None
    d0 = series[default]
    v0 = readings[default].at(d0.val)
    others, best, best_z = [], default, 0.0
    for k in reach[1:]:
        s, rd = series[k], readings[k]
        diff = rd.at(s.val) - v0
        se = math.nan
        if vdraws is not None and s.vals is not None:
            a, b0 = s.draws_at(rd, vdraws), d0.draws_at(readings[default], vdraws)
            if a is not None and b0 is not None:
                se = float(np.nanstd(a - b0, ddof=1))
        if math.isnan(se):
            se = math.hypot(s.se_at(rd, None), d0.se_at(readings[default], None))
        others.append({"series": s.name(), "diff": diff, "se": se})
        z = diff / se if se and not math.isnan(se) else 0.0
        if z > Z_CHOICE and z > best_z:
            best, best_z = k, z
    ses = [o["se"] for o in others if not math.isnan(o["se"])]
    return best, {"default": d0.name(), "chosen": series[best].name(), "others": others,
                  "resolution": Z_CHOICE * max(ses) if ses else None}


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
            # the validation reading of the point each seed read (its value and standard error), the
            # test KL there, and how each seed chose among its rounds and arms
            e["validation"] = [None if c["val_values"][bi] is None else
                               {"value": c["val_values"][bi], "se": c["val_se"][bi]} for c in cells]
            e["test_kl"] = [c["test_kls"][bi] for c in cells]
            e["series"] = [c["series"][bi] for c in cells]
            e["choice"] = [c["choices"][bi] for c in cells]
            e["ends"] = [c.get("ends") or {} for c in cells]
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
                chance = [e["algorithm"] for e in (ea, eb) if (e.get("scorer") or {}).get("chance")]
                if chance:  # a control whose scorer ranks at chance loses by construction: no bar to beat
                    d["left_out"] = f"{chance[0]}'s scorer ranks at chance"
                elif ea["kind"] in COMPARED and eb["kind"] in COMPARED:
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
         "not reached": "not reached"}


def cell_reason(e: dict) -> str:
    """Why a headline cell is what it is, in words (the cell itself shows its value and a mark)."""
    kind = e.get("kind") or ("measured" if e["reached"] else "not reached")
    who = f"{e['algorithm']}: "  # no budget: the cells a reason holds for share its note
    searched = "temperature" if e["algorithm"] == "control: temperature" else "η"
    stopped = f"; {searched} search stopped by {' / '.join(e['stopped_by'])}" if e.get("stopped_by") else ""
    spans = [x for x in e.get("bracket") or [] if x]
    on = "validation " if e.get("selected_on") == "validation" else ""
    span = f"{on}KL {min(x[0] for x in spans):.3g} and {max(x[1] for x in spans):.3g}" if spans else ""
    if kind == "not reached":
        ends = [max(d.values(), key=lambda t: t[0]) for d in e.get("ends") or [] if d]
        end = (f"its series end at {on}KL {max(t[0] for t in ends):.3g} ({max(ends, key=lambda t: t[0])[1]})"
               if ends else f"its series end at {on}KL {max(e['max_kl']):.3g}")
        seeds = f"; {e['seeds_reaching']} of {e['seeds']} seeds reach it" if e["seeds"] > 1 and e["seeds_reaching"] else ""
        return f"{who}not reached: {end}{seeds}{stopped}"
    if kind == "chord from base":
        first = f" (at {on}KL {min(x[1] for x in spans):.3g})" if spans else ""
        return (f"{who}chord from base: between the base model and its series' first point{first}, a line no "
                f"point between them measured{stopped}")
    if kind == "wide interpolation":
        return (f"{who}wide interpolation" + (f" between points at {span}" if span else "")
                + ", further apart than eval.wide_ratio: a line across a stretch no point measured")
    if kind == "interpolated":
        return f"{who}interpolated" + (f" between points at {span}" if span else " between two points of its series")
    return ""


def validation_note(es: list[dict]) -> str | None:
    """One method's validation reading at every budget it reaches (the value its series reads
    there and that value's standard error, the first seed's where several): the noise each
    placed point carries on validation."""
    parts = []
    for e in sorted(es, key=lambda x: x["kl_budget"]):
        v = next((x for x in e.get("validation") or [] if x), None)
        if v and _finite(v.get("value")):
            se = f" ± {v['se']:.3f}" if _finite(v.get("se")) else ""
            parts.append(f"{e['kl_budget']:g}: {v['value']:.3f}{se}")
    if not parts or es[0].get("selected_on") != "validation":
        return None
    return f"{es[0]['algorithm']}: on validation, at KL " + "; ".join(parts) + " (± its standard error)"


def choice_note(es: list[dict]) -> str | None:
    """How one method's budgets were read where more than one of its series (rounds, arms) reached
    them: the default, what replaced it and the differences validation saw, with the smallest
    difference it could tell apart."""
    made = [(e, c) for e in sorted(es, key=lambda x: x["kl_budget"]) for c in e.get("choice") or [] if c]
    if not made:
        return None
    if all(abs(o["diff"]) < 1e-12 and (not _finite(o.get("se")) or o["se"] < 1e-12) for _, c in made for o in c["others"]):
        return (f"{es[0]['algorithm']}: its rounds or arms read the same on validation where several reach a budget "
                f"(the same samples); the latest round is read")
    moved = [f"{e['kl_budget']:g} ({c['chosen']} over {c['default']}: {_diff(c, c['chosen'])})" for e, c in made
             if c["chosen"] != c["default"]]
    kept = [f"{e['kl_budget']:g} ({'; '.join(o['series'] + ' ' + _diff(c, o['series']) for o in c['others'])})"
            for e, c in made if c["chosen"] == c["default"]]
    res = [c["resolution"] for _, c in made if _finite(c.get("resolution"))]
    text = (f"{es[0]['algorithm']}: where several of its rounds or arms reach a budget, the latest round (then "
            f"the first arm) is read unless another beats it on validation by more than {Z_CHOICE:g} standard "
            f"errors of their difference")
    if res:
        text += f" (validation told apart differences above {min(res):.3f} to {max(res):.3f} here)"
    if kept:
        text += "; kept at KL " + ", ".join(kept)
    if moved:
        text += "; replaced at KL " + ", ".join(moved)
    return text


def _diff(c: dict, name: str) -> str:
    o = next((o for o in c["others"] if o["series"] == name), None)
    if o is None:
        return ""
    se = f" ± {o['se']:.3f}" if _finite(o.get("se")) else ""
    return f"{o['diff']:+.3f}{se}"


def _cell_text(e: dict, what: str = "value", notes: Notes | None = None, extra: Sequence[str] = ()) -> str:
    """A headline cell: its value, its interval where it has one, and a short mark with the number
    of its note (``notes``); without a collector the reason follows the mark in parentheses.
    ``extra``: the method's own notes (its validation reading, its choices), cited by each cell."""
    kind = e.get("kind") or ("measured" if e["reached"] else "not reached")
    signed = what == "gain"
    f = (lambda x: f"{x:+.3f}") if signed else (lambda x: f"{x:.3f}")
    reasons = [cell_reason(e)]
    share = e.get("draws_reaching")
    if kind in WITH_INTERVAL and share is not None and share < 1:
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
    if kind != "not reached":
        reasons += list(extra)
    reasons = [r for r in reasons if r]
    mark = MARKS.get(kind, "") + (" chance scorer" if sc and sc.get("chance") and kind != "not reached" else "")
    mark = mark.strip()
    if kind == "not reached":
        text = mark
    else:
        text = f(e[what])
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
        own = {a: [n for n in (validation_note([e for e in es if e["algorithm"] == a]),
                               choice_note([e for e in es if e["algorithm"] == a])) if n] for a in algos}
        tab += [[name[a]] + [_cell_text(at[(a, b)], notes=notes, extra=own[a]) if (a, b) in at else ""
                             for b in budgets] for a in algos]
        gains = [[name[a]] + [_cell_text(at[(a, b)], "gain", notes, own[a]) if (a, b) in at else "" for b in budgets]
                 for a in algos]
        on = sorted({e.get("selected_on", "test") for e in es})
        where = {"validation": "validation KL (each series read where its validation KL reaches the budget)",
                 "test": "test KL (no validation rows)"}
        lines += [f"#### {title}: {es[0]['metric']} at equal KL" + (f", mean of {seeds} seeds" if seeds > 1 else ""),
                  "", f"Points placed on: {'; '.join(where.get(o, o) for o in on)}.", "", _md(head, tab), "",
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
            "test_selected", "bracket", "stopped_by", "scorer", "validation", "test_kl", "series", "choice", "ends")
    return [{k: e[k] for k in keep if k in e} for e in cells]
