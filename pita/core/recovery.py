"""A run folder whose state or config is damaged or missing, rebuilt from what its jobs left.

Every attempt writes ``jobs/<id>/launch.json`` (the job as planned, its fingerprint and the whole
resolved config) before it starts, and every finished job a ``.done`` marker listing its outputs.
That is enough to resume: the config comes from the newest ``launch.json``, and the state from
the markers (COMPLETED where the marker and its outputs are there, PENDING otherwise). Jobs
that never started have no trace; the resumed plan adds them again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from pita.core.errors import ResumeError
from pita.core.paths import RunPaths
from pita.core.state import StateStore

log = logging.getLogger("pita.recovery")


def launches(run: RunPaths) -> list[tuple[float, str, dict]]:
    out = []
    if not run.jobs_dir.is_dir():
        return out
    for d in os.scandir(run.jobs_dir):
        p = Path(d.path) / "launch.json"
        try:
            out.append((p.stat().st_mtime, d.name, json.loads(p.read_text())))
        except (OSError, ValueError):
            continue
    return out


def config_from_jobs(run: RunPaths) -> dict:
    """The resolved config every job received (the newest launch.json's); ResumeError if none."""
    for _, _, launch in sorted(launches(run), key=lambda t: t[0], reverse=True):
        if isinstance(launch.get("config"), dict) and launch["config"]:
            return launch["config"]
    raise ResumeError(f"{run.config} is missing or damaged and no job of {run.root} ever started (no "
                      f"jobs/*/launch.json holds the config): there is nothing to resume; start a new run")


def _move_aside(path: Path) -> Path | None:
    if not path.exists():
        return None
    dest = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, dest)
    for extra in ("-wal", "-shm"):
        side = path.with_name(path.name + extra)
        if side.exists():
            os.replace(side, dest.with_name(dest.name + extra))
    return dest


def rebuild_state(run: RunPaths) -> tuple[int, int]:
    """Replace a damaged or missing state with one rebuilt from launch.json files and markers;
    (jobs found, of which completed). The damaged files are kept beside, renamed."""
    store = StateStore(run.state)
    moved = [p for p in (_move_aside(store.db_path), _move_aside(run.state)) if p]
    jobs, completed = {}, 0
    for _, jid, launch in launches(run):
        job = launch.get("job") or {}
        problem = run.job(jid).done_problem()
        entry = {"kind": job.get("kind"), "group": job.get("group", ""), "deps": job.get("deps", []),
                 "log": f"jobs/{jid}/job.log", "attempt": launch.get("attempt"),
                 "state": "COMPLETED" if problem is None else "PENDING"}
        if launch.get("fingerprint"):
            entry["fingerprint"] = launch["fingerprint"]
        completed += problem is None
        jobs[jid] = entry
    store = StateStore(run.state)
    store.apply(jobs, meta={"created": time.time(), "rebuilt": {"at": time.time(), "from": "launch.json and .done",
                                                                 "damaged": [p.name for p in moved]}})
    store.write_snapshot()
    store.close()
    return len(jobs), completed
