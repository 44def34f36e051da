"""Runs one job attempt: in a worker process (``python -m pita.core.worker launch.json``, or
:func:`forked_main` in a child of the local backend's fork server) or in-process (the inline
backend). All go through :func:`execute`.

The parent sets ``CUDA_VISIBLE_DEVICES`` in the environment before torch touches CUDA, so torch
only ever sees the job's own devices. The config arrives as a plain dict and is rebuilt
as an OmegaConf object here. The outcome of the attempt is written to ``attempt-<n>.json`` (with
the platform it computed on: CPU, kernel ISA, torch, BLAS, threads, GPUs); on
success ``result.json`` then the ``.done`` marker are written, the marker last.

Exit codes: 0 success, 1 the job raised, 3 out of memory (the parent may retry with a smaller
batch). Any other code or a signal means the worker died.

A worker is a child subreaper and ends every process still below it when the job returns or
when it gets SIGTERM (:mod:`pita.core.proctree`): nothing a job starts outlives it, even in a
session of its own. ``result.json`` stores paths inside the run folder relative to it.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_OOM, EXIT_NOSPACE, EXIT_REQUEUE = 0, 1, 3, 4, 5


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory, whatever torch version raised it, in the worker or in one of its ranks."""
    from pita.core.errors import DeviceOutOfMemory

    if isinstance(exc, DeviceOutOfMemory):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    msg = str(exc)
    if not isinstance(exc, RuntimeError):  # DistBackendError is a RuntimeError too
        return False
    if "CUDA out of memory" in msg or "CUDA error: out of memory" in msg:
        return True
    # NCCL allocating its buffers on a full device (a collective of a sharded job): torch raises
    # DistBackendError with NCCL's own words, "... Failed to CUDA calloc ..." / "out of memory"
    dist_backend = getattr(getattr(torch, "distributed", None), "DistBackendError", None) if torch else None
    nccl = (dist_backend is not None and isinstance(exc, dist_backend)) or "NCCL" in msg
    return nccl and _says_out_of_memory(msg)


def _says_out_of_memory(text: str) -> bool:
    low = text.lower()
    return "out of memory" in low or "cuda calloc" in low or "cudamalloc" in low


def nccl_watchdog_oom(output: str) -> str | None:
    """The line of a rank's output that says NCCL ran out of device memory in torch's watchdog
    thread, or None. An NCCL error raised there never reaches Python: the watchdog logs it and
    terminates the process (SIGABRT), so the rank leaves no out-of-memory marker and the job
    would fail as a plain crash instead of being retried at half the micro-batch."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        low = line.lower()
        if "watchdog" in low or "c10::distbackenderror" in low:
            # the error's own lines follow its first one (NCCL's "Last error: ... 'out of memory'")
            if _says_out_of_memory("\n".join(lines[i:i + 8])):
                return line.strip()
    return None


def _peak_memory(declared: int | None = None) -> dict:
    """The attempt's peaks: resident set (the worker's, and its largest finished child's), torch's
    allocated and reserved GPU memory (the most on any of its devices), and what the job declared
    (``ctx.report_peak``). pita.core.memlearn turns them into the unit of the device's capacity."""
    out = {}
    try:
        import resource

        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if children:
            out["peak_rss_children_bytes"] = children
    except Exception:  # not on every platform
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = range(torch.cuda.device_count())
        out["peak_gpu_bytes"] = int(max(torch.cuda.max_memory_allocated(i) for i in devices))
        out["peak_gpu_reserved_bytes"] = int(max(torch.cuda.max_memory_reserved(i) for i in devices))
    if declared is not None:
        out["peak_declared_bytes"] = int(declared)
    return out


def execute(launch: dict, logger: logging.Logger) -> dict:
    """Run the job described by ``launch``; return the attempt's outcome (never raises)."""
    from omegaconf import OmegaConf

    from pita.core.context import JobContext
    from pita.core.job import Job, resolve_target
    from pita.core.paths import RunPaths, atomic_write, atomic_write_json

    job = Job.from_dict(launch["job"])
    run = RunPaths(launch["run_dir"])
    paths = run.job(job.id)
    attempt = launch["attempt"]
    t0 = time.time()
    ctx = None
    try:
        fn = resolve_target(launch["target"])
        cfg = OmegaConf.create(launch.get("config") or {})
        ctx = JobContext(job, attempt, paths, run, cfg, launch.get("devices", []), logger)
        # the parameters are in launch.json beside this log (a line of them here would be a
        # kilobyte of JSON in run.log for every job)
        logger.info("attempt %d of %s (%s) on %s", attempt, job.id, job.kind,
                    ", ".join(d.get("label", "?") for d in ctx.devices) or "host")
        from pita.core.devinfo import describe_process

        logger.info("%s", describe_process(OmegaConf.select(cfg, "system.attn_impl") if job.resources.devices else None,
                                           ctx.devices))
        _report_torch_memory(paths.torch_memory)
        result = fn(ctx)
        if result is None:
            result = {}
        if not isinstance(result, dict):
            raise TypeError(f"job kind {job.kind!r} returned {type(result).__name__}; it must return a dict or None")
        atomic_write_json(paths.result, run.to_relative(result))
        paths.write_done(attempt)
        outcome = {"status": "ok"}
    except BaseException as e:  # the job's failure is data for the parent, not a crash of the worker
        from pita.core.preempt import Requeue

        if isinstance(e, Requeue):  # saved on a signal: run again from the save
            logger.warning("job %s stops to run again: %s", job.id, e)
            outcome = {"status": "requeue", "error": str(e)}
            outcome.update(attempt=attempt, duration_s=time.time() - t0,
                           **_peak_memory(getattr(ctx, "declared_peak_bytes", None)), platform=_platform())
            return outcome
        tb = traceback.format_exc()
        logger.error("job %s failed:\n%s", job.id, tb.rstrip())
        if is_oom(e):
            outcome = {"status": "oom", "error": f"{type(e).__name__}: {e}"}
        elif isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            outcome = {"status": "nospace", "error": f"{type(e).__name__}: {e}"}
        else:
            outcome = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": tb[-4000:]}
        if isinstance(e, KeyboardInterrupt):
            outcome["status"] = "cancelled"
    outcome.update(attempt=attempt, duration_s=time.time() - t0,
                   **_peak_memory(getattr(ctx, "declared_peak_bytes", None)), platform=_platform())
    return outcome


_MEMORY_REPORT: dict = {}  # the file the reporter thread writes (one thread per process)


def _report_torch_memory(path: Path, every_s: float = 5.0) -> None:
    """While the job runs, write what its torch holds on its GPUs (allocated and reserved bytes,
    summed over its devices) every few seconds, for run.log's device lines; nothing on CPU."""
    import threading

    started = "path" in _MEMORY_REPORT
    _MEMORY_REPORT["path"] = path
    if started:
        return

    def loop():
        from pita.core.paths import atomic_write_json

        while True:
            time.sleep(every_s)
            torch = sys.modules.get("torch")
            path = _MEMORY_REPORT.get("path")
            try:
                if path is None or torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
                    continue
                n = torch.cuda.device_count()
                atomic_write_json(path, {"allocated": sum(torch.cuda.memory_allocated(i) for i in range(n)),
                                         "reserved": sum(torch.cuda.memory_reserved(i) for i in range(n)),
                                         "time": time.time()})
            except Exception:  # noqa: BLE001 - a progress figure, never a reason to fail the job
                continue

    threading.Thread(target=loop, name="pita-torch-memory", daemon=True).start()


def _platform() -> dict:
    """What the attempt's numbers depend on besides config and seed (pita.core.provenance)."""
    try:
        from pita.core.provenance import describe

        return describe()
    except Exception as e:  # noqa: BLE001 - a record, never a reason to fail the attempt
        return {"error": f"{type(e).__name__}: {e}"}


def _process_started() -> float:
    """When this process started (the kernel's clock for it), before any import."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - a record
        return time.time()


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this worker when the orchestrator dies (even by SIGKILL): no orphans."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(EXIT_ERROR)


def main(argv: list[str] | None = None, parent_pid: int | None = None) -> int:
    from pita.core import preempt

    if preempt.enabled():  # a Slurm attempt: its warning signal is held before anything else happens
        preempt.hold()
    argv = sys.argv[1:] if argv is None else argv
    launch_path = Path(argv[0])
    launch = json.loads(launch_path.read_text())
    # PITA_PARENT_PID: a parent other than the orchestrator (the ray backend's runner, the fork server)
    parent = parent_pid or os.environ.get("PITA_PARENT_PID") or launch.get("parent_pid")
    if parent:
        _die_with_parent(int(parent))
    _own_descendants()
    from pita.core.paths import JobPaths

    try:  # Slurm may run an attempt again (requeued on preemption): its earlier outcome is not this one's
        JobPaths(launch_path.parent).attempt(launch["attempt"]).unlink()
    except OSError:
        pass
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger = logging.getLogger("pita.job")
    outcome = execute(launch, logger)
    # the process's own span (a queued backend learns run time from it, not from the wait in its queue)
    outcome.update(process_started=_process_started(), process_ended=time.time())
    from pita.core.paths import JobPaths, atomic_write_json

    from pita.core.proctree import end_descendants

    left = end_descendants()
    if left:
        print(f"pita worker: ended {left} process(es) the job left running", flush=True)
    try:
        atomic_write_json(JobPaths(launch_path.parent).attempt(launch["attempt"]), outcome)
    except OSError as e:
        print(f"pita worker: cannot write the attempt's outcome: {e}", flush=True)
        return EXIT_NOSPACE if e.errno in (errno.ENOSPC, errno.EDQUOT) else EXIT_ERROR
    sys.stdout.flush()
    return {"ok": EXIT_OK, "oom": EXIT_OOM, "requeue": EXIT_REQUEUE}.get(outcome["status"], EXIT_ERROR)


def _own_descendants() -> None:
    """Keep every process the job starts below this one (subreaper), and on SIGTERM end them all
    before dying of it, so a timeout or Ctrl-C leaves nothing behind (even in another session)."""
    from pita.core.proctree import become_subreaper, end_descendants

    become_subreaper()

    def on_term(signum, frame):
        end_descendants()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    from pita.core import preempt

    if preempt.enabled():  # a Slurm attempt: USR1 and TERM ask a training job to save first
        preempt.install(on_term)
    else:
        signal.signal(signal.SIGTERM, on_term)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # a pack's child gets it blocked


def _cuda_unsafe_after_fork() -> bool:
    """True if this process was forked from one that initialised CUDA: torch cannot use CUDA here."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork())
    except Exception:  # noqa: BLE001 - an unknown torch: do not risk it
        return True


def _set_title(title: str) -> None:
    """Name the process as ``ps`` shows it (a forked worker otherwise shows the fork server's command)."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except Exception:  # noqa: BLE001 - cosmetic
        pass


def forked_entry(launch_path: str, env: dict, cwd: str, log_path: str) -> None:
    """The fork server's target: run the attempt, then leave with its exit code (multiprocessing
    would report 0 for whatever a target returns) without tearing the interpreter down."""
    code = EXIT_ERROR
    try:
        code = forked_main(launch_path, env, cwd, log_path)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else EXIT_ERROR
    except BaseException:  # noqa: BLE001 - a bug in the worker itself: on the job's log
        traceback.print_exc()
    exit_now(code)


def _release_fork_server() -> None:
    """Close this worker's copy of the fork server's liveness pipe (the library hands every child
    one): while any copy is open, the server cannot see that the orchestrator died, so a
    SIGKILLed orchestrator would leave the server and its workers running."""
    try:
        from multiprocessing import forkserver

        fd = forkserver._forkserver._forkserver_alive_fd
        if fd is not None:
            forkserver._forkserver._forkserver_alive_fd = None
            os.close(fd)
    except (ImportError, AttributeError, OSError):
        pass


START = "exec"  # how this worker started: "forked" once forked_main ran (the synthetic env job reports it)


def forked_main(launch_path: str, env: dict, cwd: str, log_path: str) -> int:
    """An attempt forked by the local backend's fork server (``executor.worker_start=forkserver``).

    Becomes what ``python -m pita.core.worker`` is: its own session (the backend signals the
    group), stdout and stderr on the job's log, the orchestrator's environment with the job's
    devices, the orchestrator's working directory, and death with its parent (the server). A job
    that uses CUDA devices, in a child of a process that touched CUDA (or with
    ``PITA_FRESH_INTERPRETER=1``), replaces itself with a fresh interpreter instead: same process,
    log and session.
    """
    global START
    START = "forked"
    _release_fork_server()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked in the server (local._interrupts_held)
    parent = os.getppid()
    os.setsid()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=True)
        except (AttributeError, ValueError):
            pass
    cmd = [sys.executable, "-m", "pita.core.worker", launch_path]
    _set_title(" ".join(cmd))  # before the environment changes: setproctitle finds its space there
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    uses_cuda = bool(env.get("CUDA_VISIBLE_DEVICES", "").strip())
    if env.get("PITA_FRESH_INTERPRETER") == "1" or (uses_cuda and _cuda_unsafe_after_fork()):
        os.execve(sys.executable, cmd, dict(env, PITA_PARENT_PID=str(parent)))
    threads = env.get("OMP_NUM_THREADS")
    torch = sys.modules.get("torch")
    if threads and threads.isdigit() and torch is not None:
        torch.set_num_threads(int(threads))  # OpenMP read its variables when the fork server imported torch
    return main([launch_path], parent_pid=parent)


def exit_now(code: int) -> None:
    """Leave the worker without tearing the interpreter down: with torch and transformers loaded
    that takes 1-2 s, and the attempt's outcome is on disk already. Exit handlers still run."""
    try:
        atexit._run_exitfuncs()  # logging's flush and whatever the libraries registered
    except BaseException:  # noqa: BLE001 - leaving anyway
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
