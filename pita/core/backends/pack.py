"""A pack: one Slurm allocation that runs several short attempts, one after another, each forked
from an interpreter that imported torch, transformers and the job kinds once.

A fresh interpreter spends several seconds importing those (most of a short job), and each
Slurm job waits for the scheduler; the Slurm backend (``executor.slurm.pack_below_s``) hands
attempts planned shorter than that to packs instead of submitting each as its own job. The
driver and a pack talk through files in the pack's folder on the shared file system
(``<run>/slurm-packs/<name>/``), never through Slurm:

    started         the pack is up (written once, after its imports): {pid, host, slurm_job, time}
    task.json       driver -> pack: the one attempt to run next {job_id, attempt, launch, log, env}
    running.json    task.json, renamed by the pack as it takes it (the driver knows it started)
    done-<job>-<attempt>.json
                    pack -> driver: the attempt's exit code and span (its outcome file is the
                    worker's own, next to its launch file, as for any attempt)
    kill.json       driver -> pack: end the running attempt (TERM to its process group, KILL
                    after {grace_s})
    stop            driver -> pack: take nothing more and leave once the running attempt ends
    closed          the pack takes nothing more (it is leaving): a task.json it did not take
                    goes back to the driver, which hands it to another pack

The pack leaves when it has been idle ``idle_s``, when told to stop, and after USR1 (its time
limit is near: ``--signal=B:USR1@<margin>``) or TERM (preemption, scancel), which it forwards
to the running attempt first: a training job saves and asks to run again, as it does in a Slurm
job of its own. Each attempt runs in a session of its own (the worker's ``forked_main``), dies
with the pack (PR_SET_PDEATHSIG), and writes its log and outcome where an unpacked attempt does.

The pack never installs a signal handler: USR1, TERM and INT are blocked from its first line and
taken by its loop (``sigtimedwait``), so none arrives in the middle of a hand-over, and the
attempt it forks starts with them blocked, pending until its worker is ready for them
(:mod:`pita.core.preempt`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

LOOK_S = 0.1  # how often the pack looks for a task, a kill or a child that ended
HELD = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}  # taken by the pack's loop, never by a handler


def done_name(job_id: str, attempt: int) -> str:
    return f"done-{job_id}-{attempt}.json"


class Pack:
    def __init__(self, folder: Path, idle_s: float):
        self.dir, self.idle_s = Path(folder), float(idle_s)
        self.child: int | None = None  # pid (and process group) of the running attempt
        self.task: dict | None = None
        self.draining = ""  # why the pack takes nothing more
        self.term_at: float | None = None  # when the running attempt was sent TERM by a kill.json
        self.kill_grace = 10.0

    # ------------------------------------------------------------------ signals
    def _forward(self, signum: int) -> None:
        """USR1 (the pack's limit is near) or TERM/INT (preempted, cancelled): the running attempt
        hears it as in a Slurm job of its own, and the pack takes nothing more. USR1 goes to the
        attempt's worker alone, as ``--signal=B:`` sends it to a batch script alone; TERM goes to its
        whole session, as Slurm's TERM reaches every process of a job."""
        name = signal.Signals(signum).name
        self.draining = self.draining or f"{name} received"
        if self.child is not None:
            if signum == signal.SIGUSR1:
                try:
                    os.kill(self.child, signum)
                except ProcessLookupError:
                    pass
            else:
                self._signal_child(signum)
        print(f"pita pack: {name} received: {'forwarded to ' + self.task['job_id'] if self.task else 'idle'}"
              f"; taking nothing more", flush=True)

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, acting on any signal that came (they are blocked in the pack:
        :func:`main`), so none is ever acted on by default or in the middle of a hand-over."""
        got = signal.sigtimedwait(HELD, seconds)
        while got is not None:
            self._forward(got.si_signo)
            got = signal.sigtimedwait(HELD, 0)

    def _signal_child(self, signum: int) -> None:
        try:
            os.killpg(self.child, signum)  # the attempt's session (forked_main: setsid)
        except (ProcessLookupError, PermissionError):
            try:  # not in its own session yet
                os.kill(self.child, signum)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ one attempt
    def _take(self) -> bool:
        src = self.dir / "task.json"
        try:
            os.rename(src, self.dir / "running.json")
        except FileNotFoundError:
            return False
        task = json.loads((self.dir / "running.json").read_text())
        env = dict(os.environ)
        env.pop("PITA_PACK", None)
        env.update(task.get("env") or {})
        self.task, self.started = task, time.time()
        pid = os.fork()
        if pid == 0:  # the attempt: the worker's own entry, as the local backend's fork server runs it
            # it starts with USR1, TERM and INT blocked (the pack's mask): one sent before the worker
            # is ready waits, pending, for the worker's own handling (preempt.install unblocks them)
            from pita.core.worker import forked_entry

            forked_entry(task["launch"], env, task.get("cwd") or os.getcwd(), task["log"])
            os._exit(1)  # not reached: forked_entry leaves with the attempt's code
        self.child = pid
        print(f"pita pack: {task['job_id']} attempt {task['attempt']} started (pid {pid})", flush=True)
        return True

    def _reap(self) -> None:
        pid, status = os.waitpid(self.child, os.WNOHANG)
        if pid == 0:
            self._kill_if_asked()
            return
        rc = os.waitstatus_to_exitcode(status)
        task, self.child, self.term_at = self.task, None, None
        from pita.core.paths import atomic_write_json

        atomic_write_json(self.dir / done_name(task["job_id"], task["attempt"]),
                          {"job_id": task["job_id"], "attempt": task["attempt"], "rc": rc, "started": self.started,
                           "ended": time.time()})
        for name in ("running.json", "kill.json"):
            try:
                (self.dir / name).unlink()
            except FileNotFoundError:
                pass
        print(f"pita pack: {task['job_id']} attempt {task['attempt']} ended ({rc})", flush=True)
        self.task, self.idle_since = None, time.time()

    def _kill_if_asked(self) -> None:
        path = self.dir / "kill.json"
        if self.term_at is None:
            try:
                ask = json.loads(path.read_text())
            except (OSError, ValueError):
                return
            if ask.get("job_id") != self.task["job_id"] or int(ask.get("attempt", -1)) != int(self.task["attempt"]):
                return
            self.kill_grace = float(ask.get("grace_s", 10.0))
            self.term_at = time.time()
            self._signal_child(signal.SIGTERM)
        elif time.time() - self.term_at > self.kill_grace:
            self._signal_child(signal.SIGKILL)

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        from pita.core.paths import atomic_write_json

        atomic_write_json(self.dir / "started", {"pid": os.getpid(), "host": socket.gethostname(),
                                                 "slurm_job": os.environ.get("SLURM_JOB_ID"), "time": time.time()})
        self.idle_since = time.time()
        while True:
            if self.child is not None:
                self._reap()
            if self.child is None:
                if (self.dir / "stop").exists():
                    self.draining = self.draining or "told to stop"
                if not self.draining and time.time() - self.idle_since > self.idle_s:
                    self.draining = f"idle for {self.idle_s:g}s"
                if self.draining:
                    break
                if self._take():
                    continue
            self._wait(LOOK_S)
        # closed first, then nothing is taken: a task.json written meanwhile goes back to the driver
        (self.dir / "closed").write_text(self.draining + "\n")
        print(f"pita pack: leaving ({self.draining})", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder, idle_s = Path(argv[0]), float(argv[1]) if len(argv) > 1 else 60.0
    # blocked before the imports start any thread: the signals wait for the loop (Pack._wait), and
    # every attempt forked from here starts with them blocked, until its worker is ready for them
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    import pita.core.preload  # noqa: F401 - what every attempt imports, once (no CUDA is touched)

    return Pack(folder, idle_s).run()


if __name__ == "__main__":
    from pita.core.worker import exit_now

    exit_now(main())
