"""``pita status RUN``: a run's jobs by state, devices, failures and their logs (safe on a live run);
given a folder of runs, the runs below it."""

from __future__ import annotations

import sys
from pathlib import Path

from pita.core.errors import ConfigError, ResumeError


def _runs_below(folder: str) -> list[Path]:
    """Run folders below ``folder`` (an experiment's folder, a sweep folder, or outputs/), up to
    three levels down (outputs/<name>/sweep-<time>/<point>), in path order; empty when ``folder``
    is itself a run."""
    root = Path(folder)
    if not root.is_dir() or any((root / m).exists() for m in ("state.db", "state.json", "config.yaml", "jobs")):
        return []

    def is_run(p: Path) -> bool:
        return p.is_dir() and any((p / m).exists() for m in ("state.db", "state.json", "config.yaml"))

    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        for p in sorted(d.iterdir()):
            if is_run(p):
                found.append(p)
            elif p.is_dir() and depth < 3:
                walk(p, depth + 1)

    walk(root, 1)
    return found


def status_main(run_dir: str, show_all: bool = False) -> int:
    """Jobs by state and by group (round), what runs where and for how long, failures with their
    logs; whether an orchestrator owns the run now (its owner lock) or it stopped. Reads the state
    database without blocking the run."""
    import time
    from collections import Counter

    from pita.core.owner import describe, probe
    from pita.core.paths import RunPaths
    from pita.core.state import for_reading

    runs = _runs_below(run_dir)
    if runs:  # a folder of runs (outputs/<name>): list them
        print(f"{run_dir} holds {len(runs)} run(s); show one with: pita status <run>")
        for r in runs:
            owned, _ = probe(r)
            print(f"  {r}  ({'running' if owned else 'not running'})")
        return 0
    try:
        run = RunPaths.open_existing(run_dir, "pita status")
        store, source = for_reading(run.root)
        if not store.exists():
            raise ResumeError(f"{run.root} has no state (state.db, state.json); resume_from= rebuilds it from "
                              f"the jobs' folders")
        data = store.read()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs = data["jobs"]
    now = time.time()
    owned, owner = probe(run.root)
    if owned:
        live = f"running: {describe(owner)}"
    elif data.get("finished") and not data.get("interrupted"):
        live = "finished"
    elif data.get("interrupted"):
        live = "interrupted"
    else:
        live = (f"stopped: its orchestrator ({describe(owner)}) is gone without finishing" if owner else "stopped")
    counts = Counter(j.get("state", "PENDING") for j in jobs.values())
    print(f"{run.root} ({live}): {len(jobs)} jobs; " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items())))
    if source:
        print(f"  ({source})")
    if not owned and counts.get("RUNNING"):
        command = next((r["command"] for r in reversed(data.get("runs", [])) if r.get("command")), "pita run")
        print(f"  ({counts['RUNNING']} job(s) were running when it stopped; resume with: "
              f"{command} resume_from={run.root.resolve()})")
    groups: dict[str, Counter] = {}
    for j in jobs.values():
        groups.setdefault(j.get("group") or "-", Counter())[j.get("state", "PENDING")] += 1
    for g, c in sorted(groups.items()):
        print(f"  {g:<10} " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(c.items())))

    def devs(j):
        return ",".join(d.get("label", "?") for d in j.get("devices", [])) or "host"

    def line(jid, j):
        st = j.get("state", "PENDING")
        n = max(int(j.get("attempt") or 0), len(j.get("attempts", [])))
        if st == "RUNNING":
            took = f"running {now - (j.get('started') or now):.0f}s" if owned else "was running when it stopped"
        elif j.get("duration_s") is not None:
            took = f"{j['duration_s']:.1f}s"
        else:
            took = ""
        extra = ""
        if st == "FAILED":
            log_path = j.get("log") or f"jobs/{jid}/job.log"
            extra = f"\n           error: {j.get('error')}\n           log: {run.root / log_path}"
        elif st == "SKIPPED":
            extra = f"  ({j.get('reason') or 'a dependency failed'})"
        return f"  {st:<9} {jid}  on {devs(j)}, attempt{'s' if n != 1 else ''} {n}, {took}{extra}"

    shown = [(jid, j) for jid, j in sorted(jobs.items())
             if show_all or j.get("state") in ("RUNNING", "FAILED", "SKIPPED")]
    if shown:
        print("jobs:" if show_all else "running, failed and skipped jobs:")
        for jid, j in shown:
            print(line(jid, j))
    busy = Counter(d.get("label", "?") for j in jobs.values() if j.get("state") == "RUNNING"
                   for d in j.get("devices", []))
    if busy and owned:
        print("devices: " + ", ".join(f"{k} {v} job{'s' if v != 1 else ''}" for k, v in sorted(busy.items())))
    from pita.core.memlearn import status_lines

    for text in status_lines(data):
        print(text)
    print(f"log: {run.run_log}")
    return 0

