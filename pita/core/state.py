"""state.json: job states, devices, timings and attempts, written atomically under a file lock.

Every change is a read-modify-write of the file under ``state.json.lock``, so updates from
several processes are never lost; readers (``python -m pita status``) take the same lock.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

from pita.core.errors import ResumeError
from pita.core.paths import atomic_write_json

STATE_VERSION = 1


class StateStore:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.lock = FileLock(str(self.path) + ".lock", timeout=60)

    def read(self) -> dict:
        with self.lock:
            return self._read_unlocked()

    def _read_unlocked(self) -> dict:
        if not self.path.exists():
            return {"version": STATE_VERSION, "jobs": {}}
        try:
            data = json.loads(self.path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ResumeError(f"{self.path} is corrupt ({e}); it cannot be resumed. Start a new run, or restore "
                              f"the file from a backup") from e
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), dict):
            raise ResumeError(f"{self.path} is corrupt (no 'jobs' table); it cannot be resumed. Start a new run")
        return data

    def update(self, fn: Callable[[dict], Any]) -> dict:
        """Apply ``fn(state)`` (which mutates it) under the lock, then write atomically."""
        with self.lock:
            data = self._read_unlocked()
            fn(data)
            data["updated"] = time.time()
            atomic_write_json(self.path, data)
            return data

    def update_jobs(self, changes: dict[str, dict]) -> dict:
        """Merge ``{job_id: {field: value}}`` into the jobs table in one locked write."""
        def apply(data):
            for jid, fields in changes.items():
                data["jobs"].setdefault(jid, {}).update(fields)
        return self.update(apply)
