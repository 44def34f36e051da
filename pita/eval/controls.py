"""Controls: what the base model gets at a given KL with no training, on every equal-KL frontier.

A method's gain at equal KL may come from something far simpler than the method: a value head
that starts from the LM's own log-probabilities tilts towards likely tokens, which is what a
lower temperature does, and any policy that reranks the base model's samples by a reward gains
as best-of-n does. Two controls make those explanations visible, computed from the base model
alone (no training job), evaluated on the test prompts and on the validation prompts like every
method, their frontier chosen on validation:

``control: temperature``  the base model sampled at ``eval.control_temperatures`` (lower than
    ``eval.temperature``), its KL measured exactly per step against the base model at the
    evaluation's temperature, as every other row's (``reference_temperature`` of
    ``LM.generate_ids``). One row per temperature (``variant`` ``T=0.7``). Like a guided
    method's eta, the temperatures are then searched on the validation prompts until the KL
    budgets are bracketed (``eval.eta_search_steps`` rounds, down to
    ``eval.control_temperature_min``; :func:`temperature_search`), and the test prompts sample
    the ones the search added: a fixed grid left method - control differences missing at the
    larger budgets.

``control: best-of-n``    for n in ``eval.best_of_n``: the completion with the highest score
    among n base-model samples. The score is one a user would have at test time, never the gold
    answer: the reward model on reward tasks; on verifier tasks the proxy reward model the run
    trains anyway (Q#-HF's or GRPO-HF's, round 0), so the control exists on a verifier task only
    when one of them runs. From a pool of N = POOL_FACTOR x max(n) samples per prompt (``pool``
    on each row; a pool of max(n) left the KL's plug-in estimate biased up to +25% in simulation,
    tests/test_controls.py) the value is the
    unbiased estimate of the expected metric of the best of n drawn without replacement: with the
    pool sorted by score, the i-th lowest of N is the best of a random n-subset with probability
    C(i-1, n-1) / C(N, n). Its KL is measured from the pool (``best_of_n_kl``: exact where the
    pool's distinct completions hold the support, the bound where nothing repeats), the standard
    bound log n - (n-1)/n kept as ``kl_bound``; one row per n (``variant`` ``n=4``). Each row
    also says how well its scorer ranks the pool (``scorer_agreement``: of the pairs of one
    prompt's samples whose outcomes differ, the share it orders as the outcomes are, score ties
    counting 1/2; ``scorer_chance``: not above 0.5 by two standard errors;
    ``scorer_prompt_agreement``: how well its mean per prompt orders the prompts by pass rate): a
    scorer no better than chance makes a best-of-n that loses by construction, which the report
    names in its cell, with whether it learned the prompts' difficulty instead.

``control: best-of-n by value``  on a verifier task with Q# in the run: the same pool ranked by
    Q#'s round-0 value model (its predicted value of each whole sequence), the supervision Q# had.

``control: best-of-n by log-prob``  on a verifier task: the pool ranked by the base model's own
    log-probability per token (no model to train or load). A learned scorer trained on a few
    hundred returns may rank at chance; the model's own confidence is the reranker it must beat.

``control: best-of-n by reward model``  on a verifier task whose dataset has a reward model
    (``model.reward_models.<dataset>``, as the PITA reference scores math): the pool ranked by
    that model's score alone, without the verifier, as a user would have it at test time.

``control: majority vote``  on a verifier task (``eval.controls`` ``majority_vote``): the answer
    most of n pool samples give (self-consistency), answers grouped by mathematical equivalence;
    per prompt and n the expected correctness over ``MAJORITY_DRAWS`` random n-subsets (a tie
    drawn uniformly), and its KL at the level of the answers: the vote outputs a sample of its
    winning answer, so its KL is that of the winning answer's distribution against the pool's.

A control whose scorer ranks at chance is shown with its mark in the equal-KL table and left out
of the table of differences between methods.

Job ids: ``control.temperature.<family>.<dataset>.{eval,val,eval-search}.*``,
``control.temperature.<family>.<dataset>.search`` and
``control.best_of_n.<family>.<dataset>.{pool,valpool}.*`` (``.merge``: ranked by the reward model
or the proxy; ``.value``: by Q#'s value model; ``.logprob``, ``.rm``, ``.majority``).
"""

from __future__ import annotations

import math

from pita.core.errors import JobError
from pita.core.job import Job, Resources, add_kind_module, job_kind

add_kind_module("pita.eval.controls")
add_kind_module("pita.eval.eta_search")  # eval.eta_search: the temperature control's search

CONTROLS = ("temperature", "best_of_n", "majority_vote")
SCORE_BATCH = 64  # sequences the best-of-n merge scores with the proxy at once (its micro_batch_size)
TEMPERATURE = "control: temperature"
BEST_OF_N = "control: best-of-n"
BEST_OF_N_VALUE = "control: best-of-n by value"
BEST_OF_N_RM = "control: best-of-n by reward model"
BEST_OF_N_LOGP = "control: best-of-n by log-prob"
MAJORITY = "control: majority vote"
MAJORITY_DRAWS = 400  # random n-subsets of each prompt's pool that majority vote's estimate averages
VALUE_OF = "QSharp"  # the algorithm whose round-0 value model scores the second best-of-n on verifier tasks
KL_ESTIMATOR = "best-of-n over the pool"
DEFAULT_FACTORS = (0.85, 0.7, 0.55, 0.4)  # of eval.temperature, when eval.control_temperatures is null
PROXY_OF = ("QSharp-HF", "GRPO-HF")  # algorithms whose round-0 proxy reward model scores best-of-n on verifier tasks
T_MIN = 0.05  # eval.control_temperature_min's default: the coldest temperature the control's search tries
T_MAX = 0.98  # the warmest, as a fraction of eval.temperature (the base model itself is at 1)
POOL_FACTOR = 4  # the best-of-n pool: this many times max(eval.best_of_n) samples per prompt


def ranking_agreement(scores: list[list[float]], values: list[list[float]]) -> dict:
    """How well a scorer ranks each prompt's pool: of the pairs of one prompt's samples whose
    outcomes (``values``) differ, the share it orders as the outcomes are (equal scores count
    1/2), over all prompts; its standard error over prompts (a ratio estimate: the prompts are
    the independent units); the pairs and prompts counted; and ``chance``: the share is not above
    0.5 by two standard errors (or no pair differs)."""
    per = []
    for sc, v in zip(scores, values):
        agree = pairs = 0.0
        for i in range(len(v)):
            for j in range(i + 1, len(v)):
                if v[i] == v[j]:
                    continue
                pairs += 1
                d = (sc[i] - sc[j]) * (v[i] - v[j])
                agree += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
        if pairs:
            per.append((agree, pairs))
    between = prompt_agreement(scores, values)
    total = sum(n for _, n in per)
    if not total:
        return {"agreement": None, "agreement_se": None, "pairs": 0, "prompts": 0, "chance": True,
                "prompt_agreement": between}
    r = sum(a for a, _ in per) / total
    k = len(per)
    se = (math.sqrt(sum((a - r * n) ** 2 for a, n in per) * k / (k - 1)) / total) if k > 1 else float("inf")
    return {"agreement": r, "agreement_se": se, "pairs": int(total), "prompts": k, "chance": not r - 2 * se > 0.5,
            "prompt_agreement": between}


def prompt_agreement(scores: list[list[float]], values: list[list[float]]) -> float | None:
    """How well a scorer's mean over a prompt's pool orders the prompts by their mean outcome: of
    the pairs of prompts whose mean outcomes differ, the share it orders as they are (equal means
    count 1/2); None with fewer than two such prompts. Beside :func:`ranking_agreement` it tells a
    scorer that learned which prompts are hard (high here, chance within a prompt) from one that
    learned nothing: a value model fitted to a few hundred returns learns the prompt's difficulty
    first, which guides no choice among one prompt's completions."""
    means = [(math.fsum(s) / len(s), math.fsum(v) / len(v)) for s, v in zip(scores, values) if s]
    agree = pairs = 0.0
    for i in range(len(means)):
        for j in range(i + 1, len(means)):
            dv = means[i][1] - means[j][1]
            if dv == 0:
                continue
            pairs += 1
            d = (means[i][0] - means[j][0]) * dv
            agree += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
    return agree / pairs if pairs else None


def temperatures(ev) -> list[float]:
    """The control's temperatures: ``eval.control_temperatures`` or fractions of ``eval.temperature``."""
    if ev.control_temperatures is not None:
        return [float(t) for t in ev.control_temperatures]
    return [round(f * float(ev.temperature), 4) for f in DEFAULT_FACTORS]


def check(ev) -> list[str]:
    """Problems with the ``eval`` keys of the controls."""
    from pita.core.names import unknown_name

    p = [unknown_name("eval.controls", c, CONTROLS) for c in ev.controls if c not in CONTROLS]
    if "temperature" in ev.controls:
        if not ev.temperature > 0:
            p.append(f"eval.controls lists temperature but eval.temperature={ev.temperature} is greedy; lower "
                     f"temperatures need a sampling one (or drop temperature from eval.controls)")
        else:
            t_min = ev.get("control_temperature_min", T_MIN)
            if not (isinstance(t_min, (int, float)) and not isinstance(t_min, bool) and 0 < t_min < ev.temperature):
                p.append(f"eval.control_temperature_min={t_min!r} must be a number in (0, eval.temperature="
                         f"{ev.temperature}): the coldest temperature the control's search may try, e.g. 0.05")
            bad = [t for t in temperatures(ev) if not 0 < t < float(ev.temperature)]
            if bad or not temperatures(ev):
                p.append(f"eval.control_temperatures={list(ev.control_temperatures or [])} must list temperatures in "
                         f"(0, eval.temperature={ev.temperature}): the control is the base model sampled colder; "
                         f"e.g. [{0.7 * ev.temperature:g}, {0.5 * ev.temperature:g}], or null for "
                         f"{', '.join(f'{f:g}' for f in DEFAULT_FACTORS)} x eval.temperature")
    if "best_of_n" in ev.controls or "majority_vote" in ev.controls:
        ns = list(ev.best_of_n)
        if not ns or any(int(n) != n or n < 2 for n in ns):
            p.append(f"eval.best_of_n={ns} must list integers >= 2 (e.g. [2, 4, 8, 16]); the pool holds 4 x max(n) "
                     f"samples per prompt")
        if ev.temperature <= 0 and ns:
            p.append(f"eval.controls lists best_of_n but eval.temperature={ev.temperature} is greedy: n greedy samples "
                     f"are one; drop best_of_n from eval.controls")
    return p


def plan(cfg, ds, gen, eval_request, n_test: int, n_val: int, task: str, memory_gb: float,
         proxies: dict[str, str], score_gb: float | None = None, value: str | None = None,
         scoring: dict | None = None, rm_gb: float | None = None, scorers: list | None = None) -> list:
    """The control jobs of one training dataset's own evaluation (``eval_request(ds)``), on its
    test and validation prompts. ``proxies``: algorithm -> its round-0 proxy job id in this run
    (the best-of-n score on a verifier task); ``value``: Q#'s round-0 value-training job id in
    this run (a second best-of-n on a verifier task, ranked by it); ``score_gb``: what a merge
    that scores the pool with a model holds (that model alone; default the pool's shards'
    ``memory_gb``); ``scoring`` / ``rm_gb``: a verifier task's reward model (its scoring settings,
    what scoring the pool with it holds), which ranks a best-of-n of its own; ``scorers``: the
    run's learned scorers, (algorithm, round, job id, value model or proxy), each of which scores
    the validation pool to say how well it orders one prompt's completions
    (:func:`scorer_quality`)."""
    import logging

    from pita.models.families import chat_template_kwargs

    ev, fam = cfg.eval, cfg.model.name
    jobs = []
    labels = {"family": fam, "train_dataset": ds.name, "round": 0, "eval_dataset": ds.name, "task": task,
              "control": True}
    splits = [("test", n_test, None)] + ([("validation", n_val, "held_out")] if n_val else [])
    if "temperature" in ev.controls:
        val_merge = None
        for split, n, held in splits:
            req = eval_request(ds, held)
            req["etas"] = temperatures(ev)  # the sweep's key: each row's temperature
            req["sweep"] = "temperature"
            name = f"control.temperature.{fam}.{ds.name}.{'eval' if split == 'test' else 'val'}"
            sub = gen.plan(req, name, n, memory_gb=memory_gb, group="base")
            sub[-1].kind = "eval.merge"
            sub[-1].params.update(labels={"algorithm": TEMPERATURE, **labels,
                                          **({"split": "validation"} if held else {})},
                                  variant="T={:g}", kl_fraction=ev.kl_fraction)
            jobs += sub
            val_merge = sub[-1] if held else val_merge
        if val_merge is not None and int(ev.eta_search_steps) > 0:
            jobs += temperature_search(cfg, ds, gen, eval_request, n_test, n_val, labels, memory_gb, val_merge)
    pooled = "best_of_n" in ev.controls or ("majority_vote" in ev.controls and task != "reward")
    if "majority_vote" in ev.controls and task == "reward":
        logging.getLogger("pita").info("eval.controls: no majority vote on %s: a reward task's completions have no "
                                       "answer to vote on", ds.name)
    if pooled:
        best = "best_of_n" in ev.controls
        proxy = next((proxies[a] for a in PROXY_OF if a in proxies), None) if task != "reward" and best else None
        value = value if task != "reward" and best else None  # a reward task ranks by its reward model
        rm = scoring if task != "reward" and best and scoring and scoring.get("reward_model") else None
        for split, n, held in splits:
            req = eval_request(ds, held)
            req["n"] = POOL_FACTOR * max(int(x) for x in ev.best_of_n)
            req["with_prompt"] = True
            name = f"control.best_of_n.{fam}.{ds.name}.{'pool' if split == 'test' else 'valpool'}"
            sub = gen.plan(req, name, n, memory_gb=memory_gb, group="base")
            merge = sub[-1]
            shards = sub[:-1]
            sub = list(shards)
            params = dict(merge.params, labels={**labels, **({"split": "validation"} if held else {})},
                          ns=sorted(int(x) for x in ev.best_of_n), reference=req["policy"]["model"],
                          micro_batch_size=SCORE_BATCH, **chat_template_kwargs(cfg.model))
            score_res = Resources(1, score_gb if score_gb is not None else memory_gb)
            if best and (task == "reward" or proxy is not None):  # ranked by the reward model, or the run's proxy
                merge.kind = "control.best_of_n"
                merge.params = {**params, "labels": {"algorithm": BEST_OF_N, **params["labels"]}, "proxy": proxy}
                if proxy is not None:  # scored by the proxy on a device (the proxy alone: the pool is sampled)
                    merge.deps.append(proxy)
                    merge.resources = score_res
                sub.append(merge)

            def ranked(suffix: str, algorithm: str, resources: Resources, deps=(), **extra) -> Job:
                return Job(id=f"{name}.{suffix}", kind="control.best_of_n", deps=[j.id for j in shards] + list(deps),
                           group=merge.group, params={**params, "labels": {"algorithm": algorithm, **params["labels"]},
                                                      "proxy": None, **extra},
                           resources=resources, duration_hint=merge.duration_hint)
            if value is not None:  # ranked by Q#'s own value model: the control with Q#'s supervision
                sub.append(ranked("value", BEST_OF_N_VALUE, score_res, [value], value=value))
            if task != "reward":
                if best:  # ranked by the base model's own log-probability per token: no model to load
                    sub.append(ranked("logprob", BEST_OF_N_LOGP, Resources(0, 0.0), rank="logprob"))
                if rm is not None:  # ranked by the dataset's reward model alone (no verifier at test time)
                    sub.append(ranked("rm", BEST_OF_N_RM, Resources(1, rm_gb if rm_gb is not None else memory_gb),
                                      rank="reward_model", scoring=dict(rm)))
                if "majority_vote" in ev.controls:  # the answer most of n samples give (self-consistency)
                    sub.append(ranked("majority", MAJORITY, Resources(0, 0.0), rank="majority"))
            if held:  # every learned scorer on the validation pool: does it order one prompt's completions?
                for algo, rnd, job_id, is_value in scorers or []:
                    sub.append(Job(id=f"{name}.scorer.{job_id}", kind="eval.scorer_quality",
                                   deps=[j.id for j in shards] + [job_id], group=merge.group,
                                   params={"shards": params["shards"], "model_job": job_id, "value": is_value,
                                           "reference": params["reference"], "micro_batch_size": SCORE_BATCH,
                                           **chat_template_kwargs(cfg.model),
                                           "labels": {"algorithm": algo, "family": fam, "train_dataset": ds.name,
                                                      "round": rnd, "task": task,
                                                      "model": "value model" if is_value else "proxy reward model"}},
                                   resources=score_res, duration_hint=merge.duration_hint))
            jobs += sub
    return jobs


def temperature_search(cfg, ds, gen, eval_request, n_test: int, n_val: int, labels: dict, memory_gb: float,
                       val_merge: Job) -> list:
    """The temperature control searched as eta is (pita/eval/eta_search.py): after its first
    temperatures' validation rows, new temperatures on the validation prompts until the KL
    budgets are bracketed (``control.temperature.<family>.<dataset>.search``), then the test
    prompts at the temperatures it added (``...eval-search``, nothing when none was)."""
    ev, fam = cfg.eval, cfg.model.name
    search = f"control.temperature.{fam}.{ds.name}.search"
    req = eval_request(ds, "held_out")
    req["sweep"] = "temperature"
    t0 = float(ev.temperature)
    job = Job(id=search, kind="eval.eta_search", deps=[val_merge.id], group="base",
              params={"request": req, "labels": dict(val_merge.params["labels"]), "validation": val_merge.id,
                      "variant": "T={:g}", "budgets": [float(b) for b in ev.kl_budgets],
                      "steps": int(ev.eta_search_steps), "coordinate": "temperature", "t_eval": t0,
                      "t_min": float(ev.get("control_temperature_min", T_MIN)), "t_max": T_MAX * t0,
                      "kl_fraction": float(ev.kl_fraction), "n_examples": n_val,
                      "wide_ratio": float(ev.get("wide_ratio", 4.0)), "batch_size": req["sampling"]["batch_size"]},
              resources=Resources(1, memory_gb), duration_hint=1.0 * n_val * int(ev.eta_search_steps))
    treq = eval_request(ds)
    treq["sweep"] = "temperature"
    treq["etas_from"] = search
    sub = gen.plan(treq, f"control.temperature.{fam}.{ds.name}.eval-search", n_test, deps=[search],
                   memory_gb=memory_gb, group="base")
    sub[-1].kind = "eval.merge"
    sub[-1].params.update(labels={"algorithm": TEMPERATURE, **labels}, variant="T={:g}",
                          kl_fraction=ev.kl_fraction, may_be_empty=True)
    return [job, *sub]


def best_of_n_weights(N: int, n: int) -> list[float]:
    """w[i] (i = 0..N-1, the pool sorted by score ascending): the probability that the i-th lowest
    of N is the best of a uniformly random n-subset, C(i, n-1) / C(N, n). Sums to 1."""
    if not 1 <= n <= N:
        raise ValueError(f"best-of-{n} needs a pool of at least {n} samples per prompt, not {N}")
    total = math.comb(N, n)
    return [math.comb(i, n - 1) / total for i in range(N)]


def kl_bound(n: int) -> float:
    """The standard bound on KL(best-of-n || base): log n - (n - 1) / n."""
    return math.log(n) - (n - 1) / n


def _xlogx(x: float) -> float:
    return x * math.log(x) if x > 0 else 0.0


def _continuous_kl(a: float, b: float, n: int) -> float:
    """The KL terms of reference mass spread thinly (no outcome carries any of it alone) over
    [a, b] of the score CDF: the integral of n F^(n-1) log(n F^(n-1)) dF, which over [0, 1] is
    the bound log n - (n-1)/n."""
    an, bn = a ** n, b ** n
    return math.log(n) * (bn - an) + (n - 1) * ((_xlogx(b) * b ** (n - 1) - bn / n) - (_xlogx(a) * a ** (n - 1) - an / n))


def _atom_kl(f: float, mass: float, n: int) -> float:
    """The KL term of one score level carrying ``mass`` of the reference above CDF ``f``: the
    best of n lands on it with probability (f + mass)^n - f^n, spread over it as the reference."""
    if mass <= 0:
        return 0.0
    if f > 0:  # (f + m)^n - f^n without cancellation when m << f
        got = f ** n * math.expm1(n * math.log1p(mass / f))
    else:
        got = mass ** n
    return got * math.log(got / mass) if got > 0 else 0.0


def best_of_n_kl(scores: list[float], logps: list[float], keys: list, n: int) -> tuple[float, float]:
    """(KL(best-of-n || sampling policy) for one prompt, the reference mass its pool covers), from
    a pool of samples drawn from the policy: ``scores`` (what best-of-n ranks by), ``logps`` (each
    sample's log-probability under the policy it was drawn from) and ``keys`` (equal for equal
    completions).

    Best-of-n, with the outcomes' scores sorted and F the score's CDF under the policy, puts
    F(s)^n - F^-(s)^n on a score level s (Beirami et al. 2024, "Theoretical guarantees on the
    best-of-n alignment policy"), so its KL is a sum over levels. The pool's distinct completions
    are levels whose reference mass is known exactly (exp(logp)); the mass no sample of the pool
    reached (1 - their sum) is spread thinly over the scores of the completions drawn once (the
    unseen mass's best stand-ins, as in Good-Turing), or over every sample if none was. When the
    pool's completions carry all the mass (short answers that repeat) the value is exact; when
    every completion is new and improbable it tends to the bound log n - (n-1)/n, which it never
    exceeds."""
    if not scores:
        raise ValueError("best_of_n_kl: an empty pool")
    distinct: dict = {}
    count: dict = {}
    for sc, lp, k in zip(scores, logps, keys, strict=True):
        distinct.setdefault(k, (float(sc), []))[1].append(float(lp))
        count[k] = count.get(k, 0) + 1
    atoms = {k: (sc, math.exp(math.fsum(lps) / len(lps))) for k, (sc, lps) in distinct.items()}
    covered = math.fsum(m for _, m in atoms.values())
    if covered > 1.0:  # float noise in long sums of log-probs: the pool is the whole support
        atoms = {k: (sc, m / covered) for k, (sc, m) in atoms.items()}
        covered = 1.0
    unseen = 1.0 - covered
    holders = [k for k in atoms if count[k] == 1] or [k for k in keys]
    spread: dict = {}
    for k in holders:
        spread[k] = spread.get(k, 0.0) + unseen / len(holders)
    # levels in score order; at one score the completions' own mass first, then the thin mass
    levels: dict[float, list[float]] = {}
    for k, (sc, m) in atoms.items():
        lv = levels.setdefault(sc, [0.0, 0.0])
        lv[0] += m
        lv[1] += spread.get(k, 0.0)
    kl, f = 0.0, 0.0
    for sc in sorted(levels):
        atom, thin = levels[sc]
        kl += _atom_kl(f, atom, n)
        f += atom
        if thin > 0:
            kl += _continuous_kl(f, min(1.0, f + thin), n)
            f = min(1.0, f + thin)
    return min(max(0.0, kl), kl_bound(n)), covered


def best_of_n_value(scores: list[float], values: list[float], n: int) -> float:
    """The unbiased estimate, from one prompt's pool, of the metric of its best-of-n completion:
    the pool sorted by score (ties by pool order), each value weighted by the chance that it is
    the best of a random n-subset."""
    order = sorted(range(len(scores)), key=lambda i: (scores[i], -i))
    w = best_of_n_weights(len(scores), n)
    return math.fsum(w[k] * float(values[i]) for k, i in enumerate(order))


@job_kind("control.best_of_n")
def best_of_n_merge(ctx):
    """Gather the pool's samples, score each (the reward model's score on a reward task, the run's
    proxy on a verifier task, or with ``value`` Q#'s round-0 value model), save per prompt and n
    the estimate as a record (``correct`` / ``reward`` then hold the expected value, ``eta``
    holds n, ``kl_path`` the prompt's best-of-n KL) and return one row per n."""
    import statistics

    from pita.generation.jobs import gather, save_records

    p = ctx.params
    labels, ns = p["labels"], [int(n) for n in p["ns"]]
    records = gather(ctx)
    if not records:
        raise JobError("the best-of-n pool produced no samples")
    by_id: dict[str, list[dict]] = {}
    for r in records:
        by_id.setdefault(r["id"], []).append(r)
    groups = [sorted(g, key=lambda x: x["sample"]) for _, g in sorted(by_id.items())]
    if p.get("rank") == "majority":
        return majority_merge(ctx, labels, ns, groups)
    if p.get("value"):
        scores = _model_scores(ctx, p["value"], p, groups, value=True)
        scored_by = f"value model of {p['value']}"
    elif p.get("proxy"):
        scores = _model_scores(ctx, p["proxy"], p, groups)
        scored_by = f"proxy reward model of {p['proxy']}"
    elif p.get("rank") == "logprob":
        from pita.eval.metrics import kl_steps

        scores = [[float(s["logp"]) / max(1, kl_steps(s)) for s in g] for g in groups]
        scored_by = "the base model's log-probability per token"
    elif p.get("rank") == "reward_model":
        scores = _reward_model_scores(ctx, p["scoring"], groups)
        scored_by = f"reward model {p['scoring']['reward_model']}"
    else:
        scores = [[float(s["reward"]) for s in g] for g in groups]
        scored_by = "the task's reward model"
    math_task = labels["task"] == "math"
    metric = "correct" if math_task else "reward"
    quality = ranking_agreement(scores, [[float(bool(s["correct"])) if math_task else float(s["reward"]) for s in g]
                                         for g in groups])
    # the KL from the pool where every sample carries its text and log-probabilities (runs from
    # before they were saved: the bound)
    measured = all(isinstance(s.get("logp"), (int, float)) and "completion" in s for g in groups for s in g)
    out, results = [], []
    for n in ns:
        per, kls, mass = [], [], []
        for g, sc in zip(groups, scores):
            v = best_of_n_value(sc, [float(bool(s["correct"])) if math_task else float(s["reward"]) for s in g], n)
            per.append(v)
            kl = kl_bound(n)
            if measured:
                kl, covered = best_of_n_kl(sc, [float(s["logp"]) for s in g],
                                           [(s["completion"], s.get("finish")) for s in g], n)
                # against the reference the other rows are measured to: the sampling policy's own
                # distance from it (a nucleus), as the best of n sees it
                if any(isinstance(s.get("logp_ref"), (int, float)) and s["logp_ref"] != s["logp"] for s in g):
                    kl += best_of_n_value(sc, [float(s["logp"]) - float(s.get("logp_ref", s["logp"])) for s in g], n)
                mass.append(covered)
            kls.append(kl)
            out.append({"id": g[0]["id"], "eta": float(n), "sample": 0, metric: v,
                        **({"reward": v} if not math_task else {}), "n_tokens": None, "finish": None,
                        # logp - logp_ref: the prompt's expected log-ratio under best-of-n, its KL
                        **({"logp": kl, "logp_ref": 0.0, "kl_path": kl} if measured else {})})
        se = statistics.stdev(per) / math.sqrt(len(per)) if len(per) > 1 else 0.0
        key = "pass@1" if math_task else "mean_reward"
        row = {**labels, "eta": float(n), "variant": f"n={n}", key: statistics.fmean(per),
               f"{key}_stderr": se, "kl_bound": kl_bound(n), "n": n, "pool": len(groups[0]),
               "prompts": len(groups), "scored_by": scored_by, "scorer_agreement": quality["agreement"],
               "scorer_agreement_se": quality["agreement_se"], "scorer_pairs": quality["pairs"],
               "scorer_chance": quality["chance"], "scorer_prompt_agreement": quality["prompt_agreement"]}
        if measured:
            row.update(kl=statistics.fmean(kls), kl_stderr=statistics.stdev(kls) / math.sqrt(len(kls)) if len(kls) > 1
                       else 0.0, kl_estimator=KL_ESTIMATOR, kl_pool_mass=statistics.fmean(mass))
        else:
            row.update(kl=kl_bound(n), kl_stderr=0.0, kl_estimator="bound: log n - (n-1)/n")
        results.append(row)
    save_records(ctx, out)
    ctx.log.info("best-of-n over a pool of %d samples x %d prompts, scored by %s (ranks %s of %d pairs whose "
                 "outcomes differ as they are%s; orders the prompts by pass rate %s): %s", len(groups[0]), len(groups),
                 scored_by, "-" if quality["agreement"] is None else f"{quality['agreement']:.3f}", quality["pairs"],
                 ", no better than chance" if quality["chance"] else "",
                 "-" if quality["prompt_agreement"] is None else f"{quality['prompt_agreement']:.3f}", ", ".join(f"n={r['n']} {r.get('pass@1', r.get('mean_reward')):.4f} at KL {r['kl']:.3f} "
                                      f"(bound {r['kl_bound']:.3f})" for r in results))
    return {"labels": labels, "results": results}


def _model_scores(ctx, job_id: str, p: dict, groups: list[list[dict]], value: bool = False) -> list[list[float]]:
    from pita.guidance.proxy import score_sequences, text_ids
    from pita.guidance.value_model import ValueModel
    from pita.models.chat import load_tokenizer
    from pita.models.lm import default_device

    dev = default_device()
    vm = ValueModel.load(ctx.dep_result(job_id)["checkpoint"], device=dev).eval()
    tok = load_tokenizer(p["reference"], p.get("chat_template_kwargs"))
    flat = [s for g in groups for s in g]
    seqs = [text_ids(tok, s["prompt"], s["completion"], s.get("finish") == "eos") for s in flat]
    got = score_sequences(vm, seqs, dev, batch=max(1, int(p.get("micro_batch_size") or 64)), value=value)
    out, k = [], 0
    for g in groups:
        out.append([float(x) for x in got[k:k + len(g)]])
        k += len(g)
    return out


def _reward_model_scores(ctx, scoring: dict, groups: list[list[dict]]) -> list[list[float]]:
    """The dataset's reward model's score of each pool sample (its score alone: at test time there
    is no verifier), as its data collection scores them."""
    from pita.models.lm import default_device
    from pita.rewards.function import reward_scorer

    rm = reward_scorer(scoring["reward_model"], device=default_device(), batch_size=int(scoring["reward_batch_size"]),
                       inputs=scoring.get("reward_input", "prompt_completion"), score=scoring.get("reward_score", "margin"))
    flat = [s for g in groups for s in g]
    got = rm.score([s["prompt"] for s in flat], [s["completion"] for s in flat])
    out, k = [], 0
    for g in groups:
        out.append([float(x) for x in got[k:k + len(g)]])
        k += len(g)
    return out


def majority_value(classes: list[int | None], correct: list[bool], n: int, draws: int, seed) -> tuple[float, dict]:
    """(the expected correctness of majority vote over n samples, the distribution of its answer
    class) from one prompt's pool: ``draws`` random n-subsets (seeded), each voting by answer class
    (None: no answer, no vote; a tie between classes drawn uniformly; nobody voting: wrong, class
    None). A class is right when its samples are (its first one's ``correct``)."""
    import random

    rng = random.Random(str(seed))
    right = {}
    for c, ok in zip(classes, correct):
        if c is not None:
            right.setdefault(c, bool(ok))
    total, freq = 0.0, {}
    idx = range(len(classes))
    for _ in range(draws):
        counts: dict = {}
        for i in rng.sample(idx, n):
            if classes[i] is not None:
                counts[classes[i]] = counts.get(classes[i], 0) + 1
        if counts:
            top = max(counts.values())
            winner = rng.choice(sorted(c for c, k in counts.items() if k == top))
        else:
            winner = None
        freq[winner] = freq.get(winner, 0) + 1
        total += float(right.get(winner, False))
    return total / draws, {c: k / draws for c, k in freq.items()}


def majority_kl(classes: list[int | None], picked: dict) -> float:
    """KL(majority vote || sampling policy) at the answer level, from the pool: majority vote
    outputs a sample of its winning class (as the policy spreads its mass within the class), so
    its KL is that of the classes' distributions, the vote's (``picked``) against the pool's
    frequencies (no answer counted as one outcome)."""
    pool: dict = {}
    for c in classes:
        pool[c] = pool.get(c, 0) + 1 / len(classes)
    return max(0.0, math.fsum(q * math.log(q / pool[c]) for c, q in picked.items() if q > 0))


def majority_merge(ctx, labels: dict, ns: list[int], groups: list[list[dict]]) -> dict:
    """Majority vote (self-consistency) at each n from the best-of-n pool: per prompt and n the
    expected correctness of the answer most of n random samples give, and its KL from the answer
    classes' distributions (:func:`majority_value`, :func:`majority_kl`); one row per n."""
    import statistics

    from pita.eval.metrics import answer_classes
    from pita.generation.jobs import save_records

    if labels.get("task") == "reward":
        raise JobError("majority vote needs answers to vote on; a reward task has none")
    out, results = [], []
    classes = [answer_classes([s.get("extracted") for s in g]) for g in groups]
    for n in ns:
        per, kls = [], []
        for g, cl in zip(groups, classes):
            v, picked = majority_value(cl, [bool(s["correct"]) for s in g], n, MAJORITY_DRAWS, f"{g[0]['id']}/{n}")
            kl = majority_kl(cl, picked)
            per.append(v)
            kls.append(kl)
            out.append({"id": g[0]["id"], "eta": float(n), "sample": 0, "correct": v, "n_tokens": None, "finish": None,
                        "logp": kl, "logp_ref": 0.0, "kl_path": kl})
        se = statistics.stdev(per) / math.sqrt(len(per)) if len(per) > 1 else 0.0
        results.append({**labels, "eta": float(n), "variant": f"n={n}", "pass@1": statistics.fmean(per),
                        "pass@1_stderr": se, "n": n, "pool": len(groups[0]), "prompts": len(groups),
                        "kl": statistics.fmean(kls), "kl_stderr": statistics.stdev(kls) / math.sqrt(len(kls))
                        if len(kls) > 1 else 0.0, "kl_estimator": "majority vote: answer classes over the pool",
                        "scored_by": "majority of the extracted answers"})
    save_records(ctx, out)
    ctx.log.info("majority vote over a pool of %d samples x %d prompts: %s", len(groups[0]), len(groups),
                 ", ".join(f"n={r['n']} {r['pass@1']:.4f} at KL {r['kl']:.3f}" for r in results))
    return {"labels": labels, "results": results}


@job_kind("eval.scorer_quality")
def scorer_quality(ctx):
    """How well one learned scorer (a value model's predicted value of each whole completion, or a
    proxy's reward) orders the validation pool: of each prompt's completions whose outcomes differ,
    the share it orders as the outcomes are, with its standard error (:func:`ranking_agreement`),
    beside how well its mean per prompt orders the prompts (:func:`prompt_agreement`). A scorer
    high on the second and at chance on the first learned which prompts are hard, which guides
    no choice among one prompt's completions."""
    from pita.generation.jobs import gather

    p = ctx.params
    by_id: dict[str, list[dict]] = {}
    for r in gather(ctx):
        by_id.setdefault(r["id"], []).append(r)
    if not by_id:
        raise JobError("the validation pool produced no samples")
    groups = [sorted(g, key=lambda x: x["sample"]) for _, g in sorted(by_id.items())]
    scores = _model_scores(ctx, p["model_job"], p, groups, value=bool(p["value"]))
    math_task = p["labels"]["task"] == "math"
    outcomes = [[float(bool(s["correct"])) if math_task else float(s["reward"]) for s in g] for g in groups]
    q = ranking_agreement(scores, outcomes)
    ctx.log.info("%s %s of %s: orders %s of %d pairs of one prompt's completions as their outcomes%s; orders the "
                 "prompts %s", p["labels"]["algorithm"], p["labels"]["model"], p["model_job"],
                 "-" if q["agreement"] is None else f"{q['agreement']:.3f}", q["pairs"],
                 " (no better than chance)" if q["chance"] else "",
                 "-" if q["prompt_agreement"] is None else f"{q['prompt_agreement']:.3f}")
    return {"labels": p["labels"], "scorer": {**p["labels"], "job": p["model_job"], **q,
                                              "prompts_with_pairs": q["prompts"], "prompts": len(groups),
                                              "pool": len(groups[0])}}
