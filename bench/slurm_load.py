"""Load on the Slurm controller of a run through the Slurm backend, read from slurmctld's own
counters (``sdiag``): the status RPCs (job, partition, node, federation info) a synthetic grid of
``--job-seconds`` jobs costs per minute, beside the submissions. Needs a cluster (``make
slurm-up``) and root for ``sdiag -r`` (the counters are reset first, so run nothing else on the
cluster meanwhile). Prints JSON; asserts nothing.

    python -m bench.slurm_load --job-seconds 30 --algos A,B,C --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# read-only queries a driver makes about jobs and the cluster (sdiag's REQUEST_STATS_INFO is this
# bench reading the counters, and is left out)
STATUS = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_USER_INFO", "REQUEST_PARTITION_INFO",
          "REQUEST_NODE_INFO", "REQUEST_FED_INFO", "REQUEST_JOB_STEP_INFO", "REQUEST_RESERVATION_INFO",
          "REQUEST_BUILD_INFO", "REQUEST_JOB_READY")


def rpc_counts() -> dict[str, int]:
    """sdiag's 'Remote Procedure Call statistics by message type': {name: count}."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    section = out.split("Remote Procedure Call statistics by message type", 1)[1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", section, re.M)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-seconds", type=float, default=30.0)
    ap.add_argument("--algos", default="A,B,C")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides for the run (e.g. executor.slurm.*)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pita-slurm-load-") as tmp:
        cmd = [sys.executable, str(ROOT / "run_parallel.py"), "experiment.workload=synthetic",
               f"synthetic.algos=[{args.algos}]", "synthetic.families=[f]", "synthetic.datasets=[d]",
               f"synthetic.rounds={args.rounds}", "synthetic.gen_shards=1", "synthetic.eval_shards=1",
               f"synthetic.job_seconds={args.job_seconds:g}", "executor.backend=slurm",
               "executor.slurm.gpu_card=H100", "executor.slurm.min_minutes=2", "experiment.name=load",
               f"system.output_dir={tmp}", "executor.progress=off", *args.extra]
        subprocess.run(["sdiag", "-r"], capture_output=True, check=True)
        before = rpc_counts()
        t0 = time.time()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        wall = time.time() - t0
        after = rpc_counts()
        if r.returncode != 0:
            print(r.stdout[-2000:] + r.stderr[-2000:], file=sys.stderr)
            return r.returncode
        state = json.loads(next(Path(tmp, "load").glob("*/state.json")).read_text())
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) - before.get(k, 0) > 0}
    delta.pop("REQUEST_STATS_INFO", None)
    status = {k: v for k, v in delta.items() if k in STATUS}
    out = {"jobs": len(state["jobs"]),
           "slurm_jobs": sum(1 for e in state["jobs"].values() for a in e.get("attempts", []) if a.get("slurm_job")),
           "job_seconds": args.job_seconds, "wall_s": round(wall, 1), "status_rpcs": sum(status.values()),
           "status_rpcs_per_minute": round(sum(status.values()) / (wall / 60), 1), "status_by_type": status,
           "other_rpcs": {k: v for k, v in delta.items() if k not in STATUS}, "overrides": args.extra}
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip()
    except OSError:
        pass
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
