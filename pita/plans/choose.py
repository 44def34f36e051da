"""gpu=auto's device counts, chosen for the makespan.

``resolve_auto_training`` finds, per training algorithm, every device count whose jobs fit (the
configured count when it fits; else FSDP over 2, 4, 8, ... devices). The fewest that fit is not
always the fastest plan, nor the most is: sampling with transformers is bound by each step's
latency, so twice the devices cost twice the device-hours for about the same hours per job,
and a job that holds the whole node keeps everything else waiting. Here each alternative is
planned and simulated by the production scheduler, one algorithm at a time (most device-hours
first), and the count with the shortest makespan is kept (a shorter one must win by 1%; ties keep
fewer devices). What was weighed is returned for ``pita plan`` to print.

    jobs = for_makespan(cfg, build, jobs, totals, options)   # cfg updated in place
"""

from __future__ import annotations

import copy

from omegaconf import open_dict

MARGIN = 0.01  # a count with more devices must shorten the makespan by this share to be chosen


def makespan(cfg, jobs, totals: list[int]) -> float:
    from pita.core.simulation import simulate

    ex = cfg.executor
    per_device = 1 if ex.backend == "slurm" else ex.max_jobs_per_device  # Slurm: whole GPUs per job
    return simulate(jobs, totals, ex.memory_margin, max_jobs_per_device=per_device,
                    starvation_passes=ex.starvation_passes).makespan


def _apply(cfg, name: str, option) -> None:
    k, sharding, micro, gc = option
    with open_dict(cfg):
        a = cfg.algos[name]
        a.devices, a.sharding, a.micro_batch_size, a.gradient_checkpointing = k, sharding, micro, gc


def for_makespan(cfg, build, jobs, totals: list[int], options: dict) -> list:
    """The jobs of the fastest combination; ``options["weighed"]``: per algorithm, each count tried
    with its simulated makespan and whether it was chosen. ``build(cfg)``: the plan's jobs."""
    from pita.plans.fit import job_algorithm

    alts = {n: o for n, o in options.items() if n not in ("raised", "weighed") and len(o) > 1}
    weighed: dict = {}
    if not alts:
        return jobs
    best = makespan(cfg, jobs, totals)
    hours: dict = {}
    for j in jobs:
        hours[job_algorithm(j)] = hours.get(job_algorithm(j), 0.0) + j.duration_hint * max(0, j.resources.devices)
    for name in sorted(alts, key=lambda n: -hours.get(n, 0.0)):
        current = next(o for o in alts[name] if o[0] == int(cfg.algos[name].devices))
        tried = [{"devices": current[0], "micro_batch_size": current[2], "makespan_s": round(best, 1)}]
        for option in alts[name]:
            if option == current:
                continue
            trial = copy.deepcopy(cfg)
            _apply(trial, name, option)
            trial_jobs = build(trial)
            ms = makespan(trial, trial_jobs, totals)
            tried.append({"devices": option[0], "micro_batch_size": option[2], "makespan_s": round(ms, 1)})
            if ms < best * (1 - MARGIN) or (ms <= best and option[0] < current[0]):
                best, jobs, current = ms, trial_jobs, option
                _apply(cfg, name, option)
        for t in tried:
            t["chosen"] = t["devices"] == current[0]
        if name in options.get("raised", {}):  # a user's count raised: to the count chosen here
            options["raised"][name] = (options["raised"][name][0], current[0])
        weighed[name] = sorted(tried, key=lambda t: t["devices"])
    options["weighed"] = weighed
    return jobs
