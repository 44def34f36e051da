"""Scheduler benchmark in simulated time: the production Scheduler on a synthetic experiment grid.

    python -m bench.scheduler [--json] [--seed 0]

Workload (``pita.plans.synthetic.benchmark_grid``): 6 algorithms x 5 datasets x 2 model
families x 3 rounds; per round 4 generation shards -> merge (host) -> training -> 4 evaluation
shards -> merge (host); plus a base-model evaluation per (family, dataset). Durations (minutes)
and memory (GB) differ by stage, family and dataset, with seeded +-30% jitter; small-family
jobs (19 GB) pack four to an 80 GB device, large-family inference (38 GB) two, large
trainings (76 GB) hold a device alone.

For 1, 2, 4 and 8 devices of 80 GB it prints:
    makespan          simulated minutes to finish everything
    lower_bound       max(critical path, device-time / devices); a job holding m of a device's
                      usable memory for t minutes counts t*m/usable device-minutes
    efficiency        lower_bound / makespan
    speedup           makespan on 1 device / makespan here
    barrier_makespan  baseline policy: one job per device at a time, rounds separated by barriers
Co-located jobs are assumed not to slow each other (optimistic for sharing; see docs/decisions/scheduler-benchmark-model.md).
"""

from __future__ import annotations

import argparse
import json

from pita.core.simulation import simulate, with_round_barriers
from pita.plans.synthetic import benchmark_grid


def run(seed: int = 0, device_counts=(1, 2, 4, 8), device_gb: float = 80.0) -> dict:
    jobs = benchmark_grid(seed)
    rows = []
    base = None
    for n in device_counts:
        totals = [int(device_gb * 1e9)] * n
        res = simulate(jobs, totals)
        barrier = simulate(with_round_barriers(jobs), totals, max_jobs_per_device=1)
        base = base or res.makespan
        rows.append({
            "devices": n,
            "makespan": round(res.makespan, 2),
            "lower_bound": round(res.lower_bound, 2),
            "efficiency": round(res.efficiency, 4),
            "speedup": round(base / res.makespan, 3),
            "barrier_makespan": round(barrier.makespan, 2),
            "barrier_ratio": round(barrier.makespan / res.makespan, 3),
        })
    return {"benchmark": "scheduler", "unit": "simulated minutes", "jobs": len(jobs), "seed": seed,
            "device_gb": device_gb, "results": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = run(args.seed)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['jobs']} jobs, devices of {out['device_gb']:.0f} GB, times in simulated minutes")
    print(f"{'devices':>7} {'makespan':>9} {'bound':>9} {'eff':>6} {'speedup':>7} {'barrier':>9} {'ratio':>6}")
    for r in out["results"]:
        print(f"{r['devices']:>7} {r['makespan']:>9.1f} {r['lower_bound']:>9.1f} {r['efficiency']:>6.3f} "
              f"{r['speedup']:>7.2f} {r['barrier_makespan']:>9.1f} {r['barrier_ratio']:>6.2f}")


if __name__ == "__main__":
    main()
