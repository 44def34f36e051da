"""The KL-matched headline (pita/report/matched.py), label quality (pita/report/labels.py) and their keys.

Frontiers are built by hand here: points (KL, metric) whose interpolated values at each budget
are worked out on paper, a method that never reaches a budget, and two seeds pooled.
"""

from __future__ import annotations

import math

import pytest

from helpers import cli
from pita.report.labels import NEAR_TIE_P, gap_quality
from pita.report.matched import envelope, matched_cells, matched_tables, value_at


def test_the_frontier_keeps_the_points_no_cheaper_point_beats():
    pts = [(0.0, 0.30), (0.2, 0.28), (0.1, 0.35), (0.4, 0.50), (0.3, 0.36), (0.9, 0.45)]
    assert envelope(pts) == [(0.0, 0.30), (0.1, 0.35), (0.3, 0.36), (0.4, 0.50)]
    assert envelope([(0.0, 0.3), (0.0, 0.4), (float("nan"), 9.0)]) == [(0.0, 0.4)]


def test_values_are_interpolated_along_the_frontier_and_never_extrapolated():
    pts = [(0.0, 0.30), (0.1, 0.35), (0.2, 0.28), (0.4, 0.50), (0.9, 0.45)]
    assert value_at(pts, 0.05) == pytest.approx(0.325)            # halfway from base to the first point
    assert value_at(pts, 0.25) == pytest.approx(0.35 + 0.15 * 0.5)  # 0.2's point is below the frontier
    assert value_at(pts, 0.4) == pytest.approx(0.50)
    assert value_at(pts, 0.6) == pytest.approx(0.50)              # past the best point: its value, not more
    assert value_at(pts, 0.9) == pytest.approx(0.50)
    assert value_at(pts, 1.0) is None                              # beyond the largest KL: not reached
    assert value_at([(0.0, 0.3)], 0.05) is None


def _rows(seed_shift: float = 0.0) -> list[dict]:
    base = {"algorithm": "base", "family": "tiny", "train_dataset": "arith", "eval_dataset": "arith", "round": 0,
            "eta": 0.0, "pass@1": 0.30 + seed_shift, "kl": 0.0}
    out = [base]
    for eta, kl, v in ((0.0, 0.0, 0.30), (1.0, 0.04, 0.34), (2.0, 0.2, 0.42)):
        out.append({**base, "algorithm": "PITA", "eta": eta, "kl": kl, "pass@1": v + seed_shift})
    for rnd, kl, v in ((0, 0.3, 0.33), (1, 0.6, 0.36)):
        out.append({**base, "algorithm": "DPO", "round": rnd, "kl": kl, "pass@1": v + seed_shift})
    return out


def test_cells_per_method_and_budget_and_two_seeds_pooled():
    budgets = [0.1, 0.5]
    one = {(c["algorithm"], c["kl_budget"]): c for c in matched_cells([(_rows(), None)], budgets)}
    assert one[("PITA", 0.1)]["value"] == pytest.approx(0.34 + (0.42 - 0.34) * (0.06 / 0.16))
    assert one[("PITA", 0.1)]["from"] == ["r0 η=1 .. r0 η=2"]
    assert one[("PITA", 0.5)]["reached"] is False and one[("PITA", 0.5)]["value"] is None
    assert one[("DPO", 0.1)]["value"] == pytest.approx(0.30 + 0.03 / 3)   # base to round 0
    assert one[("DPO", 0.5)]["value"] == pytest.approx(0.33 + 0.03 * 2 / 3)
    assert one[("DPO", 0.5)]["gain"] == pytest.approx(0.05)
    assert one[("DPO", 0.1)]["ci_lo"] is None  # no per-sample records: no interval, never a made-up one
    # two seeds: the mean of the seeds' values; a budget only one seed reaches is not reached
    late = [dict(r, kl=r["kl"] * 3) if r["algorithm"] == "PITA" else r for r in _rows(0.1)]
    two = {(c["algorithm"], c["kl_budget"]): c for c in matched_cells([(_rows(), None), (late, None)], budgets)}
    assert two[("DPO", 0.5)]["value"] == pytest.approx(one[("DPO", 0.5)]["value"] + 0.05)
    assert two[("DPO", 0.5)]["gain"] == pytest.approx(0.05)
    assert two[("PITA", 0.5)]["reached"] is False and two[("PITA", 0.5)]["seeds_reaching"] == 1
    text = "\n".join(matched_tables(list(two.values()), ["PITA", "DPO"]))
    assert "mean of 2 seeds" in text and "not reached (max KL 0.6; 1/2 seeds)" in text


class Records:
    """A RecordStore stand-in: per (eval job, eta) the per-sample records of that row."""

    def __init__(self, recs: dict):
        self.recs = recs

    def records(self, job, eta):
        return self.recs.get((job, float(eta)))


def _sampled(rows: list[dict], n_prompts: int = 40) -> tuple[list[dict], Records]:
    """Rows with per-sample records whose means are the rows' values (2 samples a prompt)."""
    import random

    rng = random.Random(0)
    store = {}
    for i, r in enumerate(rows):
        r["eval_job"] = f"job{i}"
        recs, p, kl = [], r["pass@1"], r["kl"]
        correct = [k < round(p * 2 * n_prompts) for k in range(2 * n_prompts)]
        rng.shuffle(correct)
        for k in range(2 * n_prompts):
            recs.append({"id": f"q{k // 2}", "sample": k % 2, "correct": correct[k], "logp": 0.0, "logp_ref": 0.0,
                         "kl_path": kl * (0.5 + rng.random())})
        got = sum(x["kl_path"] for x in recs) / len(recs)
        for x in recs:  # the row's KL exactly
            x["kl_path"] *= kl / got if got else 0.0
        r["pass@1"] = sum(correct) / len(correct)
        store[(r["eval_job"], float(r["eta"]))] = recs
    return rows, Records(store)


def test_intervals_cover_the_value_and_the_gain_is_paired():
    rows, store = _sampled(_rows())
    cells = matched_cells([(rows, store)], [0.1, 0.5], resamples=300)
    for c in cells:
        if c["reached"]:
            assert c["ci_lo"] <= c["value"] + 1e-9 and c["value"] - 1e-9 <= c["ci_hi"]
            assert c["gain_ci_lo"] <= c["gain"] + 1e-9 and c["gain"] - 1e-9 <= c["gain_ci_hi"]
            assert 0 < c["draws_reaching"] <= 1
    # a method identical to the base model gains exactly 0 in every draw
    same = [r for r in rows if r["algorithm"] == "base"]
    same.append({**same[0], "algorithm": "PITA", "eta": 1.0, "kl": 0.3})
    store.recs[(same[1]["eval_job"], 1.0)] = [dict(x, kl_path=0.3) for x in store.recs[(same[0]["eval_job"], 0.0)]]
    [c] = [c for c in matched_cells([(same, store)], [0.1], resamples=100) if c["algorithm"] == "PITA"]
    assert (c["gain"], c["gain_ci_lo"], c["gain_ci_hi"]) == (0.0, 0.0, 0.0)


def test_label_quality_figures_by_hand():
    beta = 1.0
    q = gap_quality([0.0, 0.0, 0.1, 0.3, 2.0], [False, False, True, False, False], beta)
    near = math.log(NEAR_TIE_P / (1 - NEAR_TIE_P))  # 0.2007: 0.1 is a near tie, 0.3 is not
    assert 0.1 < near < 0.3
    assert (q["pairs"], q["ties"], q["near_ties"], q["informative"]) == (5, 0.4, 0.2, 0.4)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert q["agreement"] == pytest.approx((0.5 + 0.5 + sig(0.1) + sig(0.3) + sig(2.0)) / 5)
    assert q["against_reward"] == 0.2 and q["median_gap"] == 0.1
    assert gap_quality([], None, 1.0) == {"pairs": 0}


@pytest.mark.parametrize("value,bad", [("[0.1,0]", "0"), ("[-0.5]", "-0.5"), ("[]", "empty")])
def test_a_kl_budget_that_is_not_positive_exits_2_naming_the_key(tmp_path, value, bad):
    r = cli(["experiment.name=kb", f"eval.kl_budgets={value}"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "eval.kl_budgets=" in r.stderr and "must be a finite number of nats per sequence > 0" in r.stderr
    assert bad in r.stderr.split("eval.kl_budgets=")[1]
    assert not (tmp_path / "kb").exists()
