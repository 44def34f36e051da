"""The ``experiment`` workload: algorithms x datasets x rounds on one model family, plus the base
model's evaluation, all in one job graph. Each algorithm plans its own jobs (pita/algos/, found by
name in the registry); this module checks the whole config, resolves the family, estimates memory
and hands every algorithm the same PlanContext.

    python run_parallel.py experiment.name=x experiment.workload=experiment \
        experiment.algos=[PITA,QSharp] experiment.datasets=[arith] experiment.rounds=2
"""

from __future__ import annotations

import logging

from omegaconf import OmegaConf, open_dict

from pita.core.errors import ConfigError
from pita.core.job import Job
from pita.core.names import unknown_name
from pita.plans.common import dataset_cfg, estimate_memory_gb, request_for

log = logging.getLogger(__name__)


def eval_request_factory(cfg, paths):
    ev = cfg.eval

    def make(ds):
        req = request_for(cfg, ds, paths["reference"], paths["reward_models"].get(ds.name))
        req.update(recipe="eval", split=ev.split, n=ev.n, seed=cfg.system.seed + 777, etas=[0.0])
        req["sampling"] = {"max_new_tokens": ev.max_new_tokens, "temperature": ev.temperature, "top_p": ev.top_p,
                           "top_k": 0, "batch_size": ev.batch_size}
        return req

    return make


def experiment_plan(cfg, device_totals: list[int], cuda: bool) -> list[Job]:
    from pita.algos import ALGORITHMS, PlanContext, algorithm
    from pita.algos.base import base_evaluation, base_validation
    from pita.core.memory import ModelShape, training_bytes
    from pita.datasets.loading import load_examples
    from pita.generation.parallel import ParallelDataGenerator
    from pita.models.families import check_tokenizers, family_build_jobs, resolve_family

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
    if cfg.data_collection.pairs_per_prompt < 1:
        problems.append(f"data_collection.pairs_per_prompt={cfg.data_collection.pairs_per_prompt} must be >= 1 "
                        f"(labelled preference pairs per prompt and round)")
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
    if not 0 < ev.kl_fraction <= 1:
        problems.append(f"eval.kl_fraction={ev.kl_fraction} must be in (0, 1]")
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
                problems.append(unknown_name(key, n, list(cfg.datasets)) + " (each needs a datasets.<name> entry)")
                continue
            try:
                configs[n] = dataset_cfg(cfg, n)
            except ConfigError as e:
                problems += [f"{key}: {x}" for x in e.problems]
    if problems:
        raise ConfigError(problems)
    paths = resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed, defer=True)
    check_tokenizers(paths["reference"], paths["guidance"])
    model_problems = [x for alg in algos.values() for x in alg.check_models(paths)]
    if model_problems:
        raise ConfigError(model_problems)
    gen = ParallelDataGenerator(device_totals)
    dc = cfg.data_collection
    resolve_auto_training(cfg, paths, device_totals, cuda)
    mem = {"gen": dc.memory_gb if dc.memory_gb is not None else
           estimate_memory_gb(paths["reference"], cfg.model.dtype, dc.batch_size, 256 + dc.max_new_tokens, cuda)}
    # evaluation samples with its own batch and length; a guided one holds the value model too
    ev_seq = 256 + ev.max_new_tokens
    mem["eval"] = dc.memory_gb if dc.memory_gb is not None else \
        estimate_memory_gb(paths["reference"], cfg.model.dtype, ev.batch_size, ev_seq, cuda)
    mem["eval_guided"] = dc.memory_gb if dc.memory_gb is not None else \
        mem["eval"] + estimate_memory_gb(paths["guidance"], cfg.model.dtype, ev.batch_size, ev_seq, cuda)
    try:
        from transformers import AutoConfig

        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(paths["guidance"]))
        micro = int(cfg.training.micro_batch_size) or 32
        mem["train"] = training_bytes(shape, "float32", min(32, micro), 256, cuda=cuda,
                                      gradient_checkpointing=bool(cfg.training.gradient_checkpointing)) / 1e9
    except OSError:
        mem["train"] = 0.0
    policy_params = None
    try:
        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(paths["reference"]))
        policy_params = shape.n_params
        micro = int(cfg.training.micro_batch_size) or 16
        mem["policy_train"] = training_bytes(shape, "float32", min(16, micro), 256 + dc.max_new_tokens, cuda=cuda,
                                             gradient_checkpointing=bool(cfg.training.gradient_checkpointing)) / 1e9
    except OSError:
        mem["policy_train"] = 0.0
    eval_request = eval_request_factory(cfg, paths)
    eval_names = {ds.name: by_train.get(ds.name, [ds.name]) for ds in datasets}
    tunes = any(alg.tunes_eta for alg in algos.values())
    n_val = {ds.name: carve_validation(ds, ev.validation_prompts) if tunes else 0 for ds in datasets}
    tests, tasks = {}, {}

    def task_of(name: str, split: str) -> str:
        task = load_examples(configs[name], split)[0].task
        if task == "reward" and not paths["reward_models"].get(name):
            raise ConfigError(f"dataset {name} is scored by a reward model but model.reward_models.{name} is "
                              f"not set for model={cfg.model.name}")
        return task

    train_tasks = {ds.name: task_of(ds.name, "train") for ds in datasets}
    for name in dict.fromkeys(n for names in eval_names.values() for n in names):  # first-seen order
        tests[name] = len(load_examples(configs[name], ev.split))
        tasks[name] = task_of(name, ev.split)
    jobs: list[Job] = []
    for name in tests:  # the base model on every dataset something is evaluated on
        base = gen.plan(eval_request(configs[name]), base_evaluation(cfg.model.name, name), tests[name],
                        memory_gb=mem["eval"], group="base")
        base[-1].kind = "eval.merge"
        base[-1].params.update(labels={"algorithm": "base", "family": cfg.model.name, "train_dataset": name,
                                       "round": 0, "eval_dataset": name, "task": tasks[name]},
                               kl_fraction=ev.kl_fraction)
        jobs += base
    for ds in datasets:  # and on the validation prompts: eta 0 of every guided validation row
        if n_val[ds.name]:
            vreq = eval_request(ds)
            vreq["split"] = "held_out"
            val = gen.plan(vreq, base_validation(cfg.model.name, ds.name), n_val[ds.name], memory_gb=mem["eval"],
                           group="base")
            val[-1].kind = "eval.merge"
            val[-1].params.update(labels={"algorithm": "base", "family": cfg.model.name, "train_dataset": ds.name,
                                          "round": 0, "eval_dataset": ds.name, "task": train_tasks[ds.name],
                                          "split": "validation"}, kl_fraction=ev.kl_fraction)
            jobs += val
    for ds in datasets:
        rm = paths["reward_models"].get(ds.name)
        ctx = PlanContext(cfg=cfg, ds=ds, paths=paths, gen=gen, n_train=len(load_examples(ds, "train")),
                          n_validation=n_val[ds.name],
                          evals=[(configs[n], tests[n], tasks[n]) for n in eval_names[ds.name]],
                          task=train_tasks[ds.name], mem=mem, policy_params=policy_params, eval_request=eval_request,
                          data_request=lambda ds=ds, rm=rm: request_for(cfg, ds, paths["reference"], rm))
        for algo in cfg.experiment.algos:
            algo_jobs = algos[algo].plan(ctx)
            for j in algo_jobs:
                if j.kind == "eval.merge":
                    j.params["kl_fraction"] = ev.kl_fraction
            jobs += algo_jobs
    return family_build_jobs(cfg.model, cfg.system.cache_dir, cfg.system.seed, jobs, cuda,
                             len(device_totals)) + jobs


def carve_validation(ds, wanted: int) -> int:
    """Set aside validation prompts from ``ds``'s training split (its held_out split): the
    dataset's own ``held_out`` when set, else ``wanted`` capped at a quarter of the training
    prompts. Returns how many (0: none)."""
    from pita.datasets.loading import load_examples

    if ds.held_out:
        return len(load_examples(ds, "held_out"))
    if wanted <= 0:
        return 0
    n = len(load_examples(ds, "train"))
    ds.held_out = min(wanted, n // 4)
    if ds.held_out < wanted:
        log.info("eval.validation_prompts=%d: %s has %d training prompts, so %d are set aside to choose eta on",
                 wanted, ds.name, n, ds.held_out)
    return len(load_examples(ds, "held_out")) if ds.held_out else 0


def check_training(t) -> list[str]:
    p = []
    m, gc = t.micro_batch_size, t.gradient_checkpointing
    if not (m == "auto" or (isinstance(m, int) and not isinstance(m, bool) and m >= 0)):
        p.append(f"training.micro_batch_size={m!r} must be an integer >= 0 (0 = the whole batch at once) or auto")
    if not (gc == "auto" or isinstance(gc, bool)):
        p.append(f"training.gradient_checkpointing={gc!r} must be true, false or auto")
    return p


def resolve_auto_training(cfg, paths: dict, device_totals: list[int], cuda: bool) -> None:
    """``training.micro_batch_size=auto`` / ``gradient_checkpointing=auto`` (the gpu=auto preset):
    the largest micro-batch whose training-memory estimate (weights, gradients, AdamW states,
    activations, logits) fits on the smallest device with executor.memory_margin to spare,
    dividing every baseline's per-device batch; checkpointing only when no micro-batch fits
    without it. Written into the config, so the run's config.yaml shows what was chosen."""
    from transformers import AutoConfig

    from pita.core.memory import ModelShape, training_bytes

    t = cfg.training
    if t.micro_batch_size != "auto" and t.gradient_checkpointing != "auto":
        return
    shapes = []
    for key in ("reference", "guidance"):
        try:
            shapes.append(ModelShape.from_hf_config(AutoConfig.from_pretrained(paths[key])))
        except OSError:
            pass
    seq = 256 + cfg.data_collection.max_new_tokens
    budget = min(device_totals) * (1 - cfg.executor.memory_margin) if device_totals else 0
    from pita.algos import ALGORITHMS, algorithm

    batches = [algorithm(a, cfg.algos[a]).per_device_batch() for a in cfg.experiment.algos
               if a in cfg.algos and a in ALGORITHMS]
    cap = min(batches) if batches else 32

    def fits(micro: int, gc: bool) -> bool:
        return all(training_bytes(sh, "float32", micro, seq, gradient_checkpointing=gc, cuda=cuda) <= budget
                   for sh in shapes)

    def choose(gc: bool) -> int:
        fixed = t.micro_batch_size if t.micro_batch_size != "auto" else None
        if fixed is not None:
            return fixed if fixed == 0 or fits(fixed, gc) else -1
        ok = [m for m in range(cap, 0, -1) if all(b % m == 0 for b in batches) and fits(m, gc)]
        return ok[0] if ok else -1

    options = [False, True] if t.gradient_checkpointing == "auto" else [bool(t.gradient_checkpointing)]
    for gc in options:
        micro = choose(gc)
        if micro >= 0:
            break
    else:
        raise ConfigError(f"training.micro_batch_size=auto: not even a micro-batch of 1 sequence of {seq} tokens "
                          f"fits the training-memory estimate on the smallest device "
                          f"({min(device_totals) / 2**30:.1f} GiB); train with LoRA (algos.<A>.lora_r), a smaller "
                          f"model, or shorter sequences (data_collection.max_new_tokens)")
    with open_dict(cfg):
        cfg.training.micro_batch_size = micro
        cfg.training.gradient_checkpointing = gc
    log.info("gpu=auto: training.micro_batch_size=%d, training.gradient_checkpointing=%s (smallest device %.1f GiB)",
             micro, gc, min(device_totals) / 2**30 if device_totals else 0)
