"""The run's state: job states, devices, timings and attempts, in SQLite (WAL mode).

    store = StateStore(run.state)          # state.json's path; the database is state.db beside it
    store.apply({"job-a": {"state": "RUNNING"}}, attempts={"job-b": [{"n": 1, ...}]})
    store.read()                           # {"version", "jobs": {id: {...}}, <run-level fields>}
    store.write_snapshot()                 # state.json: the same dict, for people and the report

Why SQLite: every state change used to re-read and rewrite the whole ``state.json`` under a file
lock with an fsync, so the orchestrator's cost per change grew with the run (86 ms of CPU per job
at 507 jobs, 165 ms at 1,014). Here a change rewrites only the rows it touches (one row per job,
its fields as a JSON object), in one transaction per executor tick; WAL mode lets readers
(``pita status``) read while the orchestrator writes, without blocking either. ``synchronous=NORMAL``
makes a commit survive the orchestrator's death (SIGKILL, OOM) without an fsync per commit; a
power cut can lose the last commits, which resume re-derives from the ``.done`` markers anyway.

``state.json`` is a snapshot of the same dict written atomically now and then (the executor
writes one at start, every so often and at the end), so ``cat``, ``jq`` and the report keep
working; the database is the truth. A run folder from before the database (``state.json`` only)
is imported on first use.

Another process holding the database's write lock (an ``sqlite3`` shell, a backup tool) makes
writes raise :class:`StateBusy` after ``busy_timeout_s``; the executor keeps its changes in memory
and retries (see ``Executor._flush``), so no result is lost while it waits.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

from pita.core.errors import ResumeError
from pita.core.paths import atomic_write_json

STATE_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StateBusy(RuntimeError):
    """Another process holds the state database's write lock longer than the busy timeout."""


def is_disk_full(e: BaseException) -> bool:
    """A write failed because the file system is full (or over quota)."""
    import errno

    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, sqlite3.OperationalError) and "disk is full" in str(e)


class StateStore:
    def __init__(self, path: Path | str, busy_timeout_s: float = 60.0, snapshot_only: bool = False):
        """``path``: the run's ``state.json`` (the snapshot); the database is ``state.db`` beside it.
        ``snapshot_only``: read state.json and never open the database (:func:`for_reading`)."""
        self.path = Path(path)
        self.db_path = self.path.with_suffix(".db")
        self.busy_timeout_s = busy_timeout_s
        self.snapshot_only = snapshot_only
        self._conn: sqlite3.Connection | None = None

    # ------------------------------------------------------------------ connection
    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self.snapshot_only:
            raise RuntimeError(f"{self.db_path}: this store reads the snapshot only (its owner runs on another host)")
        fresh = not self.db_path.exists()
        try:
            conn = sqlite3.connect(str(self.db_path), timeout=self.busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
            self._setup(conn)
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise StateBusy(f"{self.db_path} is locked by another process ({e})") from e
            if is_disk_full(e):
                raise OSError(28, f"no space left on device writing {self.db_path}") from e
            raise
        except sqlite3.DatabaseError as e:
            raise ResumeError(f"{self.db_path} is corrupt ({e}); move it away and resume: the state is "
                              f"rebuilt from the jobs' .done markers and launch.json files") from e
        self._conn = conn
        if fresh and self.path.exists():
            self._import_json()
        return conn

    def _setup(self, conn: sqlite3.Connection) -> None:
        """WAL mode and the schema. Switching a new database to WAL takes an exclusive lock for which
        SQLite does not wait (its busy handler is not called): processes opening a new run's
        database at the same moment retry for up to ``busy_timeout_s`` instead of failing."""
        import time

        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.01
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                return
            except sqlite3.OperationalError as e:
                if not ("locked" in str(e) or "busy" in str(e)) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(0.5, delay * 2)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _import_json(self) -> None:
        """A run folder written before the database: take state.json in once."""
        data = self._read_json()
        self._write(lambda c: (
            c.executemany("INSERT OR REPLACE INTO jobs VALUES (?, ?)",
                          [(k, json.dumps(v)) for k, v in data["jobs"].items()]),
            c.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                          [(k, json.dumps(v)) for k, v in data.items() if k != "jobs"])))

    def _read_json(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ResumeError(f"{self.path} is corrupt ({e})") from e
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), dict):
            raise ResumeError(f"{self.path} is corrupt (no 'jobs' table)")
        return data

    def _write(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if is_disk_full(e):
                raise OSError(28, f"no space left on device writing {self.db_path}") from e
            raise StateBusy(f"{self.db_path} is locked by another process ({e})") from e
        try:
            fn(conn)
            conn.execute("COMMIT")
        except BaseException as e:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if is_disk_full(e) and not isinstance(e, OSError):
                raise OSError(28, f"no space left on device writing {self.db_path}") from e
            raise

    # ------------------------------------------------------------------ reads
    def exists(self) -> bool:
        return self.db_path.exists() or self.path.exists()

    def read(self) -> dict:
        """The whole state as one dict (what state.json holds). Never blocks a writer."""
        if self.snapshot_only:
            return self._read_json() if self.path.exists() else {"version": STATE_VERSION, "jobs": {}}
        if not self.db_path.exists():
            if self.path.exists():
                return self._read_json()
            return {"version": STATE_VERSION, "jobs": {}}
        conn = self._connect()
        try:
            conn.execute("BEGIN")
            meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
            jobs = {k: json.loads(v) for k, v in conn.execute("SELECT id, data FROM jobs")}
            conn.execute("COMMIT")
        except sqlite3.DatabaseError as e:
            raise ResumeError(f"{self.db_path} is corrupt ({e}); move it away and resume: the state is "
                              f"rebuilt from the jobs' .done markers and launch.json files") from e
        meta.setdefault("version", STATE_VERSION)
        return {**meta, "jobs": jobs}

    def job(self, job_id: str) -> dict:
        row = self._connect().execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return json.loads(row[0]) if row else {}

    # ------------------------------------------------------------------ writes
    def apply(self, changes: dict[str, dict] | None = None, attempts: dict[str, list[dict]] | None = None,
              meta: dict | None = None) -> None:
        """Merge ``{job: {field: value}}``, append attempt records and set run-level fields, in one
        transaction. The cost depends on the jobs touched, not on the size of the run."""
        changes, attempts, meta = changes or {}, attempts or {}, dict(meta or {})
        meta["updated"] = time.time()

        def fn(c: sqlite3.Connection) -> None:
            touched = set(changes) | set(attempts)
            for jid in touched:
                row = c.execute("SELECT data FROM jobs WHERE id = ?", (jid,)).fetchone()
                entry = json.loads(row[0]) if row else {}
                entry.update(changes.get(jid, {}))
                if jid in attempts:
                    entry.setdefault("attempts", []).extend(attempts[jid])
                c.execute("INSERT INTO jobs VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET data = excluded.data",
                          (jid, json.dumps(entry)))
            c.executemany("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                          [(k, json.dumps(v)) for k, v in meta.items()])

        self._write(fn)

    def update_jobs(self, changes: dict[str, dict]) -> None:
        self.apply(changes)

    def update(self, fn: Callable[[dict], Any]) -> dict:
        """Apply ``fn(state)`` to the whole state in one transaction (cost grows with the run: for
        setup and repairs, not for the executor's loop)."""
        out: dict = {}

        def whole(c: sqlite3.Connection) -> None:
            meta = {k: json.loads(v) for k, v in c.execute("SELECT key, value FROM meta")}
            jobs = {k: json.loads(v) for k, v in c.execute("SELECT id, data FROM jobs")}
            data = {**meta, "jobs": jobs}
            fn(data)
            data["updated"] = time.time()
            data.setdefault("version", STATE_VERSION)
            c.execute("DELETE FROM jobs")
            c.executemany("INSERT INTO jobs VALUES (?, ?)", [(k, json.dumps(v)) for k, v in data["jobs"].items()])
            c.execute("DELETE FROM meta")
            c.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in data.items() if k != "jobs"])
            out.update(data)

        self._write(whole)
        return out

    def write_snapshot(self) -> None:
        """state.json: the whole state, atomically (for people, ``jq`` and the report)."""
        atomic_write_json(self.path, self.read())


def for_reading(run_root: Path | str) -> tuple[StateStore, str]:
    """The store a reader (``pita status``, ``pita report``, ``pita seeds``) opens, and a line
    saying which: the database, unless a live orchestrator on another host owns the run folder.
    Then the snapshot it publishes atomically (``state.json``, at most
    ``executor.snapshot_interval_s`` old): SQLite's WAL mode needs every process on one host (its
    shared-memory index does not cross a network filesystem), so a login node never opens the
    database a compute node's driver writes."""
    import socket

    from pita.core.owner import probe

    root = Path(run_root)
    owned, info = probe(root)
    path = root / "state.json"
    if owned and info and info.get("host") != socket.gethostname():
        try:
            age = f"{time.time() - path.stat().st_mtime:.0f} s old"
        except OSError:
            age = "not written yet"
        return (StateStore(path, snapshot_only=True),
                f"read from state.json ({age}): the run's driver is on host {info.get('host')}, and its database "
                f"is read on that host only")
    return StateStore(path), ""
