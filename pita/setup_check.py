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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check GPU detection and per-device worker isolation.")
    ap.add_argument("--devices", default="auto", help="auto, cpu, or comma-separated indices")
    ap.add_argument("--keep", action="store_true", help="keep the check's run folder")
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    sel = args.devices if args.devices in ("auto", "cpu") else [int(x) for x in args.devices.split(",")]
    gpus = GPUManager.detect(sel, cpu_devices=min(usable_cores(), 2))
    cuda = not gpus.is_cpu
    before = [d.used_bytes for d in gpus.devices]
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
    gpus.refresh()
    after = [d.used_bytes for d in gpus.devices]

    t = Table(title="one worker per device")
    for col in ("device", "uuid", "worker pid", "CUDA_VISIBLE_DEVICES", "torch sees", "mem before GB", "mem after GB"):
        t.add_column(col)
    placed = {}
    import json

    state = json.loads(run.state.read_text())
    for i in range(n):
        devs = state["jobs"][f"env.{i}"].get("devices", [])
        placed[i] = devs[0]["ordinal"] if devs else None
    for i, env in enumerate(envs):
        o = placed.get(i)
        d = gpus.devices[o] if o is not None else None
        t.add_row(d.label if d else "?", d.uuid if d else "?", str(env.get("pid", "?")),
                  str(env.get("CUDA_VISIBLE_DEVICES")), str(env.get("device_count", "?")),
                  f"{before[o] / 1e9:.2f}" if d else "?", f"{after[o] / 1e9:.2f}" if d else "?")
    console.print(t)
    if len(envs) == n and all(envs):
        expected = [str(d.index) for d in gpus.devices]
        problems += check_assignments([e.get("CUDA_VISIBLE_DEVICES") for e in envs], expected, cuda,
                                      [int(e.get("device_count", -1)) for e in envs])
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
    if problems:
        console.print("[bold red]FAILED[/bold red]")
        for p in problems:
            console.print(f"  - {p}")
    else:
        console.print("[bold green]OK[/bold green]: every worker saw only its own device")
    if args.keep or problems:
        console.print(f"check folder: {run.root}")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
