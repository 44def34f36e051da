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


def _exact_best_of_n_kl(probs: list[float], n: int) -> float:
    """KL(best-of-n || p) of a distribution whose outcomes (in ascending score order) have ``probs``."""
    kl, f = 0.0, 0.0
    for p in probs:
        got = (f + p) ** n - f ** n
        kl += got * math.log(got / p) if got > 0 else 0.0
        f += p
    return kl


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_best_of_n_kl_is_exact_where_the_pool_holds_the_support(n):
    """Two equally likely answers, one scored higher: best-of-n picks the better with probability
    1 - 2^-n, a KL below log 2 for every n, where the bound log n - (n-1)/n grows without limit
    (1.84 nats at n = 16). A pool of 16 samples of three answers carrying all the mass gives the
    exact value whichever answer it drew how often."""
    got, covered = controls.best_of_n_kl([0.0, 1.0, 1.0, 0.0], [math.log(0.5)] * 4, ["a", "b", "b", "a"], n)
    assert covered == pytest.approx(1.0)
    assert got == pytest.approx(_exact_best_of_n_kl([0.5, 0.5], n), rel=1e-9) and got < math.log(2)
    probs, scores = [0.6, 0.3, 0.1], [0.2, -1.0, 3.0]  # by score: 0.3, 0.6, 0.1
    pool = [0] * 9 + [1] * 5 + [2] * 2
    got, _ = controls.best_of_n_kl([scores[k] for k in pool], [math.log(probs[k]) for k in pool], pool, n)
    assert got == pytest.approx(_exact_best_of_n_kl([0.3, 0.6, 0.1], n), rel=1e-9)
    assert got < controls.kl_bound(n)


def test_best_of_n_kl_tends_to_the_bound_when_every_completion_is_new():
    """Sixteen distinct improbable completions: the unseen mass is spread thinly over their scores,
    which is the bound's own assumption, and the estimate is the bound."""
    for n in (2, 4, 16):
        got, covered = controls.best_of_n_kl([0.1 * i for i in range(16)], [-40.0] * 16, list(range(16)), n)
        assert covered < 1e-12 and got == pytest.approx(controls.kl_bound(n), rel=1e-9)


def test_best_of_n_kl_estimates_a_long_tail_better_than_the_bound():
    """A reference like a small model's short answers: one answer with 0.7 of the mass, another
    with 0.1, and 200 rare ones the pool mostly misses. Over 200 pools of 16 the estimate's mean
    is within 25% of the exact KL at n = 2, 4 and 16, and at most half as far from it as the bound
    (which puts best-of-16 at 1.84 nats against an exact 0.97)."""
    import random

    rng = random.Random(0)
    tail = 200
    probs = [0.7, 0.1] + [0.2 / tail] * tail
    scores = [rng.random() for _ in probs]
    order = sorted(range(len(probs)), key=lambda k: scores[k])
    for n in (2, 4, 16):
        exact = _exact_best_of_n_kl([probs[k] for k in order], n)
        est = []
        for _ in range(200):
            pool = rng.choices(range(len(probs)), weights=probs, k=16)
            est.append(controls.best_of_n_kl([scores[k] for k in pool], [math.log(probs[k]) for k in pool], pool, n)[0])
        mean = sum(est) / len(est)
        assert abs(mean - exact) < 0.25 * exact, (n, mean, exact)
        assert abs(mean - exact) < 0.5 * (controls.kl_bound(n) - exact), (n, mean, exact)


@pytest.mark.parametrize("overrides, needle", [
    (("eval.control_temperatures=[0.5,1.2]",), "eval.control_temperatures=[0.5, 1.2] must list temperatures in (0, "
                                               "eval.temperature=1.0)"),
    (("eval.best_of_n=[1,4]",), "eval.best_of_n=[1, 4] must list integers >= 2"),
    (("eval.control_temperature_min=1.5",), "eval.control_temperature_min=1.5 must be a number in (0, "
                                            "eval.temperature=1.0)"),
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
    """On a verifier task the best-of-n scores are ones a user has at test time, never the gold
    answer: the run's own proxy (Q#-HF's round 0 here), the base model's log-probability, and
    majority vote ranks nothing; without a proxy-training method the last two remain. On a reward
    task the reward model scores, and there is no answer to vote on. Every control job samples the
    base model (no guidance, no trained policy) and the temperature sweep is measured against the
    evaluation's temperature."""
    jobs = _controls(tiny_cache, "experiment.algos=[QSharp-HF]", "experiment.rounds=1")
    merges = {k: j for k, j in jobs.items() if k.endswith(".merge")}
    assert set(merges) == {"control.temperature.tiny.arith.eval.merge", "control.temperature.tiny.arith.val.merge",
                           "control.temperature.tiny.arith.eval-search.merge",
                           "control.best_of_n.tiny.arith.pool.merge", "control.best_of_n.tiny.arith.valpool.merge"}
    # the temperature control searched on validation as eta is, the test split sampling what it adds
    search = jobs["control.temperature.tiny.arith.search"]
    assert search.kind == "eval.eta_search" and search.deps == ["control.temperature.tiny.arith.val.merge"]
    assert search.params["coordinate"] == "temperature" and search.params["request"]["split"] == "held_out"
    assert merges["control.temperature.tiny.arith.eval-search.merge"].params["may_be_empty"]
    pool = merges["control.best_of_n.tiny.arith.pool.merge"]
    assert pool.kind == "control.best_of_n" and pool.params["proxy"] == "QSharp-HF.tiny.arith.r0.proxy"
    assert "QSharp-HF.tiny.arith.r0.proxy" in pool.deps and pool.params["ns"] == [2, 4, 8]  # the demo preset's
    assert merges["control.best_of_n.tiny.arith.valpool.merge"].params["labels"]["split"] == "validation"
    for split in ("pool", "valpool"):  # ranked by log-probability and majority vote: no model, no device
        for rank, algo in (("logprob", controls.BEST_OF_N_LOGP), ("majority", controls.MAJORITY)):
            j = jobs[f"control.best_of_n.tiny.arith.{split}.{rank}"]
            assert j.params["rank"] == rank and j.params["labels"]["algorithm"] == algo
            assert j.resources.devices == 0 and set(j.params["shards"]) == set(pool.params["shards"] if split == "pool"
                                                                               else j.params["shards"])
    shards = [j for k, j in jobs.items() if "request" in j.params]
    for j in shards:
        req = j.params["request"]
        assert req["policy"]["guidance"] is None and not req["policy"].get("model_from_job")
        if ".best_of_n." in j.id:
            assert req["n"] == 32 and req["with_prompt"]  # the pool: 4 x max(eval.best_of_n)
        elif ".search" in j.id or "eval-search" in j.id:
            assert req["sweep"] == "temperature" and (j.kind == "eval.eta_search" or req["etas_from"] == search.id)
        else:
            assert req["sweep"] == "temperature" and req["etas"] == [0.85, 0.7, 0.55, 0.4]
            assert req["sampling"]["temperature"] == 1.0
    none = _controls(tiny_cache, "experiment.algos=[PITA]", "experiment.rounds=1")
    assert "control.best_of_n.tiny.arith.pool.merge" not in none and any(".temperature." in k for k in none)
    assert {"control.best_of_n.tiny.arith.pool.logprob", "control.best_of_n.tiny.arith.pool.majority"} <= set(none)
    reward = _controls(tiny_cache, "experiment.algos=[PITA]", "experiment.rounds=1", "experiment.datasets=[sentiment]",
                       "datasets.sentiment.toy_train_size=40", "datasets.sentiment.toy_test_size=8")
    pool = reward["control.best_of_n.tiny.sentiment.pool.merge"]
    assert pool.params["proxy"] is None and not [d for d in pool.deps if "proxy" in d]
    assert not [k for k in reward if k.endswith((".logprob", ".majority", ".rm"))]
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


def test_the_best_of_n_job_places_its_rows_at_their_measured_kl(monkeypatch):
    """Short answers that repeat, as a small model's arithmetic does: each prompt's pool holds two
    answers carrying all the reference mass. The row's KL is the pool's exact best-of-n KL (the
    bound kept beside it), a nucleus's own distance from the reference is added as best-of-n sees
    it, and each prompt's record carries its KL for the bootstrap."""
    from pita.generation import jobs as gen_jobs
    from pita.report.intervals import prompt_columns

    def sample(i, s, right):
        return {"id": f"p{i}", "sample": s, "completion": "4" if right else "5", "finish": "eos", "correct": right,
                "reward": None, "logp": math.log(0.8 if right else 0.2), "logp_ref": math.log(0.8 if right else 0.2),
                "prompt": "2+2="}
    pool = [sample(i, s, s % 4 != 0) for i in range(2) for s in range(8)]
    saved = {}
    monkeypatch.setattr(gen_jobs, "gather", lambda ctx: pool)
    monkeypatch.setattr(gen_jobs, "save_records", lambda ctx, recs: saved.setdefault("recs", recs))
    monkeypatch.setattr(controls, "_model_scores", lambda ctx, job, p, groups, value=False:
                        [[1.0 if s["correct"] else 0.0 for s in g] for g in groups])
    ctx = SimpleNamespace(params={"labels": {"algorithm": controls.BEST_OF_N, "task": "math", "control": True},
                                  "ns": [2, 8], "proxy": "QSharp-HF.tiny.arith.r0.proxy"},
                          log=SimpleNamespace(info=lambda *a, **k: None))
    rows = {r["n"]: r for r in controls.best_of_n_merge(ctx)["results"]}
    for n in (2, 8):
        exact = _exact_best_of_n_kl([0.2, 0.8], n)  # the wrong answer scores lower
        assert rows[n]["kl"] == pytest.approx(exact, rel=1e-9) and rows[n]["kl_estimator"] == controls.KL_ESTIMATOR
        assert rows[n]["kl_bound"] == pytest.approx(controls.kl_bound(n)) and rows[n]["kl"] < rows[n]["kl_bound"]
        assert rows[n]["kl_pool_mass"] == pytest.approx(1.0)
    assert rows[8]["kl"] < 0.25 < controls.kl_bound(8)  # 0.22 nats, not the bound's 1.20
    cols = prompt_columns([r for r in saved["recs"] if r["eta"] == 8.0])
    assert cols["kl"]["p0"][0] == pytest.approx(rows[8]["kl"])
    # a nucleus: the sampling policy is 0.1 nats from the reference on every sample
    for s in pool:
        s["logp_ref"] = s["logp"] - 0.1
    saved.clear()
    nucleus = {r["n"]: r for r in controls.best_of_n_merge(ctx)["results"]}
    assert nucleus[2]["kl"] == pytest.approx(rows[2]["kl"] + 0.1)


def test_a_second_best_of_n_is_ranked_by_qsharps_own_value_model(tiny_cache):
    """With Q# in the run, a verifier task's best-of-n is also ranked by Q#'s round-0 value model
    (the supervision Q# had), from the same pool; with no proxy trainer it is the only one."""
    jobs = _controls(tiny_cache, "experiment.algos=[QSharp,QSharp-HF]", "experiment.rounds=1")
    value = jobs["control.best_of_n.tiny.arith.pool.value"]
    proxy = jobs["control.best_of_n.tiny.arith.pool.merge"]
    assert value.kind == proxy.kind == "control.best_of_n"
    assert value.params["value"] == "QSharp.tiny.arith.r0.train" and value.params["proxy"] is None
    assert value.params["labels"]["algorithm"] == controls.BEST_OF_N_VALUE
    assert set(value.params["shards"]) == set(proxy.params["shards"]) and "QSharp.tiny.arith.r0.train" in value.deps
    assert jobs["control.best_of_n.tiny.arith.valpool.value"].params["labels"]["split"] == "validation"
    alone = _controls(tiny_cache, "experiment.algos=[QSharp]", "experiment.rounds=1")
    assert "control.best_of_n.tiny.arith.pool.value" in alone and "control.best_of_n.tiny.arith.pool.merge" not in alone


def test_a_verifier_tasks_reward_model_ranks_a_best_of_n_of_its_own_by_its_score_alone(tiny_cache, monkeypatch):
    """model.reward_models.arith set (as the PITA reference scores math): one more best-of-n, ranked
    by that model's score (no verifier at test time), on a device with the reward model's memory."""
    jobs = _controls(tiny_cache, "experiment.algos=[PITA]", "experiment.rounds=1",
                     "+model.reward_models.arith=${model.reward_models.sentiment}")
    rm = jobs["control.best_of_n.tiny.arith.pool.rm"]
    assert rm.params["rank"] == "reward_model" and rm.params["labels"]["algorithm"] == controls.BEST_OF_N_RM
    assert rm.params["scoring"]["reward_model"] and rm.resources.devices == 1 and rm.resources.memory_gb > 0
    # the job scores each sample by the model alone and ranks by it
    from pita.generation import jobs as gen_jobs

    pool = [{"id": f"p{i}", "sample": s, "prompt": "2+2=", "completion": str(s), "finish": "eos",
             "correct": s == 3, "reward": None, "logp": -1.0, "logp_ref": -1.0, "extracted": str(s)}
            for i in range(2) for s in range(4)]
    monkeypatch.setattr(gen_jobs, "gather", lambda ctx: pool)
    monkeypatch.setattr(gen_jobs, "save_records", lambda ctx, recs: None)
    monkeypatch.setattr(controls, "_reward_model_scores", lambda ctx, sc, groups:
                        [[float(s["completion"] == "3") for s in g] for g in groups])
    ctx = SimpleNamespace(params={**rm.params, "ns": [4]}, log=SimpleNamespace(info=lambda *a, **k: None))
    [row] = controls.best_of_n_merge(ctx)["results"]
    assert row["pass@1"] == pytest.approx(1.0) and row["scored_by"].startswith("reward model ")


def test_best_of_n_by_log_prob_ranks_by_the_base_models_log_probability_per_token(monkeypatch):
    """By hand: each prompt's pool is a right answer of 2 tokens at log-prob -1 (-0.33 a step with
    its EOS) and a wrong one of 9 tokens at -2 (-0.2 a step): per token the wrong one ranks first,
    so best of 2 is wrong whenever both are drawn: the value is the chance that a 2-subset of the
    pool (2 right, 2 wrong) holds no wrong answer, 1/6."""
    from pita.generation import jobs as gen_jobs

    def sample(i, s):
        right = s < 2
        return {"id": f"p{i}", "sample": s, "completion": "4" if right else "it is five", "finish": "eos",
                "correct": right, "reward": None, "logp": -1.0 if right else -2.0, "logp_ref": -1.0 if right else -2.0,
                "n_tokens": 2 if right else 9, "prompt": "2+2=", "extracted": "4" if right else "5"}
    pool = [sample(i, s) for i in range(3) for s in range(4)]
    monkeypatch.setattr(gen_jobs, "gather", lambda ctx: pool)
    monkeypatch.setattr(gen_jobs, "save_records", lambda ctx, recs: None)
    ctx = SimpleNamespace(params={"labels": {"algorithm": controls.BEST_OF_N_LOGP, "task": "math", "control": True},
                                  "ns": [2], "proxy": None, "rank": "logprob"},
                          log=SimpleNamespace(info=lambda *a, **k: None))
    [row] = controls.best_of_n_merge(ctx)["results"]
    assert row["pass@1"] == pytest.approx(1 / 6) and row["scored_by"] == "the base model's log-probability per token"
    assert row["scorer_agreement"] == 0.0 and row["scorer_chance"]  # it orders every differing pair the wrong way


def test_majority_vote_is_the_expected_correctness_of_the_most_given_answer_and_its_answer_level_kl():
    """A pool of 4 samples: answers 4, 4, 5 and none (no vote), right = 4. Worked by hand over the
    6 pairs (n = 2): {4,4} 4; {4,5} x2 a tie, 4 half the time; {4,-} x2 4; {5,-} 5: right
    (1 + 1 + 2) / 6 = 2/3; the vote's answers 4 with 2/3, 5 with 1/3 against the pool's 1/2, 1/4
    and 1/4 for no answer: KL = 2/3 log(4/3) + 1/3 log(4/3) = log(4/3). The estimate averages
    random pairs: within 0.03 of both over 4,000 of them."""
    classes = [0, 0, 1, None]
    v, picked = controls.majority_value(classes, [True, True, False, False], 2, 4000, "p0/2")
    assert v == pytest.approx(2 / 3, abs=0.03)
    assert controls.majority_kl(classes, picked) == pytest.approx(math.log(4 / 3), abs=0.03)
    # n = the whole pool: always answer 4 (two votes of three), KL = log(1 / 0.5)
    v, picked = controls.majority_value(classes, [True, True, False, False], 4, 50, "p0/4")
    assert v == 1.0 and picked == {0: 1.0} and controls.majority_kl(classes, picked) == pytest.approx(math.log(2))
    # nobody answers: wrong, and the vote is the policy itself (KL 0)
    v, picked = controls.majority_value([None] * 3, [False] * 3, 2, 50, "p1/2")
    assert v == 0.0 and controls.majority_kl([None] * 3, picked) == 0.0


def test_every_learned_scorer_is_checked_on_the_validation_pool(tiny_cache, monkeypatch):
    """Each value model (every round of PITA, Q#, Q#-HF) and each proxy (Q#-HF's, GRPO-HF's)
    scores the validation pool: one job each, whose result says how well it orders one prompt's
    completions and how well it orders the prompts."""
    jobs = _controls(tiny_cache, "experiment.algos=[PITA,QSharp-HF,GRPO-HF]", "experiment.rounds=2")
    got = sorted(j.params["model_job"] for j in jobs.values() if j.kind == "eval.scorer_quality")
    assert got == ["GRPO-HF.tiny.arith.r0.proxy", "GRPO-HF.tiny.arith.r1.proxy", "PITA.tiny.arith.r0.train",
                   "PITA.tiny.arith.r1.train", "QSharp-HF.tiny.arith.r0.proxy", "QSharp-HF.tiny.arith.r0.train",
                   "QSharp-HF.tiny.arith.r1.proxy", "QSharp-HF.tiny.arith.r1.train"]
    j = jobs["control.best_of_n.tiny.arith.valpool.scorer.PITA.tiny.arith.r1.train"]
    assert j.params["value"] is True and j.params["labels"]["round"] == 1 and "PITA.tiny.arith.r1.train" in j.deps
    from pita.generation import jobs as gen_jobs

    pool = [{"id": f"p{i}", "sample": s, "prompt": "q", "completion": "a", "finish": "eos", "correct": s % 2 == 0}
            for i in range(4) for s in range(4)]
    monkeypatch.setattr(gen_jobs, "gather", lambda ctx: pool)
    monkeypatch.setattr(controls, "_model_scores", lambda ctx, job, p, groups, value=False:
                        [[1.0 if s["correct"] else 0.0 for s in g] for g in groups])
    ctx = SimpleNamespace(params=j.params, log=SimpleNamespace(info=lambda *a, **k: None))
    sc = controls.scorer_quality(ctx)["scorer"]
    assert sc["agreement"] == 1.0 and not sc["chance"] and sc["pairs"] == 16 and sc["job"] == "PITA.tiny.arith.r1.train"


def test_a_value_model_ranks_whole_sequences_by_its_predicted_value(tiny):
    """An mle value model's sequence value is the mean of its atoms under the head's distribution
    at the last token; a bce one's is the logit sequence_reward reads (either head: the reference
    head's from the last real token's own state, the embedding head's from the state before it)."""
    import torch

    from pita.guidance.value_model import ValueModel
    from pita.losses.value import atoms

    torch.manual_seed(0)
    ids = torch.tensor([[5, 6, 7, 8], [5, 9, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    for loss, head in (("mle", "embedding"), ("bce", "embedding"), ("mle", "reference"), ("bce", "reference"),
                       ("mle", "q"), ("bce", "q")):
        vm = ValueModel.create(tiny["guidance"], loss=loss, head=head).eval()
        with torch.no_grad():
            got = vm.sequence_value(ids, mask)
            h, _ = vm.hidden(ids, mask)
            for b, last in enumerate((2, 1)):
                out = (vm.scores(h[b, last], ids[b, last + 1].view(1))[0] if head != "reference"
                       else vm.score(h[b, last + 1])).float()
                want = (torch.softmax(out, -1) * atoms(vm.spec.v_min, vm.spec.v_max, vm.spec.num_atoms)).sum() \
                    if loss == "mle" else out[0]
                assert float(got[b]) == pytest.approx(float(want), abs=1e-5)


def _bias(p, s, n, factor, reps=120, seed=0):
    """Mean estimate / exact - 1 of best_of_n_kl over ``reps`` pools of factor x n samples."""
    import random

    from pita.eval.controls import best_of_n_kl

    K = len(p)
    exact, _ = best_of_n_kl(s, [math.log(x) for x in p], list(range(K)), n)
    rng, est = random.Random(seed), []
    for _ in range(reps):
        pool = rng.choices(range(K), weights=p, k=factor * n)
        est.append(best_of_n_kl([s[i] for i in pool], [math.log(p[i]) for i in pool], pool, n)[0])
    return sum(est) / len(est) / exact - 1


@pytest.mark.parametrize("case", ["likeliest highest", "likeliest lowest"])
def test_best_of_n_kl_from_a_pool_of_four_times_n_is_within_two_percent_of_the_exact_kl(case):
    """The plug-in KL of best-of-n, in simulation against the exact KL: one likely answer (mass
    0.6) and 2,000 rare distinct ones. From a pool of n samples per prompt (the pool before) the
    estimate is off by up to 10% (here: -10% at n = 2 when the likeliest answer also scores
    highest, +10% when it scores lowest); from 4 x n, the pool the control now draws, within 2%."""
    import random

    K = 2001
    p = [0.6] + [0.4 / (K - 1)] * (K - 1)
    rs = random.Random(3)
    s = [K + 1.0 if case == "likeliest highest" else -1.0] + [rs.random() * K for _ in range(K - 1)]
    worst_old = max(abs(_bias(p, s, n, 1)) for n in (2, 4))
    assert worst_old > 0.05  # the small pool's bias is real in this case
    for n in (2, 4, 8):
        assert abs(_bias(p, s, n, 4)) < 0.02, n


def test_a_scorers_ranking_agreement_counts_the_pairs_whose_outcomes_differ():
    from pita.eval.controls import ranking_agreement

    # prompt 1: the right sample scored highest (2 of 2 pairs right); prompt 2: scored lowest (0 of 2)
    got = ranking_agreement([[3.0, 1.0, 2.0], [0.0, 5.0, 6.0]], [[1, 0, 0], [1, 0, 0]])
    assert got["pairs"] == 4 and got["agreement"] == 0.5 and got["chance"]
    # equal scores count 1/2; a prompt whose outcomes are all equal has no pair
    assert ranking_agreement([[1.0, 1.0], [2.0, 2.0]], [[1, 0], [1, 1]])["agreement"] == 0.5
    good = ranking_agreement([[1.0, 0.0, 0.0, 0.0] for _ in range(30)], [[1, 0, 0, 0]] * 30)
    assert good["agreement"] == 1.0 and not good["chance"]
    assert ranking_agreement([[1.0, 2.0]], [[1, 1]]) == {"agreement": None, "agreement_se": None, "pairs": 0,
                                                           "prompts": 0, "chance": True, "prompt_agreement": None}


def test_a_scorer_that_learned_the_prompts_difficulty_orders_prompts_but_not_completions():
    from pita.eval.controls import prompt_agreement, ranking_agreement

    # as the demo's Q# value model on arith: each prompt's scores sit at its difficulty, and within
    # a prompt the wrong completions score a little higher
    rates = [0.1, 0.3, 0.5, 0.7, 0.9, 0.2, 0.6, 0.8]
    values = [[1.0] * round(8 * r) + [0.0] * (8 - round(8 * r)) for r in rates]
    scores = [[2 * r + (0.0 if v else 0.05) for v in vs] for r, vs in zip(rates, values)]
    got = ranking_agreement(scores, values)
    assert got["agreement"] == 0.0 and got["chance"]
    assert got["prompt_agreement"] == 1.0 == prompt_agreement(scores, values)
    # a scorer that knows nothing: chance both ways; one prompt alone: no prompt pair
    flat = [[0.0] * 8 for _ in rates]
    assert ranking_agreement(flat, values)["agreement"] == 0.5 and prompt_agreement(flat, values) == 0.5
    assert prompt_agreement([[1.0, 0.0]], [[1, 0]]) is None
