"""Your association's and QoS's limits (sacctmgr), and the limits of jobs, GPUs and --time in
flight they set for the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math

from dataclasses import dataclass

from pita.core.backends.slurm.commands import slurm_seconds, slurm_time, DEFAULT_IN_FLIGHT, _try, _user
from pita.core.backends.slurm.records import SlurmSettings

if TYPE_CHECKING:
    from pita.core.backends.slurm.backend import SlurmBackend


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


def _collect(found: dict[str, list], where: str, counts, tres, wall: str) -> None:
    """One association's or QoS's limits into ``found`` (key -> [(value, what sets it)]): job
    counts, GPUs and CPUs of its TRES lists, and MaxWall."""
    for key, value, what in counts:
        if value.isdigit():
            found[key].append((int(value), f"{where}'s {what} = {value}"))
    for key, name in (("gpus", "gres/gpu"), ("cpus", "cpu")):
        for text, what in tres:
            if (n := _tres(text, name)) is not None:
                found[key].append((n, f"{where}'s {what} {name}={n}"))
    if (w := slurm_seconds(wall)) is not None:
        found["wall_s"].append((w, f"{where}'s MaxWall = {wall}"))


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
        _collect(found, f"association {r[0]}", (("submit", r[4], "MaxSubmitJobs"), ("submit", r[5], "GrpSubmitJobs"),
                                                 ("running", r[6], "MaxJobs"), ("running", r[7], "GrpJobs")),
                 ((r[8], "GrpTRES"),), r[9])
    if qos:
        got = _try(["sacctmgr", "-nP", "show", "qos", "where", f"name={qos}",
                    "format=Name,MaxSubmitPU,GrpSubmit,MaxJobsPU,GrpJobs,GrpTRES,MaxTRESPU,MaxWall"])
        for line in (got.stdout.splitlines() if got else []):
            q = line.split("|")
            if len(q) != 8 or q[0] != qos:
                continue
            _collect(found, f"QoS {qos}", (("submit", q[1], "MaxSubmitJobsPerUser"), ("submit", q[2], "GrpSubmitJobs"),
                                           ("running", q[3], "MaxJobsPerUser"), ("running", q[4], "GrpJobs")),
                     ((q[5], "GrpTRES"), (q[6], "MaxTRESPerUser")), q[7])
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
