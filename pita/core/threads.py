"""A multi-core CPU job's threads, backed off while other processes want the cores.

    cores = IdleCores()          # between 1 thread and the job's budget (OMP_NUM_THREADS)
    for step in range(steps):
        cores.adjust()           # cheap; re-measures every ``interval_s``
        ...

A CPU job that holds k logical devices may run k x their threads. But a job with 2 intra-op
threads beside another CPU-heavy process on 2 cores thrashes: every parallel region waits for
its descheduled thread (measured: the tiny reference's pretraining went from 0.10 s a step to
1.55 s with a 2-thread torch neighbour, 15x, where one thread beside it costs about 2x). So the
job starts with one thread and takes more only while the cores have been idle over the last
interval: the CPU time of every other process on the machine (psutil: its busy time minus this
process's) must leave a whole core free for each extra thread. Checked every ``interval_s`` at a
step boundary (torch's thread count belongs to the calling thread, so the training loop sets
it); a neighbour that appears costs at most one interval. It never takes more than the budget
the executor gave the job, so the run's own accounting of devices holds.

Only where the results do not depend on the thread count: the tiny family's pretraining gives
the same weights bit for bit with 1 and 2 threads (the matmul kernels split output blocks, not
reductions; checked with this project's CPU wheel), so a build's result does not depend on the
machine's load.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)


class IdleCores:
    def __init__(self, ceiling: int | None = None, floor: int = 1, interval_s: float = 1.0,
                 spare: float = 0.75, enabled: bool | None = None):
        import psutil  # noqa: F401  (fail here, not in the loop)

        env = os.environ.get("OMP_NUM_THREADS", "")
        self.floor = max(1, floor)
        self.ceiling = max(self.floor, ceiling if ceiling is not None else (int(env) if env.isdigit() else 1))
        if enabled is None:  # a GPU job's CPU threads are not what limits it
            enabled = not os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        self.enabled = enabled and self.ceiling > self.floor
        self.interval_s, self.spare = interval_s, spare
        self.threads = self.floor
        if self.enabled:
            import torch

            torch.set_num_threads(self.floor)
        self._proc = psutil.Process()
        self._last = None
        self.changes = 0
        if self.enabled:
            self._last = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        import psutil

        t = psutil.cpu_times()
        busy = t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        own = self._proc.cpu_times()
        return time.monotonic(), busy, own.user + own.system + own.children_user + own.children_system

    def others(self) -> float | None:
        """Cores the rest of the machine used since the last measure (None: too soon to tell)."""
        now = self._sample()
        wall = now[0] - self._last[0]
        if wall < self.interval_s:
            return None
        busy = (now[1] - self._last[1]) / wall
        own = (now[2] - self._last[2]) / wall
        self._last = now
        return max(0.0, busy - own)

    def adjust(self) -> int:
        """Set torch's thread count for what is idle now; returns it."""
        if not self.enabled:
            return self.threads
        others = self.others()
        if others is None:
            return self.threads
        from pita.core.gpu_manager import usable_cores

        free = usable_cores() - others  # cores nobody else used in the interval (ours included)
        want = max(self.floor, min(self.ceiling, int(free - self.spare) + 1))
        if want != self.threads:
            import torch

            torch.set_num_threads(want)
            log.info("threads %d -> %d (other processes used %.2f cores over the last %.1f s)",
                     self.threads, want, others, self.interval_s)
            self.threads = want
            self.changes += 1
        return self.threads
