"""Evaluation metrics (pita.eval.metrics) against numbers worked out by hand.

Run: .venv/bin/python -m pytest -q tests/test_eval_metrics.py

Pure Python, no models: every case below states its arithmetic in the docstring.
"""

from __future__ import annotations

import math

import pytest

from pita.eval.metrics import kl_metrics, math_metrics, mean_stderr, reward_metrics, summarize


def _math(correct, extracted):
    return [{"correct": bool(c), "extracted": e} for c, e in zip(correct, extracted)]


def _kl(pairs):
    return [{"logp": a, "logp_ref": b} for a, b in pairs]


# --------------------------------------------------------------------------- mean_stderr


def test_mean_stderr_by_hand():
    """[1, 2, 3, 4]: mean 2.5; squared deviations 2.25+0.25+0.25+2.25 = 5, sample var 5/3,
    stderr sqrt(5/3 / 4) = sqrt(5/12) ~ 0.6455."""
    m, se = mean_stderr([1, 2, 3, 4])
    assert m == 2.5
    assert se == pytest.approx(math.sqrt(5 / 12), rel=1e-12)


def test_mean_stderr_edges():
    """One value: stderr 0.0; none: (nan, nan); a generator is accepted."""
    assert mean_stderr([7.0]) == (7.0, 0.0)
    m, se = mean_stderr([])
    assert math.isnan(m) and math.isnan(se)
    assert mean_stderr(x for x in (1.0, 3.0)) == (2.0, 1.0)  # var 2, stderr sqrt(2/2)


# --------------------------------------------------------------------------- math_metrics


def test_pass1_first_sample_and_majority():
    """Two prompts, 4 samples each.

    Prompt A: answers ["3", "3", "4", None], correct [1, 1, 0, 0] (gold 3).
    Prompt B: answers ["7", "2", "2", "5"],  correct [1, 0, 0, 0] (gold 7).
    pass@1 = mean(2/4, 1/4) = 0.375; per-prompt values [0.5, 0.25]: var (0.125^2*2)/1 = 0.03125,
    stderr sqrt(0.03125/2) = 0.125.
    first_sample_acc = mean(1, 1) = 1.0, stderr 0.
    maj@4: A -> "3" (2 votes, None does not vote) correct; B -> "2" (2 votes) incorrect: 0.5,
    stderr over [1, 0] = sqrt(0.5/2) = 0.5.
    """
    out = math_metrics([
        _math([1, 1, 0, 0], ["3", "3", "4", None]),
        _math([1, 0, 0, 0], ["7", "2", "2", "5"]),
    ])
    assert out["pass@1"] == pytest.approx(0.375)
    assert out["pass@1_stderr"] == pytest.approx(0.125)
    assert out["first_sample_acc"] == 1.0 and out["first_sample_acc_stderr"] == 0.0
    assert out["maj@n"] == 0.5
    assert out["maj@n_stderr"] == pytest.approx(0.5)
    assert (out["n"], out["n_max"], out["prompts"]) == (4, 4, 2)


def test_brief_example_pass1_half():
    """Correctness [1,0,1,1] and [0,0,0,1]: pass@1 = (0.75 + 0.25)/2 = 0.5, per-prompt values
    [0.75, 0.25] give stderr sqrt(((0.25^2)*2/1)/2) = 0.25; first sample [1, 0] -> 0.5.
    Answers A ["3","9","3","3"] -> "3" (3 votes) correct; B ["1","1","2","8"] -> "1" incorrect."""
    out = math_metrics([
        _math([1, 0, 1, 1], ["3", "9", "3", "3"]),
        _math([0, 0, 0, 1], ["1", "1", "2", "8"]),
    ])
    assert out["pass@1"] == 0.5
    assert out["pass@1_stderr"] == pytest.approx(0.25)
    assert out["first_sample_acc"] == 0.5
    assert out["maj@n"] == 0.5


def test_majority_is_by_count_not_first_sample():
    """["4", "3", "3"], correct [0, 1, 1]: "3" has 2 votes and wins although sample 0 says "4":
    maj 1.0 while first_sample_acc is 0.0."""
    out = math_metrics([_math([0, 1, 1], ["4", "3", "3"])])
    assert out["maj@n"] == 1.0
    assert out["first_sample_acc"] == 0.0


def test_tie_goes_to_earliest_first_occurrence():
    """["5", "6", "6", "5"]: 2 votes each; "5" appears first (index 0) and wins. With "6" the
    correct answer the prompt scores 0; reversing the order (["6","5","5","6"]) makes "6" win: 1."""
    out = math_metrics([_math([0, 1, 1, 0], ["5", "6", "6", "5"])])
    assert out["maj@n"] == 0.0
    out = math_metrics([_math([1, 0, 0, 1], ["6", "5", "5", "6"])])
    assert out["maj@n"] == 1.0


def test_majority_takes_flag_of_first_occurrence():
    """Documented rule: the winning answer's `correct` is that of its first occurrence.
    ["7", "7", "1"] with flags [1, 0, 0] -> 1; with flags [0, 1, 1] -> 0."""
    assert math_metrics([_math([1, 0, 0], ["7", "7", "1"])])["maj@n"] == 1.0
    assert math_metrics([_math([0, 1, 1], ["7", "7", "1"])])["maj@n"] == 0.0


def test_normalisation_merges_votes():
    """["7", "1,000", "1000"], correct [0, 1, 1]: normalised, "1000" has 2 votes and wins (1.0).
    Compared raw it would be a three-way tie won by "7" (0.0)."""
    out = math_metrics([_math([0, 1, 1], ["7", "1,000", "1000"])])
    assert out["maj@n"] == 1.0


def test_equivalent_answers_share_a_vote():
    r"""["7", "\frac{1}{2}", "0.5"], correct [0, 1, 1]: "\frac{1}{2}" and "0.5" are one class with
    2 votes against 1 for "7": the class wins, its first answer (index 1) is correct -> 1.0.
    Voting by string it would be a three-way tie won by "7" (index 0) -> 0.0."""
    out = math_metrics([_math([0, 1, 1], ["7", r"\frac{1}{2}", "0.5"])])
    assert out["maj@n"] == 1.0


def test_a_matrix_and_its_first_entry_are_different_votes():
    r"""["-1/3", M spaced, M compact], correct [0, 1, 1] where M is the column (-1/3, 2/3): the two
    writings of M are one class (2 votes), "-1/3" is its own (1 vote): M wins -> 1.0."""
    answers = ["-1/3", r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}", r"\begin{pmatrix}-1/3\\2/3\end{pmatrix}"]
    assert math_metrics([_math([0, 1, 1], answers)])["maj@n"] == 1.0


def test_equivalence_classes_tie_by_first_occurrence():
    r"""["2", "\frac{4}{2}", "3", "3.0"]: classes {2, 4/2} and {3, 3.0}, 2 votes each; the class of
    "2" starts first (index 0) and wins; flags [0, 0, 1, 1] -> 0.0. Reordered
    ["3.0", "2", "3", "\frac{4}{2}"] with flags [1, 0, 1, 0]: the class of "3.0" starts at
    index 0 and wins -> 1.0. Intervals written with and without spaces are one class:
    ["12102", "(2, 12) \cup (12, 102)", "(2,12)\cup(12,102)"], flags [0, 1, 1] -> 1.0."""
    assert math_metrics([_math([0, 0, 1, 1], ["2", r"\frac{4}{2}", "3", "3.0"])])["maj@n"] == 0.0
    assert math_metrics([_math([1, 0, 1, 0], ["3.0", "2", "3", r"\frac{4}{2}"])])["maj@n"] == 1.0
    answers = ["12102", r"(2, 12) \cup (12, 102)", r"(2,12)\cup(12,102)"]
    assert math_metrics([_math([0, 1, 1], answers)])["maj@n"] == 1.0


def test_repeated_answers_are_not_compared_again(monkeypatch):
    """Ten "5" then ten "6": the only comparison is "6" against the representative "5"."""
    import pita.eval.metrics as m

    calls = []
    real = m.same_answer
    monkeypatch.setattr(m, "same_answer", lambda a, b: calls.append((a, b)) or real(a, b))
    assert m._vote(["5"] * 10 + ["6"] * 10 + [None]) == 0
    assert calls == [("6", "5")]


def test_none_does_not_vote_and_no_votes_is_incorrect():
    """[None, None, "5"] with correct [0, 0, 1]: None's two "votes" do not count, "5" wins (1.0).
    [None, None] and ["", " $ "] (normalise to nothing): no vote -> incorrect (0.0), even if the
    flags were set."""
    assert math_metrics([_math([0, 0, 1], [None, None, "5"])])["maj@n"] == 1.0
    out = math_metrics([_math([1, 1], [None, None]), _math([1, 1], ["", " $ "])])
    assert out["maj@n"] == 0.0
    assert out["pass@1"] == 1.0  # pass@1 reads the flags, not the votes


def test_unequal_sample_counts():
    """Prompts with 2 and 4 samples: n = 2 (minimum), n_max = 4; pass@1 = mean(1/2, 3/4) = 0.625."""
    out = math_metrics([_math([1, 0], ["1", "2"]), _math([1, 1, 1, 0], ["3", "3", "3", "4"])])
    assert (out["n"], out["n_max"], out["prompts"]) == (2, 4, 2)
    assert out["pass@1"] == pytest.approx(0.625)


def test_math_metrics_bad_input():
    """An empty prompt or a sample without `correct` is a ValueError naming the prompt."""
    with pytest.raises(ValueError, match="prompt 1 has no samples"):
        math_metrics([_math([1], ["1"]), []])
    with pytest.raises(ValueError, match="prompt 0 sample 0 has no 'correct'"):
        math_metrics([[{"extracted": "1"}]])


# --------------------------------------------------------------------------- reward_metrics


def test_reward_metrics_by_hand():
    """Rewards [1, 3] and [0, 0, 0, 4]: mean over all 6 samples 8/6 = 4/3 (the mean of the
    per-prompt means [2, 1] would be 1.5); stderr over [2, 1]: var 0.5, sqrt(0.5/2) = 0.5;
    first samples [1, 0] -> 0.5, stderr 0.5."""
    groups = [[{"reward": r} for r in rs] for rs in ([1.0, 3.0], [0.0, 0.0, 0.0, 4.0])]
    out = reward_metrics(groups)
    assert out["mean_reward"] == pytest.approx(4 / 3)
    assert out["mean_reward_stderr"] == pytest.approx(0.5)
    assert out["first_sample_mean_reward"] == 0.5
    assert out["first_sample_mean_reward_stderr"] == pytest.approx(0.5)


# --------------------------------------------------------------------------- kl_metrics


def test_kl_identical_is_exactly_zero():
    """logp == logp_ref for every sample (including -inf): every difference is 0.0, KL is 0.0
    exactly, stderr 0.0."""
    out = kl_metrics(_kl([(-3.7, -3.7), (-0.1, -0.1), (-123.456789, -123.456789), (-math.inf, -math.inf)]))
    assert out["kl"] == 0.0 and out["kl_stderr"] == 0.0
    assert (out["kl_samples"], out["kl_skipped"], out["kl_fraction"]) == (4, 0, 1.0)


def test_kl_by_hand():
    """Differences logp - logp_ref: (-1) - (-2) = 1 and (-1) - (-4) = 3: KL 2, var 2, stderr 1.
    The sign matters: swapping the two columns gives -2."""
    out = kl_metrics(_kl([(-1.0, -2.0), (-1.0, -4.0)]))
    assert out["kl"] == 2.0 and out["kl_stderr"] == pytest.approx(1.0)
    assert kl_metrics(_kl([(-2.0, -1.0), (-4.0, -1.0)]))["kl"] == -2.0


def test_kl_fraction_uses_first_samples():
    """Differences [1, 2, 3, 100]: fraction 0.5 -> first 2 -> 1.5; fraction 0.3 -> ceil(1.2) = 2
    -> 1.5; fraction 0.01 -> at least 1 -> 1.0. Twenty-five samples with fraction 0.28 use exactly
    7 (0.28 * 25 is 7.000000000000001 in floats, whose plain ceil would be 8)."""
    samples = _kl([(d, 0.0) for d in (1.0, 2.0, 3.0, 100.0)])
    out = kl_metrics(samples, fraction=0.5)
    assert (out["kl"], out["kl_samples"], out["kl_fraction"]) == (1.5, 2, 0.5)
    assert kl_metrics(samples, fraction=0.3)["kl_samples"] == 2
    assert kl_metrics(samples, fraction=0.01)["kl"] == 1.0
    assert kl_metrics(_kl([(float(i), 0.0) for i in range(25)]), fraction=0.28)["kl_samples"] == 7


def test_kl_skips_missing_and_counts_them():
    """Of the first five, samples 1 (no logp_ref), 2 (logp None) and 4 (logp nan) are skipped:
    3 skipped, KL over differences [1, 3] = 2. All six with fraction 0.5 -> the first 3: samples
    1 and 2 skipped, KL over [1] = 1."""
    samples = [
        {"logp": -1.0, "logp_ref": -2.0},
        {"logp": -1.0},
        {"logp": None, "logp_ref": -1.0},
        {"logp": -1.0, "logp_ref": -4.0},
        {"logp": math.nan, "logp_ref": -1.0},
        {"logp": -5.0, "logp_ref": -5.0},
    ]
    out = kl_metrics(samples[:5])
    assert (out["kl"], out["kl_samples"], out["kl_skipped"]) == (2.0, 2, 3)
    out = kl_metrics(samples, fraction=0.5)
    assert (out["kl"], out["kl_samples"], out["kl_skipped"]) == (1.0, 1, 2)


def test_kl_empty_is_nan():
    """No usable samples: KL nan, 0 samples."""
    out = kl_metrics([{"logp": None, "logp_ref": None}])
    assert math.isnan(out["kl"]) and out["kl_samples"] == 0 and out["kl_skipped"] == 1


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.0001, 2, math.nan, math.inf, True, "0.5", None])
def test_kl_bad_fraction_raises(bad):
    with pytest.raises(ValueError, match=r"eval\.kl_fraction"):
        kl_metrics(_kl([(-1.0, -1.0)]), fraction=bad)


# --------------------------------------------------------------------------- summarize


def test_summarize_math_with_reward_and_logp():
    """Math samples with rewards and logps: accuracy, reward and KL keys all present. KL runs over
    prompts in order: differences [1, 1 | 3, 3] -> 2.0; with kl_fraction 0.5 only prompt 0 -> 1.0."""
    groups = [
        [{"correct": True, "extracted": "1", "reward": 1.0, "logp": -1.0, "logp_ref": -2.0}] * 2,
        [{"correct": False, "extracted": "2", "reward": 0.0, "logp": -1.0, "logp_ref": -4.0}] * 2,
    ]
    out = summarize(groups, "math")
    assert out["pass@1"] == 0.5 and out["maj@n"] == 0.5
    assert out["mean_reward"] == 0.5
    assert out["kl"] == 2.0 and out["kl_samples"] == 4
    assert summarize(groups, "math", kl_fraction=0.5)["kl"] == 1.0


def test_summarize_selects_by_task():
    """Math without rewards or logps: no reward or KL keys. Reward task: no accuracy keys."""
    out = summarize([_math([1, 0], ["1", "2"])], "math")
    assert "pass@1" in out and "mean_reward" not in out and "kl" not in out
    out = summarize([[{"reward": 2.0}, {"reward": 4.0}]], "reward")
    assert out["mean_reward"] == 3.0 and "pass@1" not in out and "kl" not in out


def test_summarize_unknown_task():
    with pytest.raises(ValueError, match=r"did you mean 'math'"):
        summarize([], "maths")


# ---------------------------------------------------------------- intervals over seeds
def test_t_quantiles_match_the_tables():
    """Student's t quantiles (two-sided 95%: 12.706 at 1 df, 4.303 at 2, 2.776 at 4, 1.960 at many)
    and the cdf they invert."""
    from pita.eval.metrics import t_cdf, t_quantile

    for df, q in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423), (math.inf, 1.9600)):
        assert t_quantile(0.975, df) == pytest.approx(q, abs=2e-4)
        assert t_cdf(q, df) == pytest.approx(0.975, abs=1e-4)
    assert t_quantile(0.025, 3) == pytest.approx(-t_quantile(0.975, 3), abs=1e-9)


def _seed_coverage(k: int, seed_sd: float, prompt_sd: float, noise_sd: float, sims: int, prompts: int = 48,
                   resamples: int = 200) -> float:
    """How often seed_interval's 95% interval covers the true mean when k seeds of one experiment
    are measured on the same ``prompts`` test prompts: y[s, j] = seed effect + prompt effect +
    noise, the truth 0 (prompts drawn afresh in every simulated experiment), each seed's estimate
    the mean over the prompts, the prompt draws shared by the seeds as bootstrap_ratios shares them."""
    import numpy as np

    from pita.eval.metrics import seed_interval

    rng = np.random.default_rng([k, int(seed_sd * 100), int(prompt_sd * 100), int(noise_sd * 100)])
    hits = 0
    for _ in range(sims):
        y = (rng.normal(0, seed_sd, (k, 1)) + rng.normal(0, prompt_sd, (1, prompts))
             + rng.normal(0, noise_sd, (k, prompts)))
        idx = rng.integers(0, prompts, (resamples, prompts))
        draws = y[:, idx].mean(2).T  # [resamples x seeds]
        ci = seed_interval(y.mean(1), draws, prompts=prompts)
        hits += ci["lo"] <= 0.0 <= ci["hi"]
    return hits / sims


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("seed_sd,prompt_sd,noise_sd", [(1.0, 0.2, 0.5),
                                                        (0.5, 0.5, 1.0)], ids=["seeds-dominate", "seeds-and-prompts"])
def test_a_seed_level_interval_covers_95_percent_with_three_and_five_seeds(k, seed_sd, prompt_sd, noise_sd):
    """Seeds with a known variance: the 95% interval covers the truth 93-97% of the time (1,500
    simulated experiments each: the count's own standard error is 0.6%). A percentile bootstrap
    over seeds and prompts, the report's interval before, covered ~75% at k = 3."""
    cover = _seed_coverage(k, seed_sd, prompt_sd, noise_sd, sims=1500)
    assert 0.93 <= cover <= 0.97, cover


def _binary_coverage(k: int, seed_sd: float, prompt_sd: float, sims: int, prompts: int = 48, n: int = 4,
                     base: float = -0.8, resamples: int = 200) -> float:
    """As _seed_coverage with 0/1 outcomes: n samples per prompt and seed, each correct with
    probability sigmoid(base + seed effect + prompt effect) (base -0.8: pass@1 near 0.3, as the
    tiny and real arith models), each seed's estimate its pass@1 over the prompts; the truth is
    the expected pass@1 over seeds and prompts, integrated once on a large grid."""
    import numpy as np

    from pita.eval.metrics import seed_interval

    rng = np.random.default_rng([k, 7, int(seed_sd * 100), int(prompt_sd * 100)])
    z = rng.normal(0, 1, (2, 400_000))
    truth = float((1 / (1 + np.exp(-(base + seed_sd * z[0] + prompt_sd * z[1])))).mean())
    hits = 0
    for _ in range(sims):
        logit = base + rng.normal(0, seed_sd, (k, 1)) + rng.normal(0, prompt_sd, (1, prompts))
        p = 1 / (1 + np.exp(-logit))
        y = rng.binomial(n, p) / n  # [seeds x prompts]: each prompt's pass@1 over its n samples
        idx = rng.integers(0, prompts, (resamples, prompts))
        draws = y[:, idx].mean(2).T
        ci = seed_interval(y.mean(1), draws, prompts=prompts)
        hits += ci["lo"] <= truth <= ci["hi"]
    return hits / sims


# Every regime, 93-97%: the half-width is the larger of Welch-Satterthwaite's and the seeds' part's
# own. Measured at 4,000 experiments each (scratch script): 93.9% with 0/1 outcomes where seeds
# and prompts mix at k = 3 (the seeds' skew on the probability scale; a generalized pivotal
# quantity gave 93.8%, Welch-Satterthwaite alone 90.9%), 94.7-95.3% where the prompts dominate
# (the pivotal quantity: 96-98%).
BAND = (0.93, 0.97)


@pytest.mark.parametrize("k", [3, 5])
def test_a_seed_level_interval_covers_95_percent_where_the_prompts_carry_the_variance(k):
    """As real_arith: the prompts (which the seeds share) carry most of the variance, the seeds
    little. Covered 93-97% of 1,500 simulated experiments."""
    cover = _seed_coverage(k, 0.1, 1.0, 0.5, sims=1500)
    assert BAND[0] <= cover <= BAND[1], cover


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("seed_sd,prompt_sd,band", [(0.3, 1.5, BAND), (0.6, 0.5, BAND)],
                         ids=["prompts-dominate", "seeds-and-prompts"])
def test_a_seed_level_interval_covers_95_percent_with_zero_one_outcomes(k, seed_sd, prompt_sd, band):
    """0/1 per-sample outcomes (4 samples per prompt, pass@1 near 0.3), the interval around the
    expected pass@1: covered 93-97% of 1,500 simulated experiments, whether the prompts dominate
    or seeds and prompts mix."""
    cover = _binary_coverage(k, seed_sd, prompt_sd, sims=1500)
    assert band[0] <= cover <= band[1], cover


def test_a_seed_interval_without_draws_is_the_t_interval_and_one_seed_is_the_prompt_bootstrap():
    import numpy as np

    from pita.eval.metrics import seed_interval, t_quantile

    pts = [0.105, -0.004, 0.086]
    ci = seed_interval(pts)
    half = t_quantile(0.975, 2) * float(np.std(pts, ddof=1)) / math.sqrt(3)
    assert (ci["lo"], ci["hi"]) == pytest.approx((np.mean(pts) - half, np.mean(pts) + half))
    assert ci["hi"] - ci["lo"] > 0.28  # the issue's +-0.15, not the +-0.05-0.09 a bootstrap over 3 seeds gave
    one = seed_interval([0.2], np.linspace(0.1, 0.3, 101)[:, None])
    assert one["lo"] == pytest.approx(0.105) and one["hi"] == pytest.approx(0.295) and one["seeds"] == 1
    assert math.isnan(seed_interval([0.2])["lo"]) and math.isnan(seed_interval([])["mean"])
