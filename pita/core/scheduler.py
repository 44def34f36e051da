"""Placement decisions: which ready job starts on which device(s), now.

This is pure bookkeeping with no clock and no processes, so the executor and the scheduler
benchmark (``bench/scheduler.py``, simulated time) run exactly the same code.

Rules:
- A job is ready when all of its dependencies are COMPLETED (no round barriers).
- Ready jobs are tried in order of critical path (longest remaining chain first; id breaks ties).
- A job fits a device when the device's available memory covers its estimate (the planned one, or
  one learned from comparable jobs' measured peaks: ``estimate``, see pita/core/memlearn.py):
      available = total - margin - memory used by others - sum over our running jobs of
                  max(reservation, measured usage)
  where "others" is used - our measured usage, or used - our reservations when NVML attributes
  nothing to our workers (containers: NVML reports host pids)
  Several jobs share a device while memory allows; ``max_jobs_per_device`` caps the count.
- A job asking for k devices gets k devices at once (gang) or none, all on one node (devices carry
  their node: the Ray backend's GPUs of several machines). Among the devices that fit,
  the ones running the fewest jobs come first (co-located jobs share the GPU's compute, so an
  idle device is better than a busy one), then best fit (the least available memory that still
  fits), which keeps large holes open for large jobs.
- Reservation and backfilling (EASY, as batch systems do it): the most urgent device job that
  cannot start now gets a reservation: the devices that will have room for it soonest and the
  time they will (``reserve_at``), from the running jobs' expected ends (start + expected
  duration; a job past its expected end is taken to end now). A lower-priority job may still
  start on a reserved device only if it is expected to end by then, or if the device keeps room
  for the reserved job beside it. So a k-device job waits for the jobs already running, not for
  the moment k devices happen to be free together, and short jobs fill the gap before it.
- Starvation guard, for when expected durations are wrong: a job that does not fit, and has seen
  lower-priority jobs start ahead of it in ``starvation_passes`` scheduling passes, holds its
  reserved devices (or, where no reservation can be made, the devices closest to fitting it):
  nothing else starts there until it does.
- Jobs asking for 0 devices (merges, reports) use one of ``max_cpu_jobs`` host slots.
- A failed job's descendants are SKIPPED with the reason.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

from pita.core.graph import JobGraph
from pita.core.job import JobState


@dataclass
class DeviceLoad:
    total_bytes: int
    margin_bytes: int = 0
    measured_used: int = 0  # everything on the device, ours included (NVML); 0 when unknown
    reserved: dict[str, int] = field(default_factory=dict)  # running job -> estimate
    usage: dict[str, int] = field(default_factory=dict)  # running job -> measured bytes
    alive: bool = True  # False: it left the inventory (its node is gone); nothing starts there

    def others(self) -> int:
        """Device memory held by processes that are not our running jobs. Where NVML attributes
        none of the device's memory to our workers (in a container NVML reports host pids, which
        never match), our jobs are taken to hold their reservations: used - sum of reservations,
        not used - 0, which would count our own jobs twice."""
        ours_measured = sum(self.usage.values())
        if self.reserved and ours_measured == 0:
            return max(0, self.measured_used - sum(self.reserved.values()))
        return max(0, self.measured_used - ours_measured)

    def available(self) -> int:
        ours = sum(max(r, self.usage.get(j, 0)) for j, r in self.reserved.items())
        return self.total_bytes - self.margin_bytes - self.others() - ours


@dataclass
class Reservation:
    """The most urgent waiting device job's claim: the devices it will start on, and when.
    ``spare``: per reserved device, the room left beside it then (less what backfilled jobs that
    outlast ``at`` take); ``jobs_then``: the jobs running there then."""

    job: str
    at: float
    spare: dict[int, int]
    jobs_then: dict[int, int]
    need: int


class Scheduler:
    def __init__(self, graph: JobGraph, device_totals: list[int], memory_margin: float = 0.05,
                 max_jobs_per_device: int | None = None, max_cpu_jobs: int | None = None,
                 starvation_passes: int | None = 50, max_running: int | None = None,
                 estimate: Callable[[str], int] | None = None, host_bytes: int | None = None,
                 clock: Callable[[], float] | None = None, duration: Callable[[str], float] | None = None,
                 backfill: bool = True, device_nodes: list[str] | None = None):
        self.graph = graph
        # each device's node; a k-device job's devices all come from one node (None: one node)
        self._device_nodes = list(device_nodes) if device_nodes else [""] * len(device_totals)
        self.nodes = self._device_nodes if len(set(self._device_nodes)) > 1 else None
        # time now and each job's expected seconds, for reservations (the simulation's clock and
        # the plan's durations, or the executor's monotonic clock and the learned durations)
        self.clock = clock or (lambda: 0.0)
        self.duration = duration or (lambda jid: self.graph[jid].duration_hint)
        self.backfill = backfill
        self._started_at: dict[str, float] = {}
        self.reservation: Reservation | None = None  # the last pass's, for logs and tests
        # the node's host memory the running jobs' host estimates (resources.host_gb) share; None:
        # not counted. A job that alone needs more still starts when nothing else runs (the plan
        # refuses it up front; this only keeps a resumed or edited run from waiting forever)
        self.host_bytes = host_bytes
        self._host_held: dict[str, int] = {}
        # bytes to reserve per device for a job, asked when it is placed: the planned estimate,
        # or what pita.core.memlearn learned from comparable jobs' measured peaks
        self.estimate = estimate or (lambda jid: self.graph[jid].resources.memory_bytes)
        self.max_running = max_running  # jobs running at once in all (None = no cap)
        self.memory_margin = memory_margin
        self.devices = [DeviceLoad(int(t), int(t * memory_margin)) for t in device_totals]
        self.max_jobs_per_device = max_jobs_per_device
        self.max_cpu_jobs = max_cpu_jobs
        self.starvation_passes = starvation_passes
        self._passed_over: dict[str, int] = {}
        self.state: dict[str, JobState] = {j.id: JobState.PENDING for j in graph.jobs}
        self.reason: dict[str, str] = {}
        self.placement: dict[str, list[int]] = {}
        self._waiting = {j.id: len(set(j.deps)) for j in graph.jobs}
        # The ready jobs, kept sorted by priority: a pass looks at them in order and stops as soon
        # as nothing more can start, so its cost does not grow with the number of waiting jobs.
        self._ready: set[str] = set()
        self._ready_order: list[tuple[float, str]] = []
        self._ready_host: list[tuple[float, str]] = []  # the ready jobs that hold no device
        for j in graph.jobs:
            if not j.deps:
                self._add_ready(j.id)
        self._cpu_running: set[str] = set()
        self._running: set[str] = set()
        self._terminal = 0

    def _key(self, job_id: str) -> tuple[float, str]:
        return (-self.graph.priority[job_id], job_id)

    def _add_ready(self, job_id: str) -> None:
        if job_id not in self._ready:
            self._ready.add(job_id)
            bisect.insort(self._ready_order, self._key(job_id))
            if self.graph[job_id].resources.devices == 0:
                bisect.insort(self._ready_host, self._key(job_id))

    def _drop_ready(self, job_id: str) -> None:
        if job_id in self._ready:
            self._ready.discard(job_id)
            key = self._key(job_id)
            for order in (self._ready_order, self._ready_host):
                i = bisect.bisect_left(order, key)
                if i < len(order) and order[i] == key:
                    del order[i]

    def _set(self, job_id: str, new: JobState) -> None:
        """Change a job's state, keeping the running set and the count of finished jobs."""
        old = self.state[job_id]
        self._terminal += int(new.terminal) - int(old.terminal)
        if new == JobState.RUNNING:
            self._running.add(job_id)
        else:
            self._running.discard(job_id)
        self.state[job_id] = new

    # ------------------------------------------------------------------ state changes
    def mark_completed(self, job_id: str) -> None:
        """A job already done (resume) or just finished successfully."""
        prev = self.state[job_id]
        if prev == JobState.COMPLETED:
            return
        self._release(job_id)
        self._set(job_id, JobState.COMPLETED)
        self._drop_ready(job_id)
        for c in set(self.graph.dependents.get(job_id, ())):
            self._waiting[c] -= 1
            if self._waiting[c] == 0 and self.state[c] == JobState.PENDING:
                self._add_ready(c)

    def mark_failed(self, job_id: str, reason: str) -> list[str]:
        """Fail a job; returns the descendants that are now SKIPPED."""
        self._release(job_id)
        self._drop_ready(job_id)
        self._set(job_id, JobState.FAILED)
        self.reason[job_id] = reason
        skipped = []
        for d in self.graph.descendants(job_id):
            if self.state[d] == JobState.PENDING:
                self._set(d, JobState.SKIPPED)
                self.reason[d] = f"dependency {job_id} failed"
                self._drop_ready(d)
                skipped.append(d)
        return skipped

    def requeue(self, job_id: str) -> None:
        """Put a running job back in the ready set (retry after OOM or a dead worker, or interruption)."""
        self._release(job_id)
        self._set(job_id, JobState.PENDING)
        if self._waiting[job_id] == 0:
            self._add_ready(job_id)

    def add_device(self, total_bytes: int, node: str = "") -> int:
        """A device that joined (a Ray node came, or a GPU came free); returns its ordinal."""
        self.devices.append(DeviceLoad(int(total_bytes), int(total_bytes * self.memory_margin)))
        self._device_nodes.append(node)
        self.nodes = self._device_nodes if len(set(self._device_nodes)) > 1 else None
        return len(self.devices) - 1

    def remove_device(self, ordinal: int) -> list[str]:
        """A device that left (its node is gone): nothing starts there again. Returns the jobs
        running on it; the executor requeues each when its attempt is reported over."""
        self.devices[ordinal].alive = False
        if self.reservation is not None and ordinal in self.reservation.spare:
            self.reservation = None
        return sorted(self.devices[ordinal].reserved)

    def live_devices(self) -> int:
        return sum(d.alive for d in self.devices)

    def _host_fits(self, job_id: str) -> bool:
        if self.host_bytes is None:
            return True
        need = int(self.graph[job_id].resources.host_gb * 1e9)
        return need <= 0 or not self._host_held or sum(self._host_held.values()) + need <= self.host_bytes

    def host_used(self) -> int:
        """Host bytes the running jobs' estimates hold."""
        return sum(self._host_held.values())

    def _release(self, job_id: str) -> None:
        self._host_held.pop(job_id, None)
        self._started_at.pop(job_id, None)
        for o in self.placement.pop(job_id, []):
            self.devices[o].reserved.pop(job_id, None)
            self.devices[o].usage.pop(job_id, None)
        self._cpu_running.discard(job_id)

    def observe(self, ordinal: int, measured_used: int, job_usage: dict[str, int] | None = None) -> None:
        """Feed measured memory (NVML): total used on the device and per running job."""
        dev = self.devices[ordinal]
        dev.measured_used = int(measured_used)
        dev.usage = {j: int(b) for j, b in (job_usage or {}).items() if j in dev.reserved}

    # ------------------------------------------------------------------ queries
    def running(self) -> list[str]:
        return sorted(self._running)

    def jobs_on(self, ordinal: int) -> int:
        return len(self.devices[ordinal].reserved)

    def done(self) -> bool:
        return self._terminal == len(self.state)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in JobState}
        for s in self.state.values():
            out[s.value] += 1
        return out

    def ready(self) -> list[str]:
        return [j for _, j in self._ready_order]

    # ------------------------------------------------------------------ reservations
    def expected_end(self, jid: str, now: float) -> float:
        """When a running job is expected to end: its start plus its expected duration, or now
        when it has run past that."""
        return max(now, self._started_at.get(jid, now) + float(self.duration(jid)))

    def _reserve(self, jid: str, need: int, k: int, now: float) -> "Reservation | None":
        """The k devices that will have room for ``jid`` soonest, and when; None if fewer than k
        ever will (memory held by processes that are not ours)."""
        cap = self.max_jobs_per_device
        when: list[tuple[float, int, int, int, int]] = []  # (time, jobs then, ordinal, room then, jobs then)
        for o, dev in enumerate(self.devices):
            if not dev.alive:
                continue
            room, count = dev.available(), len(dev.reserved)
            ends = sorted((self.expected_end(r, now), max(b, dev.usage.get(r, 0))) for r, b in dev.reserved.items())
            t, i = now, 0
            while not (room >= need and (cap is None or count < cap)):
                if i == len(ends):
                    t = float("inf")
                    break
                t, freed = ends[i]
                room, count, i = room + freed, count - 1, i + 1
            # the room it will have at that time: jobs ending at the same moment free theirs too
            while i < len(ends) and ends[i][0] <= t:
                room, count, i = room + ends[i][1], count - 1, i + 1
            when.append((t, count, o, room, count))
        when.sort()
        chosen = when[:k]
        if self.nodes is not None and k > 1:  # the k that free first on one node
            by: dict[str, list] = {}
            for w in when:
                by.setdefault(self.nodes[w[2]], []).append(w)
            options = [ws[:k] for ws in by.values() if len(ws) >= k]
            chosen = min(options, key=lambda ws: (ws[-1][0], [w[2] for w in ws])) if options else []
        if len(chosen) < k or chosen[-1][0] == float("inf"):
            return None
        at = chosen[-1][0]
        return Reservation(jid, at, {o: room - need for _, _, o, room, _ in chosen},
                           {o: c for _, _, o, _, c in chosen}, need)

    def _one_node(self, devices: list[int], k: int, rank) -> list[int]:
        """Of ``devices``, those of the one node whose best k are best (empty when no node has k)."""
        by: dict[str, list[int]] = {}
        for o in devices:
            by.setdefault(self.nodes[o], []).append(o)
        best = [sorted(ds, key=rank)[:k] for ds in by.values() if len(ds) >= k]
        return min(best, key=lambda ds: [rank(o) for o in ds]) if best else []

    def _backfill_ok(self, res: "Reservation", o: int, jid: str, need: int, now: float) -> bool:
        """May ``jid`` start on device ``o`` now without delaying the reserved job?"""
        if o not in res.spare or now + float(self.duration(jid)) <= res.at:
            return True
        cap = self.max_jobs_per_device
        return need <= res.spare[o] and (cap is None or res.jobs_then[o] + 2 <= cap)

    # ------------------------------------------------------------------ placement
    def _fits(self, o: int, need: int, held: set[int]) -> bool:
        dev = self.devices[o]
        if o in held or not dev.alive:
            return False
        if self.max_jobs_per_device is not None and len(dev.reserved) >= self.max_jobs_per_device:
            return False
        return dev.available() >= need

    def schedule(self) -> list[tuple[str, list[int]]]:
        """Start every ready job that fits now; returns [(job_id, device ordinals)]."""
        started: list[tuple[str, list[int]]] = []
        held: set[int] = set()
        blocked: list[tuple[int, str]] = []  # (position in priority order, job)
        last_device_start = -1
        running = len(self._running)
        cap = self.max_jobs_per_device
        now = self.clock()
        res: Reservation | None = None
        self.reservation = None
        for pos, (_, jid) in enumerate(list(self._ready_order)):
            if self.max_running is not None and running + len(started) >= self.max_running:
                break
            if cap is not None and all(len(d.reserved) >= cap or not d.alive for d in self.devices):
                # No device takes another job: only host jobs can still start (and no device job
                # starts ahead of a waiting one), so the rest of the pass looks at those alone; its
                # cost does not grow with the number of jobs waiting for a device.
                for _, hid in list(self._ready_host):
                    if ((self.max_running is not None and running + len(started) >= self.max_running)
                            or (self.max_cpu_jobs is not None and len(self._cpu_running) >= self.max_cpu_jobs)):
                        break
                    if not self._host_fits(hid):
                        continue
                    self._cpu_running.add(hid)
                    self._start(hid, [])
                    started.append((hid, []))
                break
            job = self.graph[jid]
            k = job.resources.devices
            if k == 0:
                if (self.max_cpu_jobs is None or len(self._cpu_running) < self.max_cpu_jobs) and self._host_fits(jid):
                    self._cpu_running.add(jid)
                    self._start(jid, [])
                    started.append((jid, []))
                continue
            need = self.estimate(jid)
            fitting = [o for o in range(len(self.devices)) if self._fits(o, need, held)]
            if res is not None:
                fitting = [o for o in fitting if self._backfill_ok(res, o, jid, need, now)]
            if len(fitting) >= k and not self._host_fits(jid):
                fitting = []  # the devices have room, the node's RAM does not: it waits like a device job
            reserved = res.spare if res is not None else {}

            def rank(o):
                return (o in reserved, len(self.devices[o].reserved), self.devices[o].available(), o)
            if self.nodes is not None and k > 1:
                fitting = self._one_node(fitting, k, rank)
            if len(fitting) >= k:
                chosen = sorted(sorted(fitting, key=rank)[:k])
                for o in chosen:
                    self.devices[o].reserved[jid] = need
                    if o in reserved and now + float(self.duration(jid)) > res.at:  # beside the reserved job
                        res.spare[o] -= need
                        res.jobs_then[o] += 1
                self._start(jid, chosen)
                started.append((jid, chosen))
                last_device_start = pos
            else:
                blocked.append((pos, jid))
                starving = (self.starvation_passes is not None
                            and self._passed_over.get(jid, 0) >= self.starvation_passes)
                if res is None and self.backfill and self._host_fits(jid):
                    res = self._reserve(jid, need, k, now)
                    if res is not None:
                        self.reservation = res
                        if starving:  # backfilled jobs kept outlasting what was expected of them:
                            held.update(res.spare)  # its devices take nothing more until it starts
                        continue
                if starving and not held and res is None:
                    # Hold the devices closest to fitting this job so lower-priority work cannot starve it.
                    closest = sorted((o for o, d in enumerate(self.devices) if d.alive),
                                     key=lambda o: (-self.devices[o].available(), o))[:k]
                    held.update(closest)
        for pos, jid in blocked:  # lower-priority work started while this job waited
            # with a reservation, only the reserved job counts, and only while the jobs it waits
            # for have run past their expected ends: accurate durations never trigger the guard
            if last_device_start > pos and (res is None or (jid == res.job and res.at <= now)):
                self._passed_over[jid] = self._passed_over.get(jid, 0) + 1
        return started

    def adopt(self, jid: str, ordinals: list[int]) -> bool:
        """Count a job an earlier driver started (and the backend took over at resume) as running on
        ``ordinals``, reserving its estimate there; False when it is not ready or a device is gone."""
        if jid not in self._ready or any(o >= len(self.devices) or not self.devices[o].alive for o in ordinals):
            return False
        need = self.estimate(jid)
        for o in ordinals:
            self.devices[o].reserved[jid] = need
        if not ordinals:
            self._cpu_running.add(jid)
        self._start(jid, list(ordinals))
        return True

    def _start(self, jid: str, ordinals: list[int]) -> None:
        self._started_at[jid] = self.clock()
        if self.host_bytes is not None:
            self._host_held[jid] = int(self.graph[jid].resources.host_gb * 1e9)
        self._passed_over.pop(jid, None)
        self._drop_ready(jid)
        self._set(jid, JobState.RUNNING)
        self.placement[jid] = ordinals
