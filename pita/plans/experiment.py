"""The ``experiment`` workload: algorithms x datasets x rounds on one model family, plus the base
model's evaluation, all in one job graph. Each algorithm plans its own jobs (pita/algos/, found by
name in the registry); this module checks the whole config, resolves the family, estimates memory
and hands every algorithm the same PlanContext.

    python run_parallel.py experiment.name=x experiment.workload=experiment \
        experiment.algos=[PITA,QSharp] experiment.datasets=[arith] experiment.rounds=2
"""

from __future__ import annotations

import logging

from omegaconf import open_dict

from pita.core.errors import ConfigError
from pita.core.job import Job
from pita.core.names import unknown_name
from pita.plans.common import dataset_cfg, request_for, with_reward_functions

log = logging.getLogger(__name__)


def eval_request_factory(cfg, paths, task_of=None):
    """Evaluation requests per dataset. ``task_of(ds)``: its task; a verifier (math) task's
    evaluation is scored by the verifier alone, so its shards never load the reward model the
    dataset's training labels may use (pass@1 reads correctness only)."""
    ev = cfg.eval

    def make(ds, split: str | None = None):
        """``split="held_out"``: the validation prompts, at ``eval.validation_n`` samples each."""
        rm = paths["reward_models"].get(ds.name)
        if rm and task_of is not None and task_of(ds) == "math":
            rm = None
        req = request_for(cfg, ds, paths["reference"], rm)
        held = split == "held_out"
        n = int(ev.get("validation_n") or ev.n) if held else ev.n
        req.update(recipe="eval", split=split or ev.split, n=n, seed=cfg.system.seed + 777, etas=[0.0])
        req["sampling"] = {"max_new_tokens": ev.max_new_tokens, "temperature": ev.temperature, "top_p": ev.top_p,
                           "top_k": 0, "batch_size": ev.batch_size}
        return req

    return make


def experiment_plan(cfg, device_totals: list[int], cuda: bool, plan_only: bool = False,
                    options: dict | None = None) -> list[Job]:
    """The experiment's job graph. ``plan_only`` (``pita plan``): the hub is never asked; hub
    datasets that are not cached are counted from their known sizes and tokenizers that are not
    cached are checked when the run starts. ``options``: filled with gpu=auto's alternatives
    (resolve_auto_training)."""
    from pita.algos import ALGORITHMS, PlanContext, algorithm
    from pita.algos.base import base_evaluation, base_validation
    from pita.datasets.loading import count_examples
    from pita.generation.parallel import ParallelDataGenerator
    from pita.models.families import check_tokenizers, family_build_jobs, resolve_family
    from pita.models.shapes import model_shape

    problems = []
    n_devices = len(device_totals)
    algos = {}
    for a in cfg.experiment.algos:
        if a not in ALGORITHMS:
            problems.append(unknown_name("experiment.algos", a, ALGORITHMS.names()))
        elif a not in cfg.algos:
            problems.append(f"experiment.algos lists {a} but algos.{a} has no settings")
        else:
            algos[a] = algorithm(a, cfg.algos[a])
            problems += algos[a].check(cfg, n_devices)
            if not plan_only:
                problems += algos[a].run_problems()
    if cfg.data_collection.pairs_per_prompt < 1:
        problems.append(f"data_collection.pairs_per_prompt={cfg.data_collection.pairs_per_prompt} must be >= 1 "
                        f"(labelled preference pairs per prompt and round)")
    from pita.algos.base import TIE_RULES

    if cfg.data_collection.ties not in TIE_RULES:
        problems.append(unknown_name("data_collection.ties", cfg.data_collection.ties, TIE_RULES))
    if cfg.experiment.rounds < 1:
        problems.append(f"experiment.rounds={cfg.experiment.rounds} must be >= 1")
    problems += check_training(cfg.training)
    if cfg.system.clear_cache_interval < 0:
        problems.append(f"system.clear_cache_interval={cfg.system.clear_cache_interval} must be >= 0 (0 = never)")
    ev = cfg.eval
    if ev.n < 1:
        problems.append(f"eval.n={ev.n} must be >= 1")
    if ev.validation_prompts < 0:
        problems.append(f"eval.validation_prompts={ev.validation_prompts} must be >= 0 (0: eta is not chosen)")
    vn = ev.get("validation_n")
    if vn is not None and (isinstance(vn, bool) or not isinstance(vn, int) or vn < 1):
        problems.append(f"eval.validation_n={vn!r} must be an integer >= 1 (samples per validation prompt), or null "
                        f"for eval.n")
    if not 0 < ev.kl_fraction <= 1:
        problems.append(f"eval.kl_fraction={ev.kl_fraction} must be in (0, 1]")
    from pita.eval import controls

    problems += controls.check(ev)
    from pita.eval import eta_search

    problems += eta_search.check(ev)
    ck = list(ev.get("checkpoints") or [])
    if any(isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1 for f in ck):
        problems.append(f"eval.checkpoints={ck} must list fractions in (0, 1) of a policy's training (e.g. "
                        f"[0.25, 0.5]; the final policy is always evaluated), or [] for none")
    datasets, configs = [], {}
    for name in cfg.experiment.datasets:
        try:
            configs[name] = dataset_cfg(cfg, name)
            datasets.append(configs[name])
        except ConfigError as e:
            problems += e.problems
    by_train = {str(k): list(v) for k, v in (ev.datasets_by_train or {}).items()}
    for train_name, names in by_train.items():
        key = f"eval.datasets_by_train.{train_name}"
        if train_name not in cfg.experiment.datasets:
            problems.append(unknown_name(key.rsplit(".", 1)[0] + " key", train_name, list(cfg.experiment.datasets))
                            + " (keys are training datasets of experiment.datasets)")
        if not names:
            problems.append(f"{key} is empty: list at least one dataset to evaluate on, e.g. [{train_name}]")
        for n in names:
            if n in configs:
                continue
            if n not in cfg.datasets:
                problems.append(unknown_name(key, n, list(cfg.datasets)) + f"; a dataset of your own: "
                                f"+dataset@datasets.{n}=<the one whose format it has> datasets.{n}.path=<file>")
                continue
            try:
                configs[n] = dataset_cfg(cfg, n)
            except ConfigError as e:
                problems += [f"{key}: {x}" for x in e.problems]
    if problems:
        raise ConfigError(problems)
    paths = with_reward_functions(resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed,
                                                 defer="plan" if plan_only else True), configs.values())
    check_tokenizers(paths["reference"], paths["guidance"], missing_ok=plan_only)
    model_problems = [x for alg in algos.values() for x in alg.check_models(paths)]
    if model_problems:
        raise ConfigError(model_problems)
    gen = ParallelDataGenerator(device_totals)
    resolve_auto_training(cfg, paths, device_totals, cuda, algos, list(configs), alternatives=options)
    if str(cfg.training.micro_batch_size) != "auto":  # what gpu=auto chose, or left as configured
        late = [x for alg in algos.values() if hasattr(alg, "sharding_problems")
                for x in alg.sharding_problems(n_devices) + ([] if plan_only else alg.sync_problems(cfg))]
        if late:
            raise ConfigError(late)
    # estimates per dataset: a job holds the reward model of its own dataset (a training dataset's
    # jobs: of it and of the datasets its models are evaluated on) and no other
    mem_of = {name: plan_memory(cfg, paths, cuda, device_totals, algos, [name]) for name in configs}
    batches: dict = {}
    for m in mem_of.values():
        for k, b in (m.get("batches") or {}).items():
            batches[k] = min(b, batches.get(k, b))
    policy_params = model_shape(paths["reference"], "model.reference").n_params
    eval_tasks: dict[str, str] = {}

    def eval_task(ds) -> str:
        if ds.name not in eval_tasks:
            eval_tasks[ds.name] = count_examples(ds, ev.split, plan_only)[1]
        return eval_tasks[ds.name]

    eval_request = eval_request_factory(cfg, paths, eval_task)
    eval_names = {ds.name: by_train.get(ds.name, [ds.name]) for ds in datasets}
    # every method's frontier (its rounds, η and variants) is chosen on validation prompts, never on test
    n_val = {ds.name: carve_validation(ds, ev.validation_prompts, plan_only) if algos else 0 for ds in datasets}
    tests, tasks = {}, {}

    def task_of(name: str, split: str) -> str:
        task = count_examples(configs[name], split, plan_only)[1]
        if task == "reward" and not paths["reward_models"].get(name):
            raise ConfigError(f"dataset {name} is scored by a reward model but model.reward_models.{name} is "
                              f"not set for model={cfg.model.name}")
        return task

    train_tasks = {ds.name: task_of(ds.name, "train") for ds in datasets}
    for name in dict.fromkeys(n for names in eval_names.values() for n in names):  # first-seen order
        tests[name] = count_examples(configs[name], ev.split, plan_only)[0]
        tasks[name] = task_of(name, ev.split)
    jobs: list[Job] = []
    for name in tests:  # the base model on every dataset something is evaluated on
        base = gen.plan(eval_request(configs[name]), base_evaluation(cfg.model.name, name), tests[name],
                        memory_gb=mem_of[name]["eval"], group="base")
        base[-1].kind = "eval.merge"
        base[-1].params.update(labels={"algorithm": "base", "family": cfg.model.name, "train_dataset": name,
                                       "round": 0, "eval_dataset": name, "task": tasks[name]},
                               kl_fraction=ev.kl_fraction)
        jobs += base
    for ds in datasets:  # and on the validation prompts: eta 0 of every guided validation row
        if n_val[ds.name]:
            vreq = eval_request(ds, "held_out")
            val = gen.plan(vreq, base_validation(cfg.model.name, ds.name), n_val[ds.name],
                           memory_gb=mem_of[ds.name]["eval"],
                           group="base")
            val[-1].kind = "eval.merge"
            val[-1].params.update(labels={"algorithm": "base", "family": cfg.model.name, "train_dataset": ds.name,
                                          "round": 0, "eval_dataset": ds.name, "task": train_tasks[ds.name],
                                          "split": "validation"}, kl_fraction=ev.kl_fraction)
            jobs += val
    for ds in datasets:
        rm = paths["reward_models"].get(ds.name)
        ctx = PlanContext(cfg=cfg, ds=ds, paths=paths, gen=gen, n_train=count_examples(ds, "train", plan_only)[0],
                          n_validation=n_val[ds.name],
                          evals=[(configs[n], tests[n], tasks[n]) for n in eval_names[ds.name]],
                          task=train_tasks[ds.name],
                          mem=plan_memory(cfg, paths, cuda, device_totals, algos, [ds.name, *eval_names[ds.name]]),
                          policy_params=policy_params, eval_request=eval_request,
                          data_request=lambda ds=ds, rm=rm: request_for(cfg, ds, paths["reference"], rm))
        ids = set()
        for algo in cfg.experiment.algos:
            algo_jobs = algos[algo].plan(ctx)
            for j in algo_jobs:
                if j.kind == "eval.merge":
                    j.params["kl_fraction"] = ev.kl_fraction
            jobs += algo_jobs
            ids |= {j.id for j in algo_jobs}
        if ev.controls and algos and ds.name in tests:
            proxies = {a: f"{ctx.prefix(a)}.r0.proxy" for a in controls.PROXY_OF if f"{ctx.prefix(a)}.r0.proxy" in ids}
            value = f"{ctx.prefix(controls.VALUE_OF)}.r0.train" if controls.VALUE_OF in algos else None
            scoring = request_for(cfg, ds, paths["reference"], rm)["scoring"] if rm else None
            scorers = learned_scorers(ctx, algos, ids, cfg.experiment.rounds)
            jobs += controls.plan(cfg, ds, gen, eval_request, tests[ds.name], n_val[ds.name], tasks[ds.name],
                                  mem_of[ds.name]["eval"], proxies, score_gb=mem_of[ds.name].get("proxy_score"),
                                  value=value if value in ids else None, scoring=scoring,
                                  rm_gb=mem_of[ds.name].get("rm_score"), scorers=scorers)
    if batches:
        fit_sampling_batches(jobs, batches)
        log.info("system.fit_batches: sampling batches lowered to fit the smallest device: %s",
                 ", ".join(f"{k} {b}" for k, b in batches.items()))
    return family_build_jobs(cfg.model, cfg.system.cache_dir, cfg.system.seed, jobs, cuda,
                             len(device_totals)) + jobs


def learned_scorers(ctx, algos: dict, ids: set, rounds: int) -> list[tuple[str, int, str, bool]]:
    """(algorithm, round, job id, is a value model) of every model the run learns that scores a
    completion: each value-guided method's value model and each proxy reward model, every round."""
    out = []
    for name, a in algos.items():
        for r in range(rounds):
            train, proxy = f"{ctx.prefix(name)}.r{r}.train", f"{ctx.prefix(name)}.r{r}.proxy"
            shared = f"{name}.{ctx.family}.{ctx.ds.name}.r{r}.proxy"  # GRPO-HF's round 0, shared by its arms
            if getattr(a, "tunes_eta", False) and train in ids:
                out.append((name, r, train, True))
            for pid in dict.fromkeys([proxy, shared]):
                if getattr(a, "trains_proxy", False) and pid in ids:
                    out.append((name, r, pid, False))
    return out


def carve_validation(ds, wanted: int, plan_only: bool = False) -> int:
    """Set aside validation prompts from ``ds``'s training split (its held_out split): the
    dataset's own ``held_out`` when set, else ``wanted`` capped at a quarter of the training
    prompts. Returns how many (0: none)."""
    from pita.datasets.loading import count_examples

    if ds.held_out:
        return count_examples(ds, "held_out", plan_only)[0]
    if wanted <= 0:
        return 0
    n = count_examples(ds, "train", plan_only)[0]
    ds.held_out = min(wanted, n // 4)
    if ds.held_out < wanted:
        log.info("eval.validation_prompts=%d: %s has %d training prompts, so %d are set aside to choose on",
                 wanted, ds.name, n, ds.held_out)
    return count_examples(ds, "held_out", plan_only)[0] if ds.held_out else 0


def check_training(t) -> list[str]:
    p = []
    m, gc = t.micro_batch_size, t.gradient_checkpointing
    if not (m == "auto" or (isinstance(m, int) and not isinstance(m, bool) and m >= 0)):
        p.append(f"training.micro_batch_size={m!r} must be an integer >= 0 (0 = the whole batch at once) or auto")
    if not (gc == "auto" or isinstance(gc, bool)):
        p.append(f"training.gradient_checkpointing={gc!r} must be true, false or auto")
    s = t.get("save_steps", "auto")
    if not (s == "auto" or (isinstance(s, int) and not isinstance(s, bool) and s >= 0)):
        p.append(f"training.save_steps={s!r} must be an integer >= 0 (optimizer steps between checkpoints; "
                 f"0 = none) or auto (checkpoints kept under 5% of the job's time)")
    return p


# sampling job kinds: data generation and evaluation, by the policy that samples
SAMPLING_KINDS = ("gen", "gen_guided", "eval", "eval_guided", "eval_trained")


def sampling_key(job) -> str | None:
    """Which of SAMPLING_KINDS a generation shard is (a trained policy collecting data holds one
    model of the reference's shape, as the reference does: "gen")."""
    from pita.plans.fit import sampling_policy

    if job.kind not in ("generation.shard", "eval.eta_search"):  # the eta search samples as a guided shard
        return None
    req = job.params["request"]
    head = "eval" if req.get("recipe") == "eval" else "gen"
    what = sampling_policy(req)
    if what == "guided":
        return f"{head}_guided"
    return "eval_trained" if head == "eval" and what == "trained" else head


def fit_sampling_batches(jobs: list[Job], batches: dict) -> None:
    """system.fit_batches: each sampling shard of a kind whose configured batch does not fit runs
    at the largest batch that does (its request and its OOM-retry batch)."""
    import copy

    for j in jobs:
        k = sampling_key(j)
        if k in batches:
            j.params["request"] = copy.deepcopy(j.params["request"])
            j.params["request"]["sampling"]["batch_size"] = batches[k]
            j.params["batch_size"] = batches[k]


def plan_memory(cfg, paths: dict, cuda: bool, device_totals: list[int], algos: dict, datasets: list[str]) -> dict:
    """Every job kind's estimate in GB (pita/plans/memory.py): gen, gen_guided, eval, eval_guided,
    eval_trained, train (value models and proxies: the largest of the selected algorithms'), and
    policy_train.<A> per post-training algorithm."""
    from pita.plans.memory import JobMemory

    est = JobMemory(cfg, paths, cuda, device_totals)
    mem = {k: est.sampling(k, datasets) for k in SAMPLING_KINDS}
    if cfg.system.get("fit_batches") and device_totals and cfg.data_collection.memory_gb is None:
        from pita.core.memory import largest_batch

        budget = min(device_totals) * (1 - cfg.executor.memory_margin)
        for k in SAMPLING_KINDS:
            if mem[k] * 1e9 <= budget:
                continue
            configured = int(cfg.eval.batch_size if k.startswith("eval") else cfg.data_collection.batch_size)
            b = largest_batch(lambda n, k=k: est.sampling(k, datasets, n) * 1e9, budget, margin=0.0,
                              limit=configured)
            if b >= 1:
                mem[k] = est.sampling(k, datasets, b)
                mem.setdefault("batches", {})[k] = b
    if "best_of_n" in (cfg.eval.get("controls") or []):
        from pita.eval.controls import SCORE_BATCH

        mem["proxy_score"] = est.proxy_scoring(SCORE_BATCH)
        # a verifier task's best-of-n ranked by its reward model: that model scoring the pool alone
        mem["rm_score"] = est.reward_bytes([d for d in datasets if not est._reward_task(d)]) / 1e9
    for name, a in algos.items():
        mem[f"train.{name}"] = est.value_training(a)  # value models
        if a.trains_proxy:  # Bradley-Terry proxies (Q#-HF, GRPO-HF)
            mem[f"proxy.{name}"] = est.value_training(a, proxy=True)
        if hasattr(a, "train_kind"):
            mem[f"policy_train.{name}"] = est.policy_training(a, datasets=datasets)
            if a.train_kind != "algo.dpo_train":  # GRPO's rows per generate call, which the job samples with
                mem[f"generate_rows.{name}"] = est.generate_rows(a, datasets=datasets)
    return mem


def algo_devices(c) -> tuple[int, str]:
    """(devices, sharding) of an algorithm's training jobs."""
    return int(getattr(c, "devices", 1) or 1), str(getattr(c, "sharding", "none") or "none")


def shard_counts(a, n_devices: int) -> list[int]:
    """The device counts gpu=auto tries for an algorithm's training: as configured first, then,
    for full fine-tuning of a policy (DPO, GRPO, GRPO-HF), FSDP over 2, 4, 8, ... devices of
    this inventory that divide its batch."""
    from pita.training.arguments import fsdp_unavailable

    devices, sharding = algo_devices(a.c)
    first = [devices] if not (sharding == "fsdp" and devices < 2) else []
    if not hasattr(a, "train_kind") or a.c.lora_r > 0 or n_devices < 2 or fsdp_unavailable():
        return first or [devices]
    start = max(2, devices if sharding == "fsdp" else 2)
    more, k = [], start
    while k <= n_devices:
        if a.c.batch_size % k == 0 and k not in first:
            more.append(k)
        k *= 2
    return first + more


def resolve_auto_training(cfg, paths: dict, device_totals: list[int], cuda: bool, algos: dict | None = None,
                          datasets: list[str] = (), alternatives: dict | None = None) -> None:
    """``training.micro_batch_size=auto`` / ``gradient_checkpointing=auto`` (the gpu=auto preset):
    for each selected algorithm, the largest micro-batch dividing its per-device batch whose
    training-memory estimate (pita/plans/memory.py: weights, gradients, AdamW states, TRL's
    reference, activations, logits) fits the smallest device with executor.memory_margin to
    spare; checkpointing only when no micro-batch fits without it. Written into
    ``algos.<A>.micro_batch_size`` / ``gradient_checkpointing`` (an algorithm's own setting is
    kept) and ``training.*`` (the smallest micro-batch; checkpointing if any uses it), so the
    run's config.yaml shows what was chosen. A job that fits at no micro-batch is left to the
    plan's fit check, which names its fix. ``alternatives`` (a dict, filled): per algorithm, every
    (devices, sharding, micro-batch, checkpointing) that fits, the one chosen first, for
    :func:`pita.plans.choose.for_makespan`; ``alternatives["raised"]``: the algorithms whose configured
    devices were raised because they do not fit, (configured, raised to)."""
    from pita.algos import ALGORITHMS, algorithm
    from pita.plans.memory import JobMemory

    t = cfg.training
    if t.micro_batch_size != "auto" and t.gradient_checkpointing != "auto":
        return
    if algos is None:
        algos = {a: algorithm(a, cfg.algos[a]) for a in cfg.experiment.algos if a in cfg.algos and a in ALGORITHMS}
    est = JobMemory(cfg, paths, cuda, device_totals)
    budget = min(device_totals) * (1 - cfg.executor.memory_margin) if device_totals else 0

    def need(a, micro: int, gc: bool) -> float:
        proxy = est.value_training(a, micro=micro, gradient_checkpointing=gc, proxy=True) * 1e9 \
            if a.trains_proxy else 0.0  # Q#-HF and GRPO-HF train a proxy too
        if not hasattr(a, "train_kind"):
            return max(proxy, est.value_training(a, micro=micro, gradient_checkpointing=gc) * 1e9)
        policy = est.policy_training(a, micro=micro, gradient_checkpointing=gc, datasets=datasets) * 1e9
        return max(policy, proxy)

    chosen, sharded = {}, {}
    for name, a in algos.items():
        own_micro = a.c.micro_batch_size if getattr(a.c, "micro_batch_size", None) is not None else None
        micro_setting = own_micro if own_micro is not None else t.micro_batch_size
        gc_setting = a.c.gradient_checkpointing if a.c.gradient_checkpointing is not None else t.gradient_checkpointing
        options = [False, True] if gc_setting == "auto" else [bool(gc_setting)]

        def search():
            per_device = max(1, a.per_device_batch())
            micros = [micro_setting] if micro_setting != "auto" else [m for m in range(per_device, 0, -1)
                                                                       if per_device % m == 0]
            found = next(((m, gc) for gc in options for m in micros if m == 0 or need(a, m, gc) <= budget), None)
            return found, (micros[-1], options[-1])

        configured = algo_devices(a.c)
        fitting = []
        for k in shard_counts(a, len(device_totals)):  # 1 (as configured), then FSDP over 2, 4, 8, ... devices
            if k > 1:
                with open_dict(cfg):
                    cfg.algos[name].devices, cfg.algos[name].sharding = k, "fsdp"
                a.c = cfg.algos[name]
            found, _ = search()
            if found is not None:
                fitting.append((k, "fsdp" if k > 1 else configured[1], *found))
            if found is not None and k == configured[0]:
                break  # the devices configured fit: kept
        if fitting:  # the fewest devices that fit; pita.plans.choose weighs the rest by makespan
            k, shard_mode, *found = fitting[0]
            pick = tuple(found)
            if (k, shard_mode) != algo_devices(a.c):
                with open_dict(cfg):
                    cfg.algos[name].devices, cfg.algos[name].sharding = k, shard_mode
                a.c = cfg.algos[name]
            if k > 1:
                sharded[name] = k
            if alternatives is not None:
                alternatives[name] = fitting
                if k > configured[0]:
                    alternatives.setdefault("raised", {})[name] = (configured[0], k)
        else:  # nothing fits: as configured at the smallest settings, and the fit check names the fix
            if algo_devices(a.c) != configured:
                with open_dict(cfg):
                    cfg.algos[name].devices, cfg.algos[name].sharding = configured
                a.c = cfg.algos[name]
            pick = search()[1]
        chosen[name] = pick
        with open_dict(cfg):
            cfg.algos[name].micro_batch_size = pick[0]
            cfg.algos[name].gradient_checkpointing = pick[1]
        a.c = cfg.algos[name]
    micro = min((m for m, _ in chosen.values()), default=1 if t.micro_batch_size == "auto" else t.micro_batch_size)
    gc = any(g for _, g in chosen.values()) if chosen else bool(t.gradient_checkpointing == "auto" or
                                                               t.gradient_checkpointing)
    with open_dict(cfg):
        cfg.training.micro_batch_size = micro if t.micro_batch_size == "auto" else t.micro_batch_size
        cfg.training.gradient_checkpointing = gc if t.gradient_checkpointing == "auto" else t.gradient_checkpointing
    log.info("gpu=auto: %s (smallest device %.1f GiB)",
             ", ".join(f"{n} micro-batch {m}{' + checkpointing' if g else ''}"
                       f"{f' sharded (FSDP) over {sharded[n]} devices' if n in sharded else ''}"
                       for n, (m, g) in chosen.items()),
             min(device_totals) / 2**30 if device_totals else 0)
