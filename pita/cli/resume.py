"""``resume_from=<run folder>``: take the folder over, reload the config it ran with, apply the new
overrides and say which keys changed (the run command then compares the job graphs).

A damaged or missing state or config is rebuilt from the jobs' launch.json files and .done
markers (:mod:`pita.core.recovery`). Keys in ``EXECUTION_KEYS`` change how a run executes, not
what it computes: they may change on resume without changing any job.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf

from pita.cli.overrides import _schema
from pita.core.errors import ResumeError

RESUME_KEYS = ("resume_from", "resume_force")

# Keys that change how a run executes but not what it computes: free to change on resume.
EXECUTION_KEYS = ("executor.", "system.devices", "system.cpu_devices", "system.gpu_summary_interval_s",
                  "system.output_dir", "system.min_free_gb", "data_collection.batch_size", "data_collection.reward_batch_size",
                  "data_collection.memory_gb", "system.attn_impl", "system.use_parallel_execution",
                  "system.clear_cache_interval")

OWNED: list = []  # owner locks taken by this command; released however it ends


def _flatten(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def _apply_overrides(base: DictConfig, overrides: list[str]) -> DictConfig:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = OmegaConf.merge(_schema(), base)
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.key_or_group.startswith("hydra") or o.key_or_group in RESUME_KEYS:
            continue
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    return cfg


def _task_overrides(cfg_overrides: list[str] | None) -> list[str]:
    if cfg_overrides is not None:
        return list(cfg_overrides)
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except Exception:  # not under Hydra (tests build configs directly)
        return []


def _drop_foreign_algo_keys(saved: DictConfig, where) -> None:
    """A run folder written before each algorithm had its own config holds every algorithm key
    under every algorithm; those the algorithm does not have were never read, so they are dropped
    (and named), not refused."""
    import dataclasses

    from pita.algos import ALGORITHMS

    dropped = []
    for name, node in (saved.get("algos") or {}).items():
        if name in ALGORITHMS and isinstance(node, DictConfig):
            keys = {f.name for f in dataclasses.fields(ALGORITHMS.get(name).Config)}
            for k in [k for k in node if k not in keys]:
                dropped.append(f"algos.{name}.{k}")
                del node[k]
    if dropped:
        print(f"note: {where} sets {len(dropped)} algorithm key(s) that their algorithm does not read; dropped: "
              f"{', '.join(dropped[:8])}{' ...' if len(dropped) > 8 else ''}", file=sys.stderr)


def _resume_config(cfg: DictConfig, overrides: list[str]):
    """The run folder (owned from here on), its saved config, the new config, the keys that differ
    and how the state was found: False (read), True (rebuilt) or "fresh" (the run stopped before it
    recorded any job: nothing to compare, it starts afresh). A damaged or missing state or config
    is rebuilt from the jobs' launch.json files and .done markers (:mod:`pita.core.recovery`)."""
    from pita.core.owner import OwnerLock
    from pita.core.paths import RunPaths
    from pita.core.recovery import config_from_jobs, launches, rebuild_state
    from pita.core.state import StateStore

    run = RunPaths.open_existing(cfg.resume_from)
    owner = OwnerLock(run.root)
    note = owner.acquire()  # RunOwned (exit 2) while another orchestrator runs it
    OWNED.append(owner)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    store = StateStore(run.state)
    started = any(launches(run))  # a job that started left its launch.json
    fresh = False
    try:
        if not store.exists():
            raise ResumeError(f"{run.state} and {store.db_path.name} are missing")
        fresh = not store.read()["jobs"] and not started
        rebuilt = False
    except ResumeError as e:
        store.close()
        fresh, rebuilt = not started, started
        if started:
            n, done = rebuild_state(run)
            print(f"note: the run state could not be read ({e}); rebuilt it from the jobs' launch.json files and "
                  f".done markers: {n} job(s) started before, {done} of them complete", file=sys.stderr)
    finally:
        store.close()
    try:
        saved = OmegaConf.load(run.config)
        if not isinstance(saved, DictConfig) or "experiment" not in saved:
            raise ValueError("not a pita config")
    except Exception as e:
        if not started:
            raise ResumeError(f"{run.root} was stopped while it was being created: it has no readable "
                              f"{run.config.name} and no job of it ever started, so nothing was computed and "
                              f"nothing can be lost. Start the run again with the command that made it (and "
                              f"remove that folder)") from e
        saved = OmegaConf.create(config_from_jobs(run))
        print(f"note: {run.config.name} could not be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              f"using the config its jobs ran with (jobs/*/launch.json)", file=sys.stderr)
    if fresh:
        print(f"note: {run.root} was stopped before it recorded its jobs (during start-up): nothing was computed, "
              f"so it starts afresh with its saved config", file=sys.stderr)
    _drop_foreign_algo_keys(saved, run.config)
    new = _apply_overrides(saved, overrides)
    new.resume_from = str(run.root)
    new.resume_force = bool(cfg.resume_force)
    a, b = _flatten(OmegaConf.to_container(saved)), _flatten(OmegaConf.to_container(new))
    changed = sorted(k for k in set(a) | set(b) if k not in RESUME_KEYS and a.get(k) != b.get(k))
    return run, saved, new, changed, owner, "fresh" if fresh else rebuilt

