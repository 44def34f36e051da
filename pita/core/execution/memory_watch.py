"""What the devices' memory says while jobs run, and what finished jobs teach: NVML (or a Ray
node's own NVML, or the jobs' RSS on CPU devices) fed to the scheduler, the torch reports of
workers where NVML attributes nothing to them, the lines run.log shows per device, and the
learned memory estimates and durations (pita/core/memlearn.py, pita/plans/durations.py)."""

from __future__ import annotations

import json
import logging

from pita.core.gpu_manager import jobs_rss
from pita.core.memlearn import device_peak
from pita.core.backends.base import Finished

log = logging.getLogger("pita.executor")


def torch_usage(nvml: dict[str, int], reserved: dict[str, int], reports: dict[str, int], ordinal: int,
                placement: dict[str, list[int]]) -> dict[str, int]:
    """What our jobs hold on a device when NVML attributes none of its memory to them (in a
    container NVML reports host pids; on MIG per-process figures may be absent): each job's own
    torch report (its share on this device, plus the CUDA context torch does not count), or its
    reservation while it has not reported yet. Taking every job at its reservation instead would
    hide another tenant's memory whenever our jobs sit below their reservations (used - sum of
    reservations comes out too small)."""
    from pita.core.memory import CUDA_CONTEXT_BYTES

    if not reports or not any(j in reports for j in nvml):
        return nvml  # nothing reported: the scheduler takes our jobs at their reservations
    return {j: (reports[j] // max(1, len(placement.get(j) or [ordinal])) + CUDA_CONTEXT_BYTES if j in reports
                else reserved.get(j, 0)) for j in nvml}


class MemoryWatch:
    """Mixed into :class:`pita.core.executor.Executor`."""

    def _observe_memory(self) -> None:
        if not all(d.kind == "cuda" for d in self.gpus.devices):  # CPU devices: their jobs' RSS
            self._rss = jobs_rss({j: self.backend.pids(j) for j in self.backend.running()}, self.sched.placement)
        if self.gpus.source == "ray" and hasattr(self.backend, "read_memory"):
            self._read_remote_memory()
        elif self.gpus.source != "nvml":
            return
        else:
            self.gpus.refresh()
        reports = None
        for d in self.gpus.devices:
            if d.lost or (self.gpus.source == "ray" and d.job_bytes is None):  # not read on its node
                continue
            usage = {}
            for jid in self.sched.devices[d.ordinal].reserved:
                usage[jid] = self.gpus.process_usage(d.ordinal, self.backend.pids(jid), jid)
                self.sampled_peak[jid] = max(self.sampled_peak[jid], usage[jid])
            if usage and not any(usage.values()):  # NVML attributes nothing to our workers (container, MIG)
                reports = self._torch_reports() if reports is None else reports
                usage = torch_usage(usage, self.sched.devices[d.ordinal].reserved, reports, d.ordinal,
                                    self.sched.placement)
            self.sched.observe(d.ordinal, d.used_bytes, usage)

    def _read_remote_memory(self) -> None:
        """A Ray cluster's GPUs, read by NVML on their own nodes (nothing where a node has none)."""
        live = [d.ordinal for d in self.gpus.devices if not d.lost and d.kind == "cuda"]
        for o, m in self.backend.read_memory(live).items():
            d = self.gpus.devices[o]
            d.used_bytes, d.utilization = int(m["used"]), m.get("utilization")
            d.job_bytes = {j: int(b) for j, b in m.get("jobs", {}).items()}

    def _torch_reports(self) -> dict[str, int]:
        """Running job -> the torch-reserved bytes its worker last reported (all its devices)."""
        out = {}
        for jid in self.backend.running():
            try:
                out[jid] = int(json.loads(self.run_paths.job(jid).torch_memory.read_text())["reserved"])
            except (OSError, ValueError, KeyError):
                continue
        return out

    def _device_lines(self) -> list[str]:
        return self.gpus.summary({o: self.sched.jobs_on(o) for o in range(len(self.gpus.devices))}, self._rss,
                                 self._torch_memory())

    def _torch_memory(self) -> dict[int, tuple[int, int]]:
        """(allocated, reserved) bytes per GPU of the running jobs' torch, from what their workers
        report (pita/core/worker.py writes it while torch holds CUDA memory)."""
        out: dict[int, tuple[int, int]] = {}
        if self.gpus.is_cpu:
            return out
        for jid in self.backend.running():
            try:
                m = json.loads(self.run_paths.job(jid).torch_memory.read_text())
            except (OSError, ValueError):
                continue
            ordinals = self.sched.placement.get(jid) or []
            for o in ordinals:
                a, r = out.get(o, (0, 0))
                out[o] = (a + int(m["allocated"]) // len(ordinals), r + int(m["reserved"]) // len(ordinals))
        return out

    def _explain_wait(self) -> None:
        job = self.graph[self.sched.ready()[0]]
        loads = self.sched.devices[:len(self.gpus.devices)]
        best = max((d.available() for d in loads), default=0)
        others = max((d.others() for d in loads), default=0)
        ours = sum(sum(d.reserved.values()) for d in loads)
        why = (f"other processes hold up to {others / 1e9:.2f} GB of a device" if others > 0.05 * 1e9 else
               f"this run's jobs reserve {ours / 1e9:.2f} GB in all")
        log.warning("%s waits for memory: needs %.2f GB on %d device(s), the most available is %.2f GB (%s)",
                    job.id, self.memory.estimate(job.id) / 1e9, job.resources.devices, best / 1e9, why)

    def _memory_record(self, f: Finished, job, devs) -> dict | None:
        """The attempt's memory as learning sees it (kept in its record, so a resume learns too):
        its key, what it reserved, whether that was below the planned estimate, its peak in the
        devices' unit, and whether it may teach (completed at its planned params)."""
        key = self.memory.key_of.get(f.job_id)
        if key is None or not devs:
            return None
        reserved = self.reserved.get(f.job_id, job.resources.memory_bytes)
        peak = device_peak(f.extra, self.memory.unit, self.sampled_peak.pop(f.job_id, 0))
        planned_params = self.params[f.job_id].get(job.retry.batch_param) == job.params.get(job.retry.batch_param)
        learn = (f.status == "ok" and peak is not None and planned_params and not self.oom_count[f.job_id]
                 and f.job_id not in self.memory_retried)
        return {"key": key, "reserved_bytes": reserved, "lowered": reserved < job.resources.memory_bytes,
                "peak_bytes": peak, "unit": self.memory.unit, "learn": learn}

    def _expected(self, job_id: str) -> float:
        """Seconds the scheduler expects of a job (its reservations): the plan's, corrected by
        the durations measured so far in this run and the runs before it."""
        job = self.graph[job_id]
        return self.s.durations.expected(job) if self.s.durations is not None else job.duration_hint

    def _learn_duration(self, job, record: dict, seconds: float) -> None:
        record.update(seconds=round(seconds, 3), planned_s=round(job.planned_s, 3),
                      expected_s=round(self._expected(job.id), 3))
        if self.s.durations is not None:
            key = self.s.durations.key(job)
            record["duration_key"] = key
            self.s.durations.observe(key, job.planned_s, seconds)
            try:
                self.s.durations.save()
            except OSError as e:  # a full or read-only cache: the run goes on, the lesson is lost
                log.warning("could not save learned durations to %s: %s", self.s.durations.path, e)

    def _memory_changed(self, change, level: int = logging.INFO) -> None:
        """Log a moved estimate; the state's summary follows every measurement (a few keys)."""
        if change is not None:
            log.log(level, "%s", change.line())
        self.pending_meta["memory_estimates"] = self.memory.summary()

    def _restore_memory(self, saved: dict) -> None:
        """Learn from the measured peaks an earlier run of this folder recorded."""
        self.pending_meta["memory_learning"] = {"enabled": self.s.learn_memory, "unit": self.memory.unit}
        for change in self.memory.restore(saved.get("jobs", {})):
            self._memory_changed(change)
        if not self.s.learn_memory:
            log.info("memory learning is off (executor.learn_memory=false): jobs reserve their planned estimates")
        self.pending_meta["memory_estimates"] = self.memory.summary()
        self._flush(wait=True)
