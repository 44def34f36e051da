"""Slurm's commands and their words: calling them (a query never raises), parsing durations, exit
statuses and GRES, the states and reasons pita reads, and the request flags packs share by key."""

from __future__ import annotations

import json
import math
import os
import subprocess

from dataclasses import dataclass
from pathlib import Path

from pita.core.backends.base import Launch
import pita.core.backends.slurm as _pkg  # its tunables (tests set them there)


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


# sbatch refusals that name a limit on how many jobs you have queued: they clear as your jobs end
SUBMIT_LIMIT_REASONS = ("MaxSubmitJob", "MaxSubmitJobs", "GrpSubmitJob", "job submit limit")


# pending reasons that never clear by waiting: the attempt is cancelled and fails with the reason
NEVER_CLEARS = ("BadConstraints", "PartitionNodeLimit", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied",
                "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit", "QOSMaxGRESPerJob",
                "QOSMaxCpuPerJobLimit", "QOSMaxMemoryPerJob", "AssocMaxGRESPerJob", "AssocMaxCpuPerJobLimit",
                "AssocMaxMemPerJob", "QOSMinGRES", "AccountNotAllowed")


# sbatch refusals that waiting cannot change (anything else, a limit or a timeout, is retried)
_FINAL_REFUSALS = ("invalid", "unrecognized option", "requested node configuration is not available",
                   "unable to allocate resources: requested partition configuration not available")


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
                             timeout=_pkg.QUERY_TIMEOUT_S if timeout is None else min(timeout, _pkg.QUERY_TIMEOUT_S))
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


def _user() -> str:
    import getpass

    return getpass.getuser()


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


def _flag(args: list[str], prefix: str) -> str | None:
    for i, a in enumerate(args):
        if a == prefix and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(prefix + "="):
            return a.split("=", 1)[1]
    return None


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


@dataclass
class SimpleLaunch:
    """The part of a Launch that names an attempt's files."""
    paths: object
    attempt: int


def _outcome_status(launch: Launch) -> str | None:
    try:
        return json.loads(launch.paths.attempt(launch.attempt).read_text()).get("status")
    except (OSError, ValueError):
        return None


def attempt_log(launch) -> "os.PathLike":
    """Each attempt's own log (``job.log`` gathers the run's view of it: the executor's pump)."""
    return Path(launch.paths.dir) / f"attempt-{launch.attempt}.log"
