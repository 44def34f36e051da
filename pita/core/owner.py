"""One orchestrator per run folder: an exclusive lock on ``<run>/owner.lock`` while it runs.

    owner = OwnerLock(run.root)
    note = owner.acquire()          # RunOwned (exit 2, naming the owner) if another one holds it
    ...                             # run; ``pita status`` sees the folder as running
    owner.release()                 # or the process ends: the kernel drops the lock

The lock is ``flock(2)`` on a file that also records the owner (pid, host, start time, command).
The kernel releases it when the owner dies in any way (SIGKILL included), so there is no stale
lock to clean: a record whose owner did not release it and is no longer running means the last
orchestrator died, and the next one takes over with a warning. ``pita status`` probes the lock to
tell a live run from a stopped one.

File systems: local file systems honour ``flock``; on NFS (v4, and v3 with ``lockd``) Linux
implements it with POSIX byte-range locks that the server arbitrates, so it excludes orchestrators
on different nodes; so do GPFS and CephFS. Lustre honours it only when mounted with ``-o flock``
(``-o localflock`` excludes on one node only); without lock support the call fails with ENOLCK,
ENOSYS or EOPNOTSUPP, and the run goes on with a warning that a second orchestrator would not be
refused (``docs/decisions/run-owner-lock.md``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from pita.core.errors import ConfigError

log = logging.getLogger("pita.owner")

LOCK_NAME = "owner.lock"


class RunOwned(ConfigError):
    """Another orchestrator owns the run folder."""

    def __init__(self, problems):
        super().__init__(problems, header="run folder in use")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe(info: dict | None) -> str:
    if not info:
        return "an unknown process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on host {info.get('host')} (since {started})"


def read_info(root: Path | str) -> dict | None:
    try:
        return json.loads((Path(root) / LOCK_NAME).read_text() or "null")
    except (OSError, ValueError):
        return None


class OwnerLock:
    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self.fd: int | None = None
        self.supported = True

    def acquire(self, wait_s: float = 2.0) -> str | None:
        """Take the folder; returns a warning to log (a previous owner died), or None.

        Waits up to ``wait_s`` for a lock held only for a moment (``pita status`` probing it)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.time() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() < deadline:
                    time.sleep(0.05)
                    continue
                os.close(fd)
                info = read_info(self.root)
                here = info and info.get("host") == socket.gethostname()
                if here and info.get("pid") and not _pid_alive(int(info["pid"])):
                    raise RunOwned(f"{self.root} is locked by a process other than its recorded owner "
                                   f"({describe(info)}, no longer running); find it with: fuser -v {self.path}")
                raise RunOwned(f"{self.root} is in use by another orchestrator: {describe(info)}; wait for it to "
                               f"finish, or stop it (kill -INT {info.get('pid') if info else '<pid>'}"
                               f"{'' if here or not info else ' on ' + str(info.get('host'))}) and resume then")
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise
                self.supported = False
                log.warning("the file system of %s does not support locks (%s): a second orchestrator on this "
                            "run folder would not be refused; see docs/decisions/run-owner-lock.md",
                            self.root, os.strerror(e.errno))
                break
        previous = read_info(self.root)
        self.fd = fd
        self._write({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                     "argv": sys.argv[:8]})
        if previous and previous.get("pid") and not previous.get("released"):
            return (f"the previous orchestrator of {self.root} ({describe(previous)}) ended without releasing "
                    f"it (killed?); taking over")
        return None

    def _write(self, info: dict) -> None:
        # In place, not by rename: the lock belongs to this file's inode.
        data = (json.dumps(info) + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        try:
            os.fsync(self.fd)
        except OSError:
            pass

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            info = read_info(self.root) or {}
            self._write(dict(info, released=time.time()))
        except OSError:  # a full disk: the kernel still drops the lock below
            pass
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None


def probe(root: Path | str) -> tuple[bool, dict | None]:
    """(owned now, the recorded owner): whether an orchestrator holds the folder at this moment."""
    path = Path(root) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        owned = False
    except BlockingIOError:
        owned = True
    except OSError:  # no lock support: fall back on the record
        info = read_info(root)
        pid = int((info or {}).get("pid") or 0)
        owned = bool(info and not info.get("released") and info.get("host") == socket.gethostname()
                     and pid > 0 and _pid_alive(pid))
    finally:
        os.close(fd)
    return owned, read_info(root)
