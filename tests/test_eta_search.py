"""The value-guided methods' eta searched on validation until it brackets the KL budgets
(pita/eval/eta_search.py); its rows, test evaluations and stop reasons in the report."""

from __future__ import annotations

import pytest

from pita.eval.eta_search import next_etas

BUDGETS = [0.05, 0.1, 0.25, 0.5, 1.0]


def test_a_grid_whose_first_row_is_past_the_small_budgets_searches_below_it():
    """real_arith's grid put PITA's first row at ~0.45 nats: every cell at 0.25 and below was a
    chord from the base. The search halves the smallest eta; above, it doubles the largest."""
    new, stopped = next_etas([(1.0, 0.45), (2.0, 0.85)], BUDGETS, eta_min=0.0625, eta_max=64)
    assert new == [0.5, 4.0] and stopped == {}  # 0.5 below the first row; 4 past 0.85 (1.0 not within 10%)


def test_a_budget_between_rows_far_apart_in_kl_gets_the_geometric_mean_eta():
    new, _ = next_etas([(1.0, 0.04), (4.0, 0.8), (8.0, 1.05)], BUDGETS, 0.0625, 64)
    assert new == [2.0]  # 0.1, 0.25 and 0.5 lie between 0.04 and 0.8 (20x apart)
    new, _ = next_etas([(1.0, 0.2), (2.0, 0.45), (4.0, 1.02)], [0.25, 0.5], 0.0625, 64)
    assert new == []  # within 4x around each budget, or within 10% of it: bracketed


def test_each_limit_that_stops_the_search_is_named():
    new, stopped = next_etas([(32.0, 0.12), (64.0, 0.3)], BUDGETS, 0.0625, 64)
    assert 128.0 not in new
    assert stopped["0.5"].startswith("eval.eta_max=64") and stopped["1"].startswith("eval.eta_max=64")
    new, stopped = next_etas([(0.0625, 0.2)], [0.05], 0.0625, 64)
    assert new == [] and stopped["0.05"].startswith("eval.eta_min=0.0625")
    # adjacent etas whose KL jumps: their geometric mean is tried once, then the jump is named
    new, stopped = next_etas([(1.0, 0.01), (1.01, 2.0)], [0.5], 0.0625, 64)
    assert new == [] and "jumps from 0.01 at η=1 to 2 at η=1.01" in stopped["0.5"]


def test_the_search_runs_in_the_plan_and_its_rows_join_the_frontier(smoke_run):
    """PITA with a one-eta grid on the tiny family (the session's smoke run: etas 0 and 1, eta_max
    4): the search adds etas on validation, the test evaluation samples them, and the report's cells
    see both; a search stopped by a limit says so."""
    import json

    run, _ = smoke_run
    res = json.loads((run / "jobs" / "PITA.tiny.arith.r0.eta_search" / "result.json").read_text())
    added = res["etas"]
    assert added and all(e not in (0.0, 1.0) and 0.0625 <= e <= 4 for e in added)
    from pita.report.results import read_results

    rows, extras = read_results(run / "results" / "final_results.json")
    pita_test = {x["eta"] for x in rows if x["algorithm"] == "PITA"}
    val = json.loads((run / "results" / "validation.json").read_text())
    pita_val = {x["eta"] for x in val if x["algorithm"] == "PITA"}
    assert set(added) <= pita_test and set(added) <= pita_val
    for b, why in res["stopped"].items():  # a budget left unbracketed names its limit in the table
        assert why.startswith(("eval.eta_max=4", "eval.eta_min", "the KL jumps", "eval.eta_search_steps"))
        cell = next(c for c in extras["kl_matched"]["cells"] if c["algorithm"] == "PITA" and f"{c['kl_budget']:g}" == b)
        if cell["kind"] == "not reached":
            assert cell["stopped_by"] == [why]
            assert "η search stopped by" in (run / "results" / "report.md").read_text()


@pytest.mark.parametrize("over, needle", [
    (("eval.eta_search_steps=-1",), "eval.eta_search_steps=-1"),
    (("eval.eta_min=2", "eval.eta_max=1"), "eval.eta_min/eta_max"),
])
def test_a_bad_search_setting_is_refused_naming_the_key(tiny_cache, over, needle):
    from pita.core.errors import ConfigError
    from pita.plans import build_plan
    from test_baselines import compose

    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, *over), [int(8e9)])
    assert needle in str(e.value)


def test_the_search_is_planned_as_the_guided_sampling_it_does(tiny_cache):
    """The search job samples its validation prompts with the guided policy: it is sized and timed
    as a guided evaluation shard (memory, system.fit_batches' batch, the plan's seconds for one new
    eta a step), and its OOM retry halves its batch as a shard's does."""
    from pita.plans import build_plan
    from pita.plans.experiment import sampling_key
    from test_baselines import compose

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.algos=[PITA]"), [int(8e9)])}
    search, val = jobs["PITA.tiny.arith.r0.eta_search"], jobs["PITA.tiny.arith.r0.val.s0"]
    assert sampling_key(search) == sampling_key(val) == "eval_guided"
    assert search.resources.memory_gb == val.resources.memory_gb
    assert search.params["batch_size"] == search.params["request"]["sampling"]["batch_size"]
    assert search.retry.batch_param == "batch_size"
    # timed by the roofline of the sampling it does (three steps of one eta), not as a merge
    from pita.plans.durations import rows_per_example

    assert search.planned_s >= 1.0 and rows_per_example(dict(search.params["request"], etas=[0.0] * 3)) == \
        3 * rows_per_example(dict(search.params["request"], etas=[0.0]))


def test_the_temperature_controls_search_doubles_and_halves_its_sharpening_and_names_its_limits():
    """The control's coordinate is the sharpening s = T0 / T - 1 (T0 = 1 here): colder rows reach
    more KL. A budget past the coldest row doubles its sharpening (T=0.4 -> s=1.5 -> 3: T=0.25);
    one below the warmest halves it (T=0.85 -> T=0.919); its limits read as temperatures."""
    from pita.eval.eta_search import Sharpening

    c = Sharpening({"t_eval": 1.0, "t_min": 0.05, "t_max": 0.98})
    pts = [(c.to_x(t), kl) for t, kl in [(0.85, 0.08), (0.7, 0.2), (0.55, 0.4), (0.4, 0.7)]]
    new, stopped = next_etas(pts, BUDGETS, c.lo, c.hi, wide=4.0, show=c.show, limits=c.limits)
    assert [c.from_x(x) for x in new] == [0.918919, 0.25] and stopped == {}
    # at the coldest allowed temperature a budget it cannot reach names eval.control_temperature_min
    cold = [(c.to_x(0.05), 0.8)]
    new, stopped = next_etas(cold, [1.0], c.lo, c.hi, show=c.show, limits=c.limits)
    assert new == [] and stopped["1"].startswith("eval.control_temperature_min=0.05 (T=0.05 reaches KL 0.8")
    warm = [(c.to_x(0.98), 0.2)]
    new, stopped = next_etas(warm, [0.05], c.lo, c.hi, show=c.show, limits=c.limits)
    assert new == [] and "warmest temperature 0.98" in stopped["0.05"] and "T=0.98 is already at KL 0.2" in stopped["0.05"]


def test_the_temperature_control_is_searched_on_validation_and_its_new_temperatures_tested(smoke_run):
    """The smoke run's temperature control: the search adds temperatures on the validation prompts
    (below eval.temperature, at or above eval.control_temperature_min), the test prompts sample
    them, and both splits' rows of the control carry them as variants T=..."""
    import json

    run, _ = smoke_run
    res = json.loads((run / "jobs" / "control.temperature.tiny.arith.search" / "result.json").read_text())
    cfg = json.loads((run / "jobs" / "control.temperature.tiny.arith.search" / "launch.json").read_text())
    p = cfg["job"]["params"]
    added = res["etas"]
    assert p["coordinate"] == "temperature" and p["t_max"] < p["t_eval"]
    assert all(p["t_min"] <= t < p["t_eval"] for t in added)
    from pita.report.results import read_results

    rows, _ = read_results(run / "results" / "final_results.json")
    val = json.loads((run / "results" / "validation.json").read_text())
    ctrl_test = {x["eta"]: x["variant"] for x in rows if x["algorithm"] == "control: temperature"}
    ctrl_val = {x["eta"] for x in val if x["algorithm"] == "control: temperature"}
    assert set(added) <= set(ctrl_test) and set(added) <= ctrl_val
    assert all(ctrl_test[t] == f"T={t:g}" for t in added)
    for why in res["stopped"].values():
        assert why.startswith(("eval.control_temperature_min", "the control's warmest", "the KL jumps",
                               "eval.eta_search_steps"))
