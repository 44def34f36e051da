"""The Slurm backend: each job attempt is one Slurm job, submitted with ``sbatch``.

The orchestrator (the driver) runs where the user starts it, on a login node or inside a small
Slurm job of its own, and keeps everything it keeps with the other backends: the job graph, the
scheduler's order and placement, retries, OOM halving, fail-fast, resume. What it hands Slurm is
one attempt at a time, asking for what the plan gives the job:

    sbatch --parsable -J pita:<job id> -o <job dir>/job.log --open-mode=append -N 1 -n 1
           -c <cpus> --mem=<host GB>G --time=<expected x margin> [--gres=gpu:<k>]
           [-p partition] [-A account] [-q qos] [-C constraint] <extra sbatch args>
           <job dir>/slurm-<attempt>.sh     (exec python -m pita.core.worker <job dir>/launch.json)

The worker writes its outcome next to its launch file, as under the local backend, so the run
folder must be on a filesystem the cluster's nodes share. Slurm's own end states are read with
``squeue`` while a job is known there and ``scontrol show job`` after (``sacct`` where
accounting is kept); how each maps:

    COMPLETED, FAILED, OUT_OF_MEMORY   the worker's outcome and exit code (ok, error, oom, died)
    PREEMPTED, NODE_FAIL, BOOT_FAIL, DEADLINE
                                       "lost": run again, not counted as the job's crash
                                       (executor.lost_retries), like a Ray node that left
    CANCELLED (not by pita)            a person's word: final ("cancelled", the job FAILED with
                                       who cancelled it and the command that runs it again)
    TIMEOUT                            "lost" once: the next attempt asks twice the time limit
                                       (never past MaxTime or the QoS's MaxWall; the factor is
                                       kept in the job's folder, so a resume keeps it); a second
                                       TIMEOUT, or one at the longest limit, fails the job

Jobs that hold no device (merges) run on the driver, as local workers. Killing an attempt is
``scancel --signal=TERM`` then ``scancel`` after the grace period; a driver that stops cancels
every job it submitted; a driver that is killed leaves them running, and a resumed one takes
them over (``handle``/``adopt``/``end_strays``). Attempts kept waiting in the queue are reported
with squeue's reason (``queued``). GPU jobs leave ``CUDA_VISIBLE_DEVICES`` to
Slurm (its GRES plugin sets it to the allocation); CPU jobs keep the driver's empty one.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.paths import atomic_write_json

# Slurm end states of an attempt the job did not cause: run again elsewhere (lost_retries)
LOST_STATES = ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "CANCELLED", "TIMEOUT")
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                 "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")


def _run(args: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


# squeue's pending reasons (%r) a user meets most, and what to do about each
PENDING_REASONS = {
    "Resources": "the partition's nodes are busy; it starts when enough GPUs, CPUs and memory free up",
    "Priority": "jobs of higher priority come first (sprio shows the factors)",
    "None": "the scheduler has not looked at it yet",
    "PartitionTimeLimit": "its --time exceeds the partition's MaxTime: lower executor.slurm.time_margin or choose "
                          "another executor.slurm.partition",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "ReqNodeNotAvail": "the nodes that could run it are down, drained or reserved (sinfo -R says why)",
    "BadConstraints": "no node has executor.slurm.constraint's features with the GPUs, CPUs and memory asked for",
    "QOSMaxJobsPerUserLimit": "the QoS caps your running jobs; it starts when one of yours ends",
    "QOSMaxGRESPerUser": "the QoS caps the GPUs you hold at once; it starts when one of your jobs ends",
    "AssocGrpGRES": "the account's GPU allowance is in use; it starts when the account's jobs free GPUs",
    "AssocMaxJobsLimit": "the account caps its running jobs",
    "InvalidAccount": "executor.slurm.account is not an account of yours on this partition",
    "InvalidQOS": "executor.slurm.qos is not allowed for this account or partition",
    "Dependency": "it waits for another job",
    "JobHeldAdmin": "an administrator holds it (scontrol release needs one)",
    "JobHeldUser": "it is held (scontrol release <id> lets it go)",
}


def pending_reason(reason: str) -> str:
    """Slurm's pending reason with what it means, where known."""
    r = reason or "None"
    key = next((k for k in PENDING_REASONS if r == k or r.startswith(k + ",") or r.startswith(k + " ")), None)
    return f"{r} ({PENDING_REASONS[key]})" if key else r


def slurm_seconds(text: str) -> float | None:
    """Seconds of a Slurm duration (``30``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``); None for
    UNLIMITED / INFINITE / NONE."""
    t = (text or "").strip()
    if not t or t.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    days = 0
    if "-" in t:
        d, t = t.split("-", 1)
        days = int(d)
        parts = [int(x) for x in t.split(":")] + [0] * (3 - len(t.split(":")))  # D-HH, D-HH:MM, D-HH:MM:SS
    else:
        parts = [int(x) for x in t.split(":")]
        parts = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]  # minutes, MM:SS, HH:MM:SS
    h, m, sec = parts[:3]
    return float(days * 86400 + h * 3600 + m * 60 + sec)


def submit_env() -> dict[str, str]:
    """The environment sbatch runs in: the driver's, without the SLURM_* variables of an allocation
    it may itself run in (a driver submitted with sbatch): its job id, CPUs and memory would
    otherwise leak into each job's request and environment. SLURM_CONF and SBATCH_* stay."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def limit_seconds(seconds: float, margin: float, min_minutes: int, max_s: float | None = None,
                  factor: float = 1.0) -> int:
    """A Slurm time limit in seconds: ``seconds`` x ``margin``, at least ``min_minutes``, times
    ``factor`` (2 after one TIMEOUT, 4 after two), at most ``max_s`` (the partition's MaxTime: a
    longer request would wait in the queue forever)."""
    s = int(math.ceil(max(min_minutes * 60, math.ceil(seconds * margin)) * factor))
    return min(s, int(max_s)) if max_s else s


def slurm_time(s: int) -> str:
    """Seconds as Slurm writes a duration (``D-HH:MM:SS``)."""
    d, rem = divmod(int(s), 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}"


def time_limit(seconds: float, margin: float, min_minutes: int, max_s: float | None = None, factor: float = 1.0) -> str:
    """:func:`limit_seconds` as ``--time`` takes it."""
    return slurm_time(limit_seconds(seconds, margin, min_minutes, max_s, factor))


def warning_margin(limit_s: float, wanted_s: float) -> int | None:
    """Seconds before a ``limit_s`` time limit that Slurm warns the attempt (``--signal=B:USR1@``):
    ``wanted_s``, at most a quarter of the limit (a margin as long as the limit would warn at the
    start); None, no warning at all, where even that could come in the limit's first quarter,
    since Slurm may send it up to a minute early (limits under 2 minutes)."""
    margin = int(min(wanted_s, WARNING_SHARE * limit_s))
    if margin < 1 or limit_s - margin - WARNING_EARLY_S < WARNING_SHARE * limit_s:
        return None
    return margin


@dataclass
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    sbatch_args: list[str] = field(default_factory=list)
    cpus_per_job: int = 1  # per device job (merges: 1)
    time_margin: float = 2.0  # time limit = expected seconds x this
    min_minutes: int = 10
    poll_interval_s: float = 5.0  # squeue at most this often after a change; doubles while nothing does
    max_poll_interval_s: float = 60.0
    # --mem when the plan gives a GPU job no host estimate (CPU devices: their reservation); never
    # left out: without --mem a cluster with no DefMemPerNode gives a job the whole node's memory
    mem_gb: float = 4.0
    pending_report_s: float = 300.0  # a job queued longer than this is reported with Slurm's reason
    max_time_s: float | None = None  # the partition's MaxTime (read at start): no --time beyond it
    max_jobs: int | None = None  # jobs in flight at most (None: max_share, and the association's and QoS's limits)
    max_share: float = 0.25  # max_jobs None: at most this share of the partition's usable devices in flight (>= 4)
    oom_mem_factor: float = 1.5
    oom_mem_retries: int = 2
    signal_margin_s: int = 120
    outcome_wait_s: float = 60.0
    max_node_mem_mb: int | None = None  # the partition's largest node (read at start): --mem stops there
    unknown_s: float = 900.0  # a job no Slurm command knows, with no outcome file, for this long: lost
    # attempts planned shorter than this run in packs (pita.core.backends.pack: one allocation, one
    # warm interpreter, several attempts one after another); 0: every attempt is a Slurm job of its own
    pack_below_s: float = 0.0
    pack_time_s: float = 3600.0  # a pack's --time (at most the partition's MaxTime)
    pack_idle_s: float = 60.0  # a pack with nothing to run leaves after this long
    partition_refresh_s: float = 300.0  # the partition's nodes read again this often (drained, returned)


# sbatch refusals that name a limit on how many jobs you have queued: they clear as your jobs end
SUBMIT_LIMIT_REASONS = ("MaxSubmitJob", "MaxSubmitJobs", "GrpSubmitJob", "job submit limit")
OUTCOME_LOOK_S = 2.0  # running attempts' outcome files are looked for this often (a stat each)
# pending reasons that never clear by waiting: the attempt is cancelled and fails with the reason
NEVER_CLEARS = ("BadConstraints", "PartitionNodeLimit", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied",
                "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit", "QOSMaxGRESPerJob",
                "QOSMaxCpuPerJobLimit", "QOSMaxMemoryPerJob", "AssocMaxGRESPerJob", "AssocMaxCpuPerJobLimit",
                "AssocMaxMemPerJob", "QOSMinGRES", "AccountNotAllowed")
NEVER_CLEARS_AFTER_S = 60.0  # seen this long first (a reason can be transient while the scheduler looks)
# sbatch refusals that waiting cannot change (anything else, a limit or a timeout, is retried)
_FINAL_REFUSALS = ("invalid", "unrecognized option", "requested node configuration is not available",
                   "unable to allocate resources: requested partition configuration not available")


QUERY_TIMEOUT_S = 30.0  # a Slurm query slower than this counts as no answer
DEFAULT_IN_FLIGHT = 4  # executor.slurm.max_share never keeps fewer jobs in flight than this
# a batch script's first command: Slurm's warning ignored from there, through the ``exec`` into the
# worker (or the pack) and the interpreter's start-up (an ignored signal stays ignored across exec),
# until the process holds it itself (pita.core.preempt.hold); by default USR1 would end it
HOLD_WARNING = "trap '' USR1\n"
# sbatch(1): "the signal may be sent up to 60 seconds earlier than specified" (the controller
# looks at time limits periodically)
WARNING_EARLY_S = 60
WARNING_SHARE = 0.25  # the warning margin is at most this share of the attempt's time limit


def _try(args: list[str], timeout: float | None = None) -> subprocess.CompletedProcess | None:
    """A Slurm query; None when it could not answer (not found, timed out, refused). Never raises:
    a controller away for minutes is a slow answer, never a verdict on a job."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, env=submit_env(),
                             timeout=QUERY_TIMEOUT_S if timeout is None else min(timeout, QUERY_TIMEOUT_S))
    except (subprocess.TimeoutExpired, OSError):
        return None
    return out if out.returncode == 0 else None


def _wait_status(code: str) -> int | None:
    """An exit code from squeue's ``exit_code`` (a wait status: code << 8, or the signal) or
    scontrol's/sacct's ``code:signal``; negative for a signal."""
    code = (code or "").strip()
    try:
        if ":" in code:
            a, sig = code.split(":")[:2]
            return -int(sig) if int(sig or 0) else int(a)
        st = int(code)
    except ValueError:
        return None
    return -(st & 0x7F) if st & 0x7F else st >> 8


@dataclass
class _Sub:
    launch: Launch
    slurm_id: str
    submitted: float
    gpus: int
    forced: str | None = None
    reason: str = ""
    term_sent: float | None = None
    grace_s: float = 10.0
    state: str = "PENDING"
    state_reason: str = ""
    started: float | None = None  # when squeue first showed it running
    time_limit: str = ""  # the --time it was submitted with
    mem_gb: float = 0.0  # the --mem it was submitted with
    end: tuple[str, int | None] | None = None  # Slurm's end state, once read
    ended_seen: float | None = None  # when Slurm first said it ended (its outcome file may lag: NFS)
    unknown_since: float | None = None  # since when no Slurm command knows it
    never_since: float | None = None  # since when it pends for a reason that cannot clear
    requeues: int = 0  # times Slurm put it back in the queue after it ran (preemption)
    outcome_seen: float | None = None  # when its outcome file was first seen (it is ending)


@dataclass
class _Held:
    """An attempt pita has not submitted yet: the run's limit of jobs in flight is reached, or
    sbatch refused it for now (a submit limit, a timeout); tried again with backoff."""
    launch: Launch
    args: list[str]
    script: str
    since: float
    next_try: float = 0.0
    tries: int = 0
    why: str = ""


@dataclass
class _Task:
    """An attempt that runs in a pack: waiting for one (``pack`` None), handed to one
    (its task.json written), or running in it (the pack renamed task.json)."""
    launch: Launch
    key: tuple
    since: float
    mem_gb: float = 0.0
    pack: "_Pack | None" = None
    assigned: float | None = None
    taken: float | None = None
    forced: str | None = None
    reason: str = ""
    lost_since: float | None = None  # its pack ended without a done file: its outcome is waited for
    limit_s: float = 0.0  # its own time limit inside the pack (the --time a job of its own would ask)
    warn_s: int = 0  # USR1 this long before that limit (--signal=B:USR1@ of a job of its own)
    done_seen: float | None = None  # its done file first read (its outcome, or its pack's end, may lag)


@dataclass
class _Pack:
    """A Slurm job running ``pita.core.backends.pack``: one allocation of ``args``'s size."""
    name: str
    key: tuple
    args: list[str]
    dir: "os.PathLike"
    submitted: float
    limit_s: float
    mem_gb: float = 0.0
    slurm_id: str = ""
    started: float | None = None  # its started file seen
    state: str = "PENDING"
    end: tuple[str, int | None] | None = None
    unknown_since: float | None = None
    task: _Task | None = None
    closed: bool = False
    surplus_since: float | None = None
    stopped: bool = False  # told to stop (the run is over)

    def remaining(self, now: float) -> float:
        return self.limit_s - (now - self.started if self.started is not None else 0.0)


PACK_LOOK_S = 1.0  # packs' files (started, running, done, closed) are looked at this often
PACK_SURPLUS_S = 15.0  # a queued pack no waiting attempt needs for this long is cancelled
PACK_KILL_GRACE_S = 30.0  # an attempt past its own limit in a pack: KILL this long after TERM (Slurm's KillWait)


class SlurmBackend(Backend):
    name = "slurm"
    outlives_driver = True

    def __init__(self, settings: SlurmSettings | None = None, kill_grace_s: float = 10.0,
                 python: str | None = None):
        self.s = settings or SlurmSettings()
        self.kill_grace_s = kill_grace_s
        self.python = python or sys.executable
        self.subs: dict[str, _Sub] = {}
        self.held: dict[str, _Held] = {}
        self.time_factor: dict[str, float] = {}  # a job that hit its limit: twice the limit next time
        self.mem_factor: dict[str, float] = {}  # a job that ran out of host memory: more --mem next time
        self.host_ooms: dict[str, int] = {}
        self.cap: int | None = self.s.max_jobs  # jobs in flight at most (set_limits: the user's limits)
        self.cap_why = "executor.slurm.max_jobs" if self.s.max_jobs else ""
        self.gpu_cap: int | None = None  # GPUs in flight at most (set_gpu_limit: GrpTRES, MaxTRESPU)
        self.gpu_cap_why = ""
        self._sized: set[str] = set()  # job folders whose saved sizing (slurm-sizing.json) was read
        self.devices_n = 0  # the partition's usable devices (follow_nodes): max_share counts them
        self._interval = self.s.poll_interval_s
        self._next_query = 0.0
        self._last_look = 0.0  # outcome files last looked for
        self._outage: float | None = None  # since when squeue has not answered
        self._outage_note = 0.0
        self._listing: list[list[str]] | None = None  # squeue, read once while a resume adopts
        self._ended: list[Finished] = []
        self.stats = {"squeue": 0, "sacct": 0, "scontrol": 0, "sbatch": 0, "refused": 0, "failed_queries": 0,
                      "packs": 0, "packed": 0, "pack_looks": 0}
        self.tasks: dict[str, _Task] = {}  # attempts in packs, by job id
        self.packs: dict[str, _Pack] = {}  # by name
        self.no_pack: set[str] = set()  # jobs whose pack ended under them: their own Slurm job next time
        self._pack_look = 0.0
        self._nodes: dict[str, list[int]] | None = None  # node -> the inventory's ordinals of its GPUs (follow_nodes)
        self._node_state: dict[str, str] = {}
        self._template = None  # a device of the inventory: what a returning node's GPUs look like
        self._next_ordinal = 0
        self._nodes_read = 0.0
        self._new_devices: dict[int, object] = {}
        from pita.core.backends.local import LocalBackend

        self.local = LocalBackend(python=self.python, kill_grace_s=kill_grace_s, worker_start="exec")  # merges

    # ------------------------------------------------------------------ submitting
    def request(self, launch: Launch) -> list[str]:
        """The sbatch options of one attempt: what the plan gives its job."""
        self._load_sizing(launch)
        job = launch.job
        res = job.get("resources") or {}
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        devices = max(1, len(launch.devices))
        mem_gb = float(res.get("host_gb") or 0.0)
        if not mem_gb:  # CPU devices: the job's reservation is host memory
            mem_gb = float(res.get("memory_gb") or 0.0) * devices if not gpus else self.s.mem_gb
        mem_gb = (mem_gb or self.s.mem_gb) * self.mem_factor.get(launch.job_id, 1.0)
        if self.s.max_node_mem_mb:
            mem_gb = min(mem_gb, self.s.max_node_mem_mb / 1024)
        expected = float(job.get("duration_hint") or 60.0)
        limit = limit_seconds(expected, self.s.time_margin, self.s.min_minutes, self.s.max_time_s,
                              self.time_factor.get(launch.job_id, 1.0))
        args = ["-J", f"pita:{launch.job_id}", "-o", str(attempt_log(launch)), "--open-mode=append", "-N", "1",
                "-n", "1", "-c", str(self.s.cpus_per_job * devices if launch.devices else 1),
                "--time=" + slurm_time(limit)]
        margin = self.signal_margin(job, limit)
        if margin:
            args.append(f"--signal=B:USR1@{margin}")
        args.append(f"--mem={max(1, math.ceil(mem_gb))}G")
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        for flag, value in (("-p", self.s.partition), ("-A", self.s.account), ("-q", self.s.qos),
                            ("-C", self.s.constraint)):
            if value:
                args += [flag, str(value)]
        return args + list(self.s.sbatch_args)

    SIZING = "slurm-sizing.json"  # in the job's folder: what its earlier attempts taught its request

    def _load_sizing(self, launch) -> None:
        """A job's time and memory factors from its earlier attempts, read once per job: a resumed
        driver asks what the last one would have asked (a TIMEOUT's doubling is never forgotten)."""
        where = str(launch.paths.dir)  # by folder: a plan's look at the request (representative) reads none
        if where in self._sized:
            return
        self._sized.add(where)
        try:
            saved = json.loads((Path(launch.paths.dir) / self.SIZING).read_text())
        except (OSError, ValueError, TypeError):
            return
        for name, into in (("time_factor", self.time_factor), ("mem_factor", self.mem_factor),
                           ("host_ooms", self.host_ooms)):
            value = saved.get(name)
            if isinstance(value, (int, float)) and launch.job_id not in into:
                into[launch.job_id] = value

    def _save_sizing(self, launch) -> None:
        job_id = launch.job_id
        data = {name: into[job_id] for name, into in (("time_factor", self.time_factor),
                                                      ("mem_factor", self.mem_factor),
                                                      ("host_ooms", self.host_ooms)) if job_id in into}
        try:
            atomic_write_json(Path(launch.paths.dir) / self.SIZING, data)
        except OSError:  # a full disk: this driver still remembers it
            pass

    def signal_margin(self, job: dict | None, limit_s: float) -> int | None:
        """Seconds before its ``limit_s`` time limit that an attempt is told (USR1) to save and ask
        to run again: executor.slurm.signal_margin_s, or twice the job's planned checkpoint write,
        within a share of the limit (:func:`warning_margin`); None: the limit is too short to warn."""
        wanted = max(self.s.signal_margin_s, 2 * float(((job or {}).get("params") or {}).get("checkpoint_s") or 0))
        return warning_margin(limit_s, wanted)

    @staticmethod
    def attempt_env(launch: Launch, gpus: int, args: list[str] | None) -> dict[str, str]:
        """The environment an attempt runs in on its node (in a Slurm job of its own or a pack)."""
        env = dict(launch.env)
        if gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's GRES plugin sets it to the allocation
        env["PYTHONUNBUFFERED"] = "1"
        env["PITA_SLURM_SIGNALS"] = "1"  # the worker saves on USR1/TERM and asks to run again
        cpus = _flag(args or [], "-c")
        if cpus:  # the job's own CPUs, not the driver's machine's
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(cpus)
        return env

    def script(self, launch: Launch, gpus: int, args: list[str] | None = None) -> str:
        env = self.attempt_env(launch, gpus, args)
        exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(env.items()))
        return ("#!/bin/bash\n" + HOLD_WARNING +
                f"# pita job {launch.job_id}, attempt {launch.attempt}\n"
                + (f"# submitted as: sbatch {shlex.join(args)}\n" if args else "") +
                f"cd {shlex.quote(os.getcwd())}\n"
                f"{exports}"
                f"exec {shlex.quote(self.python)} -m pita.core.worker {shlex.quote(str(launch.paths.launch))}\n")

    def start(self, launch: Launch) -> None:
        if not launch.devices:  # a merge: on the driver
            self.local.start(launch)
            return
        p = launch.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p.launch, launch.to_json())
        try:
            p.attempt(launch.attempt).unlink()
        except FileNotFoundError:
            pass
        if self.packable(launch):
            args = self.request(launch)
            limit = slurm_seconds((_flag(args, "--time") or "").split("=", 1)[-1]) or 0.0
            warn = _flag(args, "--signal")
            self.tasks[launch.job_id] = _Task(launch, pack_key(args), time.time(),
                                              mem_gb=float((_flag(args, "--mem") or "0G").rstrip("G")),
                                              limit_s=limit, warn_s=int(warn.rsplit("@", 1)[1]) if warn else 0)
            self.stats["packed"] += 1
            self._dispatch(time.time())
            return
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        script = p.dir / f"slurm-{launch.attempt}.sh"
        args = self.request(launch)
        script.write_text(self.script(launch, gpus, args))
        held = _Held(launch, args, str(script), time.time())
        if self._at_cap(gpus):
            held.why = self._cap_text(gpus)
            self.held[launch.job_id] = held
            return
        if not self._submit(held):
            self.held[launch.job_id] = held

    def _in_flight(self) -> int:
        return len(self.subs) + sum(1 for pk in self.packs.values() if pk.end is None)

    def _gpus_in_flight(self) -> int:
        return (sum(s.gpus for s in self.subs.values()) +
                sum(gres_count(_flag(pk.args, "--gres")) for pk in self.packs.values() if pk.end is None))

    def _at_cap(self, gpus: int = 0) -> bool:
        """Whether one more job (of ``gpus`` GPUs) would pass the run's limit of jobs in flight, or
        of GPUs held at once (GrpTRES, MaxTRESPU: a job past it would only pend)."""
        if self.cap is not None and self._in_flight() >= self.cap:
            return True
        return bool(self.gpu_cap is not None and gpus and self._gpus_in_flight()
                    and self._gpus_in_flight() + gpus > self.gpu_cap)

    def _cap_text(self, gpus: int = 0) -> str:
        if self.cap is not None and self._in_flight() >= self.cap:
            return (f"held by pita: {self._in_flight()} of your jobs are in flight, the limit ({self.cap_why}: "
                    f"{self.cap})")
        return (f"held by pita: {self._gpus_in_flight()} GPUs of yours are in flight and it needs {gpus} more, past "
                f"the limit ({self.gpu_cap_why}: {self.gpu_cap})")

    # ------------------------------------------------------------------ the partition's nodes, followed
    lost_device_note = "finish where Slurm placed them"  # a drained node's jobs run to their end

    def follow_nodes(self, nodes: list[dict], devices: list) -> None:
        """The inventory's GPUs (``devices``, in the order of ``nodes``' usable ones) follow the
        partition: every ``partition_refresh_s`` one sinfo call; a node that drains or goes down
        takes its GPUs out (nothing new is placed for them; what runs there finishes), a node that
        returns or joins adds its GPUs."""
        self.devices_n = len(devices)  # the partition's usable devices: max_share counts them
        if not devices or devices[0].kind != "cuda" or len(devices) != sum(n["gpus"] for n in nodes if n["usable"]):
            return  # CPU devices share the largest node (or one device only): nothing to follow per node
        self._nodes, o = {}, 0
        for n in nodes:
            self._node_state[n["name"]] = n["state"]
            if n["usable"] and n["gpus"]:
                self._nodes[n["name"]] = list(range(o, o + n["gpus"]))
                o += n["gpus"]
        self._template, self._next_ordinal = devices[0], len(devices)
        self._nodes_read = time.time()

    def refresh(self) -> tuple[list[int], dict[int, str]]:
        """(ordinals added, {ordinal: why} lost) since the last call: the executor's inventory."""
        now = time.time()
        if self._nodes is None or now - self._nodes_read < self.s.partition_refresh_s:
            return [], {}
        self._nodes_read = now
        out = _try(["sinfo", "-h", "-N", *(["-p", self.s.partition] if self.s.partition else []), "-o", "%N|%t|%G"])
        if out is None:
            return [], {}  # no answer: nothing changes
        added, lost = [], {}
        seen = {}
        for line in out.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0] not in seen:
                seen[parts[0]] = (parts[1], gres_gpus(parts[2]))
        for name, (state, gpus) in seen.items():
            before = self._node_state.get(name)
            self._node_state[name] = state
            if name in self._nodes and not node_usable(state):
                for o in self._nodes.pop(name):
                    lost[o] = (f"node {name} is {state} (sinfo -R says why): nothing new is placed for its GPUs")
            elif name not in self._nodes and node_usable(state) and gpus:
                from dataclasses import replace

                ords = list(range(self._next_ordinal, self._next_ordinal + gpus))
                self._next_ordinal += gpus
                self._nodes[name] = ords
                for o in ords:
                    self._new_devices[o] = replace(self._template, ordinal=o, index=o, uuid=f"SIM-{o}", lost="",
                                                   used_bytes=0, processes=[])
                added += ords
                import logging

                logging.getLogger("pita.executor").info("node %s is %s (was %s): its %d GPU(s) join the inventory",
                                                        name, state, before or "not in the partition", gpus)
        return added, lost

    def devices(self, ordinals: list[int] | None = None, **_) -> list:
        """The devices of ``ordinals`` a refresh added."""
        return [self._new_devices[o] for o in (ordinals or [])]

    # ------------------------------------------------------------------ packs
    def packable(self, launch: Launch) -> bool:
        """Whether ``launch`` runs in a pack: packing is on (executor.slurm.pack_below_s), the job is
        planned shorter than that, fits a pack's time with its margins, and no pack ended under an
        earlier attempt of it."""
        if self.s.pack_below_s <= 0 or launch.job_id in self.no_pack:
            return False
        expected = float(launch.job.get("duration_hint") or 60.0)
        limit = self._pack_limit()
        return (expected <= self.s.pack_below_s and
                expected * self.s.time_margin + (self.signal_margin(launch.job, limit) or 0) + 30 <= limit)

    def _pack_limit(self) -> float:
        return min(self.s.pack_time_s, self.s.max_time_s or self.s.pack_time_s)

    def _fits(self, pack: _Pack, task: _Task, now: float) -> bool:
        expected = float(task.launch.job.get("duration_hint") or 60.0)
        return (task.mem_gb <= pack.mem_gb and
                pack.remaining(now) >= expected * self.s.time_margin
                + (self.signal_margin(task.launch.job, pack.limit_s) or 0) + 10)

    def _dispatch(self, now: float) -> None:
        """Packs' files read (a stat each, no Slurm call); ended attempts reported; waiting ones
        handed to idle packs; new packs submitted for the attempts no pack can take."""
        from pita.core.backends.pack import done_name

        # the packs' files are looked at once every PACK_LOOK_S, mostly one file a pack: the one of
        # its next step (started, closed, its attempt's done file): about one stat a second a pack
        look = now - self._pack_look >= PACK_LOOK_S
        if look:
            self._pack_look = now
        for name, pk in list(self.packs.items()) if look else ():
            d = Path(pk.dir)
            t = pk.task
            self.stats["pack_looks"] += 1
            if pk.started is None:
                if (d / "started").exists():
                    pk.started = now
            elif not pk.closed and (t is None or t.taken is None) and (d / "closed").exists():
                pk.closed = True  # a pack closes only while it runs nothing
            if t is not None:
                done = d / done_name(t.launch.job_id, t.launch.attempt)
                ended = done.exists()
                if not ended and t.taken is None and (d / "running.json").exists():
                    t.taken = now
                if ended:
                    if t.taken is None:
                        t.taken = now
                    self._task_ended(t, pk, done)
                elif t.taken is None and (pk.closed or pk.end is not None):
                    try:  # the pack left without taking it: another pack runs it
                        (d / "task.json").unlink()
                        pk.task, t.pack, t.assigned = None, None, None
                    except FileNotFoundError:  # taken just now
                        t.taken = now
                elif pk.end is not None:
                    self._task_lost(t, pk, now)
            if pk.end is not None and pk.task is None:
                del self.packs[name]
        waiting = sorted((t for t in self.tasks.values() if t.pack is None), key=lambda t: t.since)
        for t in waiting:
            pk = next((p for p in self.packs.values() if p.key == t.key and p.task is None and p.started is not None
                       and not p.closed and p.end is None and not p.stopped and self._fits(p, t, now)), None)
            if pk is not None:
                self._hand(t, pk, now)
        waiting = [t for t in waiting if t.pack is None]
        if waiting:  # an idle pack of a shape no waiting attempt has holds what theirs may need: it leaves
            for pk in self.packs.values():
                if (pk.started is not None and pk.task is None and not pk.closed and not pk.stopped
                        and pk.end is None and not any(t.key == pk.key for t in waiting)):
                    (Path(pk.dir) / "stop").write_text("idle, and attempts of another shape wait\n")
                    pk.stopped = True
        for key in {t.key for t in waiting}:
            want = sum(1 for t in waiting if t.key == key)
            queued = [p for p in self.packs.values() if p.key == key and p.started is None and p.end is None
                      and not p.closed and not p.stopped]
            for _ in range(want - len(queued)):
                if self._at_cap(gres_count(_flag(list(key), "--gres"))):
                    break
                if not self._submit_pack(next(t for t in waiting if t.key == key),
                                         max(t.mem_gb for t in waiting if t.key == key), now):
                    break
        for pk in self.packs.values():  # queued packs no waiting attempt needs: cancelled after a while
            needed = any(t.key == pk.key for t in waiting)
            if pk.started is None and pk.end is None and not needed and pk.slurm_id:
                pk.surplus_since = pk.surplus_since or now
                if now - pk.surplus_since > PACK_SURPLUS_S:
                    (Path(pk.dir) / "stop").write_text("not needed\n")
                    _try(["scancel", pk.slurm_id])
                    pk.stopped = True
            else:
                pk.surplus_since = None

    def _hand(self, t: _Task, pk: _Pack, now: float) -> None:
        env = self.attempt_env(t.launch, sum(1 for d in t.launch.devices if d.get("kind") == "cuda"), pk.args)
        # its own limit, as a job of its own would have it, within what the pack has left
        limit = min(t.limit_s or pk.remaining(now) - 10, pk.remaining(now) - 10)
        atomic_write_json(Path(pk.dir) / "task.json",
                          {"job_id": t.launch.job_id, "attempt": t.launch.attempt, "launch": str(t.launch.paths.launch),
                           "log": str(attempt_log(t.launch)), "env": env, "cwd": os.getcwd(),
                           "limit_s": round(limit, 1), "warn_s": t.warn_s if t.warn_s < limit / 2 else 0,
                           "grace_s": PACK_KILL_GRACE_S})
        pk.task, t.pack, t.assigned = t, pk, now

    def _submit_pack(self, t: _Task, mem_gb: float, now: float) -> bool:
        """sbatch a new pack for attempts of ``t``'s size; False when Slurm refused it for now."""
        root = Path(t.launch.run_dir) / "slurm-packs"
        n = 1 + max([int(p.name.split("-")[1]) for p in root.glob("pack-*") if p.name.split("-")[1].isdigit()] or [0])
        name = f"pack-{n}"
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        limit = self._pack_limit()
        mem = pack_mem_gb(mem_gb, (self.s.max_node_mem_mb or 0) / 1024 or None)
        seconds = limit_seconds(limit, 1.0, 1, self.s.max_time_s)
        margin = self.signal_margin(None, seconds)
        args = ["-J", f"pita:{name}", "-o", str(d / "pack.log"), "--open-mode=append", "--no-requeue",
                f"--time={slurm_time(seconds)}", *([f"--signal=B:USR1@{margin}"] if margin else []),
                f"--mem={mem}G", *t.key]
        cpus = _flag(args, "-c")
        threads = f"export OMP_NUM_THREADS={cpus} MKL_NUM_THREADS={cpus}\n" if cpus else ""
        script = d / "pack.sh"
        script.write_text("#!/bin/bash\n" + HOLD_WARNING +
                          f"# pita pack {name}: short attempts of this run, one after another, in one interpreter\n"
                          f"# submitted as: sbatch {shlex.join(args)}\n"
                          f"cd {shlex.quote(os.getcwd())}\n"
                          f"export PYTHONUNBUFFERED=1 PITA_SLURM_SIGNALS=1\n{threads}"
                          f"exec {shlex.quote(self.python)} -m pita.core.backends.pack {shlex.quote(str(d))} "
                          f"{self.s.pack_idle_s:g}\n")
        atomic_write_json(d / "pack.json", {"name": name, "args": args, "submitted": now})
        self.stats["sbatch"] += 1
        try:
            out = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True, text=True,
                                 timeout=60, env=submit_env())
        except (subprocess.TimeoutExpired, OSError) as e:
            out = None
            msg = f"{type(e).__name__}: {e}"
        if out is None or out.returncode != 0:
            self.stats["refused"] += 1
            msg = (out.stderr.strip() or out.stdout.strip()) if out is not None else msg
            import logging

            logging.getLogger("pita.executor").warning("sbatch refused a pack for %s: %s; its attempts wait",
                                                       t.launch.job_id, msg)
            if out is not None and any(w in msg.lower() for w in _FINAL_REFUSALS):
                self.s.pack_below_s = 0.0  # a pack this cluster cannot run: each attempt its own job from now on
                for task in [x for x in self.tasks.values() if x.pack is None]:
                    del self.tasks[task.launch.job_id]
                    self.start(task.launch)
            return False
        self.stats["packs"] += 1
        self.packs[name] = _Pack(name, t.key, args, d, now, limit, mem_gb=float(mem),
                                 slurm_id=out.stdout.strip().split(";")[0])
        self._changed()
        return True

    def _task_ended(self, t: _Task, pk: _Pack, done, now: float | None = None) -> None:
        """A packed attempt's done file: its end read as a Slurm job of its own would have it. Its
        own limit (ended_by "timeout") reads as TIMEOUT, the OOM killer in the pack's cgroup as
        OUT_OF_MEMORY, and an attempt that did not finish after Slurm signalled its pack
        (preemption, scancel, the pack's limit, its node) as the pack's own end state, once
        Slurm tells it; a failed attempt's outcome file is waited for as for a job of its own."""
        from pita.core.backends.local import finished_from

        now = time.time() if now is None else now
        try:
            info = json.loads(done.read_text())
        except (OSError, ValueError):
            return  # being written
        rc = info.get("rc")
        status = _outcome_status(t.launch)
        t.done_seen = t.done_seen or now
        extra = {"slurm_pack": pk.name, "queued_s": round(float(info.get("started", t.since)) - t.since, 1)}
        state = "COMPLETED" if rc == 0 else "FAILED"
        if t.forced:
            pass
        elif info.get("ended_by") == "timeout" and status != "requeue":
            state = "TIMEOUT"
        elif info.get("ended_by") == "oom" and status not in ("ok", "requeue"):
            state = "OUT_OF_MEMORY"
        elif (set(info.get("signals") or ()) & {"SIGTERM", "SIGINT"}) and status not in ("ok", "requeue"):
            if pk.end is None and now - t.done_seen < self.s.unknown_s:
                self._changed()  # Slurm's word on the pack decides: ask soon
                return
            state = pk.end[0] if pk.end else "UNKNOWN"
            if state in ("COMPLETED", "FAILED", "UNKNOWN", "TIMEOUT"):
                # signalled, yet the pack ended on its own, or at the pack's limit (the attempt's own
                # is inside it): nothing the attempt did, so it runs again, as a Slurm job of its own
                pk.task = None
                del self.tasks[t.launch.job_id]
                self.no_pack.add(t.launch.job_id)
                self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"in {pk.name}, exit {rc}, pack {state}")
                self._ended.append(finished_from(
                    t.launch, rc, t.since, "lost",
                    f"its pack ({pk.name}, Slurm job {pk.slurm_id}) was sent {'+'.join(info['signals'])} while it ran "
                    f"and ended {state}; it runs again as a Slurm job of its own",
                    {"slurm_job": pk.slurm_id, "slurm_state": state, "log": str(attempt_log(t.launch)), **extra}))
                return
        elif rc != 0 and status is None and now - t.done_seen < self.s.outcome_wait_s:
            return  # a shared file system may show its outcome late
        pk.task = None
        del self.tasks[t.launch.job_id]
        sub = _Sub(t.launch, pk.slurm_id, t.since, 0, forced=t.forced, reason=t.reason,
                   time_limit=slurm_time(int(t.limit_s)) if t.limit_s else "", mem_gb=t.mem_gb)
        self._ended.append(self._ended_sub(t.launch.job_id, sub, state, rc, pack=pk, extra_more=extra,
                                           note=f"in {pk.name}, exit {rc}"))

    def _task_lost(self, t: _Task, pk: _Pack, now: float) -> None:
        """The pack ended under a running attempt without writing its done file: the worker's
        outcome, when it wrote one (waited for as for any attempt), else the pack's Slurm end state
        read as a job of its own's (OUT_OF_MEMORY: more memory next time; PREEMPTED, NODE_FAIL,
        CANCELLED: lost) or lost; its next attempt is a Slurm job of its own."""
        from pita.core.backends.local import finished_from

        outcome = t.launch.paths.attempt(t.launch.attempt)
        t.lost_since = t.lost_since or now
        if not outcome.exists() and now - t.lost_since < self.s.outcome_wait_s:
            return
        pk.task = None
        del self.tasks[t.launch.job_id]
        state = pk.end[0] if pk.end else "UNKNOWN"
        extra = {"slurm_job": pk.slurm_id, "slurm_state": state, "slurm_pack": pk.name,
                 "log": str(attempt_log(t.launch))}
        if t.forced:
            self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"{pk.name} ended {state}")
            self._ended.append(finished_from(t.launch, None, t.since, t.forced, t.reason, extra))
            return
        self.no_pack.add(t.launch.job_id)
        if outcome.exists() and _outcome_status(t.launch):
            self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"{pk.name} ended {state}")
            self._ended.append(finished_from(t.launch, None, t.since, extra=extra))
            return
        if state in ("OUT_OF_MEMORY", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "CANCELLED", "DEADLINE"):
            sub = _Sub(t.launch, pk.slurm_id, t.since, 0, mem_gb=t.mem_gb)
            self._ended.append(self._ended_sub(t.launch.job_id, sub, state, None, pack=pk,
                                               extra_more={"slurm_pack": pk.name}, note=f"{pk.name} ended {state}"))
            return
        self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"{pk.name} ended {state}")
        self._ended.append(finished_from(t.launch, None, t.since, "lost",
                                         f"its pack ({pk.name}, Slurm job {pk.slurm_id}) ended {state} while it ran; "
                                         f"it runs again as a Slurm job of its own", extra))

    def _pack_states(self, listed: dict, now: float) -> None:
        """The packs' Slurm states from this poll's squeue; a pack squeue forgot is read from sacct
        or scontrol, or counts as ended once it closed (its own word) or after unknown_s."""
        missing = []
        for pk in self.packs.values():
            if pk.end is not None or not pk.slurm_id:
                continue
            row = listed.get(pk.slurm_id)
            if row is None:
                missing.append(pk.slurm_id)
                continue
            state, _reason, rc = row
            pk.unknown_since = None
            if state in ACTIVE_STATES:
                pk.state = state
            else:
                pk.end = (state, rc)
        if missing:
            known = self._forgotten(missing)
            for pk in self.packs.values():
                if pk.slurm_id in known:
                    pk.end = known[pk.slurm_id]
                elif pk.slurm_id in missing:
                    pk.unknown_since = pk.unknown_since or now
                    if pk.closed or now - pk.unknown_since >= self.s.unknown_s:
                        pk.end = ("COMPLETED" if pk.closed else "UNKNOWN", None)

    def _submit(self, held: _Held) -> bool:
        """sbatch one held attempt: True when Slurm took it; False when it refused for now (tried
        again with backoff); RuntimeError when the refusal is final (the job fails)."""
        launch = held.launch
        self.stats["sbatch"] += 1
        try:
            out = subprocess.run(["sbatch", "--parsable", *held.args, held.script], capture_output=True,
                                 text=True, timeout=60, env=submit_env())
            msg, ok = (out.stderr.strip() or out.stdout.strip()), out.returncode == 0
        except (subprocess.TimeoutExpired, OSError) as e:
            # a timed-out sbatch may still have queued the job: it would run twice if submitted again
            msg, ok = f"{type(e).__name__}: {e}", False
            if isinstance(e, subprocess.TimeoutExpired) and self._find_submitted(launch):
                return True
        if ok:
            sid = out.stdout.strip().split(";")[0]
            gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
            self.subs[launch.job_id] = _Sub(launch, sid, time.time(), gpus, grace_s=self.kill_grace_s,
                                            time_limit=_flag(held.args, "--time") or "",
                                            mem_gb=float((_flag(held.args, "--mem") or "0G").rstrip("G")))
            self._changed()
            return True
        self.stats["refused"] += 1
        if any(w in msg.lower() for w in _FINAL_REFUSALS):
            raise RuntimeError(f"sbatch refused {launch.job_id}: {msg}")
        final = self._policy_final(msg)
        if final:
            asked = " ".join([a for a in held.args if a.startswith(("--time=", "--gres=", "--mem="))] +
                             ([f"-c {_flag(held.args, '-c')}"] if _flag(held.args, "-c") else []))
            raise SlurmRefused(f"sbatch refused {launch.job_id}: {' '.join(msg.split())} -- {final}. It asked for "
                               f"{asked}: lower it "
                               f"(executor.slurm.time_margin, executor.slurm.min_minutes, the job's size) or run "
                               f"under another executor.slurm.qos, executor.slurm.account or executor.slurm.partition "
                               f"(sacctmgr show qos; sacctmgr show assoc user={_user()})")
        held.tries += 1
        backoff = min(300.0, 10.0 * 2 ** (held.tries - 1))
        held.next_try = time.time() + backoff
        held.why = f"sbatch refused it ({msg}); trying again in {backoff:.0f}s (attempt {held.tries})"
        import logging

        logging.getLogger("pita.executor").warning("%s: %s", launch.job_id, held.why)
        return False

    def _policy_final(self, msg: str) -> str:
        """Why an sbatch refusal by the accounting policy cannot clear by waiting ("" when it may:
        a submit limit that frees as jobs end). Slurm names the limit where it can (QOSMaxWall...,
        AssocMaxSubmitJobLimit); its generic "violates accounting/QOS policy (job submit limit,
        user's size and/or time limits)" covers both: it is final when none of this run's jobs is in
        flight and no submit limit of yours is full (sacctmgr)."""
        import re

        named = sorted(set(re.findall(r"\b(?:QOS|Assoc)\w*(?:Limit|PerJob|PerUser|PerAccount)\w*", msg)))
        if named:
            if any("Submit" in n for n in named):
                return ""
            return f"{', '.join(named)} is a per-job limit of your account or QoS, which waiting does not change"
        if "accounting/qos policy" not in msg.lower() and "job violates" not in msg.lower():
            return ""
        if self._in_flight():
            return ""  # a submit limit your queued jobs fill clears as they end
        limit, why, mine = submit_limits(self.s)
        if limit is not None and mine >= limit:
            return ""
        return (f"no job of this run is in flight and no submit limit of yours is full ({why or 'sacctmgr sets none'}, "
                f"{mine} of your jobs queued or running): the request itself breaks a size or time limit")

    def _find_submitted(self, launch: Launch) -> bool:
        """After an sbatch that timed out: the job it may have queued, found by its script."""
        out = _try(["squeue", "-h", "-u", _user(), "-o", "%i|%j|%o"])
        if out is None:
            return False
        script = str(launch.paths.dir / f"slurm-{launch.attempt}.sh")
        for line in out.stdout.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3 and parts[2] == script:
                gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
                self.subs[launch.job_id] = _Sub(launch, parts[0], time.time(), gpus, grace_s=self.kill_grace_s)
                self._changed()
                return True
        return False

    def _submit_held(self) -> None:
        now = time.time()
        for job_id, held in list(self.held.items()):
            gpus = gres_count(_flag(held.args, "--gres"))
            if self._at_cap(gpus):
                if self.cap is not None and self._in_flight() >= self.cap:
                    for h in self.held.values():
                        if h.next_try <= now:
                            h.why = self._cap_text()
                    return
                held.why = self._cap_text(gpus)  # a smaller one may still fit the GPUs left
                continue
            if held.next_try > now:
                continue
            try:
                taken = self._submit(held)
            except RuntimeError as e:
                del self.held[job_id]
                from pita.core.backends.local import finished_from

                self._ended.append(finished_from(held.launch, None, held.since, getattr(e, "status", "died"), str(e)))
                continue
            if taken:
                del self.held[job_id]

    def set_limits(self, cap: int | None, why: str) -> None:
        """The most jobs this run keeps in flight (queued or running), and what sets it."""
        if cap is not None and (self.cap is None or cap < self.cap):
            self.cap, self.cap_why = cap, why

    def set_gpu_limit(self, gpus: int | None, why: str) -> None:
        """The most GPUs this run's jobs hold at once (queued or running), and what sets it."""
        if gpus is not None and (self.gpu_cap is None or gpus < self.gpu_cap):
            self.gpu_cap, self.gpu_cap_why = gpus, why

    # ------------------------------------------------------------------ a later driver of the run
    def handle(self, job_id: str) -> dict:
        """What the run state keeps of an attempt in flight, so a resumed driver finds it again."""
        t = self.tasks.get(job_id)
        if t is not None:  # a packed attempt: the next driver runs it again (its pack is cancelled)
            return {"slurm_job": t.pack.slurm_id, "slurm_pack": t.pack.name} if t.pack is not None else {}
        sub = self.subs.get(job_id)
        return {"slurm_job": sub.slurm_id, "submitted": round(sub.submitted, 3)} if sub else {}

    def _queued(self) -> list[list[str]]:
        """This user's Slurm jobs as [id, state, reason, name, command], read once per resume."""
        if self._listing is None:
            out = None
            for pause in (0, 2, 5, 10, 20):  # a resume needs the answer: wait for the controller a while
                time.sleep(pause)
                out = _try(["squeue", "-h", "-u", _user(), "-o", "%i|%T|%r|%j|%o"])
                if out is not None:
                    break
            if out is None:
                raise RuntimeError("squeue did not answer for 37 s: cannot tell which of the run's Slurm jobs are "
                                   "still queued; resume again once the controller answers")
            self._listing = [line.split("|", 4) for line in out.stdout.splitlines() if line.count("|") >= 4]
        return self._listing

    def adopt(self, launch: Launch, handle: dict) -> str:
        """Take over an attempt an earlier driver of this run submitted (``resume_from=``): "" when
        its Slurm job is still queued or running (it is followed from now on as if submitted here),
        else why not (the job runs again). The job is found by the id the state recorded, or, when
        that driver was stopped before it recorded one, by its batch script in this job's folder."""
        if handle.get("slurm_pack"):
            return f"it ran in {handle['slurm_pack']} (a pack's attempts are short: they run again)"
        sid = str(handle.get("slurm_job") or "")
        mine = str(launch.paths.dir / "slurm-")
        row = next((r for r in self._queued() if (r[0] == sid if sid else r[4].startswith(mine))), None)
        if row is None:
            return (f"Slurm job {sid} is no longer queued ({self.end_state(sid)[0]})" if sid
                    else "no Slurm job of it is queued")
        if row[3] != f"pita:{launch.job_id}" or not row[4].startswith(mine):
            return f"Slurm job {row[0]} is now {row[3]!r}, not this job's"
        if row[1] not in ACTIVE_STATES:
            return f"Slurm job {row[0]} ended {row[1]}"
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        self.subs[launch.job_id] = _Sub(launch, row[0], float(handle.get("submitted") or time.time()), gpus,
                                        grace_s=self.kill_grace_s, state=row[1],
                                        state_reason=row[2] if row[1] == "PENDING" else "",
                                        started=time.time() if row[1] != "PENDING" else None)
        return ""

    def end_strays(self, run_root: str) -> list[str]:
        """Cancel the Slurm jobs of this run folder an adoption did not take (an attempt whose job is
        done, or runs again from here): one line each, for the log."""
        root = str(run_root).rstrip("/") + "/"
        ours = {s.slurm_id for s in self.subs.values()}
        lines = []
        for sid, state, _, name, command in self._queued():
            if command.startswith(root) and sid not in ours and state in ACTIVE_STATES:
                _try(["scancel", sid])
                lines.append(f"cancelled Slurm job {sid} ({name}, {state}): an earlier driver's attempt not taken over")
        self._listing = None
        return lines

    # ------------------------------------------------------------------ what Slurm says
    def _query(self) -> dict[str, tuple[str, str, int | None]] | None:
        """Slurm job id -> (state, reason, exit code) of this user's jobs squeue lists (one call
        for all of them); None when squeue did not answer."""
        self.stats["squeue"] += 1
        out = _try(["squeue", "-h", "-t", "all", "-u", _user(), "-O", "JobID:|,State:|,Reason:|,exit_code:"])
        if out is None:
            self.stats["failed_queries"] += 1
            return None
        states = {}
        for line in out.stdout.splitlines():
            parts = [x.strip() for x in line.split("|")]
            if len(parts) >= 4:
                states[parts[0]] = (parts[1], parts[2], _wait_status(parts[3]))
        return states

    def _forgotten(self, ids: list[str]) -> dict[str, tuple[str, int | None]]:
        """End states of jobs squeue no longer lists: one sacct for all of them where accounting
        runs, else scontrol (while the controller remembers them); missing: unknown now."""
        out = {}
        self.stats["sacct"] += 1
        acct = _try(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State,ExitCode"])
        if acct is not None:
            for line in acct.stdout.splitlines():
                parts = line.split("|")
                if len(parts) >= 3 and parts[0] in ids:
                    out[parts[0]] = (parts[1].split()[0], _wait_status(parts[2]))
        for sid in ids:
            if sid not in out:
                self.stats["scontrol"] += 1
                sc = _try(["scontrol", "-o", "show", "job", sid])
                if sc is not None:
                    fields = dict(kv.split("=", 1) for kv in sc.stdout.split() if "=" in kv)
                    if fields.get("JobState"):
                        out[sid] = (fields["JobState"], _wait_status(fields.get("ExitCode", "")))
        return out

    def _cancelled_by(self, slurm_id: str) -> str:
        """Who cancelled a job, as sacct says it ("CANCELLED by <uid>"): "by uid 1000 (ana)"; where
        accounting does not say (no slurmdbd, or it has not heard yet), "by a person"."""
        self.stats["sacct"] += 1
        out = _try(["sacct", "-n", "-X", "-P", "-j", slurm_id, "-o", "State"])
        words = (out.stdout.split("\n")[0].split() if out else [])
        if len(words) >= 3 and words[0] == "CANCELLED" and words[1] == "by" and words[2].isdigit():
            uid = int(words[2])
            try:
                import pwd

                return f"by uid {uid} ({pwd.getpwuid(uid).pw_name})"
            except (KeyError, ImportError):
                return f"by uid {uid}"
        return "by a person (sacct does not say who)"

    @staticmethod
    def end_state(slurm_id: str) -> tuple[str, int | None]:
        """(state, exit code) of a job that left squeue: scontrol while it remembers the job
        (MinJobAge), then sacct; ("UNKNOWN", None) when neither does."""
        out = _try(["scontrol", "-o", "show", "job", slurm_id])
        fields = dict(kv.split("=", 1) for kv in (out.stdout if out else "").split() if "=" in kv)
        state, code = fields.get("JobState"), fields.get("ExitCode")
        if not state:
            acct = _try(["sacct", "-n", "-X", "-P", "-j", slurm_id, "-o", "State,ExitCode"])
            line = acct.stdout.strip().splitlines()[:1] if acct else []
            if line and "|" in line[0]:
                state, code = line[0].split("|")[:2]
                state = state.split()[0]
        if not state:
            return "UNKNOWN", None
        return state, _wait_status(code or "")

    def log_path(self, launch: Launch):
        return attempt_log(launch)

    def ended_unwatched(self, job_paths, attempt: int, handle: dict) -> dict:
        if handle.get("slurm_pack"):
            launch = SimpleLaunch(job_paths, attempt)
            self._gather_log(_Sub(launch, str(handle.get("slurm_job") or ""), 0.0, 0), f"in {handle['slurm_pack']}")
            return {**handle, "slurm_state": "COMPLETED", "log": str(attempt_log(launch))}
        sid = str(handle.get("slurm_job") or "")
        state = self._forgotten([sid]).get(sid, ("COMPLETED", 0))[0] if sid else "COMPLETED"
        launch = SimpleLaunch(job_paths, attempt)
        self._gather_log(_Sub(launch, sid, 0.0, 0), state)
        return {"slurm_job": sid, "slurm_state": state, "log": str(attempt_log(launch))}

    @staticmethod
    def _gather_log(sub: _Sub, state: str) -> None:
        """The attempt's own log, appended to ``job.log`` with a header once it is over: the job's
        whole history in one file, each attempt's output in its own."""
        src = attempt_log(sub.launch)
        try:
            data = src.read_bytes() if src.exists() else b""
            with open(sub.launch.paths.log, "ab") as f:
                f.write(f"=== attempt {sub.launch.attempt}: Slurm job {sub.slurm_id}, {state} ({src.name}) ===\n"
                        .encode() + data + (b"" if not data or data.endswith(b"\n") else b"\n"))
        except OSError:  # a full disk: the attempt's own log keeps it
            pass

    def _ended_sub(self, job_id: str, sub: _Sub, state: str, rc: int | None, pack: _Pack | None = None,
                   extra_more: dict | None = None, note: str = "") -> Finished:
        """How an attempt ended, from Slurm's end state of its job (or, for a packed attempt, the
        state its pack's done file and Slurm's word on the pack give it: ``pack``)."""
        from pita.core.backends.local import finished_from

        self._gather_log(sub, note or state)
        where = f"its pack ({pack.name}, Slurm job {sub.slurm_id})" if pack is not None else f"Slurm job {sub.slurm_id}"
        if pack is not None and state not in ("COMPLETED", "FAILED") and not sub.forced:
            self.no_pack.add(job_id)  # its next attempt is a Slurm job of its own, where Slurm tells its end

        extra = {"slurm_job": sub.slurm_id, "slurm_state": state, "log": str(attempt_log(sub.launch)),
                 **(extra_more or {})}
        if sub.time_limit:
            extra["slurm_time"] = sub.time_limit
        if sub.mem_gb:
            extra["slurm_mem_gb"] = sub.mem_gb
        if sub.started is not None:
            extra["queued_s"] = round(sub.started - sub.submitted, 1)
        if sub.requeues:
            extra["slurm_requeues"] = sub.requeues
        if sub.forced:
            return finished_from(sub.launch, rc, sub.submitted, sub.forced, sub.reason, extra)
        if state == "OUT_OF_MEMORY":
            n = self.host_ooms[job_id] = self.host_ooms.get(job_id, 0) + 1
            top = (self.s.max_node_mem_mb or 0) / 1024
            self._save_sizing(sub.launch)
            if n <= self.s.oom_mem_retries and not (top and sub.mem_gb >= top - 1):
                self.mem_factor[job_id] = self.mem_factor.get(job_id, 1.0) * self.s.oom_mem_factor
                self._save_sizing(sub.launch)
                return finished_from(sub.launch, rc, sub.submitted, "lost",
                                     f"{where} ran out of host memory at --mem={sub.mem_gb:g}G "
                                     f"(OUT_OF_MEMORY): the next attempt asks for {self.s.oom_mem_factor:g}x "
                                     f"({n} of executor.slurm.oom_mem_retries={self.s.oom_mem_retries})", extra)
            return finished_from(sub.launch, rc, sub.submitted, "error",
                                 f"{where} ran out of host memory at --mem={sub.mem_gb:g}G "
                                 f"(OUT_OF_MEMORY, {n} time(s){', the largest node' if top and sub.mem_gb >= top - 1 else ''}): "
                                 f"raise executor.slurm.oom_mem_retries or executor.slurm.mem_gb, or lower the job's "
                                 f"batch", extra)
        if state == "CANCELLED" and not (pack is not None and pack.stopped):
            # pita's own cancels are forced (kill, a reason that never clears) or of packs it stopped:
            # this one is a person's, whose word is final
            who = self._cancelled_by(sub.slurm_id)
            what = f"in its pack ({pack.name}, Slurm job {sub.slurm_id})" if pack is not None else where
            return finished_from(sub.launch, rc, sub.submitted, "cancelled",
                                 f"{what} was cancelled {who} (scancel), not by pita: final, pita does not submit "
                                 f"again what a person cancelled", {**extra, "cancelled_by": who})
        if state == "TIMEOUT":
            limit_s = slurm_seconds(sub.time_limit) or 0.0
            top = self.s.max_time_s
            grown = self.time_factor.get(job_id, 1.0) > 1.0
            if grown or (top and limit_s >= top):
                return finished_from(
                    sub.launch, rc, sub.submitted, "error",
                    f"{where} hit its time limit ({sub.time_limit or 'unknown'}) "
                    + ("again, after its limit was doubled once" if grown else
                       f"at the longest limit Slurm gives it ({slurm_time(int(top))}, the partition's MaxTime or the "
                       f"QoS's MaxWall)")
                    + ": pita grows a limit once (a hung job would cost ever more); if it is slow rather than hung, "
                      "raise executor.slurm.time_margin or executor.slurm.min_minutes, or make it save on the warning "
                      "(executor.slurm.signal_margin_s) so it runs on from a checkpoint", extra)
            self.time_factor[job_id] = 2.0
            self._save_sizing(sub.launch)
        if state in LOST_STATES or state in ("SPECIAL_EXIT", "REVOKED"):
            why = {"TIMEOUT": "it hit its Slurm time limit (the next submission asks for twice as long, once)",
                   "PREEMPTED": "preempted", "NODE_FAIL": "its node failed",
                   "BOOT_FAIL": "its node failed to boot", "DEADLINE": "it reached its deadline before it could run",
                   "SPECIAL_EXIT": "Slurm held it after a special exit", "REVOKED": "a sibling cluster ran it"}
            if pack is not None:
                why["TIMEOUT"] = ("it hit its own time limit in the pack (the next attempt has twice as long, once)"
                                  if state == "TIMEOUT" else why["TIMEOUT"])
            if state in ("SPECIAL_EXIT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL") and pack is None:
                # Slurm may hold or requeue it itself: pita submits it again instead, so it never runs twice
                _try(["scancel", sub.slurm_id])
            said = (f"in its pack ({pack.name}, Slurm job {sub.slurm_id}), {state}" if pack is not None
                    else f"{where} ended {state}")
            return finished_from(sub.launch, rc, sub.submitted, "lost", f"{said}: {why.get(state, state.lower())}",
                                 extra)
        return finished_from(sub.launch, rc, sub.submitted, extra=extra)

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        self._ended += self.local.poll(0.0)
        self._look_for_outcomes()
        if self.tasks or self.packs:
            self._dispatch(time.time())
        if time.time() < self._next_query:
            if timeout > 0 and not self._ended:
                short = 0.2 if self.local.running() else (PACK_LOOK_S if self.tasks or self.packs else timeout)
                time.sleep(max(0.0, min(timeout, self._next_query - time.time(), short)))
            self._ended += self.local.poll(0.0)
            if self.tasks or self.packs:
                self._dispatch(time.time())
            if time.time() < self._next_query:
                return self._take()
        self._poll_slurm()
        return self._take()

    def _look_for_outcomes(self) -> None:
        """A worker writes its outcome file as it ends: one stat per running attempt every few
        seconds (no Slurm call) tells the driver to ask Slurm now rather than at its next poll."""
        now = time.time()
        if now - self._last_look < OUTCOME_LOOK_S:
            return
        self._last_look = now
        for sub in self.subs.values():
            if sub.end is None and not sub.outcome_seen and sub.launch.paths.attempt(sub.launch.attempt).exists():
                sub.outcome_seen = now
                self._next_query = min(self._next_query, now + 0.5)  # COMPLETING lasts a moment

    def _changed(self) -> None:
        """Something moved (a submission, an end, a kill): look again soon."""
        self._interval = self.s.poll_interval_s
        self._next_query = min(self._next_query, time.time() + self._interval)

    def _poll_slurm(self) -> None:
        now = time.time()
        self._submit_held()
        for sub in self.subs.values():  # KILL after the grace period
            if sub.term_sent is not None and now - sub.term_sent > sub.grace_s and sub.state != "KILLED":
                if _try(["scancel", sub.slurm_id]) is not None:
                    sub.state = "KILLED"
        if not self.subs and not any(pk.end is None and pk.slurm_id for pk in self.packs.values()):
            self._schedule(now, changed=False)
            return
        listed = self._query()
        if listed is None:
            self._query_failed(now)
            return
        self._pack_states(listed, now)
        if self._outage is not None:
            import logging

            logging.getLogger("pita.executor").warning("squeue answers again after %.0fs; every job kept its state",
                                                       now - self._outage)
            self._outage = None
        changed = False
        missing = []
        for job_id, sub in self.subs.items():
            row = listed.get(sub.slurm_id)
            if row is None:
                if sub.end is None:
                    missing.append(sub.slurm_id)
                continue
            state, reason, rc = row
            sub.unknown_since = None
            if state in ACTIVE_STATES:
                if state != sub.state:
                    changed = True
                    if state in ("PENDING", "REQUEUED") and sub.started is not None:
                        sub.requeues += 1  # Slurm put it back (preemption with requeue): it starts again
                        sub.started = sub.outcome_seen = None
                if state == "RUNNING" and sub.started is None:
                    sub.started = now
                sub.state, sub.state_reason = state, (reason if state == "PENDING" else "")
                self._check_reason(job_id, sub, now)
                continue
            sub.end = (state, rc)
        if missing:
            known = self._forgotten(missing)
            for sub in self.subs.values():
                if sub.slurm_id in known:
                    sub.end, sub.unknown_since = known[sub.slurm_id], None
                elif sub.slurm_id in missing:
                    sub.unknown_since = sub.unknown_since or now
        for job_id, sub in list(self.subs.items()):
            done = self._is_over(sub, now)
            if done is None:
                continue
            del self.subs[job_id]
            changed = True
            self._ended.append(self._ended_sub(job_id, sub, *done))
        self._submit_held()
        self._schedule(now, changed)

    def _is_over(self, sub: _Sub, now: float) -> tuple[str, int | None] | None:
        """(state, exit code) once an attempt is over and its outcome can be read; None while it
        runs, or while its outcome file is still on its way."""
        outcome = sub.launch.paths.attempt(sub.launch.attempt)
        if sub.end is None:
            if sub.unknown_since is None:
                return None
            if outcome.exists():  # no Slurm command knows it any more; the worker said how it ended
                try:
                    status = json.loads(outcome.read_text()).get("status")
                except (OSError, ValueError):
                    status = None
                if status:
                    return ("COMPLETED" if status == "ok" else "FAILED",
                            {"ok": 0, "oom": 3, "requeue": 5}.get(status, 1))
            if now - sub.unknown_since < self.s.unknown_s:
                return None
            return "UNKNOWN", None
        state, rc = sub.end
        if sub.forced or state not in ("COMPLETED", "FAILED") or outcome.exists():
            return state, rc
        sub.ended_seen = sub.ended_seen or now
        if now - sub.ended_seen < self.s.outcome_wait_s:  # a shared file system may show it late
            return None
        return state, rc

    def _check_reason(self, job_id: str, sub: _Sub, now: float) -> None:
        r = sub.state_reason
        if sub.state != "PENDING" or not any(r == k or r.startswith(k + ",") for k in NEVER_CLEARS):
            sub.never_since = None
            return
        sub.never_since = sub.never_since or now
        if now - sub.never_since >= NEVER_CLEARS_AFTER_S and sub.forced is None:
            sub.forced = "error"
            sub.reason = (f"Slurm job {sub.slurm_id} pends for a reason that never clears by waiting: "
                          f"{pending_reason(r)}")
            _try(["scancel", sub.slurm_id])

    def _query_failed(self, now: float) -> None:
        """squeue did not answer: every job keeps its state; ask again later, less often."""
        import logging

        if self._outage is None:
            self._outage = now
        if now - self._outage_note >= 300:
            self._outage_note = now
            logging.getLogger("pita.executor").warning(
                "squeue does not answer (for %.0fs): the %d Slurm job(s) in flight keep their state; asking again "
                "with backoff", now - self._outage, len(self.subs))
        self._interval = min(self.s.max_poll_interval_s, max(self._interval * 2, self.s.poll_interval_s))
        self._next_query = now + self._interval

    def _schedule(self, now: float, changed: bool) -> None:
        """The next query: soon after a change, twice as late each time nothing changed (up to
        max_poll_interval_s), and not before the earliest expected end of a running attempt; soon
        while an ended attempt's outcome file is awaited or an attempt is being killed."""
        if changed:
            self._interval = self.s.poll_interval_s
        else:
            self._interval = min(self.s.max_poll_interval_s, self._interval * 2)
        wait = self._interval
        running = [s for s in self.subs.values() if s.started is not None and s.end is None]
        if running and len(running) == len(self.subs):
            soonest = min(s.started + float(s.launch.job.get("duration_hint") or 0) for s in running)
            wait = max(wait, min(soonest - now, self.s.max_poll_interval_s))
        if any(s.ended_seen is not None or (s.term_sent is not None and s.state != "KILLED")
               or s.unknown_since is not None or s.outcome_seen is not None for s in self.subs.values()):
            wait = min(wait, self.s.poll_interval_s)
        if self.held:
            wait = min(wait, max(1.0, min(h.next_try for h in self.held.values()) - now))
        self._next_query = now + wait

    def _take(self) -> list[Finished]:
        out, self._ended = self._ended, []
        return out

    def queued(self) -> dict[str, tuple[str, float]]:
        """pita job id -> (Slurm's reason and what it means, seconds queued) of the attempts still
        waiting to run, pita's own held ones included."""
        now = time.time()
        out = {j: (f"Slurm job {s.slurm_id} pending, reason {pending_reason(s.state_reason)}", now - s.submitted)
               for j, s in self.subs.items() if s.state == "PENDING" and s.started is None}
        out.update({j: (h.why or "held by pita", now - h.since) for j, h in self.held.items()})
        for j, t in self.tasks.items():
            if t.taken is not None:
                continue
            queued = [pk for pk in self.packs.values() if pk.key == t.key and pk.started is None and pk.end is None]
            why = (f"waiting for a pack: Slurm job {queued[0].slurm_id} pending" if queued
                   else self._cap_text() if self._at_cap() else "waiting for a pack")
            out[j] = (why, now - t.since)
        return out

    # ------------------------------------------------------------------ ending attempts
    def kill(self, job_id: str, status: str = "cancelled", reason: str = "", grace_s: float | None = None) -> None:
        if job_id in self.local.running():
            self.local.kill(job_id, status, reason, grace_s)
            return
        task = self.tasks.get(job_id)
        if task is not None:
            self._kill_task(task, status, reason, grace_s)
            return
        if job_id in self.held:  # never submitted: ends at once
            from pita.core.backends.local import finished_from

            held = self.held.pop(job_id)
            self._ended.append(finished_from(held.launch, None, held.since, status, reason))
            return
        sub = self.subs.get(job_id)
        if sub is None or sub.term_sent is not None:
            return
        sub.forced, sub.reason = status, reason
        sub.term_sent = time.time()
        sub.grace_s = self.kill_grace_s if grace_s is None else grace_s
        _try(["scancel", "--signal=TERM", "--full", sub.slurm_id])
        if sub.state == "PENDING":  # nothing runs yet: gone at once
            _try(["scancel", sub.slurm_id])
        self._changed()

    def _kill_task(self, t: _Task, status: str, reason: str, grace_s: float | None) -> None:
        """A packed attempt: gone at once while no pack took it; else its pack TERMs it (KILL
        after the grace) and writes its done file as for any end."""
        from pita.core.backends.local import finished_from

        if t.forced is not None:
            return
        t.forced, t.reason = status, reason
        pk = t.pack
        if pk is not None and t.taken is None:
            try:
                (Path(pk.dir) / "task.json").unlink()
                pk.task, t.pack = None, None
            except FileNotFoundError:
                t.taken = time.time()
        if t.pack is None:
            del self.tasks[t.launch.job_id]
            self._ended.append(finished_from(t.launch, None, t.since, status, reason))
            return
        atomic_write_json(Path(pk.dir) / "kill.json", {"job_id": t.launch.job_id, "attempt": t.launch.attempt,
                                                       "grace_s": self.kill_grace_s if grace_s is None else grace_s})

    def shutdown(self, grace_s: float = 10.0) -> list[Finished]:
        """The driver stops: one scancel for every job of the run (Slurm itself gives each its
        KillWait between TERM and KILL), nothing waited for, so a driver that is itself a Slurm job
        finishes within its own KillWait. An attempt whose outcome already says it succeeded counts."""
        from pita.core.backends.local import finished_from

        ended: list[Finished] = []
        ids = [s.slurm_id for s in self.subs.values()] + [pk.slurm_id for pk in self.packs.values()
                                                         if pk.slurm_id and pk.end is None]
        for i in range(0, len(ids), 200):
            _try(["scancel", *ids[i:i + 200]])
        for t in list(self.tasks.values()):
            ok = t.launch.paths.attempt(t.launch.attempt).exists() and _outcome_status(t.launch) == "ok"
            if t.pack is not None:
                self._gather_log(_Sub(t.launch, t.pack.slurm_id, t.since, 0), "cancelled: the driver stopped")
            f = finished_from(t.launch, None, t.since)
            ended.append(Finished(t.launch.job_id, t.launch.attempt, "ok", 0, extra=f.extra) if ok else
                         finished_from(t.launch, None, t.since, "cancelled", "the driver stopped"))
        self.tasks.clear()
        self.packs.clear()
        for job_id, sub in list(self.subs.items()):
            self._gather_log(sub, "cancelled: the driver stopped")
            f = finished_from(sub.launch, None, sub.submitted)
            ok = f.status == "ok" or (sub.launch.paths.attempt(sub.launch.attempt).exists() and
                                      _outcome_status(sub.launch) == "ok")
            ended.append(Finished(job_id, sub.launch.attempt, "ok", 0, extra=f.extra) if ok else
                         finished_from(sub.launch, None, sub.submitted, "cancelled", "the driver stopped"))
        for job_id, held in self.held.items():
            ended.append(finished_from(held.launch, None, held.since, "cancelled", "the driver stopped"))
        self.subs.clear()
        self.held.clear()
        return ended + (self.local.shutdown(grace_s) or []) + self._take()

    def detach(self) -> list[str]:
        """The driver goes away but its jobs go on (a requeued or preempted driver): nothing is
        cancelled; the run state keeps each attempt's handle for the next driver. Returns the
        jobs left running."""
        left = list(self.subs) + list(self.tasks)  # a pack runs its attempt to its end, then leaves idle
        self.local.shutdown(self.kill_grace_s)
        return left

    def driver_leaving(self, signum: int) -> str | None:
        """A driver that is itself a Slurm job leaves its jobs running when Slurm is about to end
        it without anyone asking to stop the run: USR1 (its time limit is near: it requeues itself),
        or TERM while Slurm requeues it (preemption, ``scontrol requeue``: the controller counts one
        more restart than this process started with) or while the controller does not answer.
        TERM of a preemption that cancels (PreemptMode=CANCEL: scontrol shows its PreemptTime) leaves
        them running too, for a resume to take over. ``scancel`` of the driver (TERM, no restart
        counted, no PreemptTime) and Ctrl-C end its jobs."""
        jid = os.environ.get("SLURM_JOB_ID")
        if not jid or signum not in (signal.SIGUSR1, signal.SIGTERM):
            return None
        if signum == signal.SIGUSR1:
            return f"Slurm job {jid} (this driver) nears its time limit; it requeues itself"
        out = _try(["scontrol", "-o", "show", "job", jid], timeout=3)
        if out is None:
            return f"TERM to Slurm job {jid} (this driver) while the controller does not answer"
        fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
        try:
            restarts, mine = int(fields.get("Restarts", 0)), int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        except ValueError:
            return None
        if restarts > mine or fields.get("JobState") in ("PREEMPTED", "REQUEUED", "REQUEUE_HOLD"):
            return f"Slurm requeues job {jid} (this driver; restart {restarts})"
        if fields.get("PreemptTime") not in (None, "", "None", "Unknown"):
            # PreemptMode=CANCEL: preempted, never requeued; a plain scancel sets no PreemptTime
            return (f"Slurm preempts job {jid} (this driver, at {fields['PreemptTime']}; PreemptMode=CANCEL: it is "
                    f"not requeued): resume the run (resume_from=<its folder>) under a QoS that is not preempted "
                    f"to take its jobs over")
        return None

    def after_detach(self, signum: int) -> None:
        import logging

        jid = os.environ.get("SLURM_JOB_ID")
        if signum != signal.SIGUSR1 or not jid:
            return
        out = _try(["scontrol", "requeue", jid], timeout=20)
        lg = logging.getLogger("pita.executor")
        if out is None:
            lg.error("could not requeue Slurm job %s (this driver): submit it with --requeue (docs/guide.md), or "
                     "resume the run with resume_from=<its folder>", jid)
        else:
            lg.warning("requeued Slurm job %s (this driver): it continues this run folder when it starts again", jid)

    def close(self) -> None:
        """The run is over: every pack is told to stop and cancelled (none runs an attempt now)."""
        ids = []
        for pk in self.packs.values():
            try:
                (Path(pk.dir) / "stop").write_text("the run is over\n")
            except OSError:
                pass
            if pk.slurm_id and pk.end is None:
                ids.append(pk.slurm_id)
        if ids:
            _try(["scancel", *ids])
        self.packs.clear()
        self.local.close()

    def pids(self, job_id: str) -> set[int]:
        return self.local.pids(job_id)

    def running(self) -> list[str]:
        return list(self.subs) + list(self.held) + list(self.tasks) + self.local.running()


@dataclass
class SimpleLaunch:
    """The part of a Launch that names an attempt's files."""
    paths: object
    attempt: int


def _user() -> str:
    import getpass

    return getpass.getuser()


def _outcome_status(launch: Launch) -> str | None:
    try:
        return json.loads(launch.paths.attempt(launch.attempt).read_text()).get("status")
    except (OSError, ValueError):
        return None


def attempt_log(launch) -> "os.PathLike":
    """Each attempt's own log (``job.log`` gathers the run's view of it: the executor's pump)."""
    return Path(launch.paths.dir) / f"attempt-{launch.attempt}.log"


# ---------------------------------------------------------------- the cluster, read before anything runs
def settings_from(cfg_slurm) -> SlurmSettings:
    """:class:`SlurmSettings` from ``executor.slurm``."""
    c = cfg_slurm
    return SlurmSettings(partition=c.partition, account=c.account, qos=c.qos, constraint=c.constraint,
                         sbatch_args=[str(a) for a in (c.sbatch_args or [])], cpus_per_job=int(c.cpus_per_job),
                         time_margin=float(c.time_margin), min_minutes=int(c.min_minutes),
                         poll_interval_s=float(c.poll_interval_s), pending_report_s=float(c.pending_report_s),
                         mem_gb=float(c.mem_gb), max_poll_interval_s=float(c.max_poll_interval_s),
                         max_jobs=None if c.max_jobs is None else int(c.max_jobs),
                         max_share=float(c.max_share), oom_mem_factor=float(c.oom_mem_factor),
                         oom_mem_retries=int(c.oom_mem_retries), signal_margin_s=int(c.signal_margin_s),
                         outcome_wait_s=float(c.outcome_wait_s), pack_below_s=float(c.pack_below_s),
                         pack_time_s=float(c.pack_time_s), pack_idle_s=float(c.pack_idle_s),
                         partition_refresh_s=float(c.partition_refresh_s))


class SlurmRefused(RuntimeError):
    """An sbatch refusal that waiting cannot change: the attempt ends "error" (no crash retry)."""
    status = "error"


def gres_count(gres: str | None) -> int:
    """GPUs a request's ``--gres`` asks for (``gpu:2``, ``gpu:h100:2``); 0 for None."""
    if not gres:
        return 0
    return sum(int(p.split(":")[-1]) for p in gres.split(",")
               if p.split(":")[0] == "gpu" and p.split(":")[-1].isdigit())


def gres_gpus(gres: str) -> int:
    """GPUs in one node's GRES (``gpu:2``, ``gpu:h100:8(S:0-1)``, ``gpu:a100:4,shard:8``)."""
    n = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts and parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            n += int(parts[-1])
    return n


def cluster(settings: SlurmSettings) -> tuple[list[dict], list[str]]:
    """The nodes of the partition (``[{name, cpus, mem_mb, gpus}]``) and every problem with what
    ``executor.slurm`` asks for (no sbatch, an unknown partition), read from ``sinfo``."""
    import shutil

    key = "executor.slurm"
    missing = [t for t in ("sbatch", "squeue", "sinfo", "scancel", "scontrol") if shutil.which(t) is None]
    if missing:
        return [], [f"executor.backend=slurm: {', '.join(missing)} not found on PATH; run pita where Slurm's client "
                    f"commands are (a login node), or choose another executor.backend (local, ray)"]
    out = _run(["sinfo", "-h", "-N", "-o", "%P|%N|%c|%m|%G|%t"])
    if out.returncode != 0:
        return [], [f"executor.backend=slurm: sinfo failed ({out.stderr.strip() or out.returncode}); is slurmctld "
                    f"reachable from here (SLURM_CONF={os.environ.get('SLURM_CONF', 'unset')})?"]
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 5]
    partitions = sorted({r[0].rstrip("*") for r in rows})
    default = next((r[0].rstrip("*") for r in rows if r[0].endswith("*")), partitions[0] if partitions else None)
    part = settings.partition or default
    if settings.partition and settings.partition not in partitions:
        from pita.core.names import unknown_name

        return [], [unknown_name(f"{key}.partition", settings.partition, partitions)]
    if part is None:
        return [], [f"{key}.partition: the cluster has no partition (sinfo lists none)"]
    nodes = []
    for p, name, cpus, mem, gres, state in rows:
        if p.rstrip("*") == part and name not in {n["name"] for n in nodes}:
            nodes.append({"name": name, "cpus": int(cpus), "mem_mb": int(str(mem).rstrip("+") or 0),
                          "gpus": gres_gpus(gres), "state": state, "usable": node_usable(state)})
    return nodes, []


# sinfo's short node states (%t) of nodes that run no new job until an admin or Slurm returns them
UNUSABLE_NODE_STATES = ("drain", "drng", "down", "fail", "failg", "maint", "inval", "futr", "boot_fail", "npc",
                        "plnd", "unk", "pow_dn", "powered_down", "powering_down", "reboot^")


def node_usable(state: str) -> bool:
    """Whether a node in ``state`` (sinfo %t: idle, mix, alloc, drain, down*, ...) takes jobs now."""
    st = state.rstrip("*~#!%$@^-").lower()
    return not any(st == u or st.startswith(u) for u in UNUSABLE_NODE_STATES)


def slurm_inventory(settings: SlurmSettings, gpu_card: str | None, cpu_devices: int, cpu: bool = False):
    """The devices the scheduler places jobs on, from the partition's nodes: its GPUs (their
    memory from ``executor.slurm.gpu_card``), or, on a partition without GPUs (or with
    ``cpu``: system.devices=cpu), ``cpu_devices`` CPU devices sharing the largest node's memory.
    ConfigError names the key to fix."""
    from pita.core.errors import ConfigError
    from pita.core.gpu_manager import GPUManager, parse_inventory

    nodes, problems = cluster(settings)
    if problems:
        raise ConfigError(problems)
    out = [n for n in nodes if not n["usable"]]
    every, nodes = nodes, [n for n in nodes if n["usable"]]
    if not nodes:
        raise ConfigError(f"executor.slurm.partition={settings.partition or '(default)'}: every node is out of service "
                          f"({', '.join(n['name'] + ' ' + n['state'] for n in out)}; sinfo -R says why); wait for "
                          f"them to return or choose another executor.slurm.partition")
    settings.max_node_mem_mb = max(n["mem_mb"] for n in nodes)
    gpus = 0 if cpu else sum(n["gpus"] for n in nodes)
    if gpus:
        if not gpu_card:
            raise ConfigError(f"executor.slurm.gpu_card is not set and the partition's nodes have {gpus} GPUs "
                              f"({', '.join(n['name'] + ': ' + str(n['gpus']) for n in nodes)}): name their card "
                              f"(e.g. executor.slurm.gpu_card=H100), whose memory sizes the jobs")
        mgr = GPUManager.from_inventory(parse_inventory(f"{gpus}x{gpu_card}"))
    else:
        largest = max(nodes, key=lambda n: n["mem_mb"])
        per = int(largest["mem_mb"] * 1e6 * 0.9 / max(1, cpu_devices))
        mgr = GPUManager.cpu_inventory(cpu_devices)
        for d in mgr.devices:
            d.total_bytes = per
    mgr.source = "slurm"
    return mgr, every


# ---------------------------------------------------------------- every request checked before the first sbatch
def partition_fields(partition: str | None) -> dict[str, str]:
    """``scontrol show partition``'s fields of ``partition`` (the default one when None)."""
    out = _run(["scontrol", "-o", "show", "partition", *([partition] if partition else [])])
    lines = out.stdout.splitlines() or [""]
    line = lines[0] if partition else next((ln for ln in lines if "Default=YES" in ln), lines[0])
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def _listed(value: str | None) -> list[str] | None:
    """A partition's Allow*/Deny* list; None for ALL or unset."""
    if not value or value.upper() in ("ALL", "(NULL)", "NONE"):
        return None
    return [v for v in value.split(",") if v]


def access_problems(settings: SlurmSettings, fields: dict[str, str], assoc: list[dict] | None = None) -> list[str]:
    """executor.slurm.account and .qos against the partition's Allow/Deny lists and, where the
    cluster keeps accounting, the user's associations (``assoc``: sacctmgr's Account, Partition,
    QOS rows)."""
    part = fields.get("PartitionName", settings.partition or "the default partition")
    out = []
    for key, value, allow, deny in (("account", settings.account, "AllowAccounts", "DenyAccounts"),
                                    ("qos", settings.qos, "AllowQos", "DenyQos")):
        if value is None:
            continue
        allowed, denied = _listed(fields.get(allow)), _listed(fields.get(deny)) or []
        if allowed is not None and value not in allowed:
            out.append(f"executor.slurm.{key}={value!r}: partition {part} allows only {', '.join(allowed)} "
                       f"({allow}); set executor.slurm.{key} to one of them or choose another executor.slurm.partition")
        elif value in denied:
            out.append(f"executor.slurm.{key}={value!r}: partition {part} denies it ({deny}); choose another "
                       f"executor.slurm.{key} or executor.slurm.partition")
    if assoc is not None and not out:
        mine = [a for a in assoc if a.get("Partition") in ("", part)]
        accounts = sorted({a["Account"] for a in mine})
        if settings.account is not None and settings.account not in accounts:
            out.append(f"executor.slurm.account={settings.account!r}: you have no association with it on partition "
                       f"{part} (sacctmgr lists {', '.join(accounts) or 'none'}); set executor.slurm.account to one "
                       f"of those")
        elif settings.qos is not None:
            rows = [a for a in mine if settings.account in (None, a["Account"])]
            qos = sorted({q for a in rows for q in a.get("QOS", "").split(",") if q})
            if qos and settings.qos not in qos:
                out.append(f"executor.slurm.qos={settings.qos!r}: not a QoS of "
                           f"{'account ' + settings.account if settings.account else 'your associations'} on "
                           f"partition {part} (sacctmgr lists {', '.join(qos)}); set executor.slurm.qos to one of those")
    return out


def associations() -> list[dict] | None:
    """The user's associations (Account, Partition, QOS) where the cluster keeps accounting
    (slurmdbd); None where it does not (nothing to check against)."""
    import getpass

    conf = _run(["scontrol", "show", "config"]).stdout
    if "accounting_storage/slurmdbd" not in conf:
        return None
    out = _run(["sacctmgr", "-nP", "show", "assoc", "where", f"user={getpass.getuser()}", "format=Account,Partition,QOS"])
    if out.returncode != 0:
        return None
    return [dict(zip(("Account", "Partition", "QOS"), line.split("|")))
            for line in out.stdout.splitlines() if line.count("|") == 2]


@dataclass
class AccountLimits:
    """What your association and QoS allow this run (sacctmgr, where accounting runs): each a value
    and what sets it ("QoS tiny's MaxSubmitJobsPerUser = 1"), None where nothing sets it."""
    submit: tuple[int, str] | None = None  # jobs queued or running (MaxSubmitJobs, MaxSubmitPU, GrpSubmit)
    submitted: int = 0  # of your jobs already counted against it
    running: tuple[int, str] | None = None  # jobs running at once (MaxJobs, MaxJobsPU, GrpJobs)
    gpus: tuple[int, str] | None = None  # GPUs held at once (GrpTRES, MaxTRESPU gres/gpu)
    cpus: tuple[int, str] | None = None  # CPUs held at once (GrpTRES, MaxTRESPU cpu)
    wall_s: tuple[float, str] | None = None  # the longest --time (MaxWall of the QoS or association)


def _tres(text: str, name: str) -> int | None:
    """A count from a TRES list (``cpu=8,gres/gpu=4,mem=64G``): ``gres/gpu`` or ``cpu``."""
    for item in (text or "").split(","):
        k, _, v = item.partition("=")
        if (k == name or (name == "gres/gpu" and k.startswith("gres/gpu:"))) and v.isdigit():
            return int(v)
    return None


def account_limits(settings: SlurmSettings) -> AccountLimits:
    """The limits of the association (user, account, partition) and QoS this run submits under:
    MaxSubmitJobs/GrpSubmitJobs, MaxJobs/GrpJobs, GrpTRES, MaxWall of the association and
    MaxSubmitJobsPerUser/GrpSubmitJobs, MaxJobsPerUser/GrpJobs, GrpTRES/MaxTRESPerUser and MaxWall
    of the QoS, each the smallest that applies; empty where the cluster keeps no accounting."""
    out = AccountLimits()
    conf = _try(["scontrol", "show", "config"])
    if conf is None or "accounting_storage/slurmdbd" not in conf.stdout:
        return out
    user = _user()
    account = settings.account
    if account is None:
        got = _try(["sacctmgr", "-nP", "show", "user", user, "format=DefaultAccount"])
        account = (got.stdout.strip().splitlines() or [""])[0] if got else ""
    got = _try(["sacctmgr", "-nP", "show", "assoc", "where", f"user={user}", *([f"account={account}"] if account else []),
                "format=Account,Partition,QOS,DefaultQOS,MaxSubmit,GrpSubmit,MaxJobs,GrpJobs,GrpTRES,MaxWall"])
    rows = [line.split("|") for line in (got.stdout.splitlines() if got else []) if line.count("|") == 9]
    rows = [r for r in rows if r[1] in ("", settings.partition or "")] or rows
    found: dict[str, list] = {k: [] for k in ("submit", "running", "gpus", "cpus", "wall_s")}
    qos = settings.qos
    if rows:
        r = sorted(rows, key=lambda r: r[1] == "")[0]  # the partition's own association first
        qos = qos or r[3] or ("normal" if "normal" in r[2].split(",") else None)
        where = f"association {r[0]}"
        for key, value, what in (("submit", r[4], "MaxSubmitJobs"), ("submit", r[5], "GrpSubmitJobs"),
                                 ("running", r[6], "MaxJobs"), ("running", r[7], "GrpJobs")):
            if value.isdigit():
                found[key].append((int(value), f"{where}'s {what} = {value}"))
        for key, name in (("gpus", "gres/gpu"), ("cpus", "cpu")):
            if (n := _tres(r[8], name)) is not None:
                found[key].append((n, f"{where}'s GrpTRES {name}={n}"))
        if (w := slurm_seconds(r[9])) is not None:
            found["wall_s"].append((w, f"{where}'s MaxWall = {r[9]}"))
    if qos:
        got = _try(["sacctmgr", "-nP", "show", "qos", "where", f"name={qos}",
                    "format=Name,MaxSubmitPU,GrpSubmit,MaxJobsPU,GrpJobs,GrpTRES,MaxTRESPU,MaxWall"])
        for line in (got.stdout.splitlines() if got else []):
            q = line.split("|")
            if len(q) != 8 or q[0] != qos:
                continue
            where = f"QoS {qos}"
            for key, value, what in (("submit", q[1], "MaxSubmitJobsPerUser"), ("submit", q[2], "GrpSubmitJobs"),
                                     ("running", q[3], "MaxJobsPerUser"), ("running", q[4], "GrpJobs")):
                if value.isdigit():
                    found[key].append((int(value), f"{where}'s {what} = {value}"))
            for key, name in (("gpus", "gres/gpu"), ("cpus", "cpu")):
                for text, what in ((q[5], "GrpTRES"), (q[6], "MaxTRESPerUser")):
                    if (n := _tres(text, name)) is not None:
                        found[key].append((n, f"{where}'s {what} {name}={n}"))
            if (w := slurm_seconds(q[7])) is not None:
                found["wall_s"].append((w, f"{where}'s MaxWall = {q[7]}"))
    for key, values in found.items():
        if values:
            setattr(out, key, min(values))
    if out.submit is not None:
        mine = _try(["squeue", "-h", "-u", user, "-O", "QOS:|,Account:"])
        out.submitted = sum(1 for line in (mine.stdout.splitlines() if mine else [])
                            if line.split("|")[0].strip() == (qos or "") or not qos)
    return out


def submit_limits(settings: SlurmSettings) -> tuple[int | None, str, int]:
    """(the smallest submit limit that applies, what sets it, how many of your jobs it counts now);
    (None, "", 0) where none is set or the cluster keeps no accounting."""
    lim = account_limits(settings)
    if lim.submit is None:
        return None, "", 0
    return lim.submit[0], lim.submit[1], lim.submitted


def submit_limit(settings: SlurmSettings) -> tuple[int | None, str]:
    """How many more jobs you may have queued or running at once through this run's account and
    QoS (sacctmgr's MaxSubmitJobs and GrpSubmitJobs of the association, MaxSubmitJobsPerUser and
    GrpSubmitJobs of the QoS), less the jobs of yours already counted against it; (None, "") where
    the cluster keeps no accounting or sets no such limit."""
    limit, why, others = submit_limits(settings)
    if limit is None:
        return None, ""
    return max(1, limit - others), why + (f", {others} of your jobs already queued or running" if others else "")


def representative(backend: SlurmBackend, jobs, cuda: bool, key=lambda j: j.kind) -> dict[str, tuple[object, list[str]]]:
    """Per job kind (``key`` names it: the plan's kind with its algorithm, pita.plans.fit.job_label):
    its job with the largest request (GPUs, memory, then time) and that request's sbatch options,
    without the job's name and log."""
    from types import SimpleNamespace

    best: dict = {}
    for j in jobs:
        if j.resources.devices <= 0:
            continue
        launch = SimpleNamespace(job=j.to_dict(), job_id=j.id, attempt=1,
                                 devices=[{"kind": "cuda" if cuda else "cpu"}] * j.resources.devices,
                                 paths=SimpleNamespace(log=f"<run>/jobs/{j.id}/job.log", dir=f"<run>/jobs/{j.id}"))
        size = (j.resources.devices, j.resources.host_gb or j.resources.memory_gb, j.duration_hint)
        k = key(j)
        if k not in best or size > best[k][0]:
            best[k] = (size, j, launch)
    out = {}
    for key, (_, j, launch) in best.items():
        args, shown, skip = backend.request(launch), [], False
        for a in args:
            if skip:
                skip = False
            elif a in ("-J", "-o"):
                skip = True
            elif a != "--open-mode=append":
                shown.append(a)
        out[key] = (j, shown)
    return out


_PER_ATTEMPT = ("-J", "-o", "--time", "--signal", "--open-mode", "--mem")  # what packs do not share by key


def _without(args: list[str], flags) -> list[str]:
    """``args`` less ``flags`` (``-J name``, ``--time=...``) and their values."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        if any(a.startswith(f + "=") for f in flags):
            continue
        out.append(a)
    return out


def pack_key(args: list[str]) -> tuple:
    """The shape of an attempt's allocation (its sbatch options less its name, log, time, signal
    and memory): attempts of one shape share packs, each in a pack with at least its --mem."""
    return tuple(_without(args, _PER_ATTEMPT))


def pack_mem_gb(mem_gb: float, cap_gb: float | None = None) -> int:
    """A pack's --mem: the attempts' largest, rounded up to a power of two GB (a pack then takes
    the next attempts of its shape whose memory differs a little), at most ``cap_gb``."""
    out = 1 << max(0, math.ceil(math.log2(max(1.0, mem_gb))))
    return int(min(out, math.floor(cap_gb))) if cap_gb and cap_gb >= mem_gb else out


def _flag(args: list[str], prefix: str) -> str | None:
    for i, a in enumerate(args):
        if a == prefix and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(prefix + "="):
            return a.split("=", 1)[1]
    return None


def request_problem(job, args: list[str], message: str, nodes: list[dict]) -> str:
    """What a refused request asks that the cluster lacks, named by the key that sets it."""
    m = message.lower()
    for words, key in (("invalid account", "executor.slurm.account"), ("invalid qos", "executor.slurm.qos"),
                       ("invalid feature", "executor.slurm.constraint"),
                       ("invalid partition", "executor.slurm.partition")):
        if words in m:
            return f"{key}: Slurm refuses the requests with it ({message.strip()})"
    cpus, mem = int(_flag(args, "-c") or 1), _flag(args, "--mem")
    gpus = int((_flag(args, "--gres") or "gpu:0").split(":")[-1])
    most = {k: max((n[k] for n in nodes if n.get("usable", True)), default=0) for k in ("cpus", "mem_mb", "gpus")}
    asks = f"{job.id} asks for {' '.join(args)}"
    if gpus > most["gpus"]:
        return (f"{asks}: {gpus} GPUs on one node, and the partition's largest node has {most['gpus']}; lower the "
                f"algorithm's devices (algos.<A>.devices) or choose another executor.slurm.partition")
    if cpus > most["cpus"]:
        per = cpus // max(1, int(job.resources.devices))
        return (f"executor.slurm.cpus_per_job={per}: a {job.resources.devices}-device job asks for {cpus} CPUs on one "
                f"node, and the partition's largest node has {most['cpus']}; lower executor.slurm.cpus_per_job to at "
                f"most {max(1, most['cpus'] // max(1, int(job.resources.devices)))}")
    if mem and float(mem.rstrip("G")) * 1024 > most["mem_mb"]:
        return (f"{asks}: {mem} of host memory, and the partition's largest node has {most['mem_mb'] / 1024:.0f}G; "
                f"the plan's host estimate is too large for these nodes: lower the job's batch or length, or choose "
                f"another executor.slurm.partition")
    return (f"{asks}: Slurm refuses it ({message.strip()}); check executor.slurm.constraint, executor.slurm.sbatch_args "
            f"and executor.slurm.partition")


def in_flight_limits(backend: SlurmBackend, nodes: list[dict], cuda: bool) -> list[str]:
    """The run's limits read before its first sbatch, one note each: the longest --time (the QoS's
    or association's MaxWall below the partition's MaxTime), the jobs in flight (executor.slurm.
    max_jobs, else max_share of the partition; lowered to the submit limits, MaxJobs, GrpJobs and,
    on CPU devices, the CPUs of GrpTRES/MaxTRESPU) and the GPUs held at once (GrpTRES/MaxTRESPU)."""
    s = backend.s
    notes: list[str] = []
    lim = account_limits(s)
    if lim.wall_s is not None and (s.max_time_s is None or lim.wall_s[0] < s.max_time_s):
        s.max_time_s = lim.wall_s[0]
        notes.append(f"--time at most {slurm_time(int(lim.wall_s[0]))} ({lim.wall_s[1]}), below the partition's "
                     f"MaxTime")
    if s.max_jobs is None:  # a modest share of the partition by default, never all of it
        n = getattr(backend, "devices_n", 0) or sum(nd.get("gpus", 0) for nd in nodes if nd.get("usable", True))
        if n:
            share = max(DEFAULT_IN_FLIGHT, math.ceil(s.max_share * n))
            if share < n:
                backend.set_limits(share, f"executor.slurm.max_share={s.max_share:g} of the partition's {n} usable "
                                          f"devices, at least {DEFAULT_IN_FLIGHT}; executor.slurm.max_share or "
                                          f"executor.slurm.max_jobs raises it")
    if lim.submit is not None:
        backend.set_limits(max(1, lim.submit[0] - lim.submitted), lim.submit[1] + (
            f", {lim.submitted} of your jobs already queued or running" if lim.submitted else ""))
    if lim.running is not None:
        backend.set_limits(lim.running[0], lim.running[1])
    if lim.cpus is not None and not cuda:  # CPU devices: a job holds cpus_per_job CPUs a device
        backend.set_limits(max(1, lim.cpus[0] // max(1, s.cpus_per_job)), f"{lim.cpus[1]} at "
                                                                           f"executor.slurm.cpus_per_job={s.cpus_per_job}")
    if lim.gpus is not None and cuda:
        backend.set_gpu_limit(lim.gpus[0], lim.gpus[1])
        notes.append(f"GPUs in flight at most {backend.gpu_cap} ({backend.gpu_cap_why}); the rest wait in pita")
    if backend.cap is not None:
        notes.append(f"jobs in flight at most {backend.cap} ({backend.cap_why}); the rest wait in pita, not in sbatch "
                     f"refusals")
    return notes


def submission_problems(backend: SlurmBackend, jobs, nodes: list[dict], cuda: bool,
                        key=lambda j: j.kind) -> tuple[list[str], list[str]]:
    """(problems, notes) of the run's Slurm requests, found before anything is submitted: the
    partition's account and QoS rules, and each kind's largest request tried with ``sbatch
    --test-only``. Sets the partition's MaxTime as the longest --time asked for; a kind whose
    expected seconds exceed it is a note (its jobs continue from their checkpoints when requeued,
    or fail)."""
    s = backend.s
    fields = partition_fields(s.partition)
    problems = access_problems(s, fields, associations())
    notes: list[str] = []
    s.max_time_s = slurm_seconds(fields.get("MaxTime", ""))
    notes += in_flight_limits(backend, nodes, cuda)
    if problems:
        return problems, notes
    for kind, (job, args) in representative(backend, jobs, cuda, key).items():
        out = _run(["sbatch", "--test-only", "-J", "pita:check", "-o", "/dev/null", *args, "--wrap", "true"])
        if out.returncode != 0:
            msg = " ".join(ln.split(":", 1)[-1].strip() for ln in out.stderr.splitlines() if ln.strip()) or out.stdout
            if any(k in msg for k in SUBMIT_LIMIT_REASONS):  # your jobs fill a submit limit now: they wait in pita
                notes.append(f"{kind}: Slurm refuses more jobs of yours for now ({msg.strip()}); the run's jobs are "
                             f"submitted as yours end")
                continue
            problems.append(request_problem(job, args, msg, nodes))
        elif s.max_time_s and job.duration_hint > s.max_time_s:
            notes.append(f"{kind}: its longest job is expected to take {job.duration_hint / 3600:.1f} h, more than "
                         f"partition {fields.get('PartitionName')}'s MaxTime of {s.max_time_s / 3600:.1f} h; each "
                         f"attempt asks for MaxTime, and a training job continues from its checkpoint when requeued")
    return sorted(set(problems)), notes
