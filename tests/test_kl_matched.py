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

    PITA's validation points: base (0, 0.28), η=1 (0.05, 0.33), η=2 (0.22, 0.40), η=4 (0.7, 0.31):
    the envelope keeps η=1 and η=2 (η=4 scores less than η=2 on validation, whatever its test
    value). Its test curve: base (0, 0.30), η=1 (0.04, 0.34), η=2 (0.2, 0.42).
    DPO: both rounds score below the base (0.28) on validation: base only.
    GRPO: round 0 beats the base on validation (0.35) but scores 0.26 on test, below the base."""
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


def test_every_cell_says_what_it_is_and_the_frontier_is_chosen_on_validation():
    test, val = _rows()
    budgets = [0.02, 0.04, 0.1, 0.21, 0.3, 0.5, 0.7]
    c = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(test, val, None)], budgets)}
    expect = {  # (kind, value, from)
        ("PITA", 0.02): ("chord from base", 0.30 + 0.04 * 0.02 / 0.04, "base .. r0 η=1"),
        ("PITA", 0.04): ("measured", 0.34, "r0 η=1"),
        # between rows 5x apart in KL (0.04 and 0.2): a line across what no row measured
        ("PITA", 0.1): ("wide interpolation", 0.34 + 0.08 * 0.06 / 0.16, "r0 η=1 .. r0 η=2"),
        ("PITA", 0.21): ("measured", 0.42, "r0 η=2"),  # 0.2 is within 10% of 0.21
        ("PITA", 0.5): ("not reached", None, ""),  # η=4 (test 0.50) was never chosen: it lost on validation
        ("DPO", 0.3): ("base only", 0.30, "base"),
        ("DPO", 0.7): ("not reached", None, ""),  # beyond every DPO row
        ("GRPO", 0.1): ("chord from base", 0.30 - 0.04 * 0.1 / 0.3, "base .. r0"),
        ("GRPO", 0.3): ("measured", 0.26, "r0"),
    }
    for key, (kind, value, src) in expect.items():
        e = c[key]
        assert (e["kind"], e["from"]) == (kind, [src]), key
        assert e["value"] == (None if value is None else pytest.approx(value)), key
        assert e["selected_on"] == "validation"
    assert c[("GRPO", 0.3)]["gain"] == pytest.approx(-0.04)  # a method that hurts shows it
    assert c[("DPO", 0.3)]["gain"] == 0.0 and c[("DPO", 0.3)]["ci_lo"] is None
    assert c[("PITA", 0.1)]["bracket"] == [[0.04, 0.2]] and c[("PITA", 0.1)]["ci_lo"] is None
    # eval.wide_ratio: rows 5x apart are an ordinary interpolation where 6x is allowed
    loose = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(test, val, None)], [0.1], wide_ratio=6.0)}
    assert loose[("PITA", 0.1)]["kind"] == "interpolated"
    assert c[("PITA", 0.1)]["frontier"] == [["r0 η=1", "r0 η=2"]]
    assert c[("PITA", 0.5)]["max_kl"] == [0.2] and c[("PITA", 0.5)]["method_max_kl"] == [0.6]
    # the test-selected reading, kept for comparison: η=4 is on the test envelope
    assert c[("PITA", 0.5)]["test_selected"]["value"] == pytest.approx(0.42 + 0.08 * 0.3 / 0.4)
    text = "\n".join(matched_tables(list(c.values()), ["PITA", "DPO", "GRPO"]))
    assert "| algorithm | at KL = 0.02 |" in text and "Frontier points chosen on: validation." in text
    # a cell is its value, interval and a short mark; why it is so is a numbered note under the table
    cells = [c.strip() for line in text.splitlines() if line.startswith("| ") for c in line.split("|")[2:-1]]
    assert max(map(len, cells)) <= 40, max(cells, key=len)
    assert "| 0.320 chord (" in text and "| 0.300 base only |" in text and "| 0.370 wide (" in text
    notes = {line.split(") ", 1)[1]: line.split(")")[0].split("(")[1] for line in text.splitlines()
             if line.startswith("- (")}
    n = notes["PITA: not reached: the frontier ends at KL 0.2; its rows reach 0.6, none chosen there"]
    assert f"| not reached ({n}) |" in text
    n = notes["PITA: wide interpolation between rows at KL 0.04 and 0.2, further apart than "
              "eval.wide_ratio: a line no row measured, no interval"]
    assert f"| 0.370 wide ({n}) |" in text and f"| +0.070 wide ({n}) |" in text  # the gain cites the same note
    assert "-0.040" in text and "the frontier picked on the test split" in text


def test_without_validation_rows_the_frontier_is_the_test_envelope_and_says_so():
    test, _ = _rows()
    c = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(test, [], None)], [0.5])}
    assert c[("PITA", 0.5)]["selected_on"] == "test" and c[("PITA", 0.5)]["kind"] == "interpolated"
    assert c[("PITA", 0.5)]["value"] == pytest.approx(0.42 + 0.08 * 0.3 / 0.4)
    assert c[("PITA", 0.5)]["bracket"] == [[0.2, 0.6]]  # 3x apart: an interpolation, with its bracket shown
    text = "\n".join(matched_tables(list(c.values())))
    assert "Frontier points chosen on: test." in text
    n = next(line[3] for line in text.splitlines()
             if line.endswith(") PITA: interpolated between frontier rows at KL 0.2 and 0.6"))
    assert f"| 0.480 interp. ({n}) |" in text and f"| +0.180 interp. ({n}) |" in text


def test_two_seeds_pool_their_values_and_take_the_weakest_kind():
    budgets = [0.04, 0.1, 0.5]
    one = {(e["algorithm"], e["kl_budget"]): e for e in matched_cells([(*_rows(), None)], budgets)}
    late_test, late_val = _rows(0.1)
    late_test = [dict(r, kl=r["kl"] * 3) if r["algorithm"] == "PITA" and r.get("kl") else r for r in late_test]
    two = {(e["algorithm"], e["kl_budget"]): e
           for e in matched_cells([(*_rows(), None), (late_test, late_val, None)], budgets)}
    # seed 2's PITA: η=1 at 0.12, so 0.04 is a chord there: the pooled cell is a chord
    assert two[("PITA", 0.04)]["kinds"] == ["measured", "chord from base"]
    assert two[("PITA", 0.04)]["kind"] == "chord from base"
    assert two[("PITA", 0.04)]["value"] == pytest.approx((0.34 + (0.30 + 0.1 + 0.04 * 0.04 / 0.12)) / 2)
    assert two[("GRPO", 0.1)]["gain"] == pytest.approx(one[("GRPO", 0.1)]["gain"])
    # seed 1's PITA frontier ends at 0.2, seed 2's at 0.6: 0.5 is reached by one seed only
    assert two[("PITA", 0.5)]["reached"] is False and two[("PITA", 0.5)]["seeds_reaching"] == 1
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


def test_intervals_cover_the_value_only_where_measured_or_interpolated_and_differences_are_paired():
    test, val = _rows()
    test = [r for r in test if not r.get("reused_from")]
    test, store = _sampled(test)
    cells = matched_cells([(test, val, store)], [0.04, 0.1, 0.3], resamples=300, keep_draws=True)
    for c in cells:
        if c["kind"] in ("measured", "interpolated"):
            assert c["ci_lo"] <= c["value"] + 1e-9 and c["value"] - 1e-9 <= c["ci_hi"]
            assert c["gain_ci_lo"] <= c["gain"] + 1e-9 and c["gain"] - 1e-9 <= c["gain_ci_hi"]
            assert 0 < c["draws_reaching"] <= 1
        else:  # a chord is not measured, a base-only cell is the base: no interval
            assert c["ci_lo"] is None and c["gain_ci_lo"] is None
    diffs = differences(cells, ["PITA", "DPO", "GRPO"])
    [d] = [d for d in diffs if (d["a"], d["b"], d["kl_budget"]) == ("PITA", "GRPO", 0.3)]
    assert d["diff"] is None  # PITA's frontier ends at 0.2: not reached at 0.3, so no difference there
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
        for r in test + val:  # PITA's eta = 2 at KL 0.3 (test) and 0.33 (validation), where GRPO's round 0 is
            if r["algorithm"] == "PITA":
                r["kl"] = r["kl"] * 1.5
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
    assert notes.lines() == ["(1) PITA: interpolated between two frontier rows",
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


def test_how_often_the_chosen_frontier_rows_stay_on_the_envelope_when_validation_prompts_are_resampled():
    """Validation, 40 prompts x 2 samples: η=1 is the base's samples with one more right answer (on
    prompt q7), so it stays on the envelope exactly in the draws that hold q7 at least once:
    1 - (39/40)^40 = 0.637. η=2 gets every sample right: always on it. The budget between them
    reads both rows, so it holds as often as η=1 does."""
    n = 40
    base_ok = [k % 3 == 0 for k in range(2 * n)]  # 27 of 80
    one_more = list(base_ok)
    one_more[14] = True  # q7's first sample
    assert not base_ok[14]

    def recs(ok, kl):
        return [{"id": f"q{k // 2}", "sample": k % 2, "correct": c, "logp": 0.0, "logp_ref": 0.0, "kl_path": kl}
                for k, c in enumerate(ok)]
    base = {**BASE, "kl": 0.0, "pass@1": 0.30, "eval_job": "b"}
    test = [base] + [{**base, "algorithm": "PITA", "eta": e, "kl": kl, "pass@1": v, "eval_job": f"t{e:g}"}
                     for e, kl, v in ((1.0, 0.04, 0.34), (2.0, 0.2, 0.42))]
    vb = {**base, "split": "validation", "pass@1": sum(base_ok) / 80, "eval_job": "vb"}
    val = [vb, {**vb, "algorithm": "PITA", "eta": 1.0, "kl": 0.05, "pass@1": sum(one_more) / 80, "eval_job": "v1"},
           {**vb, "algorithm": "PITA", "eta": 2.0, "kl": 0.2, "pass@1": 1.0, "eval_job": "v2"}]
    store = Records({("vb", 0.0): recs(base_ok, 0.0), ("v1", 1.0): recs(one_more, 0.05),
                     ("v2", 2.0): recs([True] * 80, 0.2)})
    c = {e["kl_budget"]: e for e in matched_cells([(test, val, store)], [0.04, 0.1, 0.2], resamples=2000)
         if e["algorithm"] == "PITA"}
    assert [c[b]["kind"] for b in (0.04, 0.1, 0.2)] == ["measured", "wide interpolation", "measured"]
    expect = 1 - (39 / 40) ** 40
    assert abs(c[0.04]["frontier_stays"] - expect) < 0.04
    assert c[0.2]["frontier_stays"] == 1.0
    assert c[0.1]["frontier_stays"] == c[0.04]["frontier_stays"]
    # without per-sample validation records nothing is said
    assert all("frontier_stays" not in e for e in matched_cells([(test, val, Records({}))], [0.04], resamples=50))
    # the report's section names each cell and the share
    from pita.report.report import stays_section

    lines = stays_section([{**e, "frontier_stays": e["frontier_stays"]} for e in c.values()])
    assert "2 of 3 cells are under 80%" in lines[2]
    assert f"| PITA | 0.1 | r0 η=1 .. r0 η=2 | {c[0.1]['frontier_stays']:.0%} |" in "\n".join(lines)
