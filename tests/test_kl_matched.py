"""The KL-matched headline (pita/report/matched.py), label quality (pita/report/labels.py) and their keys.

Frontiers are built by hand here: points (KL, metric) whose interpolated values at each budget
are worked out on paper, a method that never reaches a budget, and two seeds pooled.
"""

from __future__ import annotations

import math

import pytest

from helpers import cli
from pita.report.labels import NEAR_TIE_P, gap_quality
from pita.report.matched import differences, envelope, matched_cells, matched_tables, value_at


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


BASE = {"algorithm": "base", "family": "tiny", "train_dataset": "arith", "eval_dataset": "arith", "round": 0,
        "eta": 0.0}


def _rows(shift: float = 0.0) -> tuple[list[dict], list[dict]]:
    """(test rows, validation rows). Worked out by hand:

    PITA's one series (round 0), validation (KL, pass@1): base (0, 0.28), η=1 (0.05, 0.33),
    η=2 (0.22, 0.40), η=4 (0.7, 0.31); test: base (0, 0.30), η=1 (0.04, 0.34), η=2 (0.2, 0.42),
    η=4 (0.6, 0.50). η=4 scores less than η=2 on validation; it is still where validation's KL
    places 0.7. DPO: two series, one point each: r0 (validation KL 0.25; test 0.3, 0.25) and r1
    (validation KL 0.5; test 0.6, 0.36). GRPO r0: validation KL 0.3, test (0.3, 0.26), below the base."""
    base = {**BASE, "pass@1": 0.30 + shift, "kl": 0.0}
    test, val = [base], [{**base, "pass@1": 0.28 + shift, "split": "validation"}]
    test.append({**base, "algorithm": "PITA", "reused_from": "base.tiny.arith.eval.merge"})  # η 0: the base itself
    for eta, kl, v, vkl, vv in ((1.0, 0.04, 0.34, 0.05, 0.33), (2.0, 0.2, 0.42, 0.22, 0.40), (4.0, 0.6, 0.50, 0.7, 0.31)):
        test.append({**base, "algorithm": "PITA", "eta": eta, "kl": kl, "pass@1": v + shift})
        val.append({**base, "algorithm": "PITA", "eta": eta, "kl": vkl, "pass@1": vv + shift, "split": "validation"})
    for algo, rnd, kl, v, vkl, vv in (("DPO", 0, 0.3, 0.25, 0.25, 0.26), ("DPO", 1, 0.6, 0.36, 0.5, 0.27),
                                      ("GRPO", 0, 0.3, 0.26, 0.3, 0.35)):
        test.append({**base, "algorithm": algo, "round": rnd, "kl": kl, "pass@1": v + shift})
        val.append({**base, "algorithm": algo, "round": rnd, "kl": vkl, "pass@1": vv + shift, "split": "validation"})
    return test, val


def test_every_cell_is_read_where_validation_kl_places_the_budget_on_its_series():
    test, val = _rows()
    budgets = [0.02, 0.04, 0.1, 0.21, 0.3, 0.5, 0.7]
    c = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(test, val, None)], budgets)}
    w = (0.1 - 0.05) / (0.22 - 0.05)
    expect = {  # (kind, test value, from): the weight that puts the validation KLs at the budget, on test
        ("PITA", 0.02): ("chord from base", 0.30 + 0.4 * 0.04, "base .. r0 η=1"),       # 0.02 / 0.05
        ("PITA", 0.04): ("chord from base", 0.30 + 0.8 * 0.04, "base .. r0 η=1"),       # 0.05 is 25% off 0.04
        ("PITA", 0.1): ("wide interpolation", 0.34 + w * 0.08, "r0 η=1 .. r0 η=2"),     # 0.22 / 0.05 > 4
        ("PITA", 0.21): ("measured", 0.42, "r0 η=2"),                                  # 0.22 is within 10%
        ("PITA", 0.3): ("interpolated", 0.42 + 0.08 / 0.48 * 0.08, "r0 η=2 .. r0 η=4"),
        ("PITA", 0.5): ("interpolated", 0.42 + 0.28 / 0.48 * 0.08, "r0 η=2 .. r0 η=4"),
        ("PITA", 0.7): ("measured", 0.50, "r0 η=4"),  # lost on validation's metric, placed by its KL
        ("DPO", 0.02): ("chord from base", 0.30 + 0.04 * 0.06, "base .. r1"),  # both rounds reach: the latest
        ("DPO", 0.3): ("chord from base", 0.30 + 0.6 * 0.06, "base .. r1"),    # r0 ends at 0.25
        ("DPO", 0.5): ("measured", 0.36, "r1"),
        ("DPO", 0.7): ("not reached", None, None),
        ("GRPO", 0.1): ("chord from base", 0.30 - 0.04 / 3, "base .. r0"),
        ("GRPO", 0.3): ("measured", 0.26, "r0"),
    }
    for key, (kind, value, src) in expect.items():
        e = c[key]
        assert (e["kind"], e["from"]) == (kind, [src]), key
        assert e["value"] == (None if value is None else pytest.approx(value)), key
        assert e["selected_on"] == "validation"
    assert c[("GRPO", 0.3)]["gain"] == pytest.approx(-0.04)  # a method that hurts shows it
    assert c[("PITA", 0.1)]["bracket"] == [[0.05, 0.22]] and c[("PITA", 0.3)]["test_kl"] == [pytest.approx(0.2 + 0.4 / 6)]
    [at] = c[("PITA", 0.7)]["validation"]  # the rows carry no stderr here: no standard error
    assert at["value"] == pytest.approx(0.31) and math.isnan(at["se"])
    # eval.wide_ratio: points 4.4x apart are an ordinary interpolation where 5x is allowed
    loose = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(test, val, None)], [0.1], wide_ratio=5.0)}
    assert loose[("PITA", 0.1)]["kind"] == "interpolated"
    # DPO's rounds both reach 0.02: the default (the latest) is read, and the choice is recorded
    [ch] = c[("DPO", 0.02)]["choice"]
    assert (ch["default"], ch["chosen"], [o["series"] for o in ch["others"]]) == ("r1", "r1", ["r0"])
    assert ch["others"][0]["diff"] == pytest.approx((0.28 - 0.08 * 0.02) - (0.28 - 0.04 * 0.01))
    assert c[("DPO", 0.3)]["choice"] == [None]  # one series reaches it: nothing to choose
    # the test-selected reading, kept for comparison: η=4 is on the test envelope
    assert c[("PITA", 0.5)]["test_selected"]["value"] == pytest.approx(0.42 + 0.08 * 0.3 / 0.4)
    text = "\n".join(matched_tables(list(c.values()), ["PITA", "DPO", "GRPO"]))
    assert "| algorithm | at KL = 0.02 |" in text and "Points placed on: validation KL" in text
    # a cell is its value, interval and a short mark; why it is so is a numbered note under the table
    cells = [c.strip() for line in text.splitlines() if line.startswith("| ") for c in line.split("|")[2:-1]]
    assert max(map(len, cells)) <= 40, max(cells, key=len)
    assert "| 0.316 chord (" in text and "| 0.364 wide (" in text
    notes = {line.split(") ", 1)[1]: line.split(")")[0].split("(")[1] for line in text.splitlines()
             if line.startswith("- (")}
    n = notes["DPO: not reached: its series end at validation KL 0.5 (r1)"]
    assert f"| not reached ({n}) |" in text
    n = notes["PITA: wide interpolation between points at validation KL 0.05 and 0.22, further apart than "
              "eval.wide_ratio: a line across a stretch no point measured"]
    assert f"| 0.364 wide ({n}" in text and f"| +0.064 wide ({n}" in text  # the gain cites the same note
    v = next(t for t in notes if t.startswith("PITA: on validation, at KL 0.02: 0.300;"))  # 0.28 + 0.4 x 0.05
    assert "0.7: 0.310" in v and f"({notes[v]})" in text  # each cell cites its method's validation reading
    assert any(t.startswith("DPO: where several of its rounds or arms reach a budget") for t in notes)
    assert "-0.040" in text and "the frontier picked on the test split" in text


def test_a_lucky_validation_row_at_a_small_kl_does_not_hide_the_rest_of_the_series():
    """The demo's sentiment case: validation 24 prompts x 3 samples, where η=0.5 scored 1.131 at KL
    0.007 against the base's 0.487 and every larger η less. The envelope of validation points stopped
    there ("not reached" from KL 0.0078 on); placed by KL, each budget reads the η whose validation
    KL reaches it, and the test values (-0.736 base, +0.239 at η=8, KL 0.32) are read there."""
    base = {**BASE, "train_dataset": "sentiment", "eval_dataset": "sentiment", "mean_reward": -0.736, "kl": 0.0}
    pts = ((0.5, 0.007, 0.008, -0.70, 1.131), (1.0, 0.02, 0.022, -0.55, 0.321), (2.0, 0.15, 0.16, 0.117, 0.646),
           (4.0, 0.22, 0.24, 0.15, 0.321), (8.0, 0.32, 0.33, 0.239, 0.70))
    test = [base] + [{**base, "algorithm": "PITA", "eta": e, "kl": k, "mean_reward": v} for e, k, _vk, v, _vv in pts]
    vb = {**base, "split": "validation", "mean_reward": 0.487}
    val = [vb] + [{**vb, "algorithm": "PITA", "eta": e, "kl": vk, "mean_reward": vv} for e, _k, vk, _v, vv in pts]
    c = {e["kl_budget"]: e for e in matched_cells([(test, val, None)], [0.0078, 0.1, 0.33])}
    assert [c[b]["kind"] for b in (0.0078, 0.1, 0.33)] == ["measured", "wide interpolation", "measured"]
    assert c[0.33]["value"] == pytest.approx(0.239) and c[0.33]["gain"] == pytest.approx(0.975)
    assert c[0.1]["from"] == ["r0 η=1 .. r0 η=2"]


def test_without_validation_rows_the_series_are_placed_on_test_kl_and_say_so():
    test, _ = _rows()
    c = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(test, [], None)], [0.5])}
    assert c[("PITA", 0.5)]["selected_on"] == "test" and c[("PITA", 0.5)]["kind"] == "interpolated"
    assert c[("PITA", 0.5)]["value"] == pytest.approx(0.42 + 0.08 * 0.3 / 0.4)
    assert c[("PITA", 0.5)]["bracket"] == [[0.2, 0.6]]  # 3x apart: an interpolation, with its bracket shown
    text = "\n".join(matched_tables(list(c.values())))
    assert "Points placed on: test KL (no validation rows)." in text
    n = next(line[3] for line in text.splitlines()
             if line.endswith(") PITA: interpolated between points at KL 0.2 and 0.6"))
    assert f"| 0.480 interp. ({n}) |" in text and f"| +0.180 interp. ({n}) |" in text


def test_two_seeds_pool_their_values_and_take_the_weakest_kind():
    budgets = [0.05, 0.3, 1.0]
    one = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(*_rows(), None)], budgets)}
    late_test, late_val = _rows(0.1)
    late_val = [dict(r, kl=r["kl"] * 3) if r["algorithm"] == "PITA" and r.get("kl") else r for r in late_val]
    two = {(e["algorithm"], e["kl_budget"]): e
           for e in matched_cells([(*_rows(), None), (late_test, late_val, None)], budgets)}
    # seed 2's PITA: η=1 at validation KL 0.15, so 0.05 is a chord there: the pooled cell is a chord
    assert two[("PITA", 0.05)]["kinds"] == ["measured", "chord from base"]
    assert two[("PITA", 0.05)]["kind"] == "chord from base"
    assert two[("PITA", 0.05)]["value"] == pytest.approx((0.34 + (0.40 + 0.04 / 3)) / 2)
    assert two[("GRPO", 0.3)]["gain"] == pytest.approx(one[("GRPO", 0.3)]["gain"])
    # seed 1's PITA series ends at 0.7, seed 2's at 2.1: 1.0 is reached by one seed only
    assert two[("PITA", 1.0)]["reached"] is False and two[("PITA", 1.0)]["seeds_reaching"] == 1
    text = "\n".join(matched_tables(list(two.values()), ["PITA", "DPO", "GRPO"]))
    assert "mean of 2 seeds" in text


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


def test_intervals_cover_every_reached_value_and_differences_are_paired_where_measured_or_interpolated():
    test, val = _rows()
    test = [r for r in test if not r.get("reused_from")]
    test, store = _sampled(test)
    cells = matched_cells([(test, val, store)], [0.04, 0.1, 0.3], resamples=300, keep_draws=True)
    for c in cells:
        if c["kind"] != "not reached":  # a chord's too: the test prompts' noise at the weight validation placed
            assert c["ci_lo"] <= c["value"] + 1e-9 and c["value"] - 1e-9 <= c["ci_hi"]
            assert c["gain_ci_lo"] <= c["gain"] + 1e-9 and c["gain"] - 1e-9 <= c["gain_ci_hi"]
        else:
            assert c["ci_lo"] is None and c["gain_ci_lo"] is None
    diffs = differences(cells, ["PITA", "DPO", "GRPO"])
    [d] = [d for d in diffs if (d["a"], d["b"], d["kl_budget"]) == ("PITA", "GRPO", 0.3)]
    at = {(c["algorithm"], c["kl_budget"]): c for c in cells}
    assert (at[("PITA", 0.3)]["kind"], at[("GRPO", 0.3)]["kind"]) == ("interpolated", "measured")
    assert d["diff"] == pytest.approx(at[("PITA", 0.3)]["value"] - at[("GRPO", 0.3)]["value"])
    assert d["ci_lo"] < d["diff"] < d["ci_hi"]
    [d] = [d for d in diffs if (d["a"], d["b"], d["kl_budget"]) == ("PITA", "GRPO", 0.1)]
    assert d["diff"] is None  # GRPO at 0.1 is a chord from base: never compared
    # a method identical to the base model gains exactly 0 in every draw, and so does the difference of
    # two identical methods
    same = [r for r in test if r["algorithm"] == "base"]
    twin = {**same[0], "algorithm": "PITA", "eta": 1.0, "kl": 0.3}
    same += [twin, {**twin, "algorithm": "QSharp"}]
    for r in same[1:]:
        r["eval_job"] = "twin"
    store.recs[("twin", 1.0)] = [dict(x, kl_path=0.3) for x in store.recs[(same[0]["eval_job"], 0.0)]]
    vsame = [{**r, "split": "validation", "pass@1": r["pass@1"] + (0.05 if r["algorithm"] != "base" else 0)}
             for r in same]
    cells = matched_cells([(same, vsame, store)], [0.3], resamples=100, keep_draws=True)
    [c] = [c for c in cells if c["algorithm"] == "PITA"]
    assert c["kind"] == "measured" and (c["gain"], c["gain_ci_lo"], c["gain_ci_hi"]) == (0.0, 0.0, 0.0)
    [d] = differences(cells)
    assert (d["diff"], d["ci_lo"], d["ci_hi"]) == (0.0, 0.0, 0.0)


def test_seeds_pair_by_their_id_and_a_seed_a_method_lacks_is_left_out_of_its_differences():
    """Three seeds given in the order 3, 1, 2; GRPO lacks seed 2. PITA's cell pools all three with
    a seed-level interval; PITA - GRPO pairs seeds 1 and 3 by id (not the runs' positions) and says
    seed 2 was left out; its value and interval are those of the two seeds' differences."""
    from pita.eval.metrics import seed_interval

    runs = {}
    for sid, shift in ((3, 0.06), (1, 0.0), (2, -0.03)):
        test, val = _rows(shift)
        test = [r for r in test if not r.get("reused_from")]
        for r in test + val:  # PITA's eta = 2 at KL 0.28 (test) and 0.308 (validation), where GRPO's round 0 is
            if r["algorithm"] == "PITA":
                r["kl"] = r["kl"] * 1.4
        if sid == 2:
            test = [r for r in test if r["algorithm"] != "GRPO"]
            val = [r for r in val if r["algorithm"] != "GRPO"]
        test, store = _sampled(test)
        runs[sid] = (test, val, store, sid)
    cells = matched_cells(list(runs.values()), [0.3], resamples=200, keep_draws=True)
    c = {e["algorithm"]: e for e in cells}
    assert c["PITA"]["kind"] == c["GRPO"]["kind"] == "measured"
    assert c["PITA"]["seed_ids"] == [3, 1, 2] and c["GRPO"]["seed_ids"] == [3, 1]
    assert "3 seeds (2 df)" in c["PITA"]["interval"] and c["PITA"]["ci_lo"] < c["PITA"]["value"] < c["PITA"]["ci_hi"]
    [d] = [d for d in differences(cells, ["PITA", "GRPO"]) if (d["a"], d["b"]) == ("PITA", "GRPO")]
    assert d["seeds"] == 2 and d["seeds_left_out"] == ["2"]
    pa, pg = c["PITA"]["_seed_values"], c["GRPO"]["_seed_values"]
    by_seed = [pa[0] - pg[0], pa[1] - pg[1]]  # seeds 3 and 1, in both cells' order
    assert d["diff"] == pytest.approx(sum(by_seed) / 2)
    want = seed_interval(by_seed, c["PITA"]["_seed_draws"][:, :2] - c["GRPO"]["_seed_draws"], prompts=40)
    assert (d["ci_lo"], d["ci_hi"]) == pytest.approx((want["lo"], want["hi"]))
    with pytest.raises(ValueError, match="repeat"):
        matched_cells([runs[1], runs[1]], [0.3])


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


def test_a_cell_some_draws_do_not_reach_says_in_what_share_it_did():
    """A share that rounds to 100% is not printed as 100%: one decimal near the top."""
    from pita.report.matched import Notes, _cell_text

    cell = {"kind": "interpolated", "value": 0.4, "ci_lo": 0.3, "ci_hi": 0.5, "draws_reaching": 0.998}
    cell = {**cell, "algorithm": "PITA", "kl_budget": 0.1}
    assert _cell_text(cell).endswith("reached in 99.8% of the bootstrap draws)")
    assert _cell_text({**cell, "draws_reaching": 0.91}).endswith("reached in 91% of the bootstrap draws)")
    assert "reached in" not in _cell_text({**cell, "draws_reaching": 1.0})
    notes = Notes()
    assert _cell_text({**cell, "draws_reaching": 0.91}, notes=notes) == "0.400 [0.300, 0.500] interp. (1)(2)"
    assert notes.lines() == ["(1) PITA: interpolated between two points of its series",
                             "(2) PITA at KL 0.1: reached in 91% of the bootstrap draws"]


def test_a_chance_scorers_cell_says_so_and_whether_it_learned_the_prompts_difficulty_instead():
    from pita.report.matched import _cell_text

    cell = {"kind": "measured", "value": 0.13, "ci_lo": 0.1, "ci_hi": 0.16, "algorithm": "control: best-of-n by value",
            "kl_budget": 1.0, "scorer": {"agreement": 0.395, "se": 0.055, "pairs": 3117, "chance": True,
                                         "on": "validation", "prompts": 0.717}}
    text = _cell_text(cell)
    assert "chance scorer" in text and "no better than chance (agreement with the outcome 0.395 ± 0.055" in text
    assert "orders the prompts by pass rate (0.717): it learned which prompts are hard" in text
    blind = _cell_text({**cell, "scorer": {**cell["scorer"], "prompts": 0.52}})
    assert "chance scorer" in blind and "learned which prompts" not in blind
    assert "chance" not in _cell_text({**cell, "scorer": {**cell["scorer"], "chance": False}})


def test_a_round_replaces_the_default_only_beyond_validations_noise_and_the_resolution_is_said():
    """DPO's two rounds, validation 40 prompts x 2 samples (records saved): r1 (the default, the
    latest round) and r0 both reach KL 0.3 (measured, each its own validation row). Where r0's
    validation pass@1 beats r1's by 0.3 (24 more right answers of 80) it replaces it; where by one
    answer (0.0125, well inside the paired standard error) the default stays. Either way the
    choice keeps the difference, its standard error and the resolution, 1.96 x that error."""
    n = 40

    def recs(ok, kl):
        return [{"id": f"q{k // 2}", "sample": k % 2, "correct": c, "logp": 0.0, "logp_ref": 0.0, "kl_path": kl}
                for k, c in enumerate(ok)]
    base_ok = [k % 3 == 0 for k in range(2 * n)]
    r1_ok = [k % 4 == 0 for k in range(2 * n)]  # 20 of 80
    far = [k % 4 == 0 or k % 4 == 1 or k % 10 == 2 for k in range(2 * n)]  # 44 of 80
    near = list(r1_ok)
    near[1] = True  # one more right answer: 21 of 80
    base = {**BASE, "kl": 0.0, "pass@1": 0.30, "eval_job": "b"}
    test = [base] + [{**base, "algorithm": "DPO", "round": r, "kl": 0.3, "pass@1": v, "eval_job": f"t{r}"}
                     for r, v in ((0, 0.40), (1, 0.35))]
    vb = {**base, "split": "validation", "pass@1": sum(base_ok) / 80, "eval_job": "vb"}

    def cells(r0_ok):
        val = [vb] + [{**vb, "algorithm": "DPO", "round": r, "kl": 0.3, "pass@1": sum(ok) / 80, "eval_job": f"v{r}"}
                      for r, ok in ((0, r0_ok), (1, r1_ok))]
        store = Records({("vb", 0.0): recs(base_ok, 0.0), ("v0", 0.0): recs(r0_ok, 0.3), ("v1", 0.0): recs(r1_ok, 0.3)})
        [e] = [e for e in matched_cells([(test, val, store)], [0.3], resamples=1000) if e["algorithm"] == "DPO"]
        return e
    moved, kept = cells(far), cells(near)
    assert moved["from"] == ["r0"] and moved["value"] == pytest.approx(0.40)
    assert kept["from"] == ["r1"] and kept["value"] == pytest.approx(0.35)
    [m], [k] = moved["choice"], kept["choice"]
    assert (m["default"], m["chosen"], k["chosen"]) == ("r1", "r0", "r1")
    assert m["others"][0]["diff"] == pytest.approx(24 / 80) and k["others"][0]["diff"] == pytest.approx(1 / 80)
    se = k["others"][0]["se"]
    assert 0.005 < se < 0.05 and k["resolution"] == pytest.approx(1.96 * se)
    text = "\n".join(matched_tables([moved]))
    assert "replaced at KL 0.3 (r0 over r1: +0.300 ± " in text and "validation told apart differences above" in text
    assert "kept at KL 0.3 (r0 +0.013 ± " in "\n".join(matched_tables([kept]))


def test_a_series_is_read_where_its_kl_first_reaches_the_budget():
    """By hand, points at KL 0 (base), 0.04, 0.2, 0.7: 0.1 lies 0.06 / 0.16 of the way from 0.04 to
    0.2, more than 4x apart (wide); 0.21 is within 10% of 0.2 (measured); 0.3 between 0.2 and 0.7
    (3.5x: interpolated); 0.02 before the first point (chord); 0.9 beyond the last (not reached);
    0.65 within 10% below the last point measures it. A non-monotone stretch: the first crossing."""
    from pita.report.series import read

    kls = [0.0, 0.04, 0.2, 0.7]
    r = read(kls, 0.1)
    assert (r.kind, r.lo, r.hi) == ("wide interpolation", 1, 2) and r.w == pytest.approx(0.06 / 0.16)
    assert r.at([0.3, 0.34, 0.42, 0.5]) == pytest.approx(0.34 + 0.08 * 0.375)
    assert (read(kls, 0.21).kind, read(kls, 0.21).hi) == ("measured", 2)
    assert read(kls, 0.3).kind == "interpolated" and read(kls, 0.3).w == pytest.approx(0.1 / 0.5)
    assert (read(kls, 0.02).kind, read(kls, 0.02).lo, read(kls, 0.02).w) == ("chord from base", 0, 0.5)
    assert read(kls, 0.9).kind == "not reached" and math.isnan(read(kls, 0.9).at([0, 1, 2, 3]))
    assert (read(kls, 0.75).kind, read(kls, 0.75).hi) == ("measured", 3)  # 0.7 is within 10% of 0.75
    bumpy = [0.0, 0.05, 0.03, 0.2]  # the second point's KL below the first's: read at the first crossing
    assert (read(bumpy, 0.04).lo, read(bumpy, 0.04).hi) == (0, 1)
    assert read([0.0, float("nan"), 0.2], 0.1).lo == 0  # a point never evaluated there is passed over


def test_series_are_ordered_by_strength_whatever_the_method():
    """η for a guided method; a trained baseline's snapshots before its final policy; the
    temperature control colder later; best-of-n by n; one series per round and arm."""
    from pita.report.series import default_order, position, series_of

    guided = [{"algorithm": "PITA", "round": 1, "eta": e} for e in (4.0, 0.5, 2.0)]
    assert [r["eta"] for r in series_of(guided)[(1, "")]] == [0.5, 2.0, 4.0]
    trained = [{"algorithm": "DPO", "round": 0, "eta": 0.0, "variant": v} for v in ("lr=1e-05", "lr=1e-05 at 50%",
                                                                                   "lr=0.0001 at 25%", "lr=0.0001")]
    s = series_of(trained)
    assert set(s) == {(0, "lr=1e-05"), (0, "lr=0.0001")}
    assert [r["variant"] for r in s[(0, "lr=1e-05")]] == ["lr=1e-05 at 50%", "lr=1e-05"]
    assert default_order(s) == [(0, "lr=1e-05"), (0, "lr=0.0001")]  # the smaller rate first
    assert default_order([(0, ""), (1, "")]) == [(1, ""), (0, "")]  # the latest round first
    colder = [{"algorithm": "control: temperature", "control": True, "eta": t, "variant": f"T={t:g}"} for t in
              (0.4, 0.85, 0.7)]
    assert [r["eta"] for r in series_of(colder)[(0, "")]] == [0.85, 0.7, 0.4]
    assert position({"algorithm": "control: best-of-n", "control": True, "eta": 8.0}) == (1.0, 8.0)
