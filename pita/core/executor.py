"""The executor: runs a validated job graph on the devices, through a backend, to the end.

One loop, in the main process:
    schedule ready jobs that fit (Scheduler) -> start attempts (Backend) -> poll for ended
    attempts -> apply the failure rules -> copy job logs into run.log -> save state -> repeat

Its rooms (pita/core/execution/): outcomes.py (what an ended attempt means: OOM halving,
crash and lost retries, failures and skipped dependents), memory_watch.py (NVML, RSS and torch
reports fed to the scheduler; learned memory and durations), disk.py (a full disk stops the run
resumable), inventory.py (devices that come and go, attempts taken over at resume, jobs waiting
in a cluster's queue), summary.py (how the run ended). Here: the loop, launching, timeouts
(TERM, then KILL after kill_grace_s, FAILED), Ctrl-C / SIGTERM (stop scheduling, end every
attempt, save, exit 130) and the state store (a store locked by another process: changes wait
in memory, with a warning, and are written once it lets go).
A job counts as COMPLETED only once its ``.done`` marker exists and the outputs it lists are
there, so a resumed run redoes exactly the jobs that did not finish (or lost their outputs).
The executor owns the run folder while it runs (:mod:`pita.core.owner`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import time
from typing import Any
from collections import Counter
from dataclasses import dataclass

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.execution.disk import DiskFull, DiskSpace
from pita.core.execution.inventory import Inventory
from pita.core.execution.memory_watch import MemoryWatch, torch_usage
from pita.core.execution.outcomes import OutcomeRules
from pita.core.execution.summary import EXIT_INTERRUPTED, RunSummary
from pita.core.gpu_manager import GPUManager
from pita.core.graph import JobGraph
from pita.core.job import JobState, kind_target
from pita.core.logs import LogPump
from pita.core.memlearn import MemoryLearner
from pita.core.owner import OwnerLock
from pita.core.paths import RunPaths
from pita.core.provenance import source
from pita.core.progress import Progress
from pita.core.scheduler import Scheduler
from pita.core.state import StateBusy, StateStore, is_disk_full

# RunSummary, EXIT_INTERRUPTED, DiskFull and torch_usage are imported from here too
__all__ = ["Executor", "ExecutorSettings", "RunSummary", "EXIT_INTERRUPTED", "DiskFull", "torch_usage"]

log = logging.getLogger("pita.executor")
joblog = logging.getLogger("pita.executor.jobs")  # per-job start/done lines: run.log only


@dataclass
class ExecutorSettings:
    oom_retries: int = 2
    crash_retries: int = 0
    job_timeout_s: float | None = None
    kill_grace_s: float = 10.0
    poll_interval_s: float = 0.1
    memory_margin: float = 0.05
    max_jobs_per_device: int | None = None
    max_cpu_jobs: int | None = None
    starvation_passes: int | None = 50
    gpu_summary_interval_s: float = 60.0
    memory_refresh_s: float = 2.0
    progress: str = "auto"
    progress_interval_s: float = 30.0
    threads_per_job: int | None = None
    max_running: int | None = None  # jobs running at once in all (system.use_parallel_execution=false: 1)
    min_free_gb: float = 1.0  # said when the disk fills: free at least this much, then resume
    snapshot_interval_s: float = 30.0  # state.json rewritten at most this often (and at the end)
    learn_memory: bool = True  # refine estimates from finished jobs' measured peaks (pita/core/memlearn.py)
    host_bytes: int | None = None  # the node's RAM the jobs' host estimates share (GPU runs; None: not counted)
    # measured / planned seconds per job kind (pita.plans.durations.DurationLearner): corrects the
    # expected durations reservations use, learns from every finished attempt, saved to its cache
    durations: Any = None
    # attempts whose device left (a Ray node lost) rerun without counting as the job's crash, up
    # to this many times per job; beyond, the job fails (something keeps taking its device away)
    lost_retries: int = 5
    # every device lost and work left: wait this long for a node to join, then stop (resumable)
    device_wait_s: float = 600.0
    # an attempt waiting in the cluster's queue (Slurm) longer than this is reported with the
    # scheduler's reason, and again every as long while it waits
    pending_report_s: float = 300.0
    command: str = ""  # how pita was started (``pita run``, ``python run_parallel.py``): resume hints repeat it


class Executor(OutcomeRules, MemoryWatch, DiskSpace, Inventory):
    """The loop and what it owns: the job graph's state, attempts, launches, timeouts and the
    state store. Each other concern is a room of its own (pita/core/execution/): what an ended
    attempt means (outcomes), what the devices' memory says (memory_watch), a full disk (disk),
    and devices that come and go, attempts taken over at resume and jobs kept in a cluster's
    queue (inventory). A backend adds only how an attempt starts, ends and is reported."""

    def _threads(self, ordinals: list[int]) -> int | None:
        """A job's thread budget: the threads of every logical device it holds (a job that holds
        both devices of a 2-core machine runs on both cores); a Ray node's device brings its own
        share of that node's cores."""
        own = [self.gpus.devices[o].threads for o in ordinals]
        if own and all(own):
            return sum(own)
        t = self.s.threads_per_job
        return t * max(1, len(ordinals)) if t else t

    def __init__(self, graph: JobGraph, gpus: GPUManager, backend: Backend, run: RunPaths,
                 settings: ExecutorSettings, config: dict | None = None, owner: OwnerLock | None = None):
        self.graph, self.gpus, self.backend, self.run_paths = graph, gpus, backend, run
        self.s = settings
        self.config = config or {}
        self.owner = owner  # None: taken (and released) by run()
        # A short busy timeout: if another process holds the database, the loop goes on and the
        # changes wait in memory (see _flush) rather than the run stalling or crashing.
        self.state = StateStore(run.state, busy_timeout_s=0.5)
        totals = [d.total_bytes for d in gpus.devices]
        # Learned estimates are in the unit the devices' capacity is counted in (GPU memory, or
        # host memory shared out on CPU devices), capped so that a job always fits some device.
        self.memory = MemoryLearner(graph, "rss" if gpus.is_cpu else "gpu",
                                    int(max(totals, default=0) * (1 - settings.memory_margin)),
                                    enabled=settings.learn_memory)
        self.sched = Scheduler(graph, totals, settings.memory_margin,
                               settings.max_jobs_per_device, settings.max_cpu_jobs, settings.starvation_passes,
                               max_running=settings.max_running, estimate=self.memory.estimate,
                               host_bytes=settings.host_bytes, clock=time.monotonic, duration=self._expected,
                               device_nodes=[getattr(d, "node", "") for d in gpus.devices])
        self.reserved: dict[str, int] = {}  # running job -> bytes reserved per device at its start
        self.sampled_peak: Counter = Counter()  # running job -> most NVML saw its processes use on a device
        self.memory_retried: set[str] = set()  # jobs retried after an OOM on a lowered estimate
        self.params = {j.id: copy.deepcopy(j.params) for j in graph.jobs}
        self.attempts: dict[str, int] = {}
        self.oom_count: Counter = Counter()
        # memory key -> the batch (params[batch_param]) a job of that kind was retried at after an
        # OOM at its planned estimate: later jobs of the kind start there instead of failing first
        self.oom_batch: dict[str, int] = {}
        self.crash_count: Counter = Counter()
        self.lost_count: Counter = Counter()
        self.requeue_count: Counter = Counter()  # saved on a signal and ran again
        self._no_device_since: float | None = None
        self.started_at: dict[str, float] = {}
        self.pending_state: dict[str, dict] = {}
        self.pending_attempts: dict[str, list[dict]] = {}
        self.pending_meta: dict = {}
        self.timed_out: set[str] = set()
        self._busy_since: float | None = None
        self._busy_note = 0.0
        self._last_snapshot = 0.0
        self._snapshot_cost = 0.0
        self._stop: int | None = None
        self._queue_said: dict[str, float] = {}  # job -> when its wait in the cluster's queue was last reported
        self._rss: dict[int, int] = {}  # CPU devices: RSS of their running jobs (bytes), as last measured
        # a cluster's jobs write to a shared file system: their logs are read every half minute
        # (and whole when they end), not at every tick
        self.pump = LogPump(run.run_log, min_interval_s=30.0 if backend.outlives_driver else 0.0)
        self.progress = Progress(settings.progress, settings.progress_interval_s)

    # ------------------------------------------------------------------ state helpers
    def _note(self, job_id: str, **fields) -> None:
        self.pending_state.setdefault(job_id, {}).update(fields)

    def _flush(self, wait: bool = False) -> bool:
        """Write the tick's changes in one transaction; True once nothing is pending.

        If another process holds the database, the changes stay in memory and the loop goes on
        (a warning now and then); with ``wait`` (start and end of the run) this waits for it."""
        while self.pending_state or self.pending_attempts or self.pending_meta:
            try:
                self.state.apply(self.pending_state, self.pending_attempts, self.pending_meta)
            except StateBusy as e:
                now = time.time()
                self._busy_since = self._busy_since or now
                if now - self._busy_note >= 10:
                    self._busy_note = now
                    log.warning("the state store is locked by another process (%s) for %.0fs now; %s %d job "
                                "change(s) in memory (the jobs' results are safe in their folders)", e,
                                now - self._busy_since, "waiting to write" if wait else "running on, keeping",
                                len(self.pending_state) + len(self.pending_attempts))
                if not wait:
                    return False
                time.sleep(0.5)
                continue
            except Exception as e:
                if is_disk_full(e):
                    raise DiskFull(str(e)) from e
                raise
            if self._busy_since is not None:
                log.info("the state store is free again after %.0fs; changes written", time.time() - self._busy_since)
                self._busy_since = None
            self.pending_state, self.pending_attempts, self.pending_meta = {}, {}, {}
        return True

    def _snapshot(self, force: bool = False) -> None:
        """state.json for people and the report; rewritten at most every snapshot_interval_s (and
        never taking more than ~5% of the loop's time), so its cost does not grow per job."""
        now = time.time()
        if not force and now - self._last_snapshot < max(self.s.snapshot_interval_s, 20 * self._snapshot_cost):
            return
        t = time.perf_counter()
        try:
            self.state.write_snapshot()
        except Exception as e:
            if is_disk_full(e):
                raise DiskFull(str(e)) from e
            raise
        self._snapshot_cost = time.perf_counter() - t
        self._last_snapshot = now

    # ------------------------------------------------------------------ setup
    def _record_unwatched(self, job_id: str, entry: dict) -> None:
        """An attempt that ended while no driver watched it (a Slurm job of a driver that was away):
        its record from the outcome it wrote, so the job's history has it."""
        n = int(entry.get("attempt") or 1)
        jp = self.run_paths.job(job_id)
        try:
            outcome = json.loads(jp.attempt(n).read_text())
        except (OSError, ValueError):
            outcome = {}
        record = {"n": n, "status": outcome.get("status", "ok"), "start": entry.get("started"),
                  "end": outcome.get("process_ended"), "devices": entry.get("devices", []),
                  "note": "ended while no driver watched it", **{k: v for k, v in outcome.items() if k != "status"},
                  **self.backend.ended_unwatched(jp, n, entry.get("handle") or {})}
        entry.setdefault("attempts", []).append(record)
        entry.update(handle=None, finished=record["end"])

    def _init_state(self) -> None:
        """Register every job; keep COMPLETED those whose marker and outputs exist, reset the rest."""
        saved = self.state.read()
        devices = [dict(d.describe(), label=d.label) for d in self.gpus.devices]
        resumed, redo = 0, {}
        done = {}
        for j in self.graph.jobs:
            jp = self.run_paths.job(j.id)
            problem = jp.done_problem()
            done[j.id] = problem is None
            if problem is not None and problem != "no .done marker":
                redo[j.id] = problem

        def apply(data):
            nonlocal resumed
            data.setdefault("created", time.time())
            data["version"] = 2
            data["devices"] = devices
            data.setdefault("runs", []).append({"started": time.time(), "pid": os.getpid(),
                                                "backend": self.backend.name, "pita": source(),
                                                **({"command": self.s.command} if self.s.command else {})})
            for j in self.graph.jobs:
                entry = data["jobs"].setdefault(j.id, {})
                entry.update(kind=j.kind, group=j.group, deps=j.deps, log=f"jobs/{j.id}/job.log",
                             fingerprint=j.fingerprint())
                if done[j.id]:
                    if entry.get("state") == JobState.RUNNING.value and entry.get("handle"):
                        self._record_unwatched(j.id, entry)
                    entry["state"] = JobState.COMPLETED.value
                    resumed += 1
                else:
                    entry.update(state=JobState.PENDING.value, error=None, reason=redo.get(j.id))

        while True:
            try:
                self.state.update(apply)
                break
            except StateBusy as e:
                log.warning("waiting for the state store, locked by another process (%s)", e)
                time.sleep(1.0)
            except Exception as e:
                if is_disk_full(e):
                    raise DiskFull(str(e)) from e
                raise
        for jid, why in redo.items():
            log.warning("re-running %s: %s", jid, why)
        for j in self.graph.jobs:
            if done[j.id]:
                self.sched.mark_completed(j.id)
            entry = saved["jobs"].get(j.id, {})
            prior = entry.get("attempts", [])
            # an attempt an earlier driver started and never recorded the end of keeps its number
            self.attempts[j.id] = max([a.get("n", 0) for a in prior] + [int(entry.get("attempt") or 0)
                                                                        if entry.get("state") == "RUNNING" else 0])
        adopted = self._adopt(saved)
        for j in self.graph.jobs:
            jp = self.run_paths.job(j.id)
            if not done[j.id] and j.id not in adopted and jp.dir.exists():
                jp.clear_for_rerun()
        if resumed:
            log.info("resume: %d of %d jobs already completed; running the other %d",
                     resumed, len(self.graph), len(self.graph) - resumed)
        self._restore_memory(saved)
        self._snapshot(force=True)

    # ------------------------------------------------------------------ main loop
    def run(self) -> RunSummary:
        t0 = time.time()
        own = self.owner is None
        if own:
            self.owner = OwnerLock(self.run_paths.root)
            note = self.owner.acquire()
            if note:
                log.warning("%s", note)
        try:
            return self._run(t0)
        finally:
            self.state.close()
            if own:
                self.owner.release()

    def _run(self, t0: float) -> RunSummary:
        try:
            self._init_state()
        except DiskFull as e:
            self.backend.close()
            return self._disk_full(t0, e)
        log.info("%d jobs on %d device(s) [%s] with the %s backend", len(self.graph), len(self.gpus.devices),
                 self.gpus.source, self.backend.name)
        for line in self.gpus.summary():
            log.info("%s", line)
        joblog.info("run.log leaves out the jobs' progress bars and per-step metric dicts; every line is in "
                    "jobs/<id>/job.log, the metrics in jobs/<id>/metrics.jsonl")
        # USR1: a driver that is itself a Slurm job is told its time limit is near (--signal=B:USR1@...)
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}

        def on_signal(signum, frame):
            if self._stop is not None:  # a second Ctrl-C: stop waiting for the grace period
                self.s.kill_grace_s = 0.0
            self._stop = signum

        for s in old:
            signal.signal(s, on_signal)
        self.progress.start()
        last_summary = last_refresh = time.time()
        last_wait_note = 0.0
        try:
            while not self.sched.done():
                if self._stop is not None and (summary := self._interrupt(t0)) is not None:
                    return summary
                now = time.time()
                try:
                    if now - last_refresh >= self.s.memory_refresh_s:
                        self._observe_memory()
                        last_refresh = now
                    self._follow_inventory()
                    if self._no_device_left(now):
                        return self._stop_without_devices(t0)
                    started = self.sched.schedule()
                    for job_id, ordinals in started:
                        self._launch(job_id, ordinals)
                    if not started and not self.backend.running() and self.sched.ready() and now - last_wait_note > 60:
                        last_wait_note = now
                        self._explain_wait()
                    for f in self.backend.poll(timeout=self.s.poll_interval_s):
                        self._handle(f)
                    self._check_timeouts()
                    self._report_queued(now)
                    self.pump.pump()
                    self._flush()
                    self._snapshot()
                except DiskFull as e:
                    return self._disk_full(t0, e)
                except OSError as e:
                    if is_disk_full(e):
                        return self._disk_full(t0, e)
                    raise
                if now - last_summary >= self.s.gpu_summary_interval_s:
                    last_summary = now
                    for line in self._device_lines():
                        log.info("%s", line)
                if self.progress.due():
                    self.progress.update(self._group_counts(), self._device_lines())
            self.progress.update(self._group_counts(), self._device_lines(), force=True)
            try:
                return self._finish(t0, interrupted=False)
            except DiskFull as e:
                return self._disk_full(t0, e)
        finally:
            self.progress.stop()
            for s, h in old.items():
                signal.signal(s, h)
            self.pump.close()
            self.backend.close()

    # ------------------------------------------------------------------ launching
    def _launch_for(self, job_id: str, ordinals: list[int], n: int) -> Launch:
        """Attempt ``n`` of a job on the devices ``ordinals``, as its worker reads it."""
        job = self.graph[job_id]
        devs = [self.gpus.devices[o] for o in ordinals]
        labels = ",".join(d.label for d in devs) or "host"
        return Launch(job=dict(job.to_dict(), params=self.params[job_id]), target=kind_target(job.kind), attempt=n,
                      run_dir=str(self.run_paths.root), config=self.config,
                      devices=[dict(d.describe(), label=d.label) for d in devs],
                      env=self.gpus.env_for(ordinals, self._threads(ordinals)), paths=self.run_paths.job(job_id),
                      tag=f"{job_id} {labels}", fingerprint=job.fingerprint())

    def _launch(self, job_id: str, ordinals: list[int]) -> None:
        job = self.graph[job_id]
        self.attempts[job_id] += 1
        n = self.attempts[job_id]
        devs = [self.gpus.devices[o] for o in ordinals]
        jp = self.run_paths.job(job_id)
        jp.dir.mkdir(parents=True, exist_ok=True)
        reserve = self.sched.devices[ordinals[0]].reserved.get(job_id, 0) if ordinals else 0
        self.reserved[job_id] = reserve
        self.sampled_peak.pop(job_id, None)
        self._apply_oom_batch(job_id)
        launch = self._launch_for(job_id, ordinals, n)
        self.pump.add(job_id, self.backend.log_path(launch), launch.tag)
        self.started_at[job_id] = time.time()
        where = ", ".join(f"{d.label} ({d.uuid})" for d in devs) or "host"
        planned = job.resources.memory_bytes
        joblog.info("start %s on %s, attempt %d%s", job_id, where, n,
                    (f", reserving {reserve / 1e9:.2f} GB per device"
                     + (f" (learned; planned {planned / 1e9:.2f} GB)" if reserve != planned else "")) if devs else "")
        self._note(job_id, state=JobState.RUNNING.value, started=self.started_at[job_id], attempt=n,
                   devices=[dict(d.describe(), label=d.label) for d in devs])
        try:
            self.backend.start(launch)
            if handle := self.backend.handle(job_id):  # a resumed driver finds the attempt by it
                self._note(job_id, handle=handle)
                self._flush()
        except Exception as e:  # the backend could not start it: a failure of this job, not of the run
            if is_disk_full(e):
                self.sched.requeue(job_id)
                self._note(job_id, state=JobState.PENDING.value, reason="disk full")
                raise DiskFull(f"{e} (starting {job_id})") from e
            log.exception("could not start %s", job_id)
            # an exception may say it is final (status "error": a refusal that waiting cannot change)
            self._handle(Finished(job_id, n, getattr(e, "status", "died"), None,
                                  f"backend could not start the worker: {e}"))

    def _check_timeouts(self) -> None:
        """A job past its limit gets TERM once; the backend KILLs its processes kill_grace_s later
        (a job that ignores TERM, or is stopped, still ends), and it is reported FAILED."""
        now = time.time()
        for job_id in self.backend.running():
            if job_id in self.timed_out:
                continue
            job = self.graph[job_id]
            limit = job.retry.timeout_s if job.retry.timeout_s is not None else self.s.job_timeout_s
            if limit and now - self.started_at.get(job_id, now) > limit:
                self.timed_out.add(job_id)
                log.warning("%s ran past its timeout of %.1fs; sending TERM, then KILL after %gs "
                            "(executor.kill_grace_s)", job_id, limit, self.s.kill_grace_s)
                self.backend.kill(job_id, status="timeout", reason=f"timed out after {limit:g}s",
                                  grace_s=self.s.kill_grace_s)

    # ------------------------------------------------------------------ the end
    def _finish(self, t0: float, interrupted: bool) -> RunSummary:
        counts = self.sched.counts()
        summary = RunSummary(counts, interrupted=interrupted, wall_s=time.time() - t0)
        self._flush(wait=True)
        for jid, st in self.sched.state.items():
            if st == JobState.FAILED:
                entry = self.state.job(jid)
                devs = ",".join(d.get("label", "") for d in entry.get("devices", [])) or "host"
                summary.failures.append({"job": jid, "device": devs, "error": self.sched.reason.get(jid, ""),
                                         "log": str(self.run_paths.job(jid).log)})
        while True:
            try:
                self.state.apply(meta={"finished": time.time(), "counts": counts, "interrupted": interrupted})
                break
            except StateBusy:
                time.sleep(0.5)
            except Exception as e:
                if is_disk_full(e):
                    raise DiskFull(str(e)) from e
                raise
        self._snapshot(force=True)
        log.info("%s after %.1fs: %d completed, %d failed, %d skipped, %d not run",
                 "interrupted" if interrupted else "finished", summary.wall_s, counts["COMPLETED"],
                 counts["FAILED"], counts["SKIPPED"], counts["PENDING"] + counts["RUNNING"])
        for fl in summary.failures:
            log.error("failed: %s on %s: %s (log: %s)", fl["job"], fl["device"], fl["error"], fl["log"])
        return summary

    def _group_counts(self) -> dict[str, Counter]:
        """Jobs by group and state (a pass over every job: called only when progress is shown)."""
        out: dict[str, Counter] = {}
        for j in self.graph.jobs:
            out.setdefault(j.group or "jobs", Counter())[self.sched.state[j.id].value] += 1
        return out

