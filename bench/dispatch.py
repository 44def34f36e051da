"""Dispatch overhead of a backend: N no-op jobs through the real executor on this machine.

    python -m bench.dispatch [--backend local|inline|ray] [--jobs 40] [--slots 2] [--json]
    python -m bench.dispatch --starts [--jobs 20]     local workers: exec vs forkserver

Per-job overhead is the time from the executor starting an attempt to noticing it ended (spawn,
interpreter start, imports, the no-op, result files, reaping) for jobs that do nothing.
Prints the median and p90 of that, and jobs/s over the whole run with ``--slots`` jobs at once.
``--backend ray`` starts a local Ray instance declaring ``--slots`` logical GPUs (its start-up
time is reported apart, ``ray_start_s``, and not counted per job) and runs the jobs through the
per-GPU actors; ``--compare`` runs local and ray on the same jobs and prints both.
``--starts`` runs jobs that import what a real job imports (torch, transformers, datasets, TRL:
``synthetic.imports``) with the local backend's two ways of starting a worker: a fresh
interpreter per attempt (exec) and a fork of the warm process that imported them (forkserver).
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


def run(backend: str = "local", n_jobs: int = 40, slots: int = 2, worker_start: str = "exec",
        kind: str = "synthetic.work") -> dict:
    params = {"seconds": 0.0} if kind == "synthetic.work" else {}
    jobs = [Job(id=f"noop.{i:04d}", kind=kind, params=params, resources=Resources(1, 0.0)) for i in range(n_jobs)]
    gpus = GPUManager.from_inventory(slots, 1e9, kind="cpu")
    extra = {}
    with tempfile.TemporaryDirectory() as tmp:
        if backend == "ray":
            import os

            from pita.core.backends.ray import RayBackend, connect

            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            t = time.perf_counter()
            owns = connect(None, num_gpus=slots, num_cpus=max(2, slots))
            be = RayBackend(owns_ray=owns)
            gpus = GPUManager(be.devices(int(1e9)), source="ray")
            extra["ray_start_s"] = round(time.perf_counter() - t, 3)
        elif backend == "local":
            from pita.core.backends.local import HEAVY_PRELOAD

            heavy = kind == "synthetic.imports"
            be = make_backend("local", worker_start=worker_start, preload=HEAVY_PRELOAD if heavy else ())
            extra["worker_start"] = worker_start
        else:
            be = make_backend(backend)
        run_paths = RunPaths.create(tmp, "dispatch")
        setup_logging(run_paths.run_log, console=False)
        settings = ExecutorSettings(max_jobs_per_device=1, progress="off", poll_interval_s=0.02)
        t0 = time.perf_counter()
        summary = Executor(JobGraph(jobs).validate(), gpus, be, run_paths, settings).run()
        wall = time.perf_counter() - t0
        state = json.loads(run_paths.state.read_text())
    overheads = sorted(a["end"] - a["start"] for j in state["jobs"].values() for a in j.get("attempts", []))
    return {"benchmark": "dispatch", "backend": backend, "kind": kind, "jobs": n_jobs, "concurrent": slots,
            "completed": summary.counts["COMPLETED"], "wall_s": round(wall, 3),
            "jobs_per_s": round(n_jobs / wall, 2),
            "median_overhead_s": round(statistics.median(overheads), 4),
            "p90_overhead_s": round(overheads[int(0.9 * (len(overheads) - 1))], 4), **extra}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--compare", action="store_true", help="local and ray on the same jobs")
    ap.add_argument("--starts", action="store_true",
                    help="local workers that import the model stack: fresh interpreter vs forked from a warm process")
    args = ap.parse_args(argv)
    if args.starts:
        outs = [run("local", args.jobs, args.slots, start, "synthetic.imports") for start in ("exec", "forkserver")]
    else:
        outs = [run(b, args.jobs, args.slots) for b in (["local", "ray"] if args.compare else [args.backend])]
    if args.json:
        print(json.dumps(outs if len(outs) > 1 else outs[0], indent=2))
        return
    for out in outs:
        what = "jobs importing the model stack" if out["kind"] == "synthetic.imports" else "no-op jobs"
        how = f" ({out['worker_start']})" if "worker_start" in out else ""
        print(f"{out['backend']}{how}: {out['jobs']} {what}, {out['concurrent']} at a time: "
              f"median {out['median_overhead_s'] * 1000:.0f} ms per job (p90 {out['p90_overhead_s'] * 1000:.0f} ms), "
              f"{out['jobs_per_s']:.1f} jobs/s" + (f"; Ray started in {out['ray_start_s']:.1f}s"
                                                  if "ray_start_s" in out else ""))


if __name__ == "__main__":
    main()
