"""Devices and attempts that change under a run: GPUs that join or leave (a Ray cluster's nodes),
a run with every device gone, attempts an earlier driver left running that a resume takes over
(Slurm jobs outlive their driver), and attempts a cluster's scheduler keeps waiting in its queue.
The backend says what changed (``refresh``, ``adopt``, ``queued``); these rules are the same for
every backend."""

from __future__ import annotations

import logging
import time

from pita.core.execution.summary import RunSummary

log = logging.getLogger("pita.executor")


class Inventory:
    """Mixed into :class:`pita.core.executor.Executor`."""

    def _follow_inventory(self) -> None:
        """Devices that joined or left since the last look (the Ray backend follows its cluster)."""
        refresh = getattr(self.backend, "refresh", None)
        if refresh is None:
            return
        added, lost = refresh()
        for o, why in sorted(lost.items()):
            d = self.gpus.devices[o]
            d.lost = why
            running = self.sched.remove_device(o)
            log.warning("%s (%s) left the inventory: %s%s", d.label, d.name, why,
                        f"; its running job(s) {', '.join(running)} "
                        f"{getattr(self.backend, 'lost_device_note', 'run again elsewhere')}" if running else "")
        for d in (self.backend.devices(ordinals=added) if added else []):
            assert d.ordinal == len(self.gpus.devices), (d.ordinal, len(self.gpus.devices))
            self.gpus.devices.append(d)
            self.sched.add_device(d.total_bytes, d.node)
            log.info("%s (%s, %.1f GB) joined the inventory", d.label, d.name, d.total_bytes / 1e9)
        if added or lost:
            self.pending_meta["devices"] = [dict(d.describe(), label=d.label, **({"lost": d.lost} if d.lost else {}))
                                            for d in self.gpus.devices]
            self._no_device_since = None

    def _no_device_left(self, now: float) -> bool:
        """Every device is lost and device work is left: wait ``device_wait_s`` for one to join."""
        if self.sched.live_devices() or not self.gpus.devices or not any(
                self.graph[j].resources.devices for j in self.sched.ready()):
            self._no_device_since = None
            return False
        if self._no_device_since is None:
            self._no_device_since = now
            log.warning("every device has left the inventory; waiting up to %.0fs (executor.device_wait_s) for a "
                        "node to join", self.s.device_wait_s)
        return now - self._no_device_since > self.s.device_wait_s

    def _stop_without_devices(self, t0: float) -> RunSummary:
        log.error("no device joined within %.0fs after the last one left: stopping; the run resumes where it "
                  "stopped with resume_from=%s once the cluster has nodes again", self.s.device_wait_s,
                  self.run_paths.root.resolve())
        self._end_running("no device left")
        return self._finish(t0, interrupted=True)

    def _adopt(self, saved: dict) -> set[str]:
        """Attempts an earlier driver of this folder started that still run (Slurm jobs outlive
        their driver): the backend takes each over, on the devices it was placed on, instead of
        starting it again; what nothing takes over is ended (it would run twice)."""
        adopted: set[str] = set()
        labels = {d.label: d.ordinal for d in self.gpus.devices}
        for jid in self.sched.ready():
            entry = saved["jobs"].get(jid, {})
            handle = entry.get("handle") or {}
            if entry.get("state") != "RUNNING" and not handle and not self.backend.outlives_driver:
                continue
            job = self.graph[jid]
            ordinals = [labels.get(d.get("label"), -1) for d in entry.get("devices") or []]
            if len(ordinals) != job.resources.devices or -1 in ordinals:
                if handle:
                    log.warning("%s ran under an earlier driver (%s) on devices this inventory lacks: running it "
                                "again", jid, handle)
                continue
            n = self.attempts[jid] or 1
            launch = self._launch_for(jid, ordinals, n)
            why = self.backend.adopt(launch, handle)
            if why:
                if handle and not self.backend.outlives_driver:  # another backend's attempt: it may still run
                    log.warning("%s: %s (%s); running it again here: end that attempt yourself if it still "
                                "runs (a Slurm job: scancel %s)", jid, why, handle, handle.get("slurm_job", "<id>"))
                elif handle:
                    log.info("%s: %s; running it again", jid, why)
                continue
            if not self.sched.adopt(jid, ordinals):
                continue
            self.attempts[jid] = n
            self.reserved[jid] = self.sched.devices[ordinals[0]].reserved.get(jid, 0) if ordinals else 0
            self.started_at[jid] = float(entry.get("started") or time.time())
            self.pump.add(jid, launch.paths.log, launch.tag)
            adopted.add(jid)
            log.info("%s: taken over from the earlier driver (%s, attempt %d)", jid,
                     ", ".join(f"{k} {v}" for k, v in (handle or self.backend.handle(jid)).items()
                               if k != "submitted"), n)
        for line in self.backend.end_strays(str(self.run_paths.root)):
            log.warning("%s", line)
        return adopted

    def _report_queued(self, now: float) -> None:
        """Attempts the cluster's scheduler has kept waiting longer than executor.pending_report_s:
        its reason, in the log and in the job's state (again every pending_report_s while it waits)."""
        for jid, (reason, waited) in self.backend.queued().items():
            if waited >= self.s.pending_report_s and now - self._queue_said.get(jid, 0.0) >= self.s.pending_report_s:
                self._queue_said[jid] = now
                log.warning("%s has waited %.0f min in the cluster's queue: %s", jid, waited / 60, reason)
                self._note(jid, queue_reason=reason)
