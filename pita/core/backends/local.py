"""The local backend: one worker process per job attempt.

Each worker runs in a new session (its own process group), with ``CUDA_VISIBLE_DEVICES`` set in
its environment before torch touches CUDA, stdout and stderr going to the job's ``job.log``.
Killing an attempt signals its whole process group: TERM once, then KILL after the grace period
even if the worker ignores TERM or is stopped. Processes that left the group (``setsid``) are
tracked too (:mod:`pita.core.proctree`) and killed when the attempt ends. A worker also dies with
its parent (PR_SET_PDEATHSIG), so a killed orchestrator leaves no orphans holding GPU memory.

How a worker starts (``executor.worker_start``):

    forkserver  forked by the standard library's fork server (``multiprocessing``'s forkserver
                context), which imported torch, transformers, datasets and TRL once
                (:mod:`pita.core.preload`): an attempt starts in milliseconds instead of
                seconds. The server never touches CUDA; a worker forked from a process that did
                re-executes itself as below. If the orchestrator dies, the server exits and its
                workers die with it.
    exec        ``python -m pita.core.worker <job dir>/launch.json``: a fresh interpreter each time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.paths import atomic_write_json
from pita.core.proctree import ProcessTree, record_all
from pita.core.worker import EXIT_ERROR, EXIT_NOSPACE, EXIT_OK, EXIT_OOM, EXIT_REQUEUE


WORKER_STARTS = ("forkserver", "exec")
WORKER_START_SETTINGS = ("auto", *WORKER_STARTS)  # what executor.worker_start accepts
HEAVY_PRELOAD = ("pita.core.preload",)  # what jobs that load models import; synthetic jobs need nothing


def resolve_worker_start(setting: str, cpu_only: bool) -> str:
    """``executor.worker_start``: auto forks on CPU devices, where a 4-6 s start-up is most of a
    short job, and starts fresh interpreters on GPUs, where jobs run for minutes and a fresh
    process is the better-trodden path for CUDA."""
    if setting == "auto":
        return "forkserver" if cpu_only else "exec"
    return setting


def describe_worker_start(start: str) -> str:
    """How workers start, in words, for the run log and the setup check."""
    return "forked from a warm process" if start == "forkserver" else "a fresh interpreter per attempt"


# What every worker imports before its job, whatever the job: once in the fork server, not once
# per attempt (the heavy model stack comes on top: HEAVY_PRELOAD).
ALWAYS_PRELOAD = ("omegaconf", "psutil", "pita.core.context", "pita.core.job", "pita.core.paths",
                  "pita.core.proctree", "pita.core.synthetic_kinds", "pita.core.worker")


def fork_server(preload: list[str] | tuple[str, ...] = ()):
    """The standard library's fork server (``multiprocessing``'s forkserver context), started now
    so that its imports run while the run is being planned. One per orchestrator process: it
    imports what the first backend asks for, and is started again if it died. It exits when the
    orchestrator does; each worker closes its copy of the server's liveness pipe
    (:func:`pita.core.worker.forked_main`), so a SIGKILLed orchestrator still takes the server,
    and through ``PR_SET_PDEATHSIG`` every worker, with it."""
    import multiprocessing
    from multiprocessing import forkserver, resource_tracker

    ctx = multiprocessing.get_context("forkserver")
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:  # not started yet in this process
        ctx.set_forkserver_preload([*ALWAYS_PRELOAD, *preload])
    resource_tracker.ensure_running()  # first: starting it unblocks SIGINT, which _interrupts_held blocks
    with _without_main_script(), _interrupts_held():
        forkserver.ensure_running()
    if not _STOP_AT_EXIT:
        import atexit

        atexit.register(_stop_fork_server)
        _STOP_AT_EXIT.append(True)
    return ctx


_STOP_AT_EXIT: list = []


def _stop_fork_server() -> None:
    """At the orchestrator's exit the server goes too, at once. It would notice the closed pipe
    only once its imports are done (torch and TRL: seconds), holding the terminal's output open
    until then: a command that stopped on a bad key in a second kept a pipeline (``pita run ...
    | tee``) waiting for six. Every worker has ended by then (the backend was closed)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _without_main_script():
    """The library makes every child re-import the script that started this process (as
    ``__mp_main__``): a second copy of the orchestrator's imports in each worker, and a second
    run of any user script that calls pita without an ``if __name__ == "__main__"`` guard. A
    worker is a job, not a copy of that script: while a worker is being started, ``__main__``
    is an empty module, so there is nothing to re-import."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


@contextlib.contextmanager
def _interrupts_held():
    """The server is started with SIGINT blocked, and keeps it blocked through its imports: the
    library ignores SIGINT only once they are done, and a Ctrl-C to the process group in the
    seconds before printed a KeyboardInterrupt traceback from the server's import of torch. A
    SIGINT that reaches this process meanwhile is held, not lost: it is delivered when the block
    is lifted. Each worker lifts the block it inherits (:func:`pita.core.worker.forked_main`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _server_gone_within(timeout: float) -> bool:
    """Whether the fork server is dead, or dies within ``timeout`` seconds (a dead one is this
    process's zombie until the library starts the next; it must not be reaped here)."""
    import psutil
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    deadline = time.time() + timeout
    while True:
        try:
            if pid is None or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:  # gone (reaped), or unknowable: treat as gone
            return True
        if time.time() >= deadline:
            return False
        time.sleep(0.01)


class _Forked:
    """A worker forked by the fork server, seen through the part of Popen's API used here."""

    def __init__(self, ctx, launch: str, env: dict, cwd: str, log: str):
        from pita.core.worker import forked_entry

        self.process = ctx.Process(target=forked_entry, args=(launch, env, cwd, log), name="pita-worker")
        with _without_main_script():
            self.process.start()
        self.pid = self.process.pid
        self.sentinel = self.process.sentinel
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.process.exitcode is not None:
            rc = self.process.exitcode
            # the server reports each worker's exit status; if the server itself died first, the
            # status never comes (the library says 255) and the worker died of PR_SET_PDEATHSIG.
            # The status pipe closes a moment before the dying server turns zombie: wait for that.
            if rc == 255 and _server_gone_within(2.0):
                rc = -signal.SIGKILL
            self.returncode = rc
            self.process.close()  # its status pipe: a long run starts thousands of workers
        return self.returncode

    def wait(self) -> int | None:
        while self.poll() is None:
            multiprocessing_wait([self.sentinel], 0.05)
        return self.returncode


def multiprocessing_wait(sentinels: list, timeout: float) -> list:
    from multiprocessing.connection import wait

    return wait(sentinels, timeout)


@dataclass
class _Proc:
    launch: Launch
    popen: subprocess.Popen | _Forked
    log_file: object
    started: float
    forced_status: str | None = None
    forced_reason: str = ""
    term_sent: float | None = None
    grace_s: float | None = None
    kill_sent: bool = False
    tree: ProcessTree | None = None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def finished_from(launch: Launch, rc: int | None, started: float, forced_status: str | None = None,
                  forced_reason: str = "", extra: dict | None = None) -> Finished:
    """How a worker ended, from its exit code and the outcome it wrote (attempt-N.json).
    Shared by the backends that run ``python -m pita.core.worker``."""
    job_id = launch.job_id
    outcome = {}
    path = launch.paths.attempt(launch.attempt)
    if path.exists():
        try:
            outcome = json.loads(path.read_text())
        except json.JSONDecodeError:
            outcome = {}
    more = {k: v for k, v in outcome.items() if k not in ("status", "error", "traceback")}
    more.update(extra or {})
    more.setdefault("duration_s", time.time() - started)
    if forced_status:
        return Finished(job_id, launch.attempt, forced_status, rc, forced_reason, extra=more)
    if rc == EXIT_OK and outcome.get("status") == "ok":
        return Finished(job_id, launch.attempt, "ok", rc, extra=more)
    if rc == EXIT_NOSPACE:
        return Finished(job_id, launch.attempt, "nospace", rc, "No space left on device (the worker could not "
                        "write its outcome)", extra=more)
    if rc == EXIT_REQUEUE and outcome.get("status") == "requeue":
        return Finished(job_id, launch.attempt, "requeue", rc, outcome.get("error", ""), extra=more)
    if rc in (EXIT_ERROR, EXIT_OOM) and outcome.get("status") in ("error", "oom", "cancelled", "nospace"):
        return Finished(job_id, launch.attempt, outcome["status"], rc, outcome.get("error", ""),
                        outcome.get("traceback", ""), more)
    if rc is None:
        why = "the worker is gone without an exit code"
    elif rc < 0:
        why = f"worker killed by {_signal_name(rc)}"
    else:
        why = f"worker exited with code {rc} without reporting a result"
    return Finished(job_id, launch.attempt, "died", rc, why, extra=more)


class LocalBackend(Backend):
    name = "local"

    def __init__(self, python: str | None = None, kill_grace_s: float = 10.0, worker_start: str = "exec",
                 preload: tuple[str, ...] | list[str] = ()):
        if worker_start not in WORKER_STARTS:
            from pita.core.errors import ConfigError
            from pita.core.names import unknown_name

            raise ConfigError(unknown_name("executor.worker_start", worker_start, WORKER_STARTS))
        self.python = python or sys.executable
        self.kill_grace_s = kill_grace_s
        # another interpreter than this one can only be exec'd
        self.worker_start = worker_start if self.python == sys.executable else "exec"
        self.procs: dict[str, _Proc] = {}
        self._last_tree = 0.0
        self.preload = list(preload)
        self.ctx = fork_server(self.preload) if self.worker_start == "forkserver" else None

    def start(self, launch: Launch) -> None:
        p = launch.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p.launch, launch.to_json(parent_pid=os.getpid()))
        try:
            p.attempt(launch.attempt).unlink()
        except FileNotFoundError:
            pass
        env = dict(os.environ)
        env.pop("PITA_PARENT_PID", None)  # the worker's parent is this process (or the fork server)
        env.update(launch.env)
        env["PYTHONUNBUFFERED"] = "1"
        if self.worker_start == "forkserver":
            worker = _Forked(self.ctx, str(p.launch), env, os.getcwd(), str(p.log))
            self.procs[launch.job_id] = _Proc(launch, worker, None, time.time(), tree=ProcessTree(worker.pid))
            return
        log = open(p.log, "ab", buffering=0)
        popen = subprocess.Popen([self.python, "-m", "pita.core.worker", str(p.launch)], stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True, close_fds=True)
        self.procs[launch.job_id] = _Proc(launch, popen, log, time.time(), tree=ProcessTree(popen.pid))

    def running(self) -> list[str]:
        return list(self.procs)

    def pids(self, job_id: str) -> set[int]:
        proc = self.procs.get(job_id)
        if proc is None:
            return set()
        try:
            import psutil

            ps = psutil.Process(proc.popen.pid)
            return {proc.popen.pid} | {c.pid for c in ps.children(recursive=True)}
        except Exception:  # the process may be gone already
            return {proc.popen.pid}

    def _killpg(self, proc: _Proc, sig: int) -> None:
        try:
            os.killpg(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:  # a just-forked worker may not lead its own group yet
                if proc.popen.poll() is None:
                    os.kill(proc.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self, job_id: str, status: str = "cancelled", reason: str = "", grace_s: float | None = None) -> None:
        """TERM once; :meth:`poll` KILLs the attempt's processes ``grace_s`` later (a worker that
        ignores TERM, or is stopped, still ends). Calling it again changes nothing."""
        proc = self.procs.get(job_id)
        if proc is None or proc.term_sent is not None:
            return
        proc.forced_status, proc.forced_reason = status, reason
        proc.grace_s = grace_s
        self._killpg(proc, signal.SIGTERM)
        proc.term_sent = time.time()

    def _kill_all(self, proc: _Proc) -> None:
        """KILL the attempt's group and every process recorded in its tree (those that left it)."""
        self._killpg(proc, signal.SIGKILL)
        if proc.tree is not None:
            proc.tree.kill_survivors()

    def _collect(self, job_id: str, proc: _Proc, rc: int) -> Finished:
        if proc.log_file is not None:
            proc.log_file.close()
        return finished_from(proc.launch, rc, proc.started, proc.forced_status, proc.forced_reason)

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        deadline = time.time() + timeout
        while True:
            out = []
            now = time.time()
            if now - self._last_tree >= 1.0:  # who the running attempts started, once a second
                self._last_tree = now
                record_all([p.tree for p in self.procs.values() if p.tree is not None])
            for job_id, proc in list(self.procs.items()):
                rc = proc.popen.poll()
                if rc is None:
                    grace = proc.grace_s if proc.grace_s is not None else self.kill_grace_s
                    if proc.term_sent is not None and not proc.kill_sent and now - proc.term_sent > grace:
                        proc.kill_sent = True
                        proc.forced_reason += f"; still running {grace:g}s after SIGTERM, so killed (SIGKILL)"
                        self._kill_all(proc)
                    continue
                # The worker is gone; make sure nothing it started lingers, in its group or not.
                self._kill_all(proc)
                del self.procs[job_id]
                out.append(self._collect(job_id, proc, rc))
            if out or time.time() >= deadline:
                return out
            self._wait(min(0.05, max(0.0, deadline - time.time())))

    def _wait(self, timeout: float) -> None:
        """Sleep until a forked worker may have ended (its sentinel is readable), at most
        ``timeout``: a finished job is noticed at once, not at the next poll tick."""
        sentinels = [p.popen.sentinel for p in self.procs.values()
                     if isinstance(p.popen, _Forked) and p.popen.returncode is None]
        if sentinels:
            multiprocessing_wait(sentinels, timeout)
        else:
            time.sleep(timeout)

    def shutdown(self, grace_s: float = 10.0) -> list[Finished]:
        for proc in self.procs.values():
            if proc.forced_status is None:
                proc.forced_status, proc.forced_reason = "cancelled", "run interrupted"
            self._killpg(proc, signal.SIGTERM)
        deadline = time.time() + grace_s
        while any(p.popen.poll() is None for p in self.procs.values()) and time.time() < deadline:
            time.sleep(0.05)
        for proc in self.procs.values():
            self._kill_all(proc)
        finished = []
        for job_id, proc in list(self.procs.items()):
            rc = proc.popen.wait()
            finished.append(self._collect(job_id, proc, rc))
        self.procs.clear()
        self.close()
        return finished

    def close(self) -> None:
        """No worker outlives the backend: those still running are killed (the fork server
        itself stays for the next run of this process, and exits with it)."""
        for proc in self.procs.values():
            self._kill_all(proc)
