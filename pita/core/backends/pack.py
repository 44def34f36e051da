"""A pack: one Slurm allocation that runs several short attempts, one after another, each forked
from an interpreter that imported torch, transformers and the job kinds once.

A fresh interpreter spends several seconds importing those (most of a short job), and each
Slurm job waits for the scheduler; the Slurm backend (``executor.slurm.pack_below_s``) hands
attempts planned shorter than that to packs instead of submitting each as its own job. The
driver and a pack talk through files in the pack's folder on the shared file system
(``<run>/slurm-packs/<name>/``), never through Slurm:

    started         the pack is up (written once, after its imports): {pid, host, slurm_job, time}
    task.json       driver -> pack: the one attempt to run next {job_id, attempt, launch, log, env,
                    limit_s, warn_s, grace_s: its own time limit, warning margin and kill grace}
    running.json    task.json, renamed by the pack as it takes it (the driver knows it started)
    done-<job>-<attempt>.json
                    pack -> driver: the attempt's exit code and span, the signals the pack
                    received from Slurm while it ran ({signals}), and ``ended_by`` where the pack
                    or the kernel ended it ("timeout": its own limit; "oom": the OOM killer took
                    a process of the pack's cgroup); the driver reads these as Slurm's end state
                    of a job of its own (its outcome file is the worker's own, next to its launch
                    file, as for any attempt)
    kill.json       driver -> pack: end the running attempt (TERM to its process group, KILL
                    after {grace_s})
    stop            driver -> pack: take nothing more and leave once the running attempt ends
    closed          the pack takes nothing more (it is leaving): a task.json it did not take
                    goes back to the driver, which hands it to another pack

Each attempt has a time limit of its own inside the pack, as a Slurm job of its own would
(``limit_s``): ``warn_s`` before it the attempt's worker gets USR1, at it TERM to its session and
KILL ``grace_s`` later. When an attempt ends, every process it left (the pack is their child
subreaper, so none escapes by double-forking) is killed and reaped before the next is taken.

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

LOOK_S = 0.1  # how often the pack looks for a child that ended (waitpid: no file is touched)
# how often it looks at its files (a task handed over, the driver's kill, stop): a shared
# filesystem sees about two metadata operations a second a pack (bench/pack_fs_ops.py)
FILE_LOOK_S = 0.5
STOP_LOOK_S = 2.0  # the stop file, looked for this often while idle
HELD = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}  # taken by the pack's loop, never by a handler
SIGNAL_RACE_S = 2.0  # an attempt that died of a signal: the pack's own signal may follow this late
LEFTOVER_WAIT_S = 10.0  # an ended attempt's leftover processes are killed and reaped within this
# where the pack reads its cgroup's OOM-kill count (a stand-in in tests); unset: its own cgroup's
# memory.events (cgroup v2) or memory.oom_control (v1)
MEMORY_EVENTS_ENV = "PITA_PACK_MEMORY_EVENTS"


def done_name(job_id: str, attempt: int) -> str:
    return f"done-{job_id}-{attempt}.json"


def _events_file() -> Path | None:
    """The file holding this process's cgroup's ``oom_kill`` count, or None where none is readable."""
    if os.environ.get(MEMORY_EVENTS_ENV):
        return Path(os.environ[MEMORY_EVENTS_ENV])
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the unified hierarchy
            roots, name = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"), "memory.events"
        elif "memory" in controllers.split(","):
            roots, name = ("/sys/fs/cgroup/memory",), "memory.oom_control"
        else:
            continue
        for root in roots:
            parts = [x for x in path.split("/") if x]
            while True:  # a cgroup namespace mounts the process's own cgroup at the root
                f = Path(root, *parts, name)
                if f.exists():
                    if name == "memory.oom_control" or parts or Path(root, "cgroup.controllers").exists():
                        return f
                if not parts:
                    break
                parts = parts[1:]
    return None


def oom_kills(path: Path | None) -> int | None:
    """The ``oom_kill`` count of a memory.events / memory.oom_control file, None if unreadable."""
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path("/proc", d, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(d))
    return out


def _set_child_subreaper() -> None:
    """Orphans of an attempt become the pack's children (not init's), so the pack finds them all."""
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Pack:
    def __init__(self, folder: Path, idle_s: float):
        self.dir, self.idle_s = Path(folder), float(idle_s)
        self.child: int | None = None  # pid (and process group) of the running attempt
        self.task: dict | None = None
        self.draining = ""  # why the pack takes nothing more
        self.term_at: float | None = None  # when the running attempt was sent TERM (a kill.json, its limit)
        self.kill_grace = 10.0
        self.signals: list[str] = []  # what Slurm sent the pack while the running attempt ran
        self.ended_by = ""  # "timeout": its own limit ended it
        self.warned = False  # its own limit's warning (USR1) sent
        self.events = _events_file()
        self.ooms_before: int | None = None
        self._kill_look = 0.0  # kill.json last looked for

    # ------------------------------------------------------------------ signals
    def _forward(self, signum: int) -> None:
        """USR1 (the pack's limit is near) or TERM/INT (preempted, cancelled): the running attempt
        hears it as in a Slurm job of its own, and the pack takes nothing more. USR1 goes to the
        attempt's worker alone, as ``--signal=B:`` sends it to a batch script alone; TERM goes to its
        whole session, as Slurm's TERM reaches every process of a job."""
        name = signal.Signals(signum).name
        self.draining = self.draining or f"{name} received"
        if self.child is not None:
            self.signals.append(name)
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
        self.signals, self.ended_by, self.warned, self.term_at = [], "", False, None
        self.kill_grace = float(task.get("grace_s") or 30.0)
        self.ooms_before = oom_kills(self.events)
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
            self._keep_limit()
            return
        rc = os.waitstatus_to_exitcode(status)
        # Slurm signals every process of the job at once (scancel, preemption): an attempt killed by
        # a signal the pack did not send may have died a moment before the pack's own arrives;
        # waited for briefly, so the done file says the pack was signalled
        wait = SIGNAL_RACE_S if rc < 0 and self.term_at is None and not self.signals else 0.0
        got = signal.sigtimedwait(HELD, wait)
        while got is not None:
            self._forward(got.si_signo)  # recorded for this attempt (self.child is still set)
            got = signal.sigtimedwait(HELD, 0)
        task, self.child, self.term_at = self.task, None, None
        left = self._end_leftovers(pid)
        ooms = oom_kills(self.events)
        if not self.ended_by and ooms is not None and self.ooms_before is not None and ooms > self.ooms_before:
            self.ended_by = "oom"
        from pita.core.paths import atomic_write_json

        atomic_write_json(self.dir / done_name(task["job_id"], task["attempt"]),
                          {"job_id": task["job_id"], "attempt": task["attempt"], "rc": rc, "started": self.started,
                           "ended": time.time(), "signals": self.signals, "ended_by": self.ended_by,
                           "leftovers": left})
        for name in ("running.json", "kill.json"):
            try:
                (self.dir / name).unlink()
            except FileNotFoundError:
                pass
        print(f"pita pack: {task['job_id']} attempt {task['attempt']} ended ({rc}"
              f"{', ' + self.ended_by if self.ended_by else ''}"
              f"{', after ' + '+'.join(self.signals) if self.signals else ''}"
              f"{f', {left} leftover process(es) killed' if left else ''})", flush=True)
        self.task, self.idle_since = None, time.time()

    def _end_leftovers(self, pid: int) -> int:
        """Kill and reap what the ended attempt left: its session (process group ``pid``) and any
        other process below the pack (orphans come to the pack, its subreaper); how many there were."""
        killed: set[int] = set()
        deadline = time.time() + LEFTOVER_WAIT_S
        while True:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            kids = _children_of(os.getpid())
            for k in kids:
                killed.add(k)
                try:
                    os.kill(k, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            while True:  # reap every ended child (the attempt's orphans are the pack's)
                try:
                    got, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    got = 0
                if got == 0:
                    break
            if not kids or time.time() > deadline:
                return len(killed)
            time.sleep(0.05)

    def _keep_limit(self) -> None:
        """The running attempt's own time limit: USR1 ``warn_s`` before it (to its worker, as Slurm's
        ``--signal=B:`` does), TERM to its session at it, KILL ``grace_s`` later (_kill_if_asked)."""
        limit = float(self.task.get("limit_s") or 0)
        if not limit:
            return
        ran = time.time() - self.started
        warn = float(self.task.get("warn_s") or 0)
        if warn and not self.warned and ran >= limit - warn:
            self.warned = True
            try:
                os.kill(self.child, signal.SIGUSR1)
            except ProcessLookupError:
                pass
            print(f"pita pack: {self.task['job_id']} is {warn:g}s from its limit ({limit:g}s): warned (USR1)",
                  flush=True)
        if ran >= limit and self.term_at is None:
            self.ended_by, self.term_at = "timeout", time.time()
            self._signal_child(signal.SIGTERM)
            print(f"pita pack: {self.task['job_id']} reached its limit ({limit:g}s): TERM, KILL after "
                  f"{self.kill_grace:g}s", flush=True)

    def _kill_if_asked(self) -> None:
        path = self.dir / "kill.json"
        if self.term_at is None:
            now = time.time()
            if now - self._kill_look < FILE_LOOK_S:
                return
            self._kill_look = now
            try:
                ask = json.loads(path.read_text())
            except (OSError, ValueError):
                return
            if ask.get("job_id") != self.task["job_id"] or int(ask.get("attempt", -1)) != int(self.task["attempt"]):
                return
            self.kill_grace = float(ask.get("grace_s", 10.0))
            self.ended_by = ""  # the driver's kill: its own status, not a limit
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
        take_look = stop_look = 0.0
        while True:
            if self.child is not None:
                self._reap()
            if self.child is None:
                now = time.time()
                if now - stop_look >= STOP_LOOK_S:
                    stop_look = now
                    if (self.dir / "stop").exists():
                        self.draining = self.draining or "told to stop"
                if not self.draining and now - self.idle_since > self.idle_s:
                    self.draining = f"idle for {self.idle_s:g}s"
                if self.draining:
                    break
                if now - take_look >= FILE_LOOK_S:
                    take_look = now
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
    _set_child_subreaper()
    import pita.core.preload  # noqa: F401 - what every attempt imports, once (no CUDA is touched)

    return Pack(folder, idle_s).run()


if __name__ == "__main__":
    from pita.core.worker import exit_now

    exit_now(main())
