"""``pita seeds K [key=value ...]``: one experiment run K times, seeds 0..K-1, pooled.

    pita seeds 5 experiment=real_arith model=smollm2          (five runs, then their pooled report)
    pita seeds 3 --first 10 experiment=demo                   (seeds 10, 11, 12)

Each run is ``pita run`` with ``system.seed=<s>`` and the run name ``<experiment.name>-seed<s>``,
one after another (every run uses every device); then ``pita report RUN ... --out
<output_dir>/<name>/seeds-<K>`` pools them (seed-level intervals, docs/guide.md "Output
layout"). A run that fails leaves the others: the pooled report is made from the runs that
finished, and the exit code is the worst run's. A seed override on the command line is refused
(exit 2): the seeds are this command's.

The same command again (a later sitting, after a crash or a Ctrl-C) picks up where the last one
stopped: each seed folder ``<output_dir>/<name>-seed<s>/`` records the overrides it was started
with (``pita-seeds.json``); a seed whose latest run finished with the same overrides is kept as
it is, one that stopped part-way is resumed (``resume_from=``: its finished jobs are not run
again), and a seed whose recorded overrides differ starts a new run, saying which. A seed whose
run an orchestrator still owns is refused (exit 2): two commands would run it at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

MANIFEST = "pita-seeds.json"  # in each seed's folder: the overrides its runs were started with


def _value(overrides: list[str], key: str, default: str) -> str:
    for o in reversed(overrides):
        if o.split("=", 1)[0].lstrip("+") == key:
            return o.split("=", 1)[1]
    return default


def _earlier(seed_dir: Path, overrides: list[str]) -> tuple[Path | None, str]:
    """What an earlier ``pita seeds`` left for one seed: (its latest run folder, "finished" |
    "stopped" | "running"), or (None, why a new run starts)."""
    try:
        recorded = json.loads((seed_dir / MANIFEST).read_text()).get("overrides")
    except (OSError, ValueError):
        return None, ""
    if recorded != overrides:
        changed = sorted(set(map(str, recorded or [])) ^ set(overrides))
        return None, f"its earlier runs were started with other overrides ({' '.join(changed)}); they are left as they are"
    from pita.cli.status import _runs_below
    from pita.core.owner import probe
    from pita.core.state import StateStore

    runs = sorted(_runs_below(str(seed_dir)))  # run folders are named by their start time
    if not runs:
        return None, ""
    run = runs[-1]
    if probe(run)[0]:
        return run, "running"
    try:
        store = StateStore(run / "state.json")
        data = store.read() if store.exists() else {}
    except Exception:  # unreadable: resume_from= rebuilds it from the jobs' folders
        data = {}
    return run, "finished" if data.get("finished") and not data.get("interrupted") else "stopped"


def _finished_code(run: Path) -> int:
    """The exit code a finished run's command gave: 1 if any job failed or was skipped."""
    from pita.core.state import StateStore

    try:
        jobs = StateStore(run / "state.json").read()["jobs"]
    except Exception:
        return 1
    return 1 if any(j.get("state") in ("FAILED", "SKIPPED") for j in jobs.values()) else 0


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
        seed_dir = out_dir / f"{name}-seed{s}"
        earlier, how = _earlier(seed_dir, list(args.overrides))
        if how == "running":
            print(f"error: seed {s}'s run {earlier} is owned by a running orchestrator (pita status {earlier}); "
                  f"wait for it or stop it, then run this command again", file=sys.stderr)
            return 2
        if how == "finished":
            print(f"pita seeds: seed {s}: finished earlier with these overrides: {earlier} (kept)", flush=True)
            runs.append(str(earlier))
            worst = max(worst, _finished_code(earlier))
            continue
        if earlier is not None:  # stopped part-way: its finished jobs are kept
            cmd = [sys.executable, "-m", "pita", "run", f"resume_from={earlier}"]
            print(f"pita seeds: seed {s}: resuming {earlier}, which stopped part-way", flush=True)
        else:
            if how:
                print(f"pita seeds: seed {s}: a new run: {how}", flush=True)
            cmd = [sys.executable, "-m", "pita", "run", *args.overrides, f"system.seed={s}",
                   f"experiment.name={name}-seed{s}"]
            seed_dir.mkdir(parents=True, exist_ok=True)
            (seed_dir / MANIFEST).write_text(json.dumps({"overrides": list(args.overrides), "seed": s}) + "\n")
            print(f"pita seeds: seed {s}: run {' '.join(cmd[3:])}", flush=True)
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
    if rc == 0:
        print(f"pita seeds: {len(runs)} runs pooled: {pooled}.md / {pooled}.json")
    else:
        print(f"pita seeds: the {len(runs)} runs could not be pooled (pita report exit {rc}, above); "
              f"each run's own report is in its results/", file=sys.stderr)
    return max(worst, rc)
