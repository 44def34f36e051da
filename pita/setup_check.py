"""Machine check behind ``python test_parallel_setup.py``: devices, one worker per device, memory.

Exit 0 when every check passes, 1 otherwise; a table says what was seen.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter

from pita.core.backends import make_backend
from pita.core.backends.local import describe_worker_start, resolve_worker_start
from pita.core.errors import ConfigError
from pita.core.executor import Executor, ExecutorSettings
from pita.core.gpu_manager import GPUManager, usable_cores
from pita.core.graph import JobGraph
from pita.core.job import Job, Resources
from pita.core.logs import setup_logging
from pita.core.paths import RunPaths


def check_assignments(reported: list[str | None], expected: list[str], cuda: bool,
                      counts: list[int]) -> list[str]:
    """Problems with what the workers saw (empty list = fine).

    Each worker must see exactly its own device: distinct CUDA_VISIBLE_DEVICES values (a list
    like ['0', '0', '1', '1'] means two workers share a device), equal to the expected ones, and
    torch must count exactly one device per worker (zero in CPU mode).
    """
    problems = []
    dup = sorted(v for v, n in Counter(reported).items() if n > 1)
    if cuda and dup:
        problems.append(f"duplicate assignments {reported}: devices {dup} were given to more than one worker")
    if cuda and sorted(map(str, reported)) != sorted(expected):
        problems.append(f"workers saw CUDA_VISIBLE_DEVICES {reported}, expected {expected}")
    want = 1 if cuda else 0
    bad = [i for i, c in enumerate(counts) if c != want]
    if bad:
        problems.append(f"workers {bad} saw {[counts[i] for i in bad]} CUDA devices; each should see {want}")
    return problems


def check_worker_devices(envs: list[dict], assigned: list[str | None]) -> tuple[list[str], list[str]]:
    """(problems, notes) from what each GPU worker reported about the device it used: the UUID
    CUDA gives it must be the one it was assigned, torch's current device cuda:0 of its one
    visible device, LOCAL_RANK unset or 0, and NVML must see its allocation while it is alive
    (where NVML can attribute memory to this pid namespace at all)."""
    problems, notes = [], []
    for i, (env, uuid) in enumerate(zip(envs, assigned)):
        if env.get("uuid") != uuid:
            problems.append(f"worker {i} was assigned {uuid} but CUDA gave it {env.get('uuid')} (CUDA and NVML number "
                            f"devices differently: CUDA_DEVICE_ORDER=PCI_BUS_ID is set for workers; check "
                            f"CUDA_VISIBLE_DEVICES)")
        if env.get("current_device") != 0:
            problems.append(f"worker {i}: torch.cuda.current_device() is {env.get('current_device')}, expected 0")
        if env.get("LOCAL_RANK") not in (None, "0"):
            problems.append(f"worker {i}: LOCAL_RANK={env.get('LOCAL_RANK')} in a one-device job")
    seen = [e.get("nvml_sees_bytes") for e in envs]
    if all(b is None for b in seen):
        notes.append("NVML attributes no memory to the workers' pids (a container's pid namespace?): per-job "
                     "usage is unknown, and the scheduler counts other processes as used - this run's reservations")
    else:
        for i, (env, b) in enumerate(zip(envs, seen)):
            if b is None or b < 0.9 * int(env.get("allocated_bytes") or 0):
                problems.append(f"worker {i} allocated {int(env.get('allocated_bytes') or 0) / 2**20:.0f} MiB but NVML "
                                f"attributes {'nothing' if b is None else f'{b / 2**20:.0f} MiB'} to its pid")
    return problems, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check GPU detection and per-device worker isolation.")
    ap.add_argument("--devices", default="auto", help="auto, cpu, or comma-separated indices")
    ap.add_argument("--keep", action="store_true", help="keep the check's run folder")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    sel = args.devices if args.devices in ("auto", "cpu") else [int(x) for x in args.devices.split(",")]
    try:
        gpus = GPUManager.detect(sel, cpu_devices=min(usable_cores(), 2))
    except ConfigError as e:  # e.g. a CUDA_VISIBLE_DEVICES the driver's devices do not match
        console.print(f"[bold red]error[/bold red]: {e}")
        return 2
    cuda = not gpus.is_cpu
    console.print(f"[bold]devices[/bold] ({gpus.source}, CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}):")
    for line in gpus.summary():
        console.print("  " + line)

    n = len(gpus.devices)
    items = 10_000
    shares = gpus.distribute(items)
    jobs = [Job(id=f"env.{i}", kind="synthetic.env", resources=Resources(1, 0.0)) for i in range(n)]
    start = 0
    for i, k in enumerate(shares):
        jobs.append(Job(id=f"share.{i}", kind="synthetic.share", params={"start": start, "stop": start + k},
                        resources=Resources(1, 0.0)))
        start += k
    root = tempfile.mkdtemp(prefix="pita-setup-")
    run = RunPaths.create(root, "setup_check")
    setup_logging(run.run_log, console=False)
    graph = JobGraph(jobs).validate([d.total_bytes for d in gpus.devices])
    settings = ExecutorSettings(max_jobs_per_device=1, progress="off", job_timeout_s=300, kill_grace_s=5)
    start = resolve_worker_start("auto", gpus.is_cpu)  # as a run would start its workers
    summary = Executor(graph, gpus, make_backend("local", worker_start=start), run, settings).run()

    problems = [f"job {f['job']} failed: {f['error']} (log {f['log']})" for f in summary.failures]
    results = {j.id: run.job(j.id).read_result() for j in jobs}
    envs = [results[f"env.{i}"] for i in range(n)]

    t = Table(title="one worker per device")
    cols = ("device", "assigned uuid", "worker pid", "CUDA_VISIBLE_DEVICES", "torch sees")
    if cuda:
        cols += ("worker's CUDA uuid", "LOCAL_RANK", "current device", "allocated MiB", "NVML sees MiB")
    for col in cols:
        t.add_column(col)
    placed, assigned = {}, []
    import json

    state = json.loads(run.state.read_text())
    for i in range(n):
        devs = state["jobs"][f"env.{i}"].get("devices", [])
        placed[i] = devs[0]["ordinal"] if devs else None
        assigned.append(devs[0].get("uuid") if devs else None)
    for i, env in enumerate(envs):
        o = placed.get(i)
        d = gpus.devices[o] if o is not None else None
        row = [d.label if d else "?", assigned[i] or "?", str(env.get("pid", "?")),
               str(env.get("CUDA_VISIBLE_DEVICES")), str(env.get("device_count", "?"))]
        if cuda:
            b = env.get("nvml_sees_bytes")
            row += [str(env.get("uuid")), str(env.get("LOCAL_RANK") or "unset"), str(env.get("current_device")),
                    f"{int(env.get('allocated_bytes') or 0) / 2**20:.0f}", "not attributed" if b is None else f"{b / 2**20:.0f}"]
        t.add_row(*row)
    console.print(t)
    notes = []
    if len(envs) == n and all(envs):
        expected = [d.visible_id for d in gpus.devices]
        problems += check_assignments([e.get("CUDA_VISIBLE_DEVICES") for e in envs], expected, cuda,
                                      [int(e.get("device_count", -1)) for e in envs])
        if cuda:
            more, notes = check_worker_devices(envs, assigned)
            problems += more
        used = sorted(o for o in placed.values() if o is not None)
        if used != list(range(n)):
            problems.append(f"workers ran on device ordinals {used}, expected one on each of 0..{n - 1}")
    got = sum(results[f"share.{i}"].get("sum", 0) for i in range(n))
    want = sum(range(items))
    console.print(f"workers start as in a run: {describe_worker_start(start)}")
    console.print(f"work distribution: {items} items split {shares} across {n} device(s); "
                  f"sum {got} (expected {want})")
    if got != want:
        problems.append(f"parallel work distribution summed to {got}, expected {want}")
    for note in notes:
        console.print(f"note: {note}")
    if args.keep or problems:
        console.print(f"check folder: {run.root}")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    if problems:
        console.print("[bold red]FAILED[/bold red]")
        for p in problems:
            console.print(f"  - {p}")
    elif cuda:
        console.print(f"[bold green]OK[/bold green]: each of {n} GPU worker(s) saw only its own device, by UUID, as "
                      f"cuda:0, with an allocation NVML {'saw' if not notes else 'could not attribute'}")
    else:
        console.print(f"[bold green]OK[/bold green] (CPU mode: {n} logical device(s), workers saw no CUDA device). "
                      f"No GPU check ran: no GPU is visible here")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
