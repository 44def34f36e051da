"""Dispatch overhead of a backend: N no-op jobs through the real executor on this machine.

    python -m bench.dispatch [--backend local|inline] [--jobs 40] [--slots 2] [--json]

Per-job overhead is the time from the executor starting an attempt to noticing it ended (spawn,
interpreter start, imports, the no-op, result files, reaping) for jobs that do nothing.
Prints the median and p90 of that, and jobs/s over the whole run with ``--slots`` jobs at once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from pita.core.backends import make_backend
from pita.core.executor import Executor, ExecutorSettings
from pita.core.gpu_manager import GPUManager
from pita.core.graph import JobGraph
from pita.core.job import Job, Resources
from pita.core.logs import setup_logging
from pita.core.paths import RunPaths


def run(backend: str = "local", n_jobs: int = 40, slots: int = 2) -> dict:
    jobs = [Job(id=f"noop.{i:04d}", kind="synthetic.work", params={"seconds": 0.0}, resources=Resources(1, 0.0))
            for i in range(n_jobs)]
    gpus = GPUManager.from_inventory(slots, 1e9, kind="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        run_paths = RunPaths.create(tmp, "dispatch")
        setup_logging(run_paths.run_log, console=False)
        settings = ExecutorSettings(max_jobs_per_device=1, progress="off", poll_interval_s=0.02)
        t0 = time.perf_counter()
        summary = Executor(JobGraph(jobs).validate(), gpus, make_backend(backend), run_paths, settings).run()
        wall = time.perf_counter() - t0
        state = json.loads(run_paths.state.read_text())
    overheads = sorted(a["end"] - a["start"] for j in state["jobs"].values() for a in j.get("attempts", []))
    return {"benchmark": "dispatch", "backend": backend, "jobs": n_jobs, "concurrent": slots,
            "completed": summary.counts["COMPLETED"], "wall_s": round(wall, 3),
            "jobs_per_s": round(n_jobs / wall, 2),
            "median_overhead_s": round(statistics.median(overheads), 4),
            "p90_overhead_s": round(overheads[int(0.9 * (len(overheads) - 1))], 4)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run(args.backend, args.jobs, args.slots)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['backend']}: {out['jobs']} no-op jobs, {out['concurrent']} at a time: "
              f"median {out['median_overhead_s'] * 1000:.0f} ms per job (p90 {out['p90_overhead_s'] * 1000:.0f} ms), "
              f"{out['jobs_per_s']:.1f} jobs/s")


if __name__ == "__main__":
    main()
