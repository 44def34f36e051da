"""Run the production Scheduler in simulated time (no processes): for benchmarks and tests.

Each job takes ``duration_hint`` time units; memory is reserved as the job requests. Jobs that
share a device are assumed not to slow each other down (an optimistic model of GPU sharing; the
benchmark states this).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from pita.core.graph import JobGraph
from pita.core.job import Job, Resources
from pita.core.scheduler import Scheduler


@dataclass
class SimResult:
    makespan: float
    critical_path: float
    device_time: float  # sum of duration * devices * (memory share of a device)
    n_devices: int
    timeline: list[tuple[str, float, float, list[int]]] = field(default_factory=list)  # (job, start, end, devices)
    overcommits: int = 0  # job starts after which a device's true peaks added up to more than it holds
    changes: list = field(default_factory=list)  # memory estimates learned (pita.core.memlearn.Change)

    @property
    def lower_bound(self) -> float:
        return max(self.critical_path, self.device_time / self.n_devices)

    @property
    def efficiency(self) -> float:
        return self.lower_bound / self.makespan if self.makespan > 0 else 1.0


def simulate(jobs: list[Job], device_totals: list[int], memory_margin: float = 0.05,
             max_jobs_per_device: int | None = None, starvation_passes: int | None = 50,
             true_peaks: dict[str, int] | None = None, learn_memory: bool = False,
             host_bytes: int | None = None, backfill: bool = True) -> SimResult:
    """``true_peaks``: bytes each job really peaks at (default: its estimate); a finished job
    reports it, and with ``learn_memory`` the executor's :class:`MemoryLearner` turns the reports
    into the estimates later jobs are placed with. Peaks are counted against the devices'
    whole memory (``overcommits``): with learning on, that is what its safety margin is for.
    ``backfill=False``: no reservations (the starvation guard only)."""
    graph = JobGraph(jobs).validate(device_totals, memory_margin, check_kinds=False)
    learner = None
    if learn_memory:
        from pita.core.memlearn import MemoryLearner

        learner = MemoryLearner(graph, "gpu", int(max(device_totals) * (1 - memory_margin)))
    clock = [0.0]
    sched = Scheduler(graph, device_totals, memory_margin, max_jobs_per_device=max_jobs_per_device,
                      starvation_passes=starvation_passes, estimate=learner.estimate if learner else None,
                      host_bytes=host_bytes, clock=lambda: clock[0], backfill=backfill)
    peaks = {j.id: j.resources.memory_bytes for j in jobs}
    peaks.update(true_peaks or {})
    now, events, timeline, seq, overcommits, changes = 0.0, [], [], 0, 0, []
    start_at: dict[str, float] = {}
    while not sched.done():
        for jid, devs in sched.schedule():
            start_at[jid] = now
            heapq.heappush(events, (now + graph[jid].duration_hint, seq, jid, devs))
            seq += 1
            overcommits += any(sum(peaks[r] for r in sched.devices[o].reserved) > sched.devices[o].total_bytes
                               for o in devs)
        if not events:
            raise RuntimeError("simulation stalled: ready jobs fit no device")  # validate() rules this out
        now, _, jid, devs = heapq.heappop(events)
        clock[0] = now
        sched.mark_completed(jid)
        if learner is not None and devs:
            change = learner.observe(jid, peaks[jid])
            if change is not None:
                changes.append(change)
        timeline.append((jid, start_at[jid], now, devs))
    usable = [t * (1 - memory_margin) for t in device_totals]
    cap = max(usable)
    device_time = sum(j.duration_hint * j.resources.devices * (j.resources.memory_bytes / cap if max_jobs_per_device != 1 else 1.0)
                      for j in jobs)
    return SimResult(now, graph.critical_path_length(), device_time, len(device_totals), timeline, overcommits,
                     changes)


def with_round_barriers(jobs: list[Job]) -> list[Job]:
    """The baseline policy's graph: every job of round r+1 also waits for all of round r.

    Jobs are grouped by ``Job.group`` ("round N"; anything else counts as round 0).
    """
    def round_of(j: Job) -> int:
        return int(j.group.split()[-1]) if j.group.startswith("round ") else 0

    rounds = sorted({round_of(j) for j in jobs})
    out = [Job.from_dict(j.to_dict()) for j in jobs]
    barriers = []
    for r in rounds[:-1]:
        members = [j.id for j in out if round_of(j) == r]
        barriers.append(Job(id=f"barrier.r{r}", kind="barrier", deps=members,
                            resources=Resources(devices=0), duration_hint=0.0, group=f"round {r}"))
    for j in out:
        r = round_of(j)
        if r > 0:
            j.deps = j.deps + [f"barrier.r{r - 1}"]
    return out + barriers
