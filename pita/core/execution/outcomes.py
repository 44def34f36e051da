"""What an ended attempt means for its job: the executor's failure rules.

    job raised            FAILED (traceback in its job.log); descendants SKIPPED; others go on
    CUDA out of memory    retried with params[batch_param] halved, at most oom_retries times; a
                          job admitted below its planned estimate first runs again at the plan
    worker died           retried crash_retries times, then FAILED
    device lost           (a Ray node gone, a Slurm job preempted or past its limit)
                          run again, not counted as the job's crash, lost_retries times
    cancelled by a person (a Slurm job scancel'ed outside pita) FAILED, with the command that
                          runs it again; descendants SKIPPED
    saved to run again    (a Slurm attempt told its time limit is near, or preempted, saved a
                          checkpoint) run again from the save, up to REQUEUE_LIMIT times
    cancelled on a stop   back to pending: a resume runs it"""

from __future__ import annotations

import logging
import signal
import time

from pita.core.backends.base import Finished
from pita.core.job import JobState
from pita.core.execution.disk import DiskFull
from pita.core.execution.summary import RunSummary

log = logging.getLogger("pita.executor")
REQUEUE_LIMIT = 100  # a job that saves and asks to run again more often than this fails
joblog = logging.getLogger("pita.executor.jobs")


class OutcomeRules:
    """Mixed into :class:`pita.core.executor.Executor`: ``_handle`` takes every ended attempt."""

    def _handle(self, f: Finished) -> None:
        if f.status == "cancelled" and self._stop is None and f.extra.get("cancelled_by"):
            # a person cancelled it (scancel): final; the job FAILS, saying how to run it again
            f = Finished(f.job_id, f.attempt, "cancelled", f.exit_code,
                         f"{f.error}; to run it again: {self.s.command or 'pita run'} "
                         f"resume_from={self.run_paths.root}", f.traceback, f.extra)
        job = self.graph[f.job_id]
        jp = self.run_paths.job(f.job_id)
        self._note(f.job_id, handle=None, queue_reason=None)
        self._queue_said.pop(f.job_id, None)
        self.pump.remove(f.job_id)
        now = time.time()
        ordinals = self.sched.placement.get(f.job_id, [])
        devs = [self.gpus.devices[o] for o in ordinals]
        where = ",".join(d.label for d in devs) or "host"
        self.timed_out.discard(f.job_id)
        record = {"n": f.attempt, "status": f.status, "start": self.started_at.get(f.job_id), "end": now,
                  "devices": [d.describe() for d in devs], "exit_code": f.exit_code, "error": f.error or None,
                  job.retry.batch_param: self.params[f.job_id].get(job.retry.batch_param), **f.extra}
        used, planned_bs = self.params[f.job_id].get(job.retry.batch_param), job.params.get(job.retry.batch_param)
        if used != planned_bs:  # an OOM (this job's or one like it) changed its size: the report says so
            record["oom_resized"] = {"param": job.retry.batch_param, "planned": planned_bs, "used": used}
        mem = self._memory_record(f, job, devs)
        if mem:
            record["memory"] = mem
        if f.status == "ok" and job.planned_s > 0 and self.started_at.get(f.job_id):
            ran = now - self.started_at[f.job_id]
            span = (f.extra.get("process_started"), f.extra.get("process_ended"))
            if self.backend.outlives_driver and all(isinstance(t, (int, float)) for t in span):
                ran = span[1] - span[0]  # a batch queue's wait is not the job's time
            self._learn_duration(job, record, ran)
        self.pending_attempts.setdefault(f.job_id, []).append(record)
        peak = f.extra.get("peak_gpu_bytes") or f.extra.get("peak_rss_bytes")
        peak_txt = f", peak {'GPU' if f.extra.get('peak_gpu_bytes') else 'RSS'} {peak / 1e9:.2f} GB" if peak else ""
        if f.status == "ok" and jp.is_done():
            self.sched.mark_completed(f.job_id)
            joblog.info("done %s on %s in %.1fs%s", f.job_id, where, f.extra.get("duration_s", 0.0), peak_txt)
            if mem and mem["learn"]:
                self._memory_changed(self.memory.observe(f.job_id, mem["peak_bytes"]))
            self._note(f.job_id, state=JobState.COMPLETED.value, finished=now, error=None,
                       duration_s=f.extra.get("duration_s"))
            return
        if f.status == "ok":  # reported success but the marker is missing: treat as a crash
            f = Finished(f.job_id, f.attempt, "died", f.exit_code, "worker reported success but wrote no .done marker")
        if f.status == "requeue":  # it saved on a signal (time limit near, preemption): again from the save
            self.requeue_count[f.job_id] += 1
            if self.requeue_count[f.job_id] <= REQUEUE_LIMIT:
                log.warning("%s on %s (attempt %d): %s; running it again (%d)", f.job_id, where, f.attempt,
                            f.error, self.requeue_count[f.job_id])
                self.sched.requeue(f.job_id)
                self._note(f.job_id, state=JobState.PENDING.value, reason="saved to run again")
                return
            f = Finished(f.job_id, f.attempt, "died", f.exit_code, f"{f.error} [asked to run again "
                         f"{REQUEUE_LIMIT} times: it never got to its end]", f.traceback, f.extra)
        if f.status == "lost":
            self.lost_count[f.job_id] += 1
            if self.lost_count[f.job_id] <= self.s.lost_retries:
                log.warning("%s lost its device on %s (attempt %d): %s; running it again (not counted as its "
                            "crash; %d of %d)", f.job_id, where, f.attempt, f.error, self.lost_count[f.job_id],
                            self.s.lost_retries)
                self.sched.requeue(f.job_id)
                self._note(f.job_id, state=JobState.PENDING.value, reason="device lost")
                return
            f = Finished(f.job_id, f.attempt, "lost", f.exit_code,
                         f"{f.error} [its device was lost {self.lost_count[f.job_id]} times; executor.lost_retries="
                         f"{self.s.lost_retries}]", f.traceback, f.extra)
        if f.status == "cancelled" and self._stop is not None:
            self.sched.requeue(f.job_id)
            self._note(f.job_id, state=JobState.PENDING.value, reason="interrupted")
            return
        if f.status != "ok" and self._out_of_space(f):
            # Not the job's fault: it runs again once space is freed (resume).
            self.sched.requeue(f.job_id)
            self._note(f.job_id, state=JobState.PENDING.value, reason="disk full")
            raise DiskFull(f"{f.job_id}: {f.error}")
        if f.status == "oom" and mem and mem["lowered"] and f.job_id not in self.memory_retried:
            # Admitted below its planned estimate: the packing, not the batch, is the likely cause.
            # Its kind goes back to the planned estimate and it runs again as planned (once).
            self._memory_changed(self.memory.distrust(f.job_id), level=logging.WARNING)
            self.memory_retried.add(f.job_id)
            log.warning("%s ran out of memory on %s (attempt %d) with a learned estimate of %.2f GB; retrying "
                        "with the planned %.2f GB and the same %s", f.job_id, where, f.attempt,
                        mem["reserved_bytes"] / 1e9, job.resources.memory_gb, job.retry.batch_param)
            self.sched.requeue(f.job_id)
            self._note(f.job_id, state=JobState.PENDING.value, reason="OOM on a learned memory estimate")
            return
        if f.status == "oom":
            limit = job.retry.oom_retries if job.retry.oom_retries is not None else self.s.oom_retries
            bs = self.params[f.job_id].get(job.retry.batch_param)
            self.oom_count[f.job_id] += 1
            if isinstance(bs, int) and bs > 1 and self.oom_count[f.job_id] <= limit:
                self.params[f.job_id][job.retry.batch_param] = bs // 2
                key = self.memory.key_of.get(f.job_id)
                if key:  # the kind's later jobs start at the smaller batch; its estimate is not lowered
                    self.oom_batch[key] = min(self.oom_batch.get(key, bs), bs // 2)
                    self._memory_changed(self.memory.distrust(f.job_id), level=logging.WARNING)
                log.warning("%s ran out of memory on %s (attempt %d); retrying with %s=%d (OOM retry %d of %d)",
                            f.job_id, where, f.attempt, job.retry.batch_param, bs // 2, self.oom_count[f.job_id], limit)
                self.sched.requeue(f.job_id)
                self._note(f.job_id, state=JobState.PENDING.value, reason="OOM retry")
                return
            why = (f"no {job.retry.batch_param} to halve" if not isinstance(bs, int)
                   else f"{job.retry.batch_param}={bs} cannot be halved" if bs <= 1
                   else f"{limit} OOM retries used (executor.oom_retries)")
            f = Finished(f.job_id, f.attempt, "oom", f.exit_code, f"{f.error} [{why}]", f.traceback, f.extra)
        if f.status == "died" and mem and mem["lowered"] and f.exit_code == -signal.SIGKILL:
            # On host memory the kernel's OOM killer answers with SIGKILL, not an exception: a job
            # killed so while admitted below its planned estimate puts its kind back on the plan.
            self._memory_changed(self.memory.distrust(f.job_id), level=logging.WARNING)
        if f.status == "died":
            limit = job.retry.crash_retries if job.retry.crash_retries is not None else self.s.crash_retries
            self.crash_count[f.job_id] += 1
            if self.crash_count[f.job_id] <= limit:
                log.warning("%s: %s on %s (attempt %d); retrying (%d of %d)", f.job_id, f.error, where,
                            f.attempt, self.crash_count[f.job_id], limit)
                self.sched.requeue(f.job_id)
                self._note(f.job_id, state=JobState.PENDING.value, reason="crash retry")
                return
        reason = f.error or f.status
        skipped = self.sched.mark_failed(f.job_id, reason)
        log.error("FAILED %s on %s (attempt %d): %s -- log: %s", f.job_id, where, f.attempt, reason, jp.log)
        self._note(f.job_id, state=JobState.FAILED.value, finished=now, error=reason)
        for s in skipped:
            self._note(s, state=JobState.SKIPPED.value, reason=f"dependency {f.job_id} failed")
        if skipped:
            log.warning("skipped %d job(s) that depend on %s", len(skipped), f.job_id)

    def _apply_oom_batch(self, job_id: str) -> None:
        """A job of a kind that already ran out of memory at its planned batch starts at the batch
        that kind was retried at (one line in the log), not at the one known to fail."""
        job = self.graph[job_id]
        key = self.memory.key_of.get(job_id)
        smaller = self.oom_batch.get(key) if key else None
        bp = job.retry.batch_param
        bs = self.params[job_id].get(bp)
        if smaller is not None and isinstance(bs, int) and bs > smaller:
            self.params[job_id][bp] = smaller
            log.info("%s starts with %s=%d instead of %d: a job like it ran out of memory at the larger one",
                     job_id, bp, smaller, bs)

    def _interrupt(self, t0: float) -> RunSummary:
        name = signal.Signals(self._stop).name
        running = self.backend.running()
        why = self.backend.driver_leaving(self._stop)
        if why:  # a driver Slurm requeues: its jobs go on, the next driver of this run takes them over
            left = self.backend.detach()
            log.warning("%s received: %s; the driver stops and leaves %d job(s) running for the next driver of this "
                        "run (it takes them over)", name, why, len(left))
            for job_id in set(running) - set(left):  # merges on the driver: run again by the next one
                self.sched.requeue(job_id)
                self._note(job_id, state=JobState.PENDING.value, reason="interrupted")
            summary = self._finish(t0, interrupted=True)
            self.backend.after_detach(self._stop)
            return summary
        if self._stop == signal.SIGUSR1:  # not a Slurm driver's warning: nothing to do about it
            log.warning("USR1 received outside a Slurm job: ignored")
            self._stop = None
            return None
        log.warning("%s received: stopping; ending %d running job(s) (grace %.0fs)", name, len(running),
                    self.s.kill_grace_s)
        self._end_running("interrupted")
        return self._finish(t0, interrupted=True)

    def _end_running(self, reason: str) -> None:
        """Stop every running job: one that finished meanwhile counts as completed, the rest go
        back to pending with ``reason`` (a resume runs them)."""
        for f in self.backend.shutdown(self.s.kill_grace_s) or []:
            self.pump.remove(f.job_id)
            if f.status == "ok" and self.run_paths.job(f.job_id).is_done():
                self.sched.mark_completed(f.job_id)
                self._note(f.job_id, state=JobState.COMPLETED.value, finished=time.time())
            else:
                self.sched.requeue(f.job_id)
                self._note(f.job_id, state=JobState.PENDING.value, reason=reason)
