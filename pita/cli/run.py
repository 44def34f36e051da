"""``pita run`` / ``python run_parallel.py``: compose, validate, plan and run an experiment.

    run_main(argv)                       # the entry point: --help, override checks, Hydra, exit code
    run_experiment(cfg, overrides)       # one run (or one sweep point) from a composed config

Plan, validate everything (model folders included) before a run folder exists, make it (or take
over ``resume_from``'s), run the job graph with the executor, then write the results and the
report. A distributed launcher (torchrun) is refused: pita starts its own process per device.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pita.cli.help import help_text
from pita.cli.overrides import CONF_DIR, check_cli_overrides, normalize_argv
from pita.cli.report import algorithm_roster, print_summary, write_report
from pita.cli.resume import EXECUTION_KEYS, OWNED, _resume_config, _task_overrides
from pita.core.errors import ConfigError, ResumeError

log = logging.getLogger("pita")
_exit_codes: list[int] = []  # one per experiment run by this process (a sweep runs several)


def run_experiment(cfg: DictConfig, overrides: list[str] | None = None, run_dir: Path | None = None) -> int:
    """Plan, validate, run; return the exit code. ConfigError -> message and 2. ``run_dir``: the
    new run's folder (a sweep point's), instead of <system.output_dir>/<experiment.name>/<time>."""
    try:
        return _run_experiment(cfg, overrides, run_dir)
    finally:  # a refused resume (graph changed, bad override) is not an orchestrator that died
        while OWNED:
            OWNED.pop().release()


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


def absolute_paths(cfg: DictConfig) -> None:
    """The paths a new run reads and writes, made absolute against the folder it was started
    from: ``system.output_dir``, ``system.cache_dir`` and each dataset's local ``path``. Workers on
    other nodes (the Ray backend) start elsewhere, and the run's ``config.yaml`` then names the
    same files wherever it is resumed from."""
    sy = cfg.system
    sy.output_dir = str(Path(sy.output_dir).expanduser().absolute())
    sy.cache_dir = str(Path(sy.cache_dir).expanduser().absolute())
    for ds in (cfg.get("datasets") or {}).values():
        p = ds.get("path") if hasattr(ds, "get") else None
        if p and not Path(p).expanduser().is_absolute() and Path(p).expanduser().exists():
            ds.path = str(Path(p).expanduser().absolute())
        if hasattr(ds, "get") and ds.get("reward") and not ds.get("reward_dir"):
            ds.reward_dir = os.getcwd()  # a reward function is imported from where the run started


def mig_problems(jobs, gpus) -> list[str]:
    """A k-device job cannot run on MIG slices: CUDA gives one process one slice at most."""
    if not any(getattr(d, "mig", None) is not None for d in gpus.devices):
        return []
    from pita.plans.fit import job_algorithm, job_kind

    seen = {}
    for j in jobs:
        if j.resources.devices > 1:
            seen.setdefault((job_kind(j), job_algorithm(j)), j)
    return [f"{kind} jobs of {algo} (e.g. {j.id}) need {j.resources.devices} devices at once, but the devices here "
            f"are MIG slices and CUDA gives a process one slice at most: set algos.{algo}.devices=1 "
            f"(and algos.{algo}.sharding=none), or run on whole GPUs (MIG off)" for (kind, algo), j in seen.items()]


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

    if cfg.system.get("inventory") is not None:
        raise ConfigError(f"system.inventory={cfg.system.inventory!r} describes devices this machine may not have; "
                          f"only `pita plan` (or --plan) accepts it. Drop it to run on this machine's devices, or "
                          f"plan with: pita plan ... system.inventory={cfg.system.inventory}")
    if not cfg.get("resume_from") and run_dir is None and (found := requeued_driver_run(cfg)):
        # Slurm started this driver again (requeued, preempted, its time limit): it continues the
        # folder its first start made, with that run's saved config, taking over its jobs
        print(f"note: Slurm job {os.environ['SLURM_JOB_ID']} (this driver) was requeued (restart "
              f"{os.environ.get('SLURM_RESTART_COUNT')}): continuing {found}", file=sys.stderr)
        cfg.resume_from, overrides = str(found), []
    resume = cfg.get("resume_from")
    owner = rebuilt = None
    if resume:
        run, saved, cfg, changed, owner, rebuilt = _resume_config(cfg, overrides)
        if cfg.executor.backend == "ray":  # workers start in the run folder, maybe on another node
            absolute_paths(cfg)
    else:
        absolute_paths(cfg)
    validate_config(cfg, models=True)  # model folders and hub ids too: before any folder is made
    sy, ex = cfg.system, cfg.executor
    cpu_n = min(usable_cores(), 2) if sy.cpu_devices == "auto" else int(sy.cpu_devices)
    devices = sy.devices if isinstance(sy.devices, str) else list(sy.devices)
    ray_backend = None
    slurm_nodes = None
    if ex.backend == "ray":
        gpus, ray_backend = _ray_inventory(ex, 2 if sy.cpu_devices == "auto" else int(sy.cpu_devices))
    elif ex.backend == "slurm":  # the partition's devices, read with sinfo: exit 2 before anything is submitted
        from pita.core.backends.slurm import settings_from, slurm_inventory

        slurm_settings = settings_from(ex.slurm)  # the partition's MaxTime and largest node go in it
        gpus, slurm_nodes = slurm_inventory(slurm_settings, ex.slurm.gpu_card, cpu_n, cpu=devices == "cpu")
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
    elif ex.backend == "slurm":
        backend = make_backend("slurm", settings=slurm_settings, kill_grace_s=ex.kill_grace_s)
        backend.follow_nodes(slurm_nodes, gpus.devices)
        where = ex.slurm.partition or "the default partition"
        out = [n for n in slurm_nodes if not n["usable"]]
        packs = (f", attempts planned under {ex.slurm.pack_below_s:g}s in packs (executor.slurm.pack_below_s)"
                 if ex.slurm.pack_below_s > 0 else "")
        start_note = (f"workers: a Slurm job per attempt{packs} on {where} "
                      f"({', '.join(n['name'] + ' ' + str(n['gpus']) + ' GPU(s)' for n in slurm_nodes if n['usable'])})"
                      + (f"; out of service, not counted: {', '.join(n['name'] + ' ' + n['state'] for n in out)}"
                         if out else ""))
    else:
        backend = ray_backend if ex.backend == "ray" else make_backend(ex.backend)
        start_note = f"workers: {ex.backend} backend"
    durations = None
    if cfg.experiment.workload != "synthetic":  # what finished jobs teach later plans and runs
        from pita.core.gpu_manager import known_card
        from pita.plans.durations import DurationLearner

        # learn_durations=false: every attempt still records its seconds (--calibrate reads them);
        # on GPUs, the store of this card's own measurements
        durations = (DurationLearner.load(sy.cache_dir, cfg.model.name, not gpus.is_cpu,
                                          None if gpus.is_cpu else known_card([d.name for d in gpus.devices]))
                     if ex.learn_durations else DurationLearner(apply=False))
    try:
        from pita.core.gpu_manager import plan_card

        planned = build_plan(cfg, totals, cuda=not gpus.is_cpu, durations=durations,
                             card=plan_card([d.name for d in gpus.devices])[0] if not gpus.is_cpu else None)
        if len(planned) > ex.max_jobs:
            raise ConfigError(f"the plan has {len(planned)} jobs, more than executor.max_jobs={ex.max_jobs}: plan fewer "
                              f"rounds, algorithms or datasets, or raise executor.max_jobs")
        from pita.plans.fit import fit_problems

        if fit := fit_problems(planned, totals, ex.memory_margin, cpu=gpus.is_cpu):
            raise ConfigError(fit)
        from pita.plans.fit import node_problems

        if nodes := node_problems(planned, gpus.devices):  # k-device jobs get k GPUs of one node
            raise ConfigError(nodes)
        host_bytes = None
        if not gpus.is_cpu:  # on CPU devices the device memory is the host's
            from pita.plans.host import host_problems, host_ram_bytes

            host_bytes = host_ram_bytes(cfg)
            if host := host_problems(planned, host_bytes):
                raise ConfigError(host)
        if mig := mig_problems(planned, gpus):
            raise ConfigError(mig)
        graph = JobGraph(planned).validate(totals, ex.memory_margin)
        if ex.backend == "slurm":  # every kind's request tried with sbatch --test-only: exit 2 before any sbatch
            from pita.core.backends.slurm import submission_problems
            from pita.plans.fit import job_label

            problems, notes = submission_problems(backend, graph.jobs, slurm_nodes, not gpus.is_cpu, job_label)
            if problems:
                raise ConfigError(problems)
            backend.notes = notes

        if resume and rebuilt == "fresh":  # nothing recorded, nothing computed: nothing to compare
            differs = []
        elif resume:
            saved_jobs = StateStore(run.state).read()["jobs"]
            old_fp = {k: v.get("fingerprint") for k, v in saved_jobs.items()}
            new_fp = graph.fingerprints()
            if rebuilt:  # only jobs that started left their fingerprint (launch.json)
                old_fp = {k: v for k, v in old_fp.items() if v is not None}
                differs = sorted(j for j in old_fp if old_fp[j] != new_fp.get(j))
            else:
                differs = sorted(j for j in set(old_fp) | set(new_fp) if old_fp.get(j) != new_fp.get(j))
            if differs and not cfg.resume_force:
                raise ResumeError(_graph_change(run, differs, changed))
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
            OWNED.append(owner)
            try:
                owner.acquire()
            except OSError as e:
                _remove_new_run(run, owner)
                raise ConfigError(f"cannot write to the new run folder {run.root} ({e.strerror}); "
                                  f"{_space_hint(sy, run.root, e)}") from e
        try:
            from pita.core.provenance import source_line

            atomic_write(run.config, f"# written by {source_line()}\n"
                         + (OmegaConf.to_yaml(cfg, resolve=True) if not resume else OmegaConf.to_yaml(cfg)))
        except OSError as e:
            if not resume:  # nothing ran and nothing is kept: the next try starts clean
                _remove_new_run(run, owner)
            raise ConfigError(f"cannot write {run.config} ({e.strerror}); {_space_hint(sy, run.root, e)}"
                              + ("" if not resume else "; the run folder is unchanged: resume it again then")) from e
        setup_logging(run.run_log)
        log.info("run folder: %s", run.root)
        mark_driver(run)
        from pita.models.families import family_build_note

        if note := family_build_note(graph.jobs):
            log.info("%s", note)
        if not sy.use_parallel_execution:
            log.info("system.use_parallel_execution=false: one job at a time on %s", gpus.devices[0].label)
        if resume:
            log.info("resuming %s%s%s", run.root, f" with changed keys: {', '.join(changed)}" if changed else "",
                     ": it stopped before it recorded its jobs, so it starts afresh" if rebuilt == "fresh" else "")
        settings = ExecutorSettings(
            oom_retries=ex.oom_retries, crash_retries=ex.crash_retries, job_timeout_s=ex.job_timeout_s,
            lost_retries=ex.lost_retries, device_wait_s=ex.device_wait_s, command=START_COMMAND[0],
            pending_report_s=ex.slurm.pending_report_s,
            kill_grace_s=ex.kill_grace_s, poll_interval_s=ex.poll_interval_s, memory_margin=ex.memory_margin,
            # Slurm gives each job whole GPUs (--gres): one pita job per device
            max_jobs_per_device=1 if not sy.use_parallel_execution or ex.backend == "slurm" else (
                ex.max_jobs_per_device if ex.max_jobs_per_device is not None else (1 if gpus.is_cpu else None)),
            max_cpu_jobs=1 if not sy.use_parallel_execution else (ex.max_cpu_jobs or usable_cores()),
            starvation_passes=ex.starvation_passes,
            gpu_summary_interval_s=sy.gpu_summary_interval_s, progress=ex.progress,
            progress_interval_s=ex.progress_interval_s,
            # every worker's threads: the cores shared out between the devices (a GPU job's CPU side,
            # tokenising, sampling, scoring, is threaded too and would otherwise take every core)
            threads_per_job=max(1, usable_cores() // len(gpus.devices)),
            max_running=None if sy.use_parallel_execution else 1, min_free_gb=sy.min_free_gb,
            learn_memory=ex.learn_memory, host_bytes=host_bytes, durations=durations)
        log.info("%s", start_note)
        for line in getattr(backend, "notes", []):  # what start-up found, said before the run folder was
            log.warning("%s", line)
        config_dict = OmegaConf.to_container(cfg, resolve=True)
        summary = Executor(graph, gpus, backend, run, settings, config_dict, owner=owner).run()
    except BaseException:
        backend.close()  # nothing ran, or the run is over: no worker left behind
        if owner is not None:
            owner.release()
        raise
    if summary.disk_full:
        owner.release()
        print_summary(summary, run, START_COMMAND[0])
        print(f"error: {summary.disk_full}", file=sys.stderr)
        return summary.exit_code
    from pita.report.results import table, write

    rows = write(run, algorithm_roster())
    if rows:
        print("\n" + table(rows))
        print(f"results: {run.results / 'results.csv'}")
    write_report(run, rows)
    owner.release()
    print_summary(summary, run, START_COMMAND[0])
    return summary.exit_code


DRIVER_MARK = "slurm-driver.json"  # the Slurm job this run's driver runs as (a requeued one finds it)


def mark_driver(run) -> None:
    """A driver that is itself a Slurm job records its job id in the run folder."""
    jid = os.environ.get("SLURM_JOB_ID")
    if not jid:
        return
    from pita.core.paths import atomic_write_json

    try:
        atomic_write_json(run.root / DRIVER_MARK, {"slurm_job": jid, "restart": int(os.environ.get("SLURM_RESTART_COUNT")
                                                                                     or 0)})
    except OSError as e:
        log.warning("could not record this driver's Slurm job in %s (%s): if Slurm requeues it, resume by hand with "
                    "resume_from=%s", run.root, e, run.root)


def requeued_driver_run(cfg) -> Path | None:
    """The run folder a requeued driver (same Slurm job id, a restart count above 0) made before."""
    jid, restart = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_RESTART_COUNT")
    if not jid or not restart or restart == "0":
        return None
    import json

    base = Path(str(cfg.system.output_dir)) / str(cfg.experiment.name)
    found = []
    for mark in base.glob(f"*/{DRIVER_MARK}"):
        try:
            if str(json.loads(mark.read_text()).get("slurm_job")) == jid:
                found.append(mark.parent)
        except (OSError, ValueError):
            continue
    return max(found, key=lambda p: p.stat().st_mtime).absolute() if found else None


def _graph_change(run, differs: list[str], changed: list[str]) -> str:
    """Why a resume is refused: the jobs that differ, and the keys that changed them, or, where no
    key changed, where else the difference comes from."""
    jobs = f"{len(differs)} job(s) differ, e.g. {', '.join(differs[:3])}"
    graph_keys = [k for k in changed if not k.startswith(EXECUTION_KEYS)]
    if changed:
        return (f"the overrides change the job graph of {run.root} ({jobs}); keys that differ from the saved "
                f"config: {', '.join(graph_keys or changed)}. Drop those overrides, or pass resume_force=true to "
                f"re-run the changed jobs and everything after them")
    return (f"the job graph of {run.root} differs from the one it ran ({jobs}), though no key differs from its "
            f"saved config: this pita or this machine plans it otherwise (another pita version, other devices, "
            f"another model in the cache). Resume it where it started, or pass resume_force=true to re-run the "
            f"changed jobs and everything after them")


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


def _ray_inventory(ex, cpu_slots: int):
    """Join (or start) Ray and start the backend's actors: one device per GPU of the cluster that
    is free (its memory read on its node; executor.ray.gpu_memory_gb, else this node's first GPU,
    else 80 GiB where a node has no NVML), or ``cpu_slots`` CPU devices per node on a cluster
    without GPUs."""
    from pita.core.backends.ray import RayBackend, connect
    from pita.core.gpu_manager import GPUManager

    rc = ex.ray
    owns = connect(rc.address, rc.num_gpus, rc.num_cpus)
    if rc.gpu_memory_gb:
        fallback = int(rc.gpu_memory_gb * 2**30)
    else:
        local = GPUManager.detect("auto", cpu_devices=1)
        fallback = local.devices[0].total_bytes if not local.is_cpu else int(80 * 2**30)
    backend = RayBackend(owns_ray=owns, kill_grace_s=ex.kill_grace_s, gpu_memory_bytes=fallback,
                         startup_timeout_s=rc.startup_timeout_s, cpu_slots=cpu_slots)
    return GPUManager(backend.devices(), source="ray"), backend


_DEFERRED: list[int] = []  # SIGINTs received while Hydra composed


def _defer_interrupts() -> object:
    """While Hydra composes, a Ctrl-C is noted rather than raised: raised inside OmegaConf's node
    construction, KeyboardInterrupt is re-raised as an AttributeError and the run would end
    with a traceback and exit 1. Returns the handler to restore (an ignored SIGINT stays ignored)."""
    import signal

    old = signal.getsignal(signal.SIGINT)
    if old is signal.SIG_IGN:
        return old
    _DEFERRED.clear()
    signal.signal(signal.SIGINT, lambda signum, frame: _DEFERRED.append(signum))
    return old


def _interrupt_now() -> None:
    """Composition is over: Ctrl-C raises again, and one that came meanwhile is raised now."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _DEFERRED:
        _DEFERRED.clear()
        raise KeyboardInterrupt


def _task(cfg: DictConfig):
    """Hydra's task function: one run, or one point of a sweep (``-m``; pita/sweep.py names its
    folder and skips the points after an interrupted one)."""
    from pita import sweep

    _interrupt_now()  # a Ctrl-C while Hydra composed: now, as a KeyboardInterrupt
    point = sweep.current()
    if point is not None and point.skip:
        return None
    _exit_codes.append(run_experiment(cfg, run_dir=point.folder if point is not None else None))
    return _exit_codes[-1]


def launcher_problem(env) -> str | None:
    """Started by a distributed launcher (torchrun, accelerate launch, deepspeed) as one of several
    ranks: every rank would be an orchestrator competing for one run folder. pita is started
    once and starts one process per device itself; a job gets several devices from the plan."""
    try:
        world = int(env.get("WORLD_SIZE") or 1)
    except ValueError:
        world = 1
    if world <= 1:
        return None
    rank = env.get("RANK", "?")
    return (f"started as rank {rank} of WORLD_SIZE={world} by a distributed launcher (torchrun or the like): "
            f"each rank would start its own orchestrator on the same run folder. Start pita once, e.g. "
            f"`python run_parallel.py ...`: it runs a worker per device itself, and a training job that needs "
            f"several GPUs gets them from algos.<DPO|GRPO|GRPO-HF>.devices=k (data-parallel ranks started for that "
            f"job alone)")


def start_command(prog: str, argv0: str | None = None) -> str:
    """The command that starts pita as this process was started, as typed where it was: ``pita
    run``, ``python -m pita run``, or ``python <the script as given>``; the interpreter by its
    full path when ``python`` on PATH is another one (a venv not activated)."""
    import shutil

    py = "python" if shutil.which("python") and os.path.realpath(shutil.which("python")) == \
        os.path.realpath(sys.executable) else sys.executable
    if prog == "python run_parallel.py":
        return f"{py} {argv0 or 'run_parallel.py'}"
    if prog == "pita run" and argv0 and os.path.basename(argv0) == "__main__.py":
        return f"{py} -m pita run"
    if prog == "pita run" and argv0 and os.path.basename(argv0) == "pita" and not shutil.which("pita"):
        return f"{argv0} run"  # the pita script, not on PATH: by its path
    return prog


START_COMMAND = ["pita run"]  # how this process was started: resume hints repeat it


def run_main(argv: list[str] | None = None, prog: str = "python run_parallel.py") -> int:
    """Start an experiment and return its exit code: ``python run_parallel.py ...``, ``pita run
    ...`` and ``python -m pita run ...`` all come here. ``-h`` / ``--help`` print our page
    (Hydra's own stays at ``--hydra-help``); ``--multirun`` / ``-m`` may stand anywhere; bad
    overrides exit 2 before Hydra composes anything."""
    import hydra

    from pita import sweep

    argv = list(sys.argv[1:] if argv is None else argv)
    START_COMMAND[0] = start_command(prog, sys.argv[0] if sys.argv else None)
    if any(a in ("-h", "--help") for a in argv):
        print(help_text(prog))
        return 0
    if "--plan" in argv:  # python run_parallel.py --plan ...: pita plan
        from pita.cli.plan import plan_main

        return plan_main(argv, prog=f"{prog} --plan")
    problem = launcher_problem(os.environ)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    old_handler = _defer_interrupts()  # checking the overrides composes the config too
    try:
        argv = normalize_argv(argv)
        check_cli_overrides(argv)
    except BaseException:
        import signal

        signal.signal(signal.SIGINT, old_handler)
        raise
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
        import signal

        signal.signal(signal.SIGINT, old_handler)
        if _DEFERRED:  # interrupted while composing, and Hydra stopped before the task (a bad config)
            _DEFERRED.clear()
            print("interrupted", file=sys.stderr)
            _exit_codes.append(130)
        sweep.close()  # a sweep cut short (Ctrl-C between points, an error) still gets its summary
    return max(_exit_codes[before:], default=0)

