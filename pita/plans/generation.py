"""The ``generate`` workload: data generation for each selected dataset with the family's reference.

    python run_parallel.py experiment.workload=generate experiment.datasets=[arith] \
        data_collection.recipe=preference_pairs data_collection.samples_per_prompt=4

One ParallelDataGenerator request per dataset: shard jobs over every device, then a merge into
``jobs/gen.<family>.<dataset>.merge/artifacts/data`` (Arrow) and ``preview.csv``.
"""

from __future__ import annotations

from pita.core.errors import ConfigError
from pita.core.job import Job
from pita.plans.common import dataset_cfg, request_for, with_reward_functions


def generation_plan(cfg, device_totals: list[int], cuda: bool, plan_only: bool = False) -> list[Job]:
    from pita.datasets.loading import count_examples
    from pita.generation.parallel import ParallelDataGenerator, check_request
    from pita.models.families import check_tokenizers, family_build_jobs, resolve_family
    from pita.plans.memory import JobMemory

    problems = []
    datasets = []
    for name in cfg.experiment.datasets:
        try:
            datasets.append(dataset_cfg(cfg, name))
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    paths = with_reward_functions(resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed,
                                                 defer="plan" if plan_only else True), datasets)
    check_tokenizers(paths["reference"], paths["guidance"], missing_ok=plan_only)
    gen = ParallelDataGenerator(device_totals)
    jobs: list[Job] = []
    dc = cfg.data_collection
    for ds in datasets:
        n_examples, task, _ = count_examples(ds, dc.split, plan_only)
        rm = paths["reward_models"].get(ds.name)
        req = request_for(cfg, ds, paths["reference"], rm)
        req_problems = check_request(req)
        if n_examples and task == "reward" and not rm and dc.recipe != "prompts":
            req_problems.append(f"dataset {ds.name} is scored by a reward model but model.reward_models.{ds.name} is "
                                f"not set for model={cfg.model.name}; add one (a local folder or hub id)")
        if req_problems:
            raise ConfigError(req_problems)
        mem = JobMemory(cfg, paths, cuda, device_totals).generation(False, [ds.name] if rm else [])
        jobs += gen.plan(req, f"gen.{cfg.model.name}.{ds.name}", n_examples, memory_gb=mem, group=ds.name)
    return family_build_jobs(cfg.model, cfg.system.cache_dir, cfg.system.seed, jobs, cuda,
                             len(device_totals)) + jobs
