"""The value-guided methods' eta, searched on the validation prompts until it brackets every KL budget.

A guided policy's KL grows with eta, and eta costs evaluations only (no training). A fixed grid
(``algos.<A>.etas``) may put the first row past the smallest budgets (every cell below it a chord
from the base model), end below the largest ("not reached" read as a result), or leave two rows
far apart in KL around a budget (a wide interpolation). After a round's validation evaluation,
``eval.eta_search`` (job ``<prefix>.r<r>.eta_search``) evaluates new etas on the same validation
prompts, ``eval.eta_search_steps`` rounds at most, each round adding for every budget b that no
row measures (a row within 10% of b):

    no row at or above b      2 x the largest eta (stopped above ``eval.eta_max``)
    no row at or below b      the smallest eta / 2 (stopped below ``eval.eta_min``)
    rows around b more than   the geometric mean of their etas (stopped when it is one of them:
    4x apart in KL            the KL jumps between two adjacent etas)

The job's validation rows join the round's (the frontier and eta are chosen on all of them), and
the test evaluation ``<prefix>.r<r>.eval-search`` samples the etas it added (none: nothing). A
budget the search could not bracket keeps the reason (``eta_search_stopped``), which the
equal-KL table prints beside "not reached".

The temperature control is searched the same way (``coordinate="temperature"``): its rows are the
base model sampled at temperatures T below the evaluation's T0, and its KL grows with the
sharpening s = T0 / T - 1, which takes eta's place above (doubled, halved, geometric means), from
``eval.control_temperatures`` down to ``eval.control_temperature_min``.
"""

from __future__ import annotations

import math

from pita.core.errors import JobError
from pita.core.job import add_kind_module, job_kind

add_kind_module("pita.eval.eta_search")

TOLERANCE = 0.1  # a row within 10% of a budget measures it (pita.report.matched.MEASURED_TOLERANCE)
WIDE = 4.0  # rows more than 4x apart in KL around a budget: a wide interpolation (eval.wide_ratio)


def check(ev) -> list[str]:
    """Problems with the ``eval`` keys of the eta search."""
    p = []
    steps, lo, hi = ev.eta_search_steps, ev.eta_min, ev.eta_max
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0):
        p.append(f"eval.eta_search_steps={steps!r} must be an integer >= 0 (rounds of new etas searched on the "
                 f"validation prompts; 0: no search)")
    number = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (lo, hi))
    w = ev.get("wide_ratio", WIDE)
    if not (isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 1):
        p.append(f"eval.wide_ratio={w!r} must be a number > 1 (how far apart in KL two rows may be for a value "
                 f"between them to count as interpolated), e.g. eval.wide_ratio=4")
    if not (number and 0 < lo < hi):
        p.append(f"eval.eta_min/eta_max={lo!r}/{hi!r} must satisfy 0 < eval.eta_min < eval.eta_max (the eta "
                 f"search's limits), e.g. eval.eta_min=0.0625 eval.eta_max=64")
    return p


def _key(eta: float) -> float:
    return float(f"{float(eta):.6g}")


def next_etas(points: list[tuple[float, float]], budgets: list[float], eta_min: float, eta_max: float,
              tried: set | None = None, wide: float = WIDE, show=None,
              limits: tuple[str, str] | None = None) -> tuple[list[float], dict[str, str]]:
    """(new etas to evaluate, {budget: why it cannot be bracketed}) from the guided rows measured
    so far, ``points`` = [(eta, validation KL)] with eta > 0. ``tried``: etas evaluated already.
    ``show`` (how a point is named in a reason, default ``η=<eta>``) and ``limits`` (the keys of
    the two limits, default eval.eta_min and eval.eta_max) serve another coordinate (a
    temperature's sharpening, :class:`Sharpening`)."""
    show = show or (lambda e: f"η={e:g}")
    lo_key, hi_key = limits or (f"eval.eta_min={eta_min:g}", f"eval.eta_max={eta_max:g}")
    pts = sorted((float(e), float(k)) for e, k in points if e > 0 and k is not None and not math.isnan(k))
    tried = {_key(e) for e in (tried or set())} | {_key(e) for e, _ in pts}
    new: list[float] = []
    stopped: dict[str, str] = {}
    if not pts:
        return [], {}
    for b in sorted(float(x) for x in budgets):
        if any(abs(k - b) <= TOLERANCE * b for _e, k in pts):
            continue
        above = [(e, k) for e, k in pts if k >= b]
        below = [(e, k) for e, k in pts if k <= b]
        if not above:
            e = 2 * max(e for e, _ in pts)
            why = f"{hi_key} ({show(max(e for e, _ in pts))} reaches KL {max(k for _, k in pts):.3g})"
            ok = e <= eta_max * (1 + 1e-9)
        elif not below:
            e = min(e for e, _ in pts) / 2
            why = f"{lo_key} ({show(min(e for e, _ in pts))} is already at KL {min(k for _, k in pts):.3g})"
            ok = e >= eta_min * (1 - 1e-9)
        else:
            (e0, k0), (e1, k1) = max(below, key=lambda p: p[1]), min(above, key=lambda p: p[1])
            if k1 <= wide * max(k0, 1e-12):
                continue
            e = math.sqrt(e0 * e1)
            why = f"the KL jumps from {k0:.3g} at {show(e0)} to {k1:.3g} at {show(e1)}"
            ok = _key(e) not in (_key(e0), _key(e1)) and abs(math.log(e1 / e0)) > 0.05
        if not ok:
            stopped[f"{b:g}"] = why
        elif _key(e) not in tried and _key(e) not in {_key(x) for x in new}:
            new.append(_key(e))
    return sorted(new), stopped


class Eta:
    """The guided methods' coordinate: eta itself."""

    def __init__(self, p: dict):
        self.lo, self.hi = float(p["eta_min"]), float(p["eta_max"])
        self.limits = None
        self.what = "eta"

    def to_x(self, eta: float) -> float:
        return float(eta)

    def from_x(self, x: float) -> float:
        return float(x)

    def show(self, x: float) -> str:
        return f"η={x:g}"


class Sharpening:
    """The temperature control's coordinate: s = T0 / T - 1 for a row sampled at temperature T
    (T0 the evaluation's), 0 at T0 and growing as T falls, as eta does for a guided method. The
    search runs from the coldest temperature ``t_min`` up to ``t_max`` (just below T0)."""

    def __init__(self, p: dict):
        self.t0, self.t_min, self.t_max = float(p["t_eval"]), float(p["t_min"]), float(p["t_max"])
        self.lo, self.hi = self.to_x(self.t_max), self.to_x(self.t_min)
        self.limits = (f"the control's warmest temperature {self.t_max:g} (below eval.temperature={self.t0:g})",
                       f"eval.control_temperature_min={self.t_min:g}")
        self.what = "temperature"

    def to_x(self, t: float) -> float:
        return self.t0 / float(t) - 1.0

    def from_x(self, x: float) -> float:
        return float(f"{self.t0 / (1.0 + float(x)):.6g}")

    def show(self, x: float) -> str:
        return f"T={self.from_x(x):g}"


def coordinate(p: dict):
    return Sharpening(p) if p.get("coordinate") == "temperature" else Eta(p)


@job_kind("eval.eta_search")
def eta_search(ctx):
    """Evaluate new etas on the validation prompts until the budgets are bracketed (see the
    module); save their per-sample records and return their rows (split validation), ``etas``
    (the ones it added, which the test evaluation samples) and ``stopped``."""
    from pita.datasets.config import DatasetConfig
    from pita.datasets.loading import load_examples
    from pita.eval.jobs import rows_by_eta
    from pita.generation.jobs import prepare, save_records
    from pita.generation.recipes import RUNNERS

    p = ctx.params
    labels, wide = p["labels"], float(p.get("wide_ratio", WIDE))
    c = coordinate(p)
    points = [(c.to_x(r["eta"]), r.get("kl")) for r in ctx.dep_result(p["validation"])["results"]
              if float(r["eta"]) > 0 and c.to_x(r["eta"]) > 0]
    req = dict(p["request"])
    # an OOM retry halves the job's batch_size param, as a shard's: the sampling batch follows it
    req["sampling"] = dict(req["sampling"], batch_size=int(p.get("batch_size", req["sampling"]["batch_size"])))
    ds = DatasetConfig(**req["dataset"])
    examples = load_examples(ds, req["split"])
    lm = scorer = None
    records, out, added = [], [], []
    stopped: dict[str, str] = {}
    search = dict(eta_min=c.lo, eta_max=c.hi, wide=wide, show=c.show, limits=c.limits)
    tried = {x for x, _ in points}
    for step in range(int(p["steps"])):
        new, stopped = next_etas(points, p["budgets"], tried=tried, **search)
        if not new:
            break
        if lm is None:
            lm, scorer = prepare(ctx, req, examples, ds)
        ctx.log.info("%s search, step %d: validation KL %s; evaluating %s", c.what, step + 1,
                     ", ".join(f"{c.show(x)}: {k:.3g}" for x, k in sorted(points)), ", ".join(c.show(x) for x in new))
        values = [c.from_x(x) for x in new]
        got = RUNNERS["eval"](lm, examples, {**req, "etas": values}, scorer)
        records += got
        tried |= set(new)
        added += values
        rows = rows_by_eta(got, labels, p.get("kl_fraction", 1.0))
        missing = set(values) - {float(r["eta"]) for r in rows}
        if missing:
            raise JobError(f"the {c.what} search's evaluation at {min(missing):g} produced no samples")
        if p.get("variant"):
            rows = [{**r, "variant": p["variant"].format(r["eta"])} for r in rows]
        out += rows
        points += [(c.to_x(r["eta"]), r.get("kl")) for r in rows]
    else:
        _new, stopped = next_etas(points, p["budgets"], tried=tried, **search)
        for b in p["budgets"]:
            if f"{float(b):g}" not in stopped and _new and not _bracketed(points, float(b), wide):
                stopped[f"{float(b):g}"] = f"eval.eta_search_steps={p['steps']}"
    if records:
        save_records(ctx, records)
    for r in out:
        r["eta_search_stopped"] = stopped
    ctx.log.info("%s search: added %s; %s", c.what, ", ".join(f"{e:g}" for e in sorted(added)) or f"no {c.what}",
                 "every budget bracketed" if not stopped else
                 "; ".join(f"KL {b}: stopped by {why}" for b, why in stopped.items()))
    return {"labels": labels, "results": sorted(out, key=lambda r: float(r["eta"])), "etas": sorted(added),
            "stopped": stopped, "sequences": getattr(lm, "sequences_generated", 0)}


def _bracketed(points: list[tuple[float, float]], b: float, wide: float = WIDE) -> bool:
    new, stopped = next_etas(points, [b], 1e-12, 1e12, wide=wide)
    return not new and not stopped
