"""A method's ordered series, and where a KL budget falls on one.

    series = series_of(rows)               {(round, arm): rows in order of strength}
    r = read([0.0, 0.04, 0.2, 0.7], 0.1)   Reading("wide interpolation", lo=1, hi=2, w=0.375)

Every method's rows already come in series: a guided method's η (η = 0 is the base model), a
trained baseline's snapshots along its training (the final policy last), the temperature
control's colder and colder temperatures, best-of-n's n. Each series starts at the base model
(KL 0) and, as its strength grows, moves away from it. A budget b is read on a series where the
series' *placement* KL (the validation prompts' KL where they were evaluated) first reaches b:
between the two consecutive points around it, at the weight ``w`` that puts their KLs at b. The
metric is read at that same weight: no metric chooses a point, so a noisy validation metric
cannot pick the luckiest row.

A point within 10% of b measures it (``measured``); b between two points is ``interpolated``,
``wide interpolation`` when their KLs are more than ``WIDE_RATIO`` apart, ``chord from base``
when the lower point is the base model; b beyond the series' last point is ``not reached``
(nothing is extrapolated). Where a series' KL is not monotone in its strength (noise at tiny
KLs), the first crossing counts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

MEASURED_TOLERANCE = 0.1  # a point whose KL is within 10% of b is the measured value at b
WIDE_RATIO = 4.0  # an interpolation between points whose KLs differ by more than this factor is "wide"
TEMPERATURE = "control: temperature"  # pita.eval.controls.TEMPERATURE (its rows' eta holds T)

_SNAPSHOT = re.compile(r"(?:^|\s)at (\d+(?:\.\d+)?)%$")


def snapshot_of(r: dict) -> float | None:
    """The fraction of its training a trained baseline's row was evaluated at (``snapshot``, or
    the ``at 50%`` of its variant in runs that did not record it); None for the final policy."""
    if r.get("snapshot") is not None:
        return float(r["snapshot"])
    m = _SNAPSHOT.search(str(r.get("variant") or ""))
    return float(m.group(1)) / 100 if m else None


def arm_of(r: dict) -> str:
    """The arm of a grid a row belongs to (``lr=1e-05``, ``lr=1e-05 beta=0.3``; "" for none): its
    variant without the snapshot; a control's variant is its setting, a point of its series."""
    if r.get("control"):
        return ""
    if r.get("arm") is not None:
        return str(r["arm"])
    return _SNAPSHOT.sub("", str(r.get("variant") or "")).strip()


def series_key(r: dict) -> tuple[int, str]:
    """(round, arm): the rows of one series."""
    return (0 if r.get("control") else int(r.get("round") or 0)), arm_of(r)


def position(r: dict) -> tuple[float, float]:
    """Where a row stands on its series, by strength: (training fraction, η) for the methods
    (the final policy at 1; a guided method's η), the temperature control colder later (its eta
    holds T), best-of-n by n (its eta holds n)."""
    snap = snapshot_of(r)
    eta = float(r.get("eta") or 0.0)
    return (1.0 if snap is None else snap), (-eta if r.get("algorithm") == TEMPERATURE else eta)


def arm_order(arm: str) -> tuple:
    """Arms in a stated order: by the numbers of their settings, ascending (``lr=1e-05`` before
    ``lr=0.0001``: the scale's own rate first, the larger multiples after), then by name."""
    nums = []
    for part in arm.split():
        _, _, v = part.partition("=")
        try:
            nums.append(float(v))
        except ValueError:
            nums.append(math.inf)
    return tuple(nums), arm


def series_of(rows: Sequence[dict]) -> dict[tuple[int, str], list[dict]]:
    """{(round, arm): its rows by :func:`position`}."""
    out: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        out.setdefault(series_key(r), []).append(r)
    return {k: sorted(v, key=position) for k, v in out.items()}


def default_order(keys) -> list[tuple[int, str]]:
    """The series in the order a default is taken from: the latest round first (the method as its
    rounds make it), then the arms in :func:`arm_order`."""
    return sorted(keys, key=lambda k: (-k[0], arm_order(k[1])))


@dataclass
class Reading:
    """Where a budget falls on a series: between points ``lo`` and ``hi`` (indices; 0 is the
    base model) at weight ``w`` (the value is (1 - w) x lo's + w x hi's); ``lo == hi`` for a
    measured point; ``kind`` as the module says."""

    kind: str
    lo: int | None = None
    hi: int | None = None
    w: float = 0.0

    @property
    def reached(self) -> bool:
        return self.kind != "not reached"

    def at(self, values: Sequence[float]) -> float:
        """The series' ``values`` (one per point, the base first) read here."""
        if not self.reached:
            return math.nan
        return (1.0 - self.w) * float(values[self.lo]) + self.w * float(values[self.hi])


def read(kls: Sequence[float], budget: float, wide_ratio: float = WIDE_RATIO,
         tolerance: float = MEASURED_TOLERANCE) -> Reading:
    """The budget on a series whose points (the base model first, at KL 0) have placement KLs
    ``kls``; see the module. A nan KL (a point not evaluated there) is passed over."""
    b = float(budget)
    pts = [(i, float(k)) for i, k in enumerate(kls) if i == 0 or not math.isnan(float(k))]
    near = lambda i, k: i > 0 and abs(k - b) <= tolerance * b  # noqa: E731
    for (i0, k0), (i1, k1) in zip(pts, pts[1:]):
        if k1 < b:
            continue
        close = [(abs(k - b), i) for i, k in ((i1, k1), (i0, k0)) if near(i, k)]
        if close:
            i = min(close)[1]
            return Reading("measured", i, i, 1.0)
        if k0 >= b:  # the base model's KL 0 is below any budget: only a non-monotone series gets here
            continue
        w = (b - k0) / (k1 - k0)
        kind = ("chord from base" if i0 == 0 else
                "wide interpolation" if k1 > wide_ratio * max(k0, 1e-12) else "interpolated")
        return Reading(kind, i0, i1, w)
    below = [(abs(k - b), i) for i, k in pts if near(i, k)]
    if below:
        i = min(below)[1]
        return Reading("measured", i, i, 1.0)
    return Reading("not reached")
