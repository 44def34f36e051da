"""The command line: plan the experiment, validate everything, run it, report.

    pita run experiment.name=NAME [key=value ...]                   (Hydra main -> run_experiment)
    python run_parallel.py experiment.name=NAME [key=value ...]     (the same: run_main)
    pita run resume_from=outputs/NAME/<time>                        (re-run unfinished jobs)
    pita status outputs/NAME/<time>                                 (jobs by state, live or not)
    pita report outputs/NAME/<time>                                 (re-render results/report.md)

``pita`` is also ``python -m pita``. ``--help`` prints :func:`help_text`.

Exit codes: 0 all jobs completed; 1 some job failed or was skipped (or the disk filled); 2 bad
configuration or input (nothing ran); 130 interrupted (state saved; resume with resume_from=).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pita.config import schema as _schema_registration  # noqa: F401  (Hydra needs pita_schema)
from pita.core.errors import ConfigError, ResumeError
from pita.core.names import suggest, unknown_name

log = logging.getLogger("pita")

CONF_DIR = Path(__file__).resolve().parent / "conf"  # shipped in the package (pyproject: package-data)
RESUME_KEYS = ("resume_from", "resume_force")
GROUPS = ("model", "dataset", "gpu", "experiment")  # Hydra config groups under pita/conf/
# Keys that change how a run executes but not what it computes: free to change on resume.
EXECUTION_KEYS = ("executor.", "system.devices", "system.cpu_devices", "system.gpu_summary_interval_s",
                  "system.output_dir", "system.min_free_gb", "data_collection.batch_size", "data_collection.reward_batch_size",
                  "data_collection.memory_gb", "system.attn_impl", "system.use_parallel_execution",
                  "system.clear_cache_interval")


# ---------------------------------------------------------------- overrides
def _schema():
    from pita.config.schema import PitaConfig

    return OmegaConf.structured(PitaConfig)


def _check_key(key: str, base: DictConfig) -> str | None:
    node = base
    walked = []
    for part in key.split("."):
        if not isinstance(node, DictConfig):
            return None  # below a leaf of type Any: nothing more to check
        if walked == ["algos"] and part not in node:
            from pita.algos import ALGORITHMS

            return unknown_name("algos", part, ALGORITHMS.names()) + f" (in the override of {key})"
        if len(walked) == 2 and walked[0] == "algos" and part not in node:
            return algo_key_problem(walked[1], part, list(node.keys()))
        if part not in node:
            if node._metadata.object_type is dict and walked:
                return None  # a map with open keys (e.g. +eval.datasets_by_train.<name>): Hydra checks the value
            where = ".".join(walked) or "top level"
            return (f"unknown key {'.'.join(walked + [part])!r}{suggest(part, list(node.keys()))}; "
                    f"keys at {where}: {', '.join(node.keys())}")
        walked.append(part)
        node = node._get_node(part)
    return None


def algo_key_problem(algo: str, key: str, keys: list[str]) -> str:
    """An ``algos.<algo>.<key>`` that the algorithm's config does not have."""
    return (f"algos.{algo}.{key}: {algo} has no key {key!r}{suggest(key, keys)}; the keys of {algo} are: "
            f"{', '.join(keys)} (each algorithm accepts only the keys it reads: pita/algos/)")


def _explain(e: BaseException) -> str | None:
    """A clear sentence for a composition error caused by an algorithm key the algorithm lacks."""
    while e.__cause__ is not None:
        e = e.__cause__
    full = getattr(e, "full_key", None) or ""
    parts = full.split(".")
    if len(parts) == 3 and parts[0] == "algos" and "not in" in str(e):
        from pita.algos import ALGORITHMS

        if parts[1] in ALGORITHMS:
            import dataclasses

            keys = [f.name for f in dataclasses.fields(ALGORITHMS.get(parts[1]).Config)]
            return algo_key_problem(parts[1], parts[2], keys)
    return None


def check_overrides(overrides: list[str]) -> None:
    """Raise ConfigError (every problem at once) for overrides that name unknown keys or bad values."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pita.config import schema  # noqa: F401  (registers the schema)

    split = _split_by_shell(overrides)
    if split:
        raise ConfigError(split)
    problems = []
    plain = [o for o in overrides if not o.startswith("-")]
    multirun = any(o in ("--multirun", "-m") for o in overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        try:
            base = compose(config_name="config")  # the defaults, group choices included
        except Exception as e:  # pita/conf/ itself is wrong (e.g. an edited config.yaml)
            raise ConfigError(f"{CONF_DIR / 'config.yaml'}: {_explain(e) or str(e).splitlines()[0]}") from e
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception as e:
        raise ConfigError(_parse_problems(plain) or [f"cannot parse the overrides {plain}: {str(e).splitlines()[0]}"])
    sweep = any(o.is_sweep_override() for o in parsed)
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra.run.dir") or key.startswith("hydra.sweep.dir"):
            problems.append(f"{key}: pita makes its own run folder, <system.output_dir>/<experiment.name>/<time> "
                            f"(a sweep: <system.output_dir>/<experiment.name>/sweep-<time>/<point>); "
                            f"set system.output_dir=... and experiment.name=... instead")
            continue
        if key.startswith("hydra") or o.is_delete():
            continue
        if o.is_sweep_override() and not multirun:
            text = next((x for x in plain if x.lstrip("+~").startswith(key + "=")), key)
            value = text.split("=", 1)[1] if "=" in text else ""
            problems.append(f"{text}: a comma list without brackets is a sweep (one run per value); for one run "
                            f"with a list write '{key}=[{value}]', to sweep add --multirun")
            continue
        if key in GROUPS:
            choices = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
            value = o.value()
            if isinstance(value, str) and value not in choices:
                problems.append(unknown_name(key, value, choices))
            continue
        msg = _check_key(key, base)
        if msg:
            problems.append(msg)
    if problems:
        raise ConfigError(problems)
    def first_line(e: Exception) -> str:
        explained = _explain(e)
        if explained:
            return explained
        while e.__cause__ is not None:
            e = e.__cause__
        text = str(e).strip()
        return text.splitlines()[0] if text else type(e).__name__

    if sweep:
        _check_sweep(plain, parsed, first_line)
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        try:
            compose(config_name="config", overrides=plain)
            return
        except Exception as e:
            whole = first_line(e)
        for o in plain:  # name each override that fails on its own
            try:
                compose(config_name="config", overrides=[o])
            except Exception as e:
                problems.append(f"{o}: {first_line(e)}")
    raise ConfigError(problems or [f"{' '.join(plain)}: {whole}"])


def _check_sweep(plain: list[str], parsed, first_line) -> None:
    """A sweep's points, each composed as Hydra will (and the sweep itself, whose experiment.name
    and system.output_dir name the sweep folder): every problem at once, before any folder exists."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    from pita.core.paths import RunPaths

    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    try:
        points = [p for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]
    except Exception as e:  # noqa: BLE001 - a sweep Hydra's basic sweeper cannot expand (e.g. interval())
        odd = [o for o, p in zip(plain, parsed) if p.is_sweep_override() and not p.is_discrete_sweep()]
        raise ConfigError(f"{' '.join(odd or plain)}: {first_line(e)}; sweep over a comma list, range() or "
                          f"choice()") from e
    base = [o for o, p in zip(plain, parsed) if not p.is_sweep_override()]
    problems: list[str] = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for point in [base, *points]:
            mine = [o for o in point if o.partition("=")[0].lstrip("+~") in swept]
            try:
                cfg = compose(config_name="config", overrides=point)
            except Exception as e:  # noqa: BLE001 - Hydra's and OmegaConf's composition errors
                whole, blamed = first_line(e), []
                for o in mine:  # name each swept value that fails on its own
                    try:
                        compose(config_name="config", overrides=[*base, o])
                    except Exception as e1:  # noqa: BLE001
                        blamed.append(f"{o}: {first_line(e1)}")
                problems += blamed or [f"{' '.join(mine) or ' '.join(base)}: {whole}"]
                continue
            try:
                RunPaths.check_name(cfg.experiment.name)
            except ConfigError as e:
                problems += e.problems
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))


def _split_by_shell(argv: list[str]) -> list[str]:
    """An unquoted list with spaces (``experiment.datasets=[arith, sentiment]``) reaches us as
    several arguments, the first with an unclosed bracket: say to quote it."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if "=" in a and not a.startswith("-") and a.count("[") + a.count("{") > a.count("]") + a.count("}"):
            j, parts = i + 1, [a]
            while j < len(argv) and "=" not in argv[j] and not argv[j].startswith("-"):
                parts.append(argv[j])
                j += 1
                if sum(x.count("[") + x.count("{") for x in parts) <= sum(x.count("]") + x.count("}") for x in parts):
                    break
            whole = " ".join(parts)
            out.append(f"{whole}: the shell split this list at its spaces; quote it ('{whole}') or drop the "
                       f"spaces ({whole.replace(' ', '')})")
            i = j
            continue
        i += 1
    return out


def normalize_argv(argv: list[str]) -> list[str]:
    """``--multirun`` / ``-m`` anywhere (Hydra wants its flags before the overrides)."""
    flags = [a for a in argv if a in ("--multirun", "-m")]
    return flags + [a for a in argv if a not in ("--multirun", "-m")]


def _parse_problems(overrides: list[str]) -> list[str]:
    """Each override that does not parse on its own, with the fix (quoting, usually)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out = []
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except Exception as e:  # noqa: BLE001 - Hydra's lexer and parser errors
            key, _, value = o.partition("=")
            odd = sorted({c for c in value if not c.isascii()})
            if odd:
                out.append(f"{o}: the value holds {', '.join(repr(c) for c in odd)}, which an unquoted value cannot; "
                           f"quote it, e.g. '{key}=\"{value}\"' (the single quotes are for the shell)")
            else:
                out.append(f"{o}: cannot be parsed ({str(e).splitlines()[0]}); quote the value, e.g. "
                           f"'{key}=\"{value}\"'")
    return out


def check_cli_overrides(argv: list[str] | None = None) -> None:
    """Run before Hydra: bad overrides exit with code 2 and say what to type instead."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "--hydra-help", "--info", "-i") or a.startswith("--cfg") or a == "-c" for a in argv):
        return
    try:
        check_overrides(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


# ---------------------------------------------------------------- resume
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
    """The run folder (owned from here on), its saved config, the new config and the keys that
    differ. A damaged or missing state or config is rebuilt from the jobs' launch.json files and
    .done markers (:mod:`pita.core.recovery`)."""
    from pita.core.owner import OwnerLock
    from pita.core.paths import RunPaths
    from pita.core.recovery import config_from_jobs, rebuild_state
    from pita.core.state import StateStore

    run = RunPaths.open_existing(cfg.resume_from)
    owner = OwnerLock(run.root)
    note = owner.acquire()  # RunOwned (exit 2) while another orchestrator runs it
    _OWNED.append(owner)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    store = StateStore(run.state)
    try:
        if not store.exists():
            raise ResumeError(f"{run.state} and {store.db_path.name} are missing")
        store.read()
        rebuilt = False
    except ResumeError as e:
        store.close()
        n, done = rebuild_state(run)
        rebuilt = True
        print(f"note: the run state could not be read ({e}); rebuilt it from the jobs' launch.json files and "
              f".done markers: {n} job(s) started before, {done} of them complete", file=sys.stderr)
    finally:
        store.close()
    try:
        saved = OmegaConf.load(run.config)
        if not isinstance(saved, DictConfig) or "experiment" not in saved:
            raise ValueError("not a pita config")
    except Exception as e:
        saved = OmegaConf.create(config_from_jobs(run))
        print(f"note: {run.config.name} could not be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              f"using the config its jobs ran with (jobs/*/launch.json)", file=sys.stderr)
    _drop_foreign_algo_keys(saved, run.config)
    new = _apply_overrides(saved, overrides)
    new.resume_from = str(run.root)
    new.resume_force = bool(cfg.resume_force)
    a, b = _flatten(OmegaConf.to_container(saved)), _flatten(OmegaConf.to_container(new))
    changed = sorted(k for k in set(a) | set(b) if k not in RESUME_KEYS and a.get(k) != b.get(k))
    return run, saved, new, changed, owner, rebuilt


# ---------------------------------------------------------------- run
_OWNED: list = []  # owner locks taken by this command; released however it ends


def run_experiment(cfg: DictConfig, overrides: list[str] | None = None, run_dir: Path | None = None) -> int:
    """Plan, validate, run; return the exit code. ConfigError -> message and 2. ``run_dir``: the
    new run's folder (a sweep point's), instead of <system.output_dir>/<experiment.name>/<time>."""
    try:
        return _run_experiment(cfg, overrides, run_dir)
    finally:  # a refused resume (graph changed, bad override) is not an orchestrator that died
        while _OWNED:
            _OWNED.pop().release()


def _run_experiment(cfg: DictConfig, overrides: list[str] | None, run_dir: Path | None) -> int:
    from pita.core.state import is_disk_full

    try:
        return _run(cfg, _task_overrides(overrides), run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        log.debug("configuration error", exc_info=True)
        return 2
    except OSError as e:
        if not is_disk_full(e):
            raise
        print(f"error: no space left on device ({e}); free space (at least system.min_free_gb="
              f"{cfg.system.min_free_gb:g} GiB) under {cfg.system.output_dir}; a run folder that was started "
              f"resumes with resume_from= once space is freed", file=sys.stderr)
        return 1


def _run(cfg: DictConfig, overrides: list[str], run_dir: Path | None = None) -> int:
    from pita.config.validate import validate_config
    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager, usable_cores
    from pita.core.graph import JobGraph
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths, atomic_write
    from pita.core.state import StateStore
    from pita.plans import build_plan

    resume = cfg.get("resume_from")
    owner = rebuilt = None
    if resume:
        run, saved, cfg, changed, owner, rebuilt = _resume_config(cfg, overrides)
    validate_config(cfg, models=True)  # model folders and hub ids too: before any folder is made
    sy, ex = cfg.system, cfg.executor
    cpu_n = min(usable_cores(), 2) if sy.cpu_devices == "auto" else int(sy.cpu_devices)
    devices = sy.devices if isinstance(sy.devices, str) else list(sy.devices)
    ray_backend = None
    if ex.backend == "ray":
        gpus, ray_backend = _ray_inventory(ex, cpu_n)
    else:
        gpus = GPUManager.detect(devices, cpu_devices=cpu_n)
    if not sy.use_parallel_execution:  # one job at a time: the first device only, one job on it
        gpus.devices = gpus.devices[:1]
    totals = [d.total_bytes for d in gpus.devices]
    if ex.backend == "local":  # made now: a warm process imports torch and TRL while the plan is built
        from pita.core.backends.local import HEAVY_PRELOAD, describe_worker_start, resolve_worker_start

        start = resolve_worker_start(ex.worker_start, gpus.is_cpu)
        backend = make_backend("local", kill_grace_s=ex.kill_grace_s, worker_start=start,
                               preload=HEAVY_PRELOAD if cfg.experiment.workload != "synthetic" else ())
        start_note = f"workers: {describe_worker_start(start)} (executor.worker_start={ex.worker_start})"
    else:
        backend = ray_backend if ex.backend == "ray" else make_backend(ex.backend)
        start_note = f"workers: {ex.backend} backend"
    try:
        planned = build_plan(cfg, totals, cuda=not gpus.is_cpu)
        if len(planned) > ex.max_jobs:
            raise ConfigError(f"the plan has {len(planned)} jobs, more than executor.max_jobs={ex.max_jobs}: plan fewer "
                              f"rounds, algorithms or datasets, or raise executor.max_jobs")
        graph = JobGraph(planned).validate(totals, ex.memory_margin)

        if resume:
            saved_jobs = StateStore(run.state).read()["jobs"]
            old_fp = {k: v.get("fingerprint") for k, v in saved_jobs.items()}
            new_fp = graph.fingerprints()
            if rebuilt:  # only jobs that started left their fingerprint (launch.json)
                old_fp = {k: v for k, v in old_fp.items() if v is not None}
                differs = sorted(j for j in old_fp if old_fp[j] != new_fp.get(j))
            else:
                differs = sorted(j for j in set(old_fp) | set(new_fp) if old_fp.get(j) != new_fp.get(j))
            graph_keys = [k for k in changed if not k.startswith(EXECUTION_KEYS)]
            if differs and not cfg.resume_force:
                raise ResumeError(
                    f"the overrides change the job graph of {run.root} ({len(differs)} job(s) differ, e.g. "
                    f"{', '.join(differs[:3])}); keys that differ from the saved config: "
                    f"{', '.join(graph_keys or changed) or '(none)'}. Drop those overrides, or pass resume_force=true "
                    f"to re-run the changed jobs and everything after them")
            if differs:
                stale = set(differs)
                for j in differs:
                    if j in graph.by_id:
                        stale.update(graph.descendants(j))
                for j in stale:
                    if j in graph.by_id:
                        run.job(j).clear_for_rerun()
        else:
            from pita.core.owner import OwnerLock

            if run_dir is not None:  # a sweep point: its folder is named by its overrides (pita/sweep.py)
                RunPaths.check_name(cfg.experiment.name)
                run = RunPaths.create_at(run_dir, output_dir=sy.output_dir, min_free_bytes=sy.min_free_gb * 2**30)
            else:
                run = RunPaths.create(sy.output_dir, cfg.experiment.name, min_free_bytes=sy.min_free_gb * 2**30)
            owner = OwnerLock(run.root)
            _OWNED.append(owner)
            try:
                owner.acquire()
            except OSError as e:
                _remove_new_run(run, owner)
                raise ConfigError(f"cannot write to the new run folder {run.root} ({e.strerror}); "
                                  f"{_space_hint(sy, run.root, e)}") from e
        try:
            atomic_write(run.config, OmegaConf.to_yaml(cfg, resolve=True) if not resume else OmegaConf.to_yaml(cfg))
        except OSError as e:
            if not resume:  # nothing ran and nothing is kept: the next try starts clean
                _remove_new_run(run, owner)
            raise ConfigError(f"cannot write {run.config} ({e.strerror}); {_space_hint(sy, run.root, e)}"
                              + ("" if not resume else "; the run folder is unchanged: resume it again then")) from e
        setup_logging(run.run_log)
        log.info("run folder: %s", run.root)
        from pita.models.families import family_build_note

        if note := family_build_note(graph.jobs):
            log.info("%s", note)
        if not sy.use_parallel_execution:
            log.info("system.use_parallel_execution=false: one job at a time on %s", gpus.devices[0].label)
        if resume:
            log.info("resuming %s%s", run.root, f" with changed keys: {', '.join(changed)}" if changed else "")
        settings = ExecutorSettings(
            oom_retries=ex.oom_retries, crash_retries=ex.crash_retries, job_timeout_s=ex.job_timeout_s,
            kill_grace_s=ex.kill_grace_s, poll_interval_s=ex.poll_interval_s, memory_margin=ex.memory_margin,
            max_jobs_per_device=1 if not sy.use_parallel_execution else (
                ex.max_jobs_per_device if ex.max_jobs_per_device is not None else (1 if gpus.is_cpu else None)),
            max_cpu_jobs=1 if not sy.use_parallel_execution else (ex.max_cpu_jobs or usable_cores()),
            starvation_passes=ex.starvation_passes,
            gpu_summary_interval_s=sy.gpu_summary_interval_s, progress=ex.progress,
            progress_interval_s=ex.progress_interval_s,
            threads_per_job=max(1, usable_cores() // len(gpus.devices)) if gpus.is_cpu else None,
            max_running=None if sy.use_parallel_execution else 1, min_free_gb=sy.min_free_gb,
            learn_memory=ex.learn_memory)
        log.info("%s", start_note)
        config_dict = OmegaConf.to_container(cfg, resolve=True)
        summary = Executor(graph, gpus, backend, run, settings, config_dict, owner=owner).run()
    except BaseException:
        backend.close()  # nothing ran, or the run is over: no warm process left behind
        if owner is not None:
            owner.release()
        raise
    if summary.disk_full:
        owner.release()
        _print_summary(summary, run)
        print(f"error: {summary.disk_full}", file=sys.stderr)
        return summary.exit_code
    from pita.report.results import table, write

    rows = write(run)
    if rows:
        print("\n" + table(rows))
        print(f"results: {run.results / 'results.csv'}")
    _write_report(run, rows)
    owner.release()
    _print_summary(summary, run)
    return summary.exit_code


def _space_hint(sy, root, e: OSError) -> str:
    from pita.core.state import is_disk_full

    if not is_disk_full(e):
        return "check the permissions there, or choose another system.output_dir"
    import shutil

    try:
        free = f"{shutil.disk_usage(root if Path(root).exists() else sy.output_dir).free / 2**20:.1f} MiB free"
    except OSError:
        free = "no space left"
    return (f"the disk of system.output_dir={sy.output_dir!r} is full ({free}): free at least "
            f"{max(sy.min_free_gb, 1.0):g} GiB there (system.min_free_gb), or point system.output_dir at another disk")


def _remove_new_run(run, owner) -> None:
    """A run folder that could not even hold its config: remove it rather than leave a husk."""
    import shutil

    try:
        owner.release()
    except OSError:
        pass
    shutil.rmtree(run.root, ignore_errors=True)


def _ray_inventory(ex, cpu_n: int):
    """Join (or start) Ray and start the backend's per-GPU actors; the executor plans with one
    device per cluster GPU (memory from executor.ray.gpu_memory_gb, else this node's first GPU,
    else 80 GiB), or with CPU devices when the cluster has no GPU."""
    from pita.core.backends.ray import RayBackend, connect
    from pita.core.gpu_manager import GPUManager

    rc = ex.ray
    owns = connect(rc.address, rc.num_gpus, rc.num_cpus)
    backend = RayBackend(owns_ray=owns, kill_grace_s=ex.kill_grace_s)
    if not backend.gpu_runners:
        return GPUManager.cpu_inventory(cpu_n), backend
    if rc.gpu_memory_gb:
        total = int(rc.gpu_memory_gb * 2**30)
    else:
        local = GPUManager.detect("auto", cpu_devices=1)
        total = local.devices[0].total_bytes if not local.is_cpu else int(80 * 2**30)
    return GPUManager(backend.devices(total), source="ray"), backend


def _write_report(run, rows) -> None:
    """The report is a view of saved results: a failure to draw it is said, and loses nothing."""
    from pita.report.report import render

    try:
        print(f"report: {render(run, rows or None)}")
    except Exception as e:  # noqa: BLE001 - the run's results are already on disk
        log.warning("the report could not be rendered (%s: %s); results are in %s; retry with: "
                    "python -m pita report %s", type(e).__name__, e, run.results, run.root)


def report_main(run_dir: str) -> int:
    from pita.core.paths import RunPaths
    from pita.report.report import render
    from pita.report.results import write

    try:
        run = RunPaths.open_existing(run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = write(run)
    print(render(run, rows or None))
    return 0


def _print_summary(summary, run) -> None:
    c = summary.counts
    print(f"\n{c['COMPLETED']} completed, {c['FAILED']} failed, {c['SKIPPED']} skipped, "
          f"{c['PENDING'] + c['RUNNING']} not run, in {summary.wall_s:.1f}s")
    for f in summary.failures:
        print(f"  FAILED {f['job']} on {f['device']}: {f['error']}\n         log: {f['log']}")
    if summary.interrupted:
        print(f"interrupted; resume with: python run_parallel.py resume_from={run.root}")
    print(f"run folder: {run.root}  (log: {run.run_log})")


# ---------------------------------------------------------------- pita status
def _runs_below(folder: str) -> list[Path]:
    """Run folders below ``folder`` (an experiment's folder, a sweep folder, or outputs/), up to
    three levels down (outputs/<name>/sweep-<time>/<point>), in path order; empty when ``folder``
    is itself a run."""
    root = Path(folder)
    if not root.is_dir() or any((root / m).exists() for m in ("state.db", "state.json", "config.yaml", "jobs")):
        return []

    def is_run(p: Path) -> bool:
        return p.is_dir() and any((p / m).exists() for m in ("state.db", "state.json", "config.yaml"))

    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        for p in sorted(d.iterdir()):
            if is_run(p):
                found.append(p)
            elif p.is_dir() and depth < 3:
                walk(p, depth + 1)

    walk(root, 1)
    return found


def status_main(run_dir: str, show_all: bool = False) -> int:
    """Jobs by state and by group (round), what runs where and for how long, failures with their
    logs; whether an orchestrator owns the run now (its owner lock) or it stopped. Reads the state
    database without blocking the run."""
    import time
    from collections import Counter

    from pita.core.owner import describe, probe
    from pita.core.paths import RunPaths
    from pita.core.state import StateStore

    runs = _runs_below(run_dir)
    if runs:  # a folder of runs (outputs/<name>): list them
        print(f"{run_dir} holds {len(runs)} run(s); show one with: pita status <run>")
        for r in runs:
            owned, _ = probe(r)
            print(f"  {r}  ({'running' if owned else 'not running'})")
        return 0
    try:
        run = RunPaths.open_existing(run_dir)
        store = StateStore(run.state)
        if not store.exists():
            raise ResumeError(f"{run.root} has no state (state.db, state.json); resume_from= rebuilds it from "
                              f"the jobs' folders")
        data = store.read()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs = data["jobs"]
    now = time.time()
    owned, owner = probe(run.root)
    if owned:
        live = f"running: {describe(owner)}"
    elif data.get("finished") and not data.get("interrupted"):
        live = "finished"
    elif data.get("interrupted"):
        live = "interrupted"
    else:
        live = (f"stopped: its orchestrator ({describe(owner)}) is gone without finishing" if owner else "stopped")
    counts = Counter(j.get("state", "PENDING") for j in jobs.values())
    print(f"{run.root} ({live}): {len(jobs)} jobs; " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items())))
    if not owned and counts.get("RUNNING"):
        print(f"  ({counts['RUNNING']} job(s) were running when it stopped; resume with: "
              f"python run_parallel.py resume_from={run.root})")
    groups: dict[str, Counter] = {}
    for j in jobs.values():
        groups.setdefault(j.get("group") or "-", Counter())[j.get("state", "PENDING")] += 1
    for g, c in sorted(groups.items()):
        print(f"  {g:<10} " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(c.items())))

    def devs(j):
        return ",".join(d.get("label", "?") for d in j.get("devices", [])) or "host"

    def line(jid, j):
        st = j.get("state", "PENDING")
        n = max(int(j.get("attempt") or 0), len(j.get("attempts", [])))
        if st == "RUNNING":
            took = f"running {now - (j.get('started') or now):.0f}s" if owned else "was running when it stopped"
        elif j.get("duration_s") is not None:
            took = f"{j['duration_s']:.1f}s"
        else:
            took = ""
        extra = ""
        if st == "FAILED":
            log_path = j.get("log") or f"jobs/{jid}/job.log"
            extra = f"\n           error: {j.get('error')}\n           log: {run.root / log_path}"
        elif st == "SKIPPED":
            extra = f"  ({j.get('reason') or 'a dependency failed'})"
        return f"  {st:<9} {jid}  on {devs(j)}, attempt{'s' if n != 1 else ''} {n}, {took}{extra}"

    shown = [(jid, j) for jid, j in sorted(jobs.items())
             if show_all or j.get("state") in ("RUNNING", "FAILED", "SKIPPED")]
    if shown:
        print("jobs:" if show_all else "running, failed and skipped jobs:")
        for jid, j in shown:
            print(line(jid, j))
    busy = Counter(d.get("label", "?") for j in jobs.values() if j.get("state") == "RUNNING"
                   for d in j.get("devices", []))
    if busy and owned:
        print("devices: " + ", ".join(f"{k} {v} job{'s' if v != 1 else ''}" for k, v in sorted(busy.items())))
    from pita.core.memlearn import status_lines

    for text in status_lines(data):
        print(text)
    print(f"log: {run.run_log}")
    return 0


# ---------------------------------------------------------------- pita run / run_parallel.py
EXIT_CODES = (  # what run_main returns; help_text and the README list these
    (0, "every job completed"),
    (1, "a job failed, or was skipped because a dependency failed; or the disk filled (free space, then "
        "resume); or pita itself failed (a traceback is printed)"),
    (2, "bad configuration or input: the message names the key, the value and the fix; nothing ran"),
    (130, "interrupted (Ctrl-C, SIGTERM): the state is saved; resume with resume_from=<run folder>"),
)
# The keys the help page lists (with their defaults and meanings, read from the schema).
HELP_KEYS = ("experiment.", "system.output_dir", "system.devices", "system.cache_dir", "system.seed",
             "executor.", "resume_from", "resume_force")
_exit_codes: list[int] = []  # one per experiment run by this process (a sweep runs several)


def _task(cfg: DictConfig):
    """Hydra's task function: one run, or one point of a sweep (``-m``; pita/sweep.py names its
    folder and skips the points after an interrupted one)."""
    from pita import sweep

    point = sweep.current()
    if point is not None and point.skip:
        return None
    _exit_codes.append(run_experiment(cfg, run_dir=point.folder if point is not None else None))
    return _exit_codes[-1]


def run_main(argv: list[str] | None = None, prog: str = "python run_parallel.py") -> int:
    """Start an experiment and return its exit code: ``python run_parallel.py ...``, ``pita run
    ...`` and ``python -m pita run ...`` all come here. ``-h`` / ``--help`` print our page
    (Hydra's own stays at ``--hydra-help``); ``--multirun`` / ``-m`` may stand anywhere; bad
    overrides exit 2 before Hydra composes anything."""
    import hydra

    from pita import sweep

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(prog))
        return 0
    argv = normalize_argv(argv)
    check_cli_overrides(argv)
    main = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)(_task)
    before = len(_exit_codes)
    saved, sys.argv = sys.argv, [prog, *argv]  # Hydra reads its command line from sys.argv
    try:
        main()
    except KeyboardInterrupt:  # outside the executor's own handling (composing, planning, between points)
        print("interrupted", file=sys.stderr)
        _exit_codes.append(130)
        sweep.close(interrupted=True)
    finally:
        sys.argv = saved
        sweep.close()  # a sweep cut short (Ctrl-C between points, an error) still gets its summary
    return max(_exit_codes[before:], default=0)


def help_text(prog: str = "pita run") -> str:
    """The page ``pita --help``, ``pita run --help`` and ``python run_parallel.py --help`` print:
    the keys, defaults and meanings come from the schema and the groups from pita/conf/, so the
    page follows the code."""
    import textwrap

    from pita.config.reference import rows

    width = 100
    out = [
        f"usage: {prog} [key=value ...] [-m|--multirun] [--cfg job]",
        "       pita run ... | python -m pita run ... | python run_parallel.py ...   (one and the same)",
        "       pita status RUN_FOLDER [--all]",
        "       pita report RUN_FOLDER",
        "",
        textwrap.fill("pita plans a post-training experiment (PITA, Q#, Q#-HF, DPO, GRPO, GRPO-HF x datasets x rounds, "
              "plus the base model's evaluation) as one job graph, checks the configuration before anything "
              "runs, and starts every job as soon as its dependencies are done and a device has memory for "
              "it: on every GPU of this machine, on CPU without one, or on a Ray cluster. It runs from any "
              "folder; outputs go below the current one.", width=width),
        "",
        "commands:",
        "  run      run an experiment (or a sweep with -m); key=value overrides, checked first",
        "  status   a run's jobs by state, its devices, failures and their logs (safe on a live run)",
        "  report   re-render a run's results/report.md and plots from its saved results",
        "",
        f"config groups (GROUP=NAME; the files: {CONF_DIR}/<group>/<NAME>.yaml):",
    ]
    defaults = {}
    try:
        for d in OmegaConf.load(CONF_DIR / "config.yaml").get("defaults", []):
            if isinstance(d, DictConfig) or isinstance(d, dict):
                for k, v in d.items():
                    defaults[str(k)] = v
    except Exception:  # noqa: BLE001 - the help page is still useful without the defaults
        pass
    for group, note in (("model", "model family"), ("experiment", "preset"), ("gpu", "GPU preset")):
        names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        d = defaults.get(group)
        shown = ", ".join(f"{n} (default)" if n == d else n for n in names)
        out.append(f"  {group + '=':<12} {note}: {shown}" + ("" if d else "; none by default"))
    datasets = sorted(p.stem for p in (CONF_DIR / "dataset").glob("*.yaml"))
    out += [f"  {'datasets.<name>.KEY=VALUE':<12} per dataset: {', '.join(datasets)}", "",
            "main keys (key=default: meaning; every key: README.md \"Configuration\", or --cfg job for the "
            "resolved config):"]
    for key, default, note in rows():
        if not key.startswith(HELP_KEYS) or key.startswith("executor.ray."):
            continue
        note = " ".join(note.split())
        if len(note) > 64:
            note = note[:61].rsplit(" ", 1)[0] + " ..."
        pair = f"{key}={default}"
        out.append(f"  {pair:<40} {note}" if len(pair) < 40 else f"  {pair}\n  {'':<40} {note}")
    out += ["  executor.ray.*, model.*, datasets.*, algos.<name>.*, eval.*, data_collection.*, training.*: "
            "see the README", ""]
    out += [
        "outputs (relative to the current folder unless system.output_dir is absolute):",
        "  outputs/<experiment.name>/<YYYY-MM-DD_HH-MM-SS>/",
        "    run.log          every line of every job, prefixed [job-id device]; follow it with tail -f",
        "    config.yaml      the resolved config that ran (resume_from= reloads it)",
        "    state.db, state.json   job states, devices, attempts, timings",
        "    jobs/<job-id>/   job.log, result.json, artifacts/, .done",
        "    results/         final_results.json, results.csv, report.md, plots/",
        "",
        "sweeps (-m / --multirun, anywhere; comma lists, range(), choice()): one run per combination, in turn",
        f"  {prog} -m model=qwen3-sm,llama experiment.rounds=1,2",
        "  outputs/<experiment.name>/sweep-<YYYY-MM-DD_HH-MM-SS>/",
        "    <key>-<value>__<key>-<value>/   a point's run folder (as above), named by the overrides it varies",
        "    summary.csv      one row per point: overrides, exit code, run folder, headline metrics",
        "    multirun.yaml    the sweep's config and command line",
        "  A line per point as it starts and ends, a table at the end; the exit code is the worst point's;",
        "  after an interrupted point the others are not run.",
        "",
        "exit codes:",
    ]
    out += [textwrap.fill(f"{code:<4} {text}", width=width, initial_indent="  ", subsequent_indent=" " * 7)
            for code, text in EXIT_CODES]
    out += ["", "Hydra's own help: --hydra-help. More: README.md and docs/architecture.md."]
    return "\n".join(out)


def console_main(argv: list[str] | None = None) -> int:
    import argparse
    import signal

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # the experiment itself: Hydra's command line, not argparse's
        return run_main(argv[1:], prog="pita run")
    # Output piped into `head` and the like: end quietly when the reader goes away, as Unix tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if argv[:1] in (["-h"], ["--help"]):
        print(help_text("pita run"))
        return 0
    ap = argparse.ArgumentParser(prog="pita", description="Run pita experiments and inspect their runs "
                                 "(pita --help: the whole page).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="run an experiment: pita run key=value ... (pita run --help)")
    st = sub.add_parser("status", help="jobs by state, devices, failures and their logs")
    st.add_argument("run_dir")
    st.add_argument("--all", action="store_true", help="every job, not only running / failed / skipped ones")
    rp = sub.add_parser("report", help="re-render results/report.md and its plots from the saved results")
    rp.add_argument("run_dir")
    args = ap.parse_args(argv)
    if args.cmd == "status":
        return status_main(args.run_dir, show_all=args.all)
    if args.cmd == "report":
        return report_main(args.run_dir)
    return 2
