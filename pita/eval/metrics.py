"""Evaluation metrics over sampled completions: pure functions of per-sample records.

    groups = [[{"correct": True, "extracted": "3"}, {"correct": False, "extracted": "4"}], ...]
    summarize(groups, "math")  # {"pass@1": ..., "maj@n": ..., "prompts": ..., ...}

Input is one list per prompt of sample dicts, in sampling order. Math samples carry ``correct``
(bool) and ``extracted`` (the verifier's answer, or None); reward samples carry ``reward``;
any sample may carry ``logp`` / ``logp_ref`` / ``kl_path`` for the KL. Every mean comes with its
standard error, and the unit of that error is the prompt (per-prompt means), because samples of
one prompt are correlated and treating them as independent would understate the error.

No torch, no I/O: the numbers are checked by hand in ``tests/test_eval_metrics.py``
(run: ``.venv/bin/python -m pytest -q tests/test_eval_metrics.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from pita.core.names import unknown_name
from pita.rewards.verifier import normalize_answer, same_answer

TASKS = ("math", "reward")

Sample = Mapping[str, object]
Groups = Sequence[Sequence[Sample]]


# the report's KL budgets (``eval.kl_budgets``), nats per sequence: pita/report/matched.py
KL_BUDGETS = (0.05, 0.1, 0.25, 0.5, 1.0)


def budget_problems(budgets: object, field: str = "eval.kl_budgets") -> list[str]:
    """Problems with a list of KL budgets (nats per sequence), in the form ``validate_config`` lists;
    ``field`` names where they came from (the config key, or ``pita report --kl-budgets``)."""
    vals = list(budgets) if isinstance(budgets, (list, tuple)) else None
    bad = [b for b in vals or [] if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b)
           or b <= 0]
    if not vals or bad:
        what = f"bad: {', '.join(map(repr, bad))}" if bad else "an empty list or not a list"
        example = "--kl-budgets 0.05,0.1,0.25,0.5,1" if field.startswith("--") else f"{field}=[0.05,0.1,0.25,0.5,1]"
        return [f"{field}={budgets!r}: every KL budget must be a finite number of nats per sequence > 0 "
                f"({what}); e.g. {example}"]
    return []


def mean_stderr(xs: Iterable[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std with n-1, over sqrt(n)).

    One value has stderr 0.0 (no spread to measure); no values give (nan, nan).
    """
    vals = [float(x) for x in xs]
    n = len(vals)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(vals) / n
    if n == 1:
        return mean, 0.0
    var = math.fsum((x - mean) ** 2 for x in vals) / (n - 1)
    return mean, math.sqrt(var / n)


def _field(sample: Sample, key: str, where: str) -> object:
    try:
        return sample[key]
    except KeyError:
        raise ValueError(f"{where} has no {key!r} field (its fields: {', '.join(map(str, sample))})") from None


def _check_groups(groups: Groups, what: str) -> None:
    for i, g in enumerate(groups):
        if len(g) == 0:
            raise ValueError(f"{what}: prompt {i} has no samples; drop it or sample at least one completion")


def answer_classes(answers: Sequence[str | None]) -> list[int | None]:
    """Each answer's class of mathematically equivalent answers (None: no answer, no vote).

    Answers group by equivalence: each one joins the first class whose representative (the
    class's earliest answer) it is equivalent to (``same_answer``: math-verify, so "\\frac{1}{2}"
    and "0.5" share a class), else starts a class of its own; classes are numbered in order of
    their first answer. An answer repeated verbatim reuses its class without a comparison, so a
    prompt costs one comparison per pair of distinct answers and classes at most."""
    reps: list[str] = []  # per class: its representative (normalised)
    class_of: dict[str, int] = {}  # normalised answer -> its class
    out: list[int | None] = []
    for a in answers:
        key = normalize_answer(a) if a is not None else ""
        if not key:  # no answer, or one that normalises to nothing: no vote
            out.append(None)
            continue
        c = class_of.get(key)
        if c is None:
            c = next((j for j, rep in enumerate(reps) if same_answer(key, rep)), None)
            if c is None:
                reps.append(key)
                c = len(reps) - 1
            class_of[key] = c
        out.append(c)
    return out


def _vote(answers: Sequence[str | None]) -> int | None:
    """Index of the first sample carrying the majority answer, or None when nobody voted
    (classes: :func:`answer_classes`). Ties go to the class whose first answer comes earliest in
    sampling order."""
    classes = answer_classes(answers)
    counts: dict[int, int] = {}
    first: dict[int, int] = {}
    for i, c in enumerate(classes):
        if c is not None:
            counts[c] = counts.get(c, 0) + 1
            first.setdefault(c, i)
    if not counts:
        return None
    # classes are numbered in order of first occurrence, and max() keeps the first maximum
    winner = max(sorted(counts), key=counts.__getitem__)
    return first[winner]


def math_metrics(groups: Groups) -> dict:
    """Accuracy metrics for math: pass@1, first-sample accuracy and majority vote, with stderrs.

    - ``pass@1``: mean over prompts of the fraction of that prompt's samples that are correct.
    - ``first_sample_acc``: correctness of each prompt's sample 0 only (what one greedy-free
      draw per prompt would score).
    - ``maj@n``: majority vote over the extracted answers grouped by mathematical equivalence
      (``pita.rewards.verifier.same_answer``, math-verify: "1,000" and "1000", "\\frac{1}{2}"
      and "0.5" are one vote); samples with no answer do not vote. Tie rule: among the classes
      with the top count, the one whose first answer in sampling order is earliest wins. The
      prompt counts as correct when the ``correct`` flag of that first answer is set. A prompt
      where nobody voted is incorrect.
    - ``n``: samples per prompt (the minimum if prompts differ), ``n_max`` the maximum;
      ``prompts``: number of prompts.

    Each ``*_stderr`` is the standard error over prompts of the per-prompt values.
    """
    _check_groups(groups, "math_metrics")
    per_prompt, first, maj = [], [], []
    for i, g in enumerate(groups):
        flags = [bool(_field(s, "correct", f"math_metrics: prompt {i} sample {j}")) for j, s in enumerate(g)]
        answers = [_field(s, "extracted", f"math_metrics: prompt {i} sample {j}") for j, s in enumerate(g)]
        per_prompt.append(sum(flags) / len(flags))
        first.append(float(flags[0]))
        w = _vote(answers)
        maj.append(float(w is not None and flags[w]))
    out: dict = {}
    for name, vals in (("pass@1", per_prompt), ("first_sample_acc", first), ("maj@n", maj)):
        out[name], out[f"{name}_stderr"] = mean_stderr(vals)
    sizes = [len(g) for g in groups]
    out["n"] = min(sizes, default=0)
    out["n_max"] = max(sizes, default=0)
    out["prompts"] = len(groups)
    return out


def reward_metrics(groups: Groups) -> dict:
    """Reward metrics: ``mean_reward`` over all samples, its stderr over per-prompt means.

    ``mean_reward_stderr`` takes prompts as the unit (standard error of the per-prompt mean
    rewards), so with unequal sample counts it is not the error of ``mean_reward`` exactly but of
    the prompt-level mean; with equal counts the two means coincide.
    ``first_sample_mean_reward`` (and its stderr) uses each prompt's sample 0 only.
    """
    _check_groups(groups, "reward_metrics")
    every, per_prompt, first = [], [], []
    for i, g in enumerate(groups):
        rs = [float(_field(s, "reward", f"reward_metrics: prompt {i} sample {j}")) for j, s in enumerate(g)]
        every.extend(rs)
        per_prompt.append(math.fsum(rs) / len(rs))
        first.append(rs[0])
    out: dict = {}
    out["mean_reward"] = math.fsum(every) / len(every) if every else math.nan
    out["mean_reward_stderr"] = mean_stderr(per_prompt)[1]
    out["first_sample_mean_reward"], out["first_sample_mean_reward_stderr"] = mean_stderr(first)
    return out


def _check_fraction(fraction: object) -> float:
    ok = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
    if not ok or not (0.0 < float(fraction) <= 1.0):  # nan fails the comparison too
        raise ValueError(
            f"eval.kl_fraction={fraction!r} is out of range; it is the share of samples used for the KL "
            "estimate and must be a number in (0, 1], e.g. 1.0 for all samples"
        )
    return float(fraction)


def _usable(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def kl_steps(sample: Sample) -> int:
    """The next-token draws a sample took: its tokens, plus the EOS it stopped on."""
    return int(sample.get("n_tokens") or 0) + (sample.get("finish") == "eos")


def kl_window(samples: Sequence[Sample], fraction: float = 1.0) -> list[Sample]:
    """The samples a KL estimate uses: the first ``ceil(fraction * N)`` in the given order (at
    least one when N > 0)."""
    frac = _check_fraction(fraction)
    # round() first: 0.28 * 25 is 7.000000000000001 in floats, and must mean 7 samples, not 8.
    take = max(1, math.ceil(round(frac * len(samples), 9))) if samples else 0
    return list(samples[:take])


def exact_kl_of(window: Sequence[Sample]) -> bool:
    """Whether the window's KL is the exact per-step one: every sample with a log-ratio also
    carries ``kl_path`` (records from before it was saved fall back to the log-ratio)."""
    usable = [s for s in window if _usable(s.get("logp")) and _usable(s.get("logp_ref"))]
    return bool(usable) and all(_usable(s.get("kl_path")) for s in usable)


def sample_kl(s: Sample, exact: bool) -> float | None:
    """One sample's KL term: ``kl_path`` (exact) or ``logp - logp_ref`` (log-ratio); None when
    the sample has none."""
    a, b = s.get("logp"), s.get("logp_ref")
    if not (_usable(a) and _usable(b)):
        return None
    if exact:
        return float(s["kl_path"])
    return 0.0 if a == b else float(a) - float(b)


def kl_metrics(samples: Sequence[Sample], fraction: float = 1.0) -> dict:
    """KL(pi || pi_ref) per sequence (nats), over samples drawn from pi, with its standard error.

    ``kl``: the mean of each sample's ``kl_path``, the exact KL of the two next-token
    distributions at every step, summed along the sampled path. Its expectation is the sequence
    KL; it is never negative and far less noisy than a single log-ratio. ``kl_estimator`` names
    it ``exact per-step``; records without ``kl_path`` (older runs) fall back to the log-ratio.
    ``kl_logratio``: the mean of ``logp - logp_ref`` (log-probabilities under pi and the
    identically processed reference), unbiased too but noisy, and a single estimate may be
    negative although KL is not. Equal ``logp`` and ``logp_ref`` contribute exactly 0.0.
    ``kl_per_token``: the summed KL over the summed steps (tokens, plus the EOS drawn).

    Only ``kl_window(samples, fraction)`` is used; within it, samples whose ``logp`` or
    ``logp_ref`` is missing, None or nan are skipped and counted in ``kl_skipped``.
    ``kl_samples`` is the number actually averaged.
    """
    frac = _check_fraction(fraction)
    window = kl_window(samples, frac)
    exact = exact_kl_of(window)
    terms, ratios, steps, skipped = [], [], 0, 0
    for s in window:
        v = sample_kl(s, exact)
        if v is None:
            skipped += 1
            continue
        terms.append(v)
        ratios.append(sample_kl(s, False))
        steps += kl_steps(s)
    kl, kl_se = mean_stderr(terms)
    lr, lr_se = mean_stderr(ratios)
    return {"kl": kl, "kl_stderr": kl_se, "kl_estimator": "exact per-step" if exact else "log-ratio",
            "kl_logratio": lr, "kl_logratio_stderr": lr_se,
            "kl_per_token": math.fsum(terms) / steps if steps else math.nan,
            "kl_samples": len(terms), "kl_skipped": skipped, "kl_fraction": frac}


def summarize(groups: Groups, task: str, kl_fraction: float = 1.0) -> dict:
    """All metrics that apply to ``task``, in one flat dict.

    ``math``: ``math_metrics``, plus ``reward_metrics`` when every sample has a ``reward``.
    ``reward``: ``reward_metrics``. Either way ``kl_metrics`` is added when any sample carries
    ``logp``, over all samples in prompt order (prompt 0's samples first).
    """
    if task not in TASKS:
        raise ValueError(unknown_name("task", task, TASKS))
    flat = [s for g in groups for s in g]
    out: dict = {}
    if task == "math":
        out.update(math_metrics(groups))
        if flat and all("reward" in s for s in flat):
            out.update(reward_metrics(groups))
    else:
        out.update(reward_metrics(groups))
        out["n"] = min((len(g) for g in groups), default=0)
        out["prompts"] = len(groups)
    if any("logp" in s for s in flat):
        out.update(kl_metrics(flat, kl_fraction))
    return out


def bootstrap_ratios(columns: Mapping[str, tuple[Sequence[float], Sequence[float]]], resamples: int = 1000,
                     seed: int = 0) -> dict[str, list[float]]:
    """Bootstrap over prompts: ``resamples`` draws of the prompts with replacement, the same draws
    for every column, and per draw each column's ``sum(num[i]) / sum(den[i])`` over the drawn
    prompts i.

    A column is (num, den), one entry per prompt, all columns over the same prompts in the same
    order. A mean over prompts is (per-prompt values, ones); a mean over samples is (per-prompt
    sums, per-prompt counts); so each column's statistic on the original prompts is its point
    estimate. Drawing the prompts once for all columns is what makes a difference of two columns
    (a row minus the base model on the same prompts) a paired comparison. A draw whose
    denominator is 0 gives nan. Seeded: the same inputs give the same draws.
    """
    import numpy as np

    cols = {k: (np.asarray(n, dtype=float), np.asarray(d, dtype=float)) for k, (n, d) in columns.items()}
    sizes = {len(n) for n, _ in cols.values()} | {len(d) for _, d in cols.values()}
    if len(sizes) > 1:
        raise ValueError(f"bootstrap_ratios: columns cover different numbers of prompts ({sorted(sizes)})")
    n_prompts = sizes.pop() if sizes else 0
    if n_prompts == 0:
        return {k: [] for k in cols}
    idx = np.random.default_rng(seed).integers(0, n_prompts, size=(resamples, n_prompts))
    out = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for k, (num, den) in cols.items():
            d = den[idx].sum(1)
            out[k] = np.where(d > 0, num[idx].sum(1) / np.where(d > 0, d, 1), np.nan).tolist()
    return out


def percentile_interval(draws: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` interval of bootstrap draws (percentile method; nan draws ignored)."""
    import numpy as np

    a = np.asarray(draws, dtype=float)
    a = a[~np.isnan(a)]
    if a.size == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(a, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


# ---------------------------------------------------------------- intervals over seeds
def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
    Lentz's method; Numerical Recipes' betacf), using the symmetry I_x(a, b) = 1 - I_{1-x}(b, a)
    where the fraction converges slowly."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df > 0, not necessarily whole)."""
    if math.isinf(df):
        return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``;
    the normal quantile for an infinite df)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} must be in (0, 1)")
    if math.isinf(df) or df > 1e7:
        from statistics import NormalDist

        return NormalDist().inv_cdf(p)
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def seed_interval(points: Sequence[float], draws=None, prompts: int | None = None, level: float = 0.95) -> dict:
    """A ``level`` interval for the mean over k seeds of a statistic measured once per seed on the
    same test prompts.

    ``points``: the k seeds' estimates. ``draws`` (optional): [resamples x k], each seed's
    estimate recomputed on resampled test prompts, the same prompt draws for every seed (what
    ``bootstrap_ratios`` gives runs of one experiment with one seed). ``prompts``: how many test
    prompts there are (the prompt part's degrees of freedom; default many).

    The mean's variance has two parts. The seeds' own (training and sampling randomness, each
    seed's sampling noise on its prompts included) is estimated by the spread of the k estimates,
    a = s^2 / k, with k - 1 degrees of freedom. The shared prompts' (the same prompts in every
    seed, so their luck does not average out over seeds) is estimated by the mean covariance of
    two different seeds' prompt draws (what a prompt draw moves in every seed alike), b, with
    prompts - 1. The half-width is the larger of two t half-widths: Welch-Satterthwaite's for the
    sum, t(nu) sqrt(a + b) with nu = (a + b)^2 / (a^2 / (k-1) + b^2 / (prompts-1)), and the
    seeds' part alone, t(k-1) sqrt(a): adding the prompts' part never makes the interval narrower
    than the seeds alone make it. Alone, Welch-Satterthwaite overstates nu when a is small by the
    luck of three seeds (91% with 0/1 outcomes at k = 3); a generalized pivotal quantity was
    conservative where the prompts dominate (98%: the (k-1)/chi2_{k-1} tail of a small part). In
    simulation (tests/test_eval_metrics.py: Gaussian and 0/1 outcomes, seeds or prompts
    dominating or mixed, k = 3 and 5) this interval covers 93.9-95.8%. It is the t interval
    with k - 1 degrees of freedom when the prompts add nothing. With one seed there is no seed
    part: the prompt draws' percentile interval.

    Returns ``{"mean", "lo", "hi", "seeds", "seed_se", "prompt_se", "method"}`` (lo / hi nan where
    nothing can be said: one seed without draws, a draw set with fewer than 2 complete draws)."""
    import numpy as np

    pts = np.asarray([float(p) for p in points], dtype=float)
    k = int(pts.size)
    out = {"mean": float(pts.mean()) if k else math.nan, "lo": math.nan, "hi": math.nan, "seeds": k,
           "seed_se": math.nan, "prompt_se": math.nan, "method": None}
    if k == 0 or np.isnan(pts).any():
        return out
    d = None if draws is None else np.asarray(draws, dtype=float).reshape(-1, k)
    if d is not None:
        d = d[~np.isnan(d).any(1)]
        if len(d) < 2:
            d = None
    if k == 1:
        if d is not None:
            out["lo"], out["hi"] = percentile_interval(d[:, 0].tolist(), level)
            out.update(prompt_se=float(d[:, 0].std(ddof=1)), method="prompt bootstrap (one seed)")
        return out
    seed_var = float(pts.var(ddof=1)) / k
    shared = 0.0
    n = int(prompts) if prompts else 0
    if d is not None:
        cov = np.cov(d, rowvar=False, ddof=1)
        shared = max(0.0, float(cov[~np.eye(k, dtype=bool)].mean()))
        if n > 1:
            shared *= n / (n - 1)  # the bootstrap's variance of a mean of n is (n - 1) / n of the sample's
    out.update(seed_se=math.sqrt(seed_var), prompt_se=math.sqrt(shared),
               method=f"seed-level ({k} seeds, k-1 = {k - 1} df{', shared prompts' if d is not None else ''})")
    q = seed_half_width(seed_var, shared, k, n, level)
    out.update(lo=float(pts.mean() - q), hi=float(pts.mean() + q))
    return out


def seed_half_width(seed_var: float, shared: float, k: int, n: int, level: float = 0.95) -> float:
    """:func:`seed_interval`'s half-width from the seeds' part ``seed_var`` (k - 1 df) and the
    shared prompts' ``shared`` (n - 1 df; many when n < 2): the larger of Welch-Satterthwaite's
    t half-width for the sum and the seeds' part's own."""
    p = 0.5 + level / 2
    alone = t_quantile(p, k - 1) * math.sqrt(seed_var)
    total = seed_var + shared
    if shared <= 0 or total <= 0:
        return alone
    denom = seed_var ** 2 / (k - 1) + (shared ** 2 / (n - 1) if n > 1 else 0.0)
    nu = total ** 2 / denom if denom > 0 else math.inf
    return max(alone, t_quantile(p, nu) * math.sqrt(total))
