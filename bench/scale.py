"""Orchestrator cost per job as a run grows: the synthetic workload, no-op jobs, 2 CPU devices.

    python -m bench.scale [--jobs 500 2000 10000] [--json] [--out bench/results/scale.json]

For each size, the synthetic grid (``pita.plans.synthetic.demo_grid``: 6 algorithms, 2 rounds,
2 generation and 2 evaluation shards, as many datasets as it takes to reach the size) runs
through the real executor and local backend (workers forked from the warm process, as CPU runs
do) with ``synthetic.job_seconds=0`` on 2 CPU devices. Measured in the orchestrator's process:

    cpu_ms_per_job      its CPU time (user + system, this process only) / jobs
    wall_s, jobs_per_s  the run from start to end
    first_tenth_s / last_tenth_s   wall time of the first and the last 10% of completions
                        (equal when the cost per job does not grow with the run)
    plan_s              building and validating the graph

The run's state store is ``state.db`` (SQLite, WAL); before it, every change rewrote the whole
state.json (86 ms of CPU per job at 507 jobs, 165 ms at 1,014). It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time
from pathlib import Path

from pita.core.backends import make_backend
from pita.core.executor import Executor, ExecutorSettings
from pita.core.gpu_manager import GPUManager
from pita.core.graph import JobGraph
from pita.core.logs import setup_logging
from pita.core.paths import RunPaths
from pita.plans.synthetic import ALGOS, demo_grid

PER_DATASET = 3 + len(ALGOS) * 2 * 7  # base evaluation + 6 algorithms x 2 rounds x 7 jobs


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(n_jobs: int, devices: int = 2) -> dict:
    datasets = [f"d{i}" for i in range(max(1, math.ceil(n_jobs / PER_DATASET)))]
    t = time.perf_counter()
    jobs = demo_grid(ALGOS, ["tiny"], datasets, 2, 2, 2, 0.0, 0.1)
    gpus = GPUManager.from_inventory(devices, 8e9, kind="cpu")
    graph = JobGraph(jobs).validate([d.total_bytes for d in gpus.devices])
    plan_s = time.perf_counter() - t
    with tempfile.TemporaryDirectory(dir=os.environ.get("PITA_BENCH_DIR")) as tmp:
        run_paths = RunPaths.create(tmp, "scale")
        setup_logging(run_paths.run_log, console=False)
        backend = make_backend("local", worker_start="forkserver")
        settings = ExecutorSettings(max_jobs_per_device=1, max_cpu_jobs=2, progress="off", poll_interval_s=0.1,
                                    threads_per_job=1)
        cpu0, t0 = _cpu(), time.time()
        summary = Executor(graph, gpus, backend, run_paths, settings).run()
        wall, cpu = time.time() - t0, _cpu() - cpu0
        state = json.loads(run_paths.state.read_text())
        db_mb = run_paths.state.with_suffix(".db").stat().st_size / 2**20
    ends = sorted(e["finished"] for e in state["jobs"].values() if e.get("finished"))
    tenth = max(1, len(ends) // 10)
    return {"jobs": len(jobs), "completed": summary.counts["COMPLETED"], "devices": devices,
            "cpu_ms_per_job": round(1000 * cpu / len(jobs), 2), "wall_s": round(wall, 1),
            "jobs_per_s": round(len(jobs) / wall, 1), "plan_s": round(plan_s, 2),
            "first_tenth_s": round(ends[tenth - 1] - t0, 1), "last_tenth_s": round(ends[-1] - ends[-tenth - 1], 1),
            "state_db_mb": round(db_mb, 1)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[500, 2000, 10000])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    rows = []
    for n in args.jobs:
        rows.append(run(n))
        if not args.json:
            r = rows[-1]
            print(f"{r['jobs']:>6} jobs: {r['cpu_ms_per_job']:6.2f} ms orchestrator CPU per job, {r['jobs_per_s']:5.1f} "
                  f"jobs/s ({r['wall_s']:.0f} s), first/last tenth {r['first_tenth_s']:.1f}/{r['last_tenth_s']:.1f} s, "
                  f"plan {r['plan_s']:.2f} s, state.db {r['state_db_mb']:.1f} MB", flush=True)
    base = rows[0]["cpu_ms_per_job"]
    out = {"benchmark": "scale", "workload": "synthetic, job_seconds=0, 2 CPU devices, forked workers",
           "cpu_count": os.cpu_count(), "results": rows,
           "cpu_per_job_ratio_largest_to_smallest": round(rows[-1]["cpu_ms_per_job"] / base, 3) if base else None}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"CPU per job, largest run / smallest run: {out['cpu_per_job_ratio_largest_to_smallest']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
