"""The controls on every equal-KL frontier (pita/eval/controls.py): the base model sampled colder,
and best-of-n by a score available at test time; planned from the base model alone, refused
with the key named when misconfigured. The colder temperature's KL is checked exactly in
tests/test_guided_exact.py; both controls run end to end in the smoke preset
(tests/test_cli_runs.py)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest

from pita.core.errors import ConfigError
from pita.eval import controls
from test_baselines import compose

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_best_of_n_is_the_mean_over_every_n_subset_of_the_pool(n):
    """The estimate from a pool of N equals, exactly, the mean over all C(N, n) subsets of the
    value of the subset's highest-scored sample: what drawing n samples without replacement
    and keeping the best gives in expectation."""
    scores = [0.3, -1.0, 2.5, 0.7, 1.1, -0.2]
    values = [1, 0, 0, 1, 1, 0]
    subsets = list(itertools.combinations(range(len(scores)), n))
    brute = sum(values[max(s, key=lambda i: scores[i])] for s in subsets) / len(subsets)
    assert controls.best_of_n_value(scores, values, n) == pytest.approx(brute, abs=1e-12)
    assert sum(controls.best_of_n_weights(len(scores), n)) == pytest.approx(1.0, abs=1e-12)


def test_best_of_n_limits_and_the_kl_bound():
    scores, values = [0.1, 0.9, 0.5], [0.2, 0.7, 0.4]
    assert controls.best_of_n_value(scores, values, 1) == pytest.approx(sum(values) / 3)  # best of 1: the mean
    assert controls.best_of_n_value(scores, values, 3) == pytest.approx(0.7)  # the whole pool: the top score's
    assert controls.kl_bound(1) == 0.0
    assert controls.kl_bound(4) == pytest.approx(math.log(4) - 0.75)
    with pytest.raises(ValueError, match="pool of at least 4"):
        controls.best_of_n_weights(3, 4)


@pytest.mark.parametrize("overrides, needle", [
    (("eval.control_temperatures=[0.5,1.2]",), "eval.control_temperatures=[0.5, 1.2] must list temperatures in (0, "
                                               "eval.temperature=1.0)"),
    (("eval.best_of_n=[1,4]",), "eval.best_of_n=[1, 4] must list integers >= 2"),
    (("eval.controls=[temprature]",), "eval.controls"),
    (("eval.temperature=0", "eval.controls=[temperature]"), "eval.temperature=0"),
])
def test_a_bad_control_setting_is_refused_naming_the_key(tiny_cache, overrides, needle):
    from pita.plans import build_plan

    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, *overrides), [int(8e9)])
    assert needle in str(e.value)


def _controls(tiny_cache, *overrides):
    from pita.plans import build_plan

    return {j.id: j for j in build_plan(compose(tiny_cache, *overrides), [int(8e9)]) if j.id.startswith("control.")}


def test_controls_are_planned_on_test_and_validation_from_the_base_model(tiny_cache):
    """On a verifier task the best-of-n score is the run's own proxy (Q#-HF's round 0 here), never
    the gold answer; without a proxy-training method there is no best-of-n on it. On a reward task
    the reward model scores. Every control job samples the base model (no guidance, no trained
    policy) and the temperature sweep is measured against the evaluation's temperature."""
    jobs = _controls(tiny_cache, "experiment.algos=[QSharp-HF]", "experiment.rounds=1")
    merges = {k: j for k, j in jobs.items() if k.endswith(".merge")}
    assert set(merges) == {"control.temperature.tiny.arith.eval.merge", "control.temperature.tiny.arith.val.merge",
                           "control.best_of_n.tiny.arith.pool.merge", "control.best_of_n.tiny.arith.valpool.merge"}
    pool = merges["control.best_of_n.tiny.arith.pool.merge"]
    assert pool.kind == "control.best_of_n" and pool.params["proxy"] == "QSharp-HF.tiny.arith.r0.proxy"
    assert "QSharp-HF.tiny.arith.r0.proxy" in pool.deps and pool.params["ns"] == [2, 4, 8, 16]
    assert merges["control.best_of_n.tiny.arith.valpool.merge"].params["labels"]["split"] == "validation"
    shards = [j for k, j in jobs.items() if not k.endswith(".merge")]
    for j in shards:
        req = j.params["request"]
        assert req["policy"]["guidance"] is None and not req["policy"].get("model_from_job")
        if ".best_of_n." in j.id:
            assert req["n"] == 16 and req["with_prompt"]
        else:
            assert req["sweep"] == "temperature" and req["etas"] == [0.85, 0.7, 0.55, 0.4]
            assert req["sampling"]["temperature"] == 1.0
    none = _controls(tiny_cache, "experiment.algos=[PITA]", "experiment.rounds=1")
    assert not [k for k in none if ".best_of_n." in k] and any(".temperature." in k for k in none)
    reward = _controls(tiny_cache, "experiment.algos=[PITA]", "experiment.rounds=1", "experiment.datasets=[sentiment]",
                       "datasets.sentiment.toy_train_size=40", "datasets.sentiment.toy_test_size=8")
    pool = reward["control.best_of_n.tiny.sentiment.pool.merge"]
    assert pool.params["proxy"] is None and not [d for d in pool.deps if "proxy" in d]
    assert _controls(tiny_cache, "eval.controls=[]") == {}


def test_the_best_of_n_job_writes_one_row_per_n_with_its_bound(tmp_path, monkeypatch):
    """On a reward task: the rows' values are the per-prompt estimates' mean, the KL is the bound
    (labelled so), and the saved records give the bootstrap its per-prompt values."""
    from pita.generation import jobs as gen_jobs

    pool = [{"id": f"p{i}", "sample": s, "reward": float((i + 1) * s), "correct": None} for i in range(3)
            for s in range(4)]
    saved = {}
    monkeypatch.setattr(gen_jobs, "gather", lambda ctx: pool)
    monkeypatch.setattr(gen_jobs, "save_records", lambda ctx, recs: saved.setdefault("recs", recs))
    ctx = SimpleNamespace(params={"labels": {"algorithm": controls.BEST_OF_N, "task": "reward", "control": True},
                                  "ns": [2, 4], "proxy": None},
                          log=SimpleNamespace(info=lambda *a, **k: None))
    out = controls.best_of_n_merge(ctx)
    rows = {r["variant"]: r for r in out["results"]}
    # prompt i's rewards are (i+1) x {0, 1, 2, 3}, scored by themselves: best of 4 is the top one
    assert rows["n=4"]["mean_reward"] == pytest.approx(sum(3 * (i + 1) for i in range(3)) / 3)
    assert rows["n=2"]["kl"] == pytest.approx(math.log(2) - 0.5) and rows["n=2"]["kl_estimator"].startswith("bound")
    assert len(saved["recs"]) == 6 and {r["eta"] for r in saved["recs"]} == {2.0, 4.0}
