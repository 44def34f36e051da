"""A full disk: the run stops cleanly (running jobs end and go back to pending, the state is
saved where it can be) and says how much to free where; the folder resumes once space is freed."""

from __future__ import annotations

import logging
import os
import time
from pita.core.backends.base import Finished
from pita.core.execution.summary import RunSummary

log = logging.getLogger("pita.executor")


class DiskFull(Exception):
    """The run folder's file system is full: the run stops (and resumes once space is freed)."""


class DiskSpace:
    """Mixed into :class:`pita.core.executor.Executor`."""

    def _out_of_space(self, f: Finished) -> bool:
        """The attempt failed because the run folder's disk is full (its error says so, or the disk
        has next to nothing left), rather than because of the job."""
        if f.status == "nospace" or "No space left on device" in (f.error or "") or "disk is full" in (f.error or ""):
            return True
        if f.status in ("died", "error"):
            import shutil

            try:
                return shutil.disk_usage(self.run_paths.root).free < 1 << 20
            except OSError:
                return False
        return False

    def _space_needed(self) -> float:
        """Bytes the rest of the run needs, judged by what the finished jobs wrote (once, when the
        disk is full), and never less than system.min_free_gb."""
        used = 0
        for folder, _, files in os.walk(self.run_paths.root):
            for f in files:
                try:
                    used += os.lstat(os.path.join(folder, f)).st_size
                except OSError:
                    pass
        done = max(1, self.sched.counts()["COMPLETED"])
        left = len(self.graph) - self.sched.counts()["COMPLETED"]
        return max(self.s.min_free_gb * 2**30, 1.5 * used / done * left, 64 * 2**20)

    def _disk_full(self, t0: float, e: BaseException) -> RunSummary:
        """Stop cleanly: end the running jobs (they re-run on resume), keep what can be kept, and
        say how much space to free where."""
        import shutil

        try:
            free = shutil.disk_usage(self.run_paths.root).free
        except OSError:
            free = 0
        msg = (f"no space left on the file system of {self.run_paths.root} ({free / 2**20:.1f} MiB free; {e}); "
               f"the run stopped. Free at least {self._space_needed() / 2**30:.2f} GiB there, then resume "
               f"with: resume_from={self.run_paths.root}")
        log.error("%s", msg)
        self._end_running("disk full")
        counts = self.sched.counts()
        try:  # best effort: on resume the markers decide anyway
            self._flush()
            self.state.apply(meta={"interrupted": True, "counts": counts})
            self._snapshot(force=True)
        except Exception:  # noqa: BLE001 - still full
            pass
        return RunSummary(counts, interrupted=True, wall_s=time.time() - t0, disk_full=msg)
