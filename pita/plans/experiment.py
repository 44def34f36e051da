"""The ``experiment`` workload: algorithms x datasets x rounds on one model family, plus the base
model's evaluation, all in one job graph (see pita/algos/value_guided.py for one algorithm's jobs).

    python run_parallel.py experiment.name=x experiment.workload=experiment \
        experiment.algos=[PITA,QSharp] experiment.datasets=[arith] experiment.rounds=2
"""

from __future__ import annotations

from omegaconf import OmegaConf

from pita.core.errors import ConfigError
from pita.core.job import Job
from pita.core.names import unknown_name


def eval_request_factory(cfg, paths):
    from pita.plans.generation import request_for

    ev = cfg.eval

    def make(ds):
        req = request_for(cfg, ds, paths["reference"], paths["reward_models"].get(ds.name))
        req.update(recipe="eval", split=ev.split, n=ev.n, seed=cfg.system.seed + 777, etas=[0.0])
        req["sampling"] = {"max_new_tokens": ev.max_new_tokens, "temperature": ev.temperature, "top_p": ev.top_p,
                           "top_k": 0, "batch_size": ev.batch_size}
        return req

    return make


def experiment_plan(cfg, device_totals: list[int], cuda: bool) -> list[Job]:
    from pita.algos import value_guided
    from pita.core.memory import ModelShape, training_bytes
    from pita.datasets.loading import load_examples
    from pita.generation.parallel import ParallelDataGenerator
    from pita.models.families import check_tokenizers, resolve_family
    from pita.plans.generation import dataset_cfg, estimate_memory_gb

    problems = []
    for a in cfg.experiment.algos:
        if a not in value_guided.VALUE_GUIDED:
            problems.append(unknown_name("experiment.algos", a, value_guided.VALUE_GUIDED))
        elif a not in cfg.algos:
            problems.append(f"experiment.algos lists {a} but algos.{a} has no settings")
        else:
            problems += value_guided.check_config(a, cfg.algos[a])
    if cfg.experiment.rounds < 1:
        problems.append(f"experiment.rounds={cfg.experiment.rounds} must be >= 1")
    ev = cfg.eval
    if ev.n < 1:
        problems.append(f"eval.n={ev.n} must be >= 1")
    if not 0 < ev.kl_fraction <= 1:
        problems.append(f"eval.kl_fraction={ev.kl_fraction} must be in (0, 1]")
    datasets = []
    for name in cfg.experiment.datasets:
        try:
            datasets.append(dataset_cfg(cfg, name))
        except ConfigError as e:
            problems += e.problems
    if problems:
        raise ConfigError(problems)
    paths = resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed)
    check_tokenizers(paths["reference"], paths["guidance"])
    gen = ParallelDataGenerator(device_totals)
    dc = cfg.data_collection
    mem = {"gen": dc.memory_gb if dc.memory_gb is not None else
           estimate_memory_gb(paths["reference"], cfg.model.dtype, dc.batch_size, 256 + dc.max_new_tokens, cuda)}
    try:
        from transformers import AutoConfig

        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(paths["guidance"]))
        mem["train"] = training_bytes(shape, "float32", 32, 256, cuda=cuda) / 1e9
    except OSError:
        mem["train"] = 0.0
    eval_request = eval_request_factory(cfg, paths)
    jobs: list[Job] = []
    for ds in datasets:
        train_ex = load_examples(ds, "train")
        test_ex = load_examples(ds, ev.split)
        task = train_ex[0].task
        if task == "reward" and not paths["reward_models"].get(ds.name):
            raise ConfigError(f"dataset {ds.name} is scored by a reward model but model.reward_models.{ds.name} is "
                              f"not set for model={cfg.model.name}")
        base = gen.plan(eval_request(ds), f"base.{cfg.model.name}.{ds.name}.eval", len(test_ex),
                        memory_gb=mem["gen"], group="base")
        base[-1].kind = "eval.merge"
        base[-1].params.update(labels={"algorithm": "base", "family": cfg.model.name, "train_dataset": ds.name,
                                       "round": 0, "eval_dataset": ds.name, "task": task},
                               kl_fraction=ev.kl_fraction)
        jobs += base
        for algo in cfg.experiment.algos:
            algo_jobs = value_guided.plan(cfg, algo, ds, paths, gen, len(train_ex), len(test_ex), task, mem,
                                          eval_request)
            for j in algo_jobs:
                if j.kind == "eval.merge":
                    j.params["kl_fraction"] = ev.kl_fraction
            jobs += algo_jobs
    return jobs
