"""Checks on a composed config that types alone cannot express; all problems reported at once."""

from __future__ import annotations

import math
import sys

from omegaconf import DictConfig, ListConfig

from pita.core.backends import BACKEND_NAMES
from pita.core.backends.local import WORKER_START_SETTINGS
from pita.core.errors import ConfigError
from pita.core.names import unknown_name
from pita.core.paths import RunPaths
from pita.plans import WORKLOADS

PROGRESS = ("auto", "rich", "plain", "off")
MAX_JOB_SECONDS = 86400.0  # a stand-in job sleeps at most a day


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def synthetic_jobs(s) -> int:
    """How many jobs the synthetic workload plans (pita/plans/synthetic.py's grid)."""
    per_round = s.gen_shards + 1 + 1 + s.eval_shards + 1  # shards, merge, train, eval shards, merge
    return len(s.families) * len(s.datasets) * ((s.eval_shards + 1) + len(s.algos) * s.rounds * per_round)


def validate_config(cfg: DictConfig, models: bool = False) -> None:
    """Raise ConfigError listing every problem; then apply the shorthands (generation.batch_size).

    ``models``: also check that every model the run loads can be found (local folders exist, hub
    ids are downloadable or cached; :mod:`pita.models.sources`). This looks at the disk and may
    ask the hub once (a few seconds at most), so the command line asks for it, before it makes
    the run folder; checks of a config alone leave it out."""
    p: list[str] = []
    ex, sy = cfg.executor, cfg.system

    def need(cond: bool, key: str, value, rule: str) -> None:
        if not cond:
            p.append(f"{key}={value!r}: {rule}")

    try:
        RunPaths.check_name(cfg.experiment.name)
    except ConfigError as e:
        p.extend(e.problems)
    if cfg.experiment.workload not in WORKLOADS:
        p.append(unknown_name("experiment.workload", cfg.experiment.workload, WORKLOADS))
    if ex.backend not in BACKEND_NAMES:
        p.append(unknown_name("executor.backend", ex.backend, BACKEND_NAMES))
    if ex.worker_start not in WORKER_START_SETTINGS:
        p.append(unknown_name("executor.worker_start", ex.worker_start, WORKER_START_SETTINGS))
    need(ex.oom_retries >= 0, "executor.oom_retries", ex.oom_retries, "must be >= 0")
    need(ex.crash_retries >= 0, "executor.crash_retries", ex.crash_retries, "must be >= 0")
    need(ex.lost_retries >= 0, "executor.lost_retries", ex.lost_retries, "must be >= 0")
    need(ex.device_wait_s >= 0, "executor.device_wait_s", ex.device_wait_s, "must be >= 0 seconds")
    need(ex.ray.startup_timeout_s > 0, "executor.ray.startup_timeout_s", ex.ray.startup_timeout_s,
         "must be > 0 seconds")
    need(ex.job_timeout_s is None or ex.job_timeout_s > 0, "executor.job_timeout_s", ex.job_timeout_s,
         "must be > 0 seconds, or null for no limit")
    need(ex.kill_grace_s >= 0, "executor.kill_grace_s", ex.kill_grace_s, "must be >= 0")
    sl = ex.slurm
    need(sl.cpus_per_job >= 1, "executor.slurm.cpus_per_job", sl.cpus_per_job, "must be >= 1 (CPUs per device a job holds)")
    need(sl.time_margin >= 1, "executor.slurm.time_margin", sl.time_margin,
         "must be >= 1 (a job's --time is its expected seconds times this)")
    need(sl.min_minutes >= 1, "executor.slurm.min_minutes", sl.min_minutes, "must be >= 1 (Slurm counts minutes)")
    need(sl.poll_interval_s > 0, "executor.slurm.poll_interval_s", sl.poll_interval_s, "must be > 0 seconds")
    need(sl.mem_gb > 0, "executor.slurm.mem_gb", sl.mem_gb, "must be > 0 GB")
    need(sl.max_poll_interval_s >= sl.poll_interval_s, "executor.slurm.max_poll_interval_s", sl.max_poll_interval_s,
         f"must be >= executor.slurm.poll_interval_s ({sl.poll_interval_s})")
    need(sl.max_jobs is None or sl.max_jobs >= 1, "executor.slurm.max_jobs", sl.max_jobs,
         "must be >= 1, or null for what your association and QoS allow")
    need(0 < sl.max_share <= 1, "executor.slurm.max_share", sl.max_share,
         "must be in (0, 1]: the share of the partition's usable GPUs this run keeps in flight (executor.slurm.max_jobs "
         "sets a number instead)")
    need(sl.oom_mem_factor > 1, "executor.slurm.oom_mem_factor", sl.oom_mem_factor,
         "must be > 1 (--mem grows by it after an OUT_OF_MEMORY)")
    need(sl.oom_mem_retries >= 0, "executor.slurm.oom_mem_retries", sl.oom_mem_retries, "must be >= 0")
    need(sl.signal_margin_s >= 10, "executor.slurm.signal_margin_s", sl.signal_margin_s,
         "must be >= 10 seconds (the time a job has to save before its limit)")
    need(sl.outcome_wait_s >= 0, "executor.slurm.outcome_wait_s", sl.outcome_wait_s, "must be >= 0 seconds")
    need(sl.pack_below_s >= 0, "executor.slurm.pack_below_s", sl.pack_below_s,
         "must be >= 0 seconds (0: no packs, every attempt a Slurm job of its own)")
    need(sl.pack_time_s >= 120, "executor.slurm.pack_time_s", sl.pack_time_s,
         "must be >= 120 seconds (a pack's --time)")
    need(sl.partition_refresh_s >= 10, "executor.slurm.partition_refresh_s", sl.partition_refresh_s,
         "must be >= 10 seconds (how often the partition's nodes are read again)")
    need(sl.pack_idle_s >= 0, "executor.slurm.pack_idle_s", sl.pack_idle_s, "must be >= 0 seconds")
    need(sl.pending_report_s > 0, "executor.slurm.pending_report_s", sl.pending_report_s, "must be > 0 seconds")
    need(ex.poll_interval_s > 0, "executor.poll_interval_s", ex.poll_interval_s, "must be > 0")
    need(0 <= ex.memory_margin < 1, "executor.memory_margin", ex.memory_margin, "must be a fraction in [0, 1)")
    if cfg.system.get("host_ram") is not None:
        from pita.plans.host import parse_size

        try:
            parse_size(cfg.system.host_ram)
        except ConfigError as e:
            p.extend(e.problems)
    need(ex.max_jobs_per_device is None or ex.max_jobs_per_device >= 1, "executor.max_jobs_per_device",
         ex.max_jobs_per_device, "must be >= 1, or null for no cap")
    need(ex.max_cpu_jobs is None or ex.max_cpu_jobs >= 1, "executor.max_cpu_jobs", ex.max_cpu_jobs,
         "must be >= 1, or null for the number of cores")
    need(ex.starvation_passes is None or ex.starvation_passes >= 0, "executor.starvation_passes",
         ex.starvation_passes, "must be >= 0, or null to disable")
    if ex.progress not in PROGRESS:
        p.append(unknown_name("executor.progress", ex.progress, PROGRESS))
    need(ex.progress_interval_s > 0, "executor.progress_interval_s", ex.progress_interval_s, "must be > 0")
    need(sy.gpu_summary_interval_s > 0, "system.gpu_summary_interval_s", sy.gpu_summary_interval_s, "must be > 0")
    from pita.models.families import ATTN_IMPLS

    if sy.attn_impl not in ATTN_IMPLS:
        p.append(unknown_name("system.attn_impl", sy.attn_impl, ATTN_IMPLS))

    dev = sy.devices
    if isinstance(dev, (list, ListConfig)):
        bad = [d for d in dev if not isinstance(d, int) or isinstance(d, bool) or d < 0]
        need(not bad and len(dev) > 0, "system.devices", list(dev),
             "must be auto, cpu, or a non-empty list of device indices >= 0, e.g. [0,1]")
    else:
        need(dev in ("auto", "cpu"), "system.devices", dev, "must be auto, cpu, or a list of device indices, e.g. [0,1]")
    cd = sy.cpu_devices
    need(cd == "auto" or (isinstance(cd, int) and not isinstance(cd, bool) and cd >= 1), "system.cpu_devices", cd,
         "must be auto or an integer >= 1")

    s = cfg.synthetic
    for key in ("rounds", "gen_shards", "eval_shards"):
        v = s[key]
        need(isinstance(v, int) and v >= 1, f"synthetic.{key}", v, "must be an integer >= 1")
    need(_number(s.job_seconds) and 0 <= s.job_seconds <= MAX_JOB_SECONDS, "synthetic.job_seconds", s.job_seconds,
         f"must be a number of seconds in [0, {MAX_JOB_SECONDS:g}] (each stand-in job sleeps this long)")
    need(_number(s.memory_gb) and s.memory_gb >= 0, "synthetic.memory_gb", s.memory_gb,
         "must be >= 0 (a finite number of GB per job)")
    need(s.get("peak_gb") is None or (_number(s.peak_gb) and s.peak_gb >= 0), "synthetic.peak_gb", s.get("peak_gb"),
         "must be >= 0 (the GB each stand-in job reports as its peak), or null to report what the worker measures")
    for key in ("algos", "families", "datasets"):
        need(len(s[key]) > 0, f"synthetic.{key}", list(s[key]), "must list at least one name")
    from pita.algos import ALGORITHMS

    for name in cfg.algos:
        if name not in ALGORITHMS:
            p.append(unknown_name("algos", name, ALGORITHMS.names()) + " (algos.<name> holds the settings of a "
                     "registered algorithm)")
    if cfg.get("logging") is not None:
        from pita.tracking import check_tracker

        p += check_tracker(cfg.logging.tracker)
    ev = cfg.eval
    need(_number(ev.temperature) and ev.temperature >= 0, "eval.temperature", ev.temperature,
         "must be >= 0 (0 = greedy; 1 samples from the policy as it is)")
    need(_number(ev.top_p) and 0 < ev.top_p <= 1, "eval.top_p", ev.top_p, "must be in (0, 1] (1 = off)")
    need(_count(ev.batch_size), "eval.batch_size", ev.batch_size,
         "must be a positive integer (sequences generated together; halved on CUDA out of memory)")
    need(_count(ev.max_new_tokens), "eval.max_new_tokens", ev.max_new_tokens,
         "must be a positive integer (the completion length limit)")
    from pita.eval.metrics import budget_problems
    from pita.models.chat import template_var_problems
    from pita.models.families import reward_scoring_problems

    p += reward_scoring_problems(cfg.model)
    p += template_var_problems(cfg.model.get("chat_template_kwargs"))

    p += budget_problems(list(ev.kl_budgets) if isinstance(ev.kl_budgets, (list, ListConfig)) else ev.kl_budgets)

    # The plan's size, before planning it (a plan of millions of jobs takes minutes and gigabytes).
    mj = ex.max_jobs
    need(_count(mj), "executor.max_jobs", mj, "must be a positive integer")
    if _count(mj) and cfg.experiment.workload == "synthetic" and all(
            _count(s[k]) for k in ("rounds", "gen_shards", "eval_shards")):
        n = synthetic_jobs(s)
        if n > mj:
            p.append(f"synthetic.rounds={s.rounds} (with {len(s.algos)} algorithms, {len(s.families)} families, "
                     f"{len(s.datasets)} datasets, {s.gen_shards}+{s.eval_shards} shards) plans {n} jobs, more than "
                     f"executor.max_jobs={mj}: lower synthetic.rounds or the lists, or raise executor.max_jobs")
    if _count(mj) and cfg.experiment.workload == "experiment" and isinstance(cfg.experiment.rounds, int):
        r = cfg.experiment.rounds
        at_least = r * len(cfg.experiment.algos) * len(cfg.experiment.datasets)  # a job per round at least
        if at_least > mj:
            p.append(f"experiment.rounds={r} with {len(cfg.experiment.algos)} algorithms and "
                     f"{len(cfg.experiment.datasets)} datasets plans more than {at_least} jobs, more than "
                     f"executor.max_jobs={mj}: lower experiment.rounds, or raise executor.max_jobs")
    gb = cfg.generation.batch_size
    need(gb is None or (isinstance(gb, int) and not isinstance(gb, bool) and gb >= 1), "generation.batch_size", gb,
         "must be a positive integer (the per-device data-generation batch), or null to use data_collection.batch_size")
    disabled = disabled_algorithms(cfg)
    if cfg.experiment.workload == "experiment" and len(cfg.experiment.algos) and \
            set(cfg.experiment.algos) <= set(disabled):
        p.append(f"experiment.algos={list(cfg.experiment.algos)}: every one of them has enabled=false "
                 f"({', '.join(f'algos.{a}.enabled' for a in cfg.experiment.algos)}); set one to true, or list "
                 f"the algorithms to run in experiment.algos")
    if models:
        from pita.models.sources import check_models

        p += check_models(cfg)
    if p:
        raise ConfigError(p)
    if gb is not None:  # the user guide's shorthand, written into the key it stands for
        cfg.data_collection.batch_size = gb
    if disabled and cfg.experiment.workload == "experiment":
        # algos.<A>.enabled=false (the user guide's switch) leaves A out of the plan, as leaving it
        # out of experiment.algos does; config.yaml then shows the list that ran
        cfg.experiment.algos = [a for a in cfg.experiment.algos if a not in disabled]
        print(f"note: left out {', '.join(a for a in disabled)} (algos.<name>.enabled=false); running "
              f"{', '.join(cfg.experiment.algos)}", file=sys.stderr)


def disabled_algorithms(cfg: DictConfig) -> list[str]:
    """The algorithms of ``experiment.algos`` whose ``algos.<name>.enabled`` is false."""
    return [a for a in cfg.experiment.algos
            if a in cfg.algos and cfg.algos[a].get("enabled", True) is False]
