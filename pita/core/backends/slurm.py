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
    CANCELLED (not by pita), PREEMPTED, NODE_FAIL, BOOT_FAIL, DEADLINE
                                       "lost": run again, not counted as the job's crash
                                       (executor.lost_retries), like a Ray node that left
    TIMEOUT                            "lost" too, and the job's next submission gets twice the
                                       time limit; training jobs continue from their checkpoint

Jobs that hold no device (merges) run on the driver, as local workers. Killing an attempt is
``scancel --signal=TERM`` then ``scancel`` after the grace period; a driver that stops cancels
every job it submitted; a driver that is killed leaves them running, and a resumed one takes
them over (``handle``/``adopt``/``end_strays``). Attempts kept waiting in the queue are reported
with squeue's reason (``queued``). GPU jobs leave ``CUDA_VISIBLE_DEVICES`` to
Slurm (its GRES plugin sets it to the allocation); CPU jobs keep the driver's empty one.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field

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


def time_limit(seconds: float, margin: float, min_minutes: int, max_s: float | None = None, factor: float = 1.0) -> str:
    """A Slurm time limit (``D-HH:MM:SS``): ``seconds`` x ``margin``, at least ``min_minutes``, times
    ``factor`` (2 after one TIMEOUT, 4 after two), at most ``max_s`` (the partition's MaxTime: a
    longer request would wait in the queue forever)."""
    s = int(math.ceil(max(min_minutes * 60, math.ceil(seconds * margin)) * factor))
    if max_s:
        s = min(s, int(max_s))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}"


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
    poll_interval_s: float = 2.0  # squeue at most this often
    # --mem when the plan gives a GPU job no host estimate (CPU devices: their reservation); never
    # left out: without --mem a cluster with no DefMemPerNode gives a job the whole node's memory
    mem_gb: float = 4.0
    pending_report_s: float = 300.0  # a job queued longer than this is reported with Slurm's reason
    max_time_s: float | None = None  # the partition's MaxTime (read at start): no --time beyond it


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


class SlurmBackend(Backend):
    name = "slurm"
    outlives_driver = True

    def __init__(self, settings: SlurmSettings | None = None, kill_grace_s: float = 10.0,
                 python: str | None = None):
        self.s = settings or SlurmSettings()
        self.kill_grace_s = kill_grace_s
        self.python = python or sys.executable
        self.subs: dict[str, _Sub] = {}
        self.time_factor: dict[str, float] = {}  # a job that hit its limit: twice the limit next time
        self._last_query = 0.0
        self._listing: list[list[str]] | None = None  # squeue, read once while a resume adopts
        self._ended: list[Finished] = []
        from pita.core.backends.local import LocalBackend

        self.local = LocalBackend(python=self.python, kill_grace_s=kill_grace_s, worker_start="exec")  # merges

    # ------------------------------------------------------------------ submitting
    def request(self, launch: Launch) -> list[str]:
        """The sbatch options of one attempt: what the plan gives its job."""
        job = launch.job
        res = job.get("resources") or {}
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        devices = max(1, len(launch.devices))
        mem_gb = float(res.get("host_gb") or 0.0)
        if not mem_gb:  # CPU devices: the job's reservation is host memory
            mem_gb = float(res.get("memory_gb") or 0.0) * devices if not gpus else self.s.mem_gb
        expected = float(job.get("duration_hint") or 60.0)
        args = ["-J", f"pita:{launch.job_id}", "-o", str(launch.paths.log), "--open-mode=append", "-N", "1", "-n", "1",
                "-c", str(self.s.cpus_per_job * devices if launch.devices else 1),
                "--time=" + time_limit(expected, self.s.time_margin, self.s.min_minutes, self.s.max_time_s,
                                       self.time_factor.get(launch.job_id, 1.0))]
        args.append(f"--mem={max(1, math.ceil(mem_gb or self.s.mem_gb))}G")
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        for flag, value in (("-p", self.s.partition), ("-A", self.s.account), ("-q", self.s.qos),
                            ("-C", self.s.constraint)):
            if value:
                args += [flag, str(value)]
        return args + list(self.s.sbatch_args)

    def script(self, launch: Launch, gpus: int, args: list[str] | None = None) -> str:
        env = dict(launch.env)
        if gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's GRES plugin sets it to the allocation
        env["PYTHONUNBUFFERED"] = "1"
        exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(env.items()))
        return ("#!/bin/bash\n"
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
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        script = p.dir / f"slurm-{launch.attempt}.sh"
        args = self.request(launch)
        script.write_text(self.script(launch, gpus, args))
        out = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True,
                             text=True, timeout=60, env=submit_env())
        if out.returncode != 0:
            raise RuntimeError(f"sbatch refused {launch.job_id}: {out.stderr.strip() or out.stdout.strip()}")
        sid = out.stdout.strip().split(";")[0]
        self.subs[launch.job_id] = _Sub(launch, sid, time.time(), gpus, grace_s=self.kill_grace_s,
                                        time_limit=next(a.split("=", 1)[1] for a in args if a.startswith("--time=")))

    # ------------------------------------------------------------------ a later driver of the run
    def handle(self, job_id: str) -> dict:
        """What the run state keeps of an attempt in flight, so a resumed driver finds it again."""
        sub = self.subs.get(job_id)
        return {"slurm_job": sub.slurm_id, "submitted": round(sub.submitted, 3)} if sub else {}

    def _queued(self) -> list[list[str]]:
        """This user's Slurm jobs as [id, state, reason, name, command], read once per resume."""
        if self._listing is None:
            import getpass

            out = _run(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%T|%r|%j|%o"])
            self._listing = [line.split("|", 4) for line in out.stdout.splitlines() if line.count("|") >= 4]
        return self._listing

    def adopt(self, launch: Launch, handle: dict) -> str:
        """Take over an attempt an earlier driver of this run submitted (``resume_from=``): "" when
        its Slurm job is still queued or running (it is followed from now on as if submitted here),
        else why not (the job runs again). The job is found by the id the state recorded, or, when
        that driver was stopped before it recorded one, by its batch script in this job's folder."""
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
                _run(["scancel", sid])
                lines.append(f"cancelled Slurm job {sid} ({name}, {state}): an earlier driver's attempt not taken over")
        self._listing = None
        return lines

    # ------------------------------------------------------------------ what Slurm says
    def _query(self) -> dict[str, tuple[str, str]]:
        """Slurm job id -> (state, reason) of the jobs squeue still lists."""
        ids = ",".join(s.slurm_id for s in self.subs.values())
        if not ids:
            return {}
        out = _run(["squeue", "-h", "-t", "all", "-j", ids, "-o", "%i|%T|%r"])
        states = {}
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3:
                states[parts[0]] = (parts[1], parts[2])
        return states

    @staticmethod
    def end_state(slurm_id: str) -> tuple[str, int | None]:
        """(state, exit code) of a job that left squeue: scontrol while it remembers the job
        (MinJobAge), then sacct; ("UNKNOWN", None) when neither does."""
        out = _run(["scontrol", "-o", "show", "job", slurm_id])
        fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
        state, code = fields.get("JobState"), fields.get("ExitCode")
        if not state:
            acct = _run(["sacct", "-n", "-X", "-P", "-j", slurm_id, "-o", "State,ExitCode"])
            line = acct.stdout.strip().splitlines()[:1]
            if line and "|" in line[0]:
                state, code = line[0].split("|")[:2]
                state = state.split()[0]
        if not state:
            return "UNKNOWN", None
        rc = None
        if code and ":" in code:
            a, sig = code.split(":")[:2]
            rc = -int(sig) if int(sig or 0) else int(a)
        return state, rc

    def _ended_sub(self, job_id: str, sub: _Sub, state: str, rc: int | None) -> Finished:
        from pita.core.backends.local import finished_from

        extra = {"slurm_job": sub.slurm_id, "slurm_state": state}
        if sub.time_limit:
            extra["slurm_time"] = sub.time_limit
        if sub.forced:
            return finished_from(sub.launch, rc, sub.submitted, sub.forced, sub.reason, extra)
        if state in LOST_STATES:
            if state == "TIMEOUT":
                self.time_factor[job_id] = self.time_factor.get(job_id, 1.0) * 2
            why = {"CANCELLED": "cancelled outside pita (scancel)", "TIMEOUT": "it hit its Slurm time limit (the next "
                   "submission asks for twice as long)", "PREEMPTED": "preempted", "NODE_FAIL": "its node failed"}
            return finished_from(sub.launch, rc, sub.submitted, "lost",
                                 f"Slurm job {sub.slurm_id} ended {state}: {why.get(state, state.lower())}", extra)
        return finished_from(sub.launch, rc, sub.submitted, extra=extra)

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        self._ended += self.local.poll(0.0)
        now = time.time()
        wait = self.s.poll_interval_s - (now - self._last_query)
        if wait > 0:
            if timeout > 0 and not self._ended:
                time.sleep(min(timeout, wait, 0.2 if self.local.running() else wait))
            self._ended += self.local.poll(0.0)
            if time.time() - self._last_query < self.s.poll_interval_s:
                return self._take()
        self._last_query = time.time()
        for sub in self.subs.values():  # KILL after the grace period
            if sub.term_sent is not None and time.time() - sub.term_sent > sub.grace_s and sub.state != "KILLED":
                _run(["scancel", sub.slurm_id])
                sub.state = "KILLED"
        listed = self._query()
        for job_id, sub in list(self.subs.items()):
            if sub.slurm_id in listed:
                state, reason = listed[sub.slurm_id]
                sub.state_reason = reason if state == "PENDING" else ""
                if state in ACTIVE_STATES:
                    if state == "RUNNING" and sub.started is None:
                        sub.started = time.time()
                    sub.state = state
                    continue
                _, rc = self.end_state(sub.slurm_id)
            else:
                state, rc = self.end_state(sub.slurm_id)
                if state in ACTIVE_STATES:
                    continue
            del self.subs[job_id]
            self._ended.append(self._ended_sub(job_id, sub, state, rc))
        return self._take()

    def _take(self) -> list[Finished]:
        out, self._ended = self._ended, []
        return out

    def queued(self) -> dict[str, tuple[str, float]]:
        """pita job id -> (Slurm's reason and what it means, seconds queued) of the attempts still
        waiting to run."""
        now = time.time()
        return {j: (f"Slurm job {s.slurm_id} pending, reason {pending_reason(s.state_reason)}", now - s.submitted)
                for j, s in self.subs.items() if s.state == "PENDING" and s.started is None}

    # ------------------------------------------------------------------ ending attempts
    def kill(self, job_id: str, status: str = "cancelled", reason: str = "", grace_s: float | None = None) -> None:
        if job_id in self.local.running():
            self.local.kill(job_id, status, reason, grace_s)
            return
        sub = self.subs.get(job_id)
        if sub is None or sub.term_sent is not None:
            return
        sub.forced, sub.reason = status, reason
        sub.term_sent = time.time()
        sub.grace_s = self.kill_grace_s if grace_s is None else grace_s
        _run(["scancel", "--signal=TERM", "--full", sub.slurm_id])
        if sub.state == "PENDING":  # nothing runs yet: gone at once
            _run(["scancel", sub.slurm_id])

    def shutdown(self, grace_s: float = 10.0) -> list[Finished]:
        for job_id in list(self.subs):
            self.kill(job_id, grace_s=grace_s)
        deadline = time.time() + grace_s + 5 * self.s.poll_interval_s + 5
        ended: list[Finished] = []
        while self.subs and time.time() < deadline:
            ended += self.poll(timeout=self.s.poll_interval_s)
        for sub in self.subs.values():  # still listed: cancelled for good
            _run(["scancel", sub.slurm_id])
        return ended + (self.local.shutdown(grace_s) or []) + self._take()

    def close(self) -> None:
        self.local.close()

    def pids(self, job_id: str) -> set[int]:
        return self.local.pids(job_id)

    def running(self) -> list[str]:
        return list(self.subs) + self.local.running()


# ---------------------------------------------------------------- the cluster, read before anything runs
def settings_from(cfg_slurm) -> SlurmSettings:
    """:class:`SlurmSettings` from ``executor.slurm``."""
    c = cfg_slurm
    return SlurmSettings(partition=c.partition, account=c.account, qos=c.qos, constraint=c.constraint,
                         sbatch_args=[str(a) for a in (c.sbatch_args or [])], cpus_per_job=int(c.cpus_per_job),
                         time_margin=float(c.time_margin), min_minutes=int(c.min_minutes),
                         poll_interval_s=float(c.poll_interval_s), pending_report_s=float(c.pending_report_s),
                         mem_gb=float(c.mem_gb))


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
                          "gpus": gres_gpus(gres), "state": state})
    return nodes, []


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
    return mgr, nodes


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
    out = _run(["sacctmgr", "-nP", "show", "assoc", f"where user={getpass.getuser()}", "format=Account,Partition,QOS"])
    if out.returncode != 0:
        return None
    return [dict(zip(("Account", "Partition", "QOS"), line.split("|")))
            for line in out.stdout.splitlines() if line.count("|") == 2]


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
                                 paths=SimpleNamespace(log=f"<run>/jobs/{j.id}/job.log"))
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
    most = {k: max((n[k] for n in nodes), default=0) for k in ("cpus", "mem_mb", "gpus")}
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
    if problems:
        return problems, notes
    for kind, (job, args) in representative(backend, jobs, cuda, key).items():
        out = _run(["sbatch", "--test-only", "-J", "pita:check", "-o", "/dev/null", *args, "--wrap", "true"])
        if out.returncode != 0:
            msg = " ".join(ln.split(":", 1)[-1].strip() for ln in out.stderr.splitlines() if ln.strip()) or out.stdout
            problems.append(request_problem(job, args, msg, nodes))
        elif s.max_time_s and job.duration_hint > s.max_time_s:
            notes.append(f"{kind}: its longest job is expected to take {job.duration_hint / 3600:.1f} h, more than "
                         f"partition {fields.get('PartitionName')}'s MaxTime of {s.max_time_s / 3600:.1f} h; each "
                         f"attempt asks for MaxTime, and a training job continues from its checkpoint when requeued")
    return sorted(set(problems)), notes
