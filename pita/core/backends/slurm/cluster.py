"""The partition read before the run (sinfo, scontrol, sacctmgr): its nodes, the inventory they
give, the account and QoS it allows, and every kind's request tried with sbatch --test-only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import os

from pita.core.backends.slurm.commands import _run, slurm_seconds, SUBMIT_LIMIT_REASONS, gres_gpus, _flag
from pita.core.backends.slurm.records import SlurmSettings
from pita.core.backends.slurm.limits import in_flight_limits

if TYPE_CHECKING:
    from pita.core.backends.slurm.backend import SlurmBackend


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
