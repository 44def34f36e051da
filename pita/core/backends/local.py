"""The local backend: one spawned worker process per job attempt.

Each worker is ``python -m pita.core.worker <job dir>/launch.json`` in a new session (its own
process group), with ``CUDA_VISIBLE_DEVICES`` set in its environment before the interpreter
starts, stdout and stderr going to the job's ``job.log``. Killing an attempt signals its whole
process group (TERM, then KILL after a grace period). A worker also dies with the orchestrator
(PR_SET_PDEATHSIG), so a killed orchestrator leaves no orphans holding GPU memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.paths import atomic_write_json
from pita.core.worker import EXIT_ERROR, EXIT_OK, EXIT_OOM


@dataclass
class _Proc:
    launch: Launch
    popen: subprocess.Popen
    log_file: object
    started: float
    forced_status: str | None = None
    forced_reason: str = ""
    term_sent: float | None = None


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
    if rc in (EXIT_ERROR, EXIT_OOM) and outcome.get("status") in ("error", "oom", "cancelled"):
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

    def __init__(self, python: str | None = None, kill_grace_s: float = 10.0):
        self.python = python or sys.executable
        self.kill_grace_s = kill_grace_s
        self.procs: dict[str, _Proc] = {}

    def start(self, launch: Launch) -> None:
        p = launch.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p.launch, launch.to_json(parent_pid=os.getpid()))
        try:
            p.attempt(launch.attempt).unlink()
        except FileNotFoundError:
            pass
        env = dict(os.environ)
        env.update(launch.env)
        env["PYTHONUNBUFFERED"] = "1"
        log = open(p.log, "ab", buffering=0)
        popen = subprocess.Popen([self.python, "-m", "pita.core.worker", str(p.launch)], stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True, close_fds=True)
        self.procs[launch.job_id] = _Proc(launch, popen, log, time.time())

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
            pass

    def kill(self, job_id: str, status: str = "cancelled", reason: str = "") -> None:
        proc = self.procs.get(job_id)
        if proc is None:
            return
        proc.forced_status, proc.forced_reason = status, reason
        self._killpg(proc, signal.SIGTERM)
        proc.term_sent = time.time()

    def _collect(self, job_id: str, proc: _Proc, rc: int) -> Finished:
        proc.log_file.close()
        return finished_from(proc.launch, rc, proc.started, proc.forced_status, proc.forced_reason)

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        deadline = time.time() + timeout
        while True:
            out = []
            now = time.time()
            for job_id, proc in list(self.procs.items()):
                rc = proc.popen.poll()
                if rc is None:
                    if proc.term_sent is not None and now - proc.term_sent > self.kill_grace_s:
                        self._killpg(proc, signal.SIGKILL)
                    continue
                # The worker is gone; make sure nothing it started lingers in its group.
                self._killpg(proc, signal.SIGKILL)
                del self.procs[job_id]
                out.append(self._collect(job_id, proc, rc))
            if out or time.time() >= deadline:
                return out
            time.sleep(min(0.05, max(0.0, deadline - time.time())))

    def shutdown(self, grace_s: float = 10.0) -> list[Finished]:
        for proc in self.procs.values():
            if proc.forced_status is None:
                proc.forced_status, proc.forced_reason = "cancelled", "run interrupted"
            self._killpg(proc, signal.SIGTERM)
        deadline = time.time() + grace_s
        while any(p.popen.poll() is None for p in self.procs.values()) and time.time() < deadline:
            time.sleep(0.05)
        for proc in self.procs.values():
            self._killpg(proc, signal.SIGKILL)
        finished = []
        for job_id, proc in list(self.procs.items()):
            rc = proc.popen.wait()
            finished.append(self._collect(job_id, proc, rc))
        self.procs.clear()
        return finished
