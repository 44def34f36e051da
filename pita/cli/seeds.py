"""``pita seeds K [key=value ...]``: one experiment run K times, seeds 0..K-1, pooled.

    pita seeds 5 experiment=real_arith model=smollm2          (five runs, then their pooled report)
    pita seeds 3 --first 10 experiment=demo                   (seeds 10, 11, 12)

Each run is ``pita run`` with ``system.seed=<s>`` and the run name ``<experiment.name>-seed<s>``,
one after another (every run uses every device); then ``pita report RUN ... --out
<output_dir>/<name>/seeds-<K>`` pools them (seed-level intervals, docs/guide.md "Reading the
results"). A run that fails leaves the others: the pooled report is made from the runs that
finished, and the exit code is the worst run's. A seed override on the command line is refused
(exit 2): the seeds are this command's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def _value(overrides: list[str], key: str, default: str) -> str:
    for o in reversed(overrides):
        if o.split("=", 1)[0].lstrip("+") == key:
            return o.split("=", 1)[1]
    return default


def seeds_main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="pita seeds", description=__doc__.splitlines()[0])
    ap.add_argument("k", type=int, help="how many seeds (runs)")
    ap.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, as for pita run")
    args = ap.parse_intermixed_args(argv)
    if args.k < 1:
        print(f"error: pita seeds K: K={args.k} must be >= 1 (e.g. pita seeds 3 experiment=demo)", file=sys.stderr)
        return 2
    if any(o.split("=", 1)[0].lstrip("+") == "system.seed" for o in args.overrides):
        print("error: system.seed is set by pita seeds (seeds --first .. --first + K - 1); drop it from the overrides",
              file=sys.stderr)
        return 2
    out_dir = Path(_value(args.overrides, "system.output_dir", "outputs"))
    name = _value(args.overrides, "experiment.name", _value(args.overrides, "experiment", "demo"))
    runs, worst = [], 0
    for s in range(args.first, args.first + args.k):
        cmd = [sys.executable, "-m", "pita", "run", *args.overrides, f"system.seed={s}",
               f"experiment.name={name}-seed{s}"]
        print(f"pita seeds: seed {s}: {' '.join(cmd[3:])}", flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sys.stdout.write(proc.stdout[-2000:])
        worst = max(worst, proc.returncode)
        if proc.returncode == 2:  # bad configuration: every seed would say the same
            return 2
        found = re.findall(r"run folder: (\S+)", proc.stdout)
        if found and Path(found[-1]).is_dir():
            runs.append(found[-1])
    if len(runs) < 2:
        print(f"pita seeds: {len(runs)} run(s) finished; pooling needs 2 or more", file=sys.stderr)
        return worst or 1
    from pita.cli.report import report_main

    pooled = out_dir / name / f"seeds-{len(runs)}"
    pooled.parent.mkdir(parents=True, exist_ok=True)
    rc = report_main(runs, out=str(pooled))
    print(f"pita seeds: {len(runs)} runs pooled: {pooled}.md / {pooled}.json")
    return max(worst, rc)
