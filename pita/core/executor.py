"""The executor: runs a validated job graph on the devices, through a backend, to the end.

One loop, in the main process:
    schedule ready jobs that fit (Scheduler) -> start attempts (Backend) -> poll for ended
    attempts -> apply the failure rules -> copy job logs into run.log -> save state -> repeat

Failure rules:
    job raised            FAILED (traceback in its job.log); descendants SKIPPED; others go on
    CUDA out of memory    retried with params[batch_param] halved, at most oom_retries times
    worker died           (signal, os._exit, segfault) retried crash_retries times, then FAILED
    timeout               TERM once, KILL the job's processes after kill_grace_s, FAILED
    Ctrl-C / SIGTERM      stop scheduling, end every worker's process group, save, exit 130
    disk full             stop scheduling, end the running jobs, save what can be saved, exit 1
                          with the free space needed; the folder resumes once space is freed
    state store locked    another process holds state.db's write lock: changes wait in memory
                          (with a warning) and are written once it lets go; jobs go on
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
from dataclasses import dataclass, field

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.gpu_manager import GPUManager, jobs_rss
from pita.core.graph import JobGraph
from pita.core.job import JobState, kind_target
from pita.core.logs import LogPump
from pita.core.memlearn import MemoryLearner, device_peak
from pita.core.owner import OwnerLock
from pita.core.paths import RunPaths
from pita.core.provenance import source
from pita.core.progress import Progress
from pita.core.scheduler import Scheduler
from pita.core.state import StateBusy, StateStore, is_disk_full

log = logging.getLogger("pita.executor")
joblog = logging.getLogger("pita.executor.jobs")  # per-job start/done lines: run.log only

EXIT_INTERRUPTED = 130


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


@dataclass
class RunSummary:
    counts: dict[str, int]
    failures: list[dict] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0
    disk_full: str = ""  # the message, when the run stopped because its disk filled

    @property
    def exit_code(self) -> int:
        if self.disk_full:
            return 1
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 1 if self.counts.get("FAILED", 0) or self.counts.get("SKIPPED", 0) else 0


class DiskFull(Exception):
    """The run folder's file system is full: the run stops (and resumes once space is freed)."""


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


class Executor:
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
        self.pump = LogPump(run.run_log)
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
                if handle:
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
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

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
                if self._stop is not None:
                    return self._interrupt(t0)
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

    # ------------------------------------------------------------------ inventory
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
                        f"; its running job(s) {', '.join(running)} run again elsewhere" if running else "")
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
        self.pump.add(job_id, jp.log, launch.tag)
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
            self._handle(Finished(job_id, n, "died", None, f"backend could not start the worker: {e}"))

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

    def _report_queued(self, now: float) -> None:
        """Attempts the cluster's scheduler has kept waiting longer than executor.pending_report_s:
        its reason, in the log and in the job's state (again every pending_report_s while it waits)."""
        for jid, (reason, waited) in self.backend.queued().items():
            if waited >= self.s.pending_report_s and now - self._queue_said.get(jid, 0.0) >= self.s.pending_report_s:
                self._queue_said[jid] = now
                log.warning("%s has waited %.0f min in the cluster's queue: %s", jid, waited / 60, reason)
                self._note(jid, queue_reason=reason)

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

    # ------------------------------------------------------------------ outcomes
    def _handle(self, f: Finished) -> None:
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
            self._learn_duration(job, record, now - self.started_at[f.job_id])
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

    def _interrupt(self, t0: float) -> RunSummary:
        name = signal.Signals(self._stop).name
        running = self.backend.running()
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

    # ------------------------------------------------------------------ monitoring
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

    def _group_counts(self) -> dict[str, Counter]:
        """Jobs by group and state (a pass over every job: called only when progress is shown)."""
        out: dict[str, Counter] = {}
        for j in self.graph.jobs:
            out.setdefault(j.group or "jobs", Counter())[self.sched.state[j.id].value] += 1
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

    # ------------------------------------------------------------------ memory learning
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
