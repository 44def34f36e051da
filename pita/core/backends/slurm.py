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
every job it submitted. GPU jobs leave ``CUDA_VISIBLE_DEVICES`` to
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


def time_limit(seconds: float, margin: float, min_minutes: int) -> str:
    """A Slurm time limit (``D-HH:MM:SS``) of ``seconds`` x ``margin``, at least ``min_minutes``."""
    s = max(min_minutes * 60, int(math.ceil(seconds * margin)))
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
    mem_gb: float = 0.0  # --mem when the plan has no host estimate (CPU devices: their reservation)


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


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(self, settings: SlurmSettings | None = None, kill_grace_s: float = 10.0,
                 python: str | None = None):
        self.s = settings or SlurmSettings()
        self.kill_grace_s = kill_grace_s
        self.python = python or sys.executable
        self.subs: dict[str, _Sub] = {}
        self.time_factor: dict[str, float] = {}  # a job that hit its limit: twice the limit next time
        self._last_query = 0.0
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
        expected = float(job.get("duration_hint") or 60.0) * self.time_factor.get(launch.job_id, 1.0)
        args = ["-J", f"pita:{launch.job_id}", "-o", str(launch.paths.log), "--open-mode=append", "-N", "1", "-n", "1",
                "-c", str(self.s.cpus_per_job * devices if launch.devices else 1),
                f"--time={time_limit(expected, self.s.time_margin, self.s.min_minutes)}"]
        if mem_gb > 0:
            args.append(f"--mem={max(1, math.ceil(mem_gb))}G")
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        for flag, value in (("-p", self.s.partition), ("-A", self.s.account), ("-q", self.s.qos),
                            ("-C", self.s.constraint)):
            if value:
                args += [flag, str(value)]
        return args + list(self.s.sbatch_args)

    def script(self, launch: Launch, gpus: int) -> str:
        env = dict(launch.env)
        if gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's GRES plugin sets it to the allocation
        env["PYTHONUNBUFFERED"] = "1"
        exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(env.items()))
        return ("#!/bin/bash\n"
                f"# pita job {launch.job_id}, attempt {launch.attempt}\n"
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
        script.write_text(self.script(launch, gpus))
        out = _run(["sbatch", "--parsable", *self.request(launch), str(script)])
        if out.returncode != 0:
            raise RuntimeError(f"sbatch refused {launch.job_id}: {out.stderr.strip() or out.stdout.strip()}")
        sid = out.stdout.strip().split(";")[0]
        self.subs[launch.job_id] = _Sub(launch, sid, time.time(), gpus, grace_s=self.kill_grace_s)

    # ------------------------------------------------------------------ what Slurm says
    def slurm_ids(self) -> dict[str, str]:
        """pita job id -> Slurm job id of every attempt in flight (saved in the run state)."""
        return {j: s.slurm_id for j, s in self.subs.items()}

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

    def pending(self) -> dict[str, str]:
        """pita job id -> Slurm's reason, for attempts still waiting in the queue."""
        return {j: s.state_reason or "Pending" for j, s in self.subs.items() if s.state == "PENDING"}

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
                         poll_interval_s=float(c.poll_interval_s))


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
