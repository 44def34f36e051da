"""Durations that learn: how well a calibrated plan predicts the next run's makespan.

    python -m bench.durations [--json] [--experiment smoke] [--cache DIR] [-- overrides...]

Runs ``run_parallel.py experiment=<experiment>`` once, plans the same experiment twice (from the
duration model alone, and ``--calibrate`` with that run), runs it a second time, and prints:

    planned_s_roofline     the plan's makespan from pita/plans/durations.py alone
    planned_s_calibrated   the plan's makespan with the first run's measured / planned seconds per kind
    run1_s, run2_s         the runs' own makespans (run.log's "finished after")
    error_calibrated       planned_s_calibrated / run2_s - 1
    error_roofline         planned_s_roofline / run2_s - 1
    factors                measured / planned per job kind, from the first run

The cache (``--cache``, default a fresh copy of .cache/pita under a temporary folder) should hold
the built family, so neither run builds it. Nothing is asserted; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(exp: str, cache: str, out: Path, extra: list[str]) -> tuple[Path, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(ROOT / "run_parallel.py"), f"experiment={exp}", f"system.cache_dir={cache}",
                        f"system.output_dir={out}", "executor.progress=plain", *extra], capture_output=True, text=True,
                       env=env, cwd=out)
    if r.returncode:
        raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
    run = max((out / exp).iterdir())
    m = re.search(r"finished after ([\d.]+)s", (run / "run.log").read_text())
    return run, float(m.group(1))


def _plan(exp: str, cache: str, extra: list[str], calibrate: Path | None) -> dict:
    args = [sys.executable, "-c", "import sys; from pita.cli.plan import plan_main; sys.exit(plan_main(sys.argv[1:]))",
            f"experiment={exp}", f"system.cache_dir={cache}", "--json", *extra]
    if calibrate:
        args += ["--calibrate", str(calibrate)]
    r = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                     PYTHONPATH=str(ROOT)))
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout)


def run(exp: str = "smoke", cache: str | None = None, extra: list[str] = ()) -> dict:
    with tempfile.TemporaryDirectory(prefix="pita-bench-durations-") as tmp:
        tmp = Path(tmp)
        if cache is None:
            cache = str(tmp / "cache")
            if (ROOT / ".cache/pita").is_dir():
                shutil.copytree(ROOT / ".cache/pita", cache)
        # an empty learned store: the roofline alone, then what the first run taught
        Path(cache, "durations.json").unlink(missing_ok=True)
        roof = _plan(exp, cache, list(extra), None)
        run1, t1 = _run(exp, cache, tmp, list(extra))
        cal = _plan(exp, cache, list(extra), run1)
        _, t2 = _run(exp, cache, tmp, list(extra))
    return {"benchmark": "durations", "experiment": exp, "jobs": len(cal["jobs"]),
            "planned_s_roofline": roof["makespan_s"], "planned_s_calibrated": cal["makespan_s"],
            "run1_s": t1, "run2_s": t2, "error_calibrated": round(cal["makespan_s"] / t2 - 1, 3),
            "error_roofline": round(roof["makespan_s"] / t2 - 1, 3),
            "factors": {k: v["measured_over_planned"] for k, v in cal["duration_corrections"].items()}}


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--experiment", default="smoke")
    ap.add_argument("--cache", default=None)
    a = ap.parse_args(argv)
    out = run(a.experiment, a.cache, extra)
    print(json.dumps(out, indent=2) if a.json else "\n".join(f"{k:>22}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
