"""Memory learning benchmark: planned estimates twice the true peaks, learning off vs on.

    python -m bench.memory_learning [--json] [--seed 0] [--no-executor] [--out bench/results/memory_learning.json]

Two parts, neither of which depends on how busy the machine's CPUs are:

simulated   the scheduler benchmark's grid (``pita.plans.synthetic.benchmark_grid``: 2030 jobs,
            durations in simulated minutes) on 1, 2, 4, 8 devices of 80 GB, with every job's true
            peak half of its planned estimate. The production Scheduler and MemoryLearner run in
            simulated time (``pita.core.simulation.simulate``): a finished job reports its true
            peak. Per device count: the makespan with learning off, on, and ``oracle`` (every job
            planned at the estimate learning converges to: the true peak x 1.2 + 256 MiB from the
            start), ``overcommits`` (job starts after which a device's true peaks added up to more
            than its whole memory; 0 means no OOM in this model) and the estimate changes logged.
            Co-located jobs are assumed not to slow each other (as in bench/scheduler.py).
executor    a small grid of sleeping synthetic jobs (``synthetic.work``, each declaring its peak
            through ``ctx.report_peak``: half its planned estimate) run for real by the executor
            with the local backend on one hand-built device of 80 GB, learning off and on. The
            jobs sleep, so their makespan is the sleeps plus the executor's dispatch overhead (a
            fork per attempt, ~0.1 s); on a loaded machine that overhead grows a little, which is
            why the load average is recorded. Wall seconds.

Nothing is asserted about speed; the figures are printed (and written with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from pita.core.job import Job
from pita.core.memlearn import learned_estimate
from pita.core.simulation import simulate
from pita.plans.synthetic import StageCost, benchmark_grid, build_grid

GB = 10**9
TRUE_SHARE = 0.5  # true peak / planned estimate: the plan's estimates are 2x too high


def _oracle(jobs: list[Job], cap: int) -> list[Job]:
    out = []
    for j in jobs:
        c = Job.from_dict(j.to_dict())
        if c.resources.devices:
            c.resources.memory_gb = learned_estimate(int(j.resources.memory_bytes * TRUE_SHARE),
                                                     j.resources.memory_bytes, cap) / 1e9
        out.append(c)
    return out


def simulated(seed: int = 0, device_counts=(1, 2, 4, 8), device_gb: float = 80.0, margin: float = 0.05) -> dict:
    jobs = benchmark_grid(seed)
    peaks = {j.id: int(j.resources.memory_bytes * TRUE_SHARE) for j in jobs}
    rows = []
    for n in device_counts:
        totals = [int(device_gb * GB)] * n
        off = simulate(jobs, totals, margin, true_peaks=peaks, learn_memory=False)
        on = simulate(jobs, totals, margin, true_peaks=peaks, learn_memory=True)
        oracle = simulate(_oracle(jobs, int(totals[0] * (1 - margin))), totals, margin, true_peaks=peaks)
        rows.append({
            "devices": n,
            "makespan_off": round(off.makespan, 2),
            "makespan_on": round(on.makespan, 2),
            "makespan_oracle": round(oracle.makespan, 2),
            "speedup_on_vs_off": round(off.makespan / on.makespan, 3),
            "overcommits_off": off.overcommits,
            "overcommits_on": on.overcommits,
            "estimate_changes_on": len(on.changes),
            "critical_path": round(on.critical_path, 2),
        })
    return {"unit": "simulated minutes", "jobs": len(jobs), "seed": seed, "device_gb": device_gb,
            "true_peak_share_of_planned": TRUE_SHARE, "results": rows}


def executor_grid(seconds: dict[str, float] | None = None) -> list[Job]:
    """3 algorithms x 1 family x 1 dataset x 2 rounds, 4 + 4 shards (71 jobs); planned memory as the
    benchmark's small family (19 GB generation and evaluation, 38 GB training), true peaks half."""
    seconds = seconds or {"gen": 1.5, "train": 2.5, "eval": 1.0, "merge": 0.1}
    memory = {"gen": 19.0, "train": 38.0, "eval": 19.0, "merge": 0.0}

    def cost(stage, *a):
        return StageCost(seconds[stage], memory[stage])

    jobs = build_grid(["PITA", "DPO", "GRPO"], ["small"], ["gsm8k"], 2, 4, 4, cost)
    for j in jobs:
        if j.resources.devices:
            j.params["peak_gb"] = j.resources.memory_gb * TRUE_SHARE
    return jobs


def executor(device_gb: float = 80.0, devices: int = 1) -> dict:
    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths

    rows = []
    for learn in (False, True):
        jobs = executor_grid()
        gpus = GPUManager.from_inventory(devices, device_gb * GB, kind="cpu")
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="pita-memlearn-") as tmp:
            run = RunPaths.create(tmp, "memlearn")
            setup_logging(run.run_log, console=False)
            settings = ExecutorSettings(progress="off", poll_interval_s=0.02, learn_memory=learn, max_cpu_jobs=8)
            be = make_backend("local", worker_start="forkserver")
            graph = JobGraph(jobs).validate([d.total_bytes for d in gpus.devices])
            t = time.perf_counter()
            summary = Executor(graph, gpus, be, run, settings).run()
            wall = time.perf_counter() - t
            state = json.loads(run.state.read_text())
            most = max(_most_at_once(state, o) for o in range(devices))
        rows.append({"learn_memory": learn, "makespan_s": round(wall, 2), "exit_code": summary.exit_code,
                     "most_jobs_on_one_device_at_once": most,
                     "estimates": {f"{e['kind']} like {e['like']}": {k: e[k] for k in ("planned_gb", "estimate_gb",
                                                                                       "jobs", "max_peak_gb")}
                                   for e in state.get("memory_estimates", {}).values()},
                     "load_average_before": [round(x, 2) for x in load_before],
                     "load_average_after": [round(x, 2) for x in os.getloadavg()]})
    sleeps = sum(j.duration_hint for j in executor_grid())
    return {"unit": "wall seconds", "jobs": len(executor_grid()), "devices": devices, "device_gb": device_gb,
            "sum_of_sleeps_s": round(sleeps, 1), "true_peak_share_of_planned": TRUE_SHARE, "results": rows}


def _most_at_once(state: dict, ordinal: int) -> int:
    """The most attempts that overlapped in time on one device (from the attempt records)."""
    spans = [(a["start"], a["end"]) for e in state["jobs"].values() for a in e.get("attempts", [])
             if any(d.get("ordinal") == ordinal for d in a.get("devices", [])) and a.get("start")]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-executor", action="store_true", help="the simulated part only")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    words = sys.argv[1:] if argv is None else list(argv)
    out = {"benchmark": "memory_learning", "command": " ".join(["python -m bench.memory_learning", *words]),
           "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "simulated": simulated(args.seed)}
    if not args.no_executor:
        out["executor"] = executor()
    text = json.dumps(out, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
        return
    sim = out["simulated"]
    print(f"simulated: {sim['jobs']} jobs, devices of {sim['device_gb']:.0f} GB, true peaks = "
          f"{sim['true_peak_share_of_planned']:g} x planned, times in simulated minutes")
    print(f"{'devices':>7} {'off':>9} {'on':>9} {'oracle':>9} {'on/off':>7} {'overcommits on':>15} {'changes':>8}")
    for r in sim["results"]:
        print(f"{r['devices']:>7} {r['makespan_off']:>9.1f} {r['makespan_on']:>9.1f} {r['makespan_oracle']:>9.1f} "
              f"{r['speedup_on_vs_off']:>7.2f} {r['overcommits_on']:>15} {r['estimate_changes_on']:>8}")
    if "executor" in out:
        ex = out["executor"]
        print(f"executor: {ex['jobs']} sleeping jobs ({ex['sum_of_sleeps_s']} s of sleeps) on {ex['devices']} "
              f"device(s) of {ex['device_gb']:.0f} GB, wall seconds")
        for r in ex["results"]:
            print(f"  learn_memory={str(r['learn_memory']).lower():<5} makespan {r['makespan_s']:.1f} s, at most "
                  f"{r['most_jobs_on_one_device_at_once']} jobs on a device, load {r['load_average_before'][0]:.1f}")


if __name__ == "__main__":
    main()
