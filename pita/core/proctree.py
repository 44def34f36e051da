"""Every process a job attempt starts ends with the attempt, even those that left its group.

A worker leads its own session and process group, so TERM / KILL to the group reaches what it
started, except a descendant that moved to a session of its own (``setsid``,
``subprocess.Popen(start_new_session=True)``, a daemonising tool). Three measures catch those:

1. The worker makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant whose
   parent exits is re-parented to the worker instead of init, so the whole tree stays below it.
2. When the job returns, and when the worker gets SIGTERM (a timeout, Ctrl-C), the worker ends
   every process still below it (:func:`end_descendants`) before it exits.
3. The orchestrator records the attempt's tree (pid and start time, so a reused pid is never
   mistaken for ours) when it starts and about once a second while it runs
   (:class:`ProcessTree`); when the attempt ends in any way, a SIGKILLed worker included, every
   recorded process still alive is killed.

cgroups (v2 ``cgroup.kill``) would also catch a process that escapes and re-forks between two
polls after its worker was SIGKILLed, but they need a delegated, writable cgroup subtree, which
containers and batch schedulers rarely give a user's process; see docs/decisions/process-tree-cleanup.md.
"""

from __future__ import annotations

import os
import signal

import psutil

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (Linux); False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def end_descendants(sig: int = signal.SIGKILL) -> int:
    """Signal every process below this one; reap those that are our children. How many were left."""
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for p in kids:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass
    psutil.wait_procs(kids, timeout=1.0)
    return len(kids)


class ProcessTree:
    """The processes of one attempt as last seen: {pid: start time}."""

    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self.seen: dict[int, float] = {}
        try:  # the root only: a just-started worker has no children yet, and this stays cheap
            self.seen[root_pid] = psutil.Process(root_pid).create_time()
        except psutil.Error:
            pass

    def record(self) -> None:
        """Add the root's current descendants (and the root) to what is known."""
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                self.seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass

    def add(self, pid: int, started: float) -> None:
        self.seen.setdefault(pid, started)

    def pids(self) -> set[int]:
        return set(self.seen)

    def kill_survivors(self) -> list[int]:
        """SIGKILL every recorded process still alive (same pid and start time); their pids."""
        self.record()
        killed = []
        for pid, started in self.seen.items():
            if pid == os.getpid():
                continue
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - started) > 0.01 or p.status() == psutil.STATUS_ZOMBIE:
                    continue
                p.kill()
                killed.append(pid)
            except psutil.Error:
                pass
        return killed


def record_all(trees: list[ProcessTree]) -> None:
    """Refresh several trees from one pass over the process table (what the local backend does
    about once a second while attempts run: the cost does not depend on the number of jobs)."""
    if not trees:
        return
    children: dict[int, list[tuple[int, float]]] = {}
    for p in psutil.process_iter(["ppid", "create_time"]):
        info = p.info
        if info.get("ppid") is not None and info.get("create_time") is not None:
            children.setdefault(info["ppid"], []).append((p.pid, info["create_time"]))
    for tree in trees:
        stack = [pid for pid in tree.seen]
        visited = set(stack)
        while stack:
            for pid, started in children.get(stack.pop(), ()):
                if pid not in visited:
                    visited.add(pid)
                    tree.add(pid, started)
                    stack.append(pid)
