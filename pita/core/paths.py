"""RunPaths and JobPaths: the one place that knows where a run's files live. Atomic writes.

    outputs/<experiment.name>/<YYYY-MM-DD_HH-MM-SS>/
      run.log  config.yaml  state.json
      jobs/<job-id>/  job.log  launch.json  attempt-<n>.json  result.json  artifacts/  .done
      results/
      state.db (the state, SQLite)  owner.lock (held by the orchestrator that runs it)

Nothing stored in the folder names the folder itself: result paths are kept relative to it, so
a run folder can be moved and still resumed.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pita.core.errors import ConfigError, ResumeError


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: 0o666 less the umask (read from
    /proc where it can be, since reading it with os.umask means setting it for a moment)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: Path | str, data: str | bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``. The file
    gets the permissions the umask allows, as a plain write would (a temporary file is made 0600:
    labmates on a shared node could not read a run's results)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path | str, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@dataclass(frozen=True)
class JobPaths:
    dir: Path

    @property
    def log(self) -> Path:
        return self.dir / "job.log"

    @property
    def launch(self) -> Path:
        return self.dir / "launch.json"

    @property
    def result(self) -> Path:
        return self.dir / "result.json"

    @property
    def done(self) -> Path:
        """Completion marker, written last: the job counts as done only once it exists."""
        return self.dir / ".done"

    @property
    def artifacts(self) -> Path:
        return self.dir / "artifacts"

    @property
    def checkpoints(self) -> Path:
        """Kept across attempts and resumes, for jobs that can continue mid-way."""
        return self.dir / "checkpoints"

    @property
    def metrics(self) -> Path:
        """Per-step training metrics, one JSON object a line (loss, reward, KL, ...)."""
        return self.dir / "metrics.jsonl"

    @property
    def torch_memory(self) -> Path:
        """What the running attempt's torch holds on its GPUs now (allocated, reserved bytes)."""
        return self.dir / "torch-memory.json"

    def write_metrics(self, rows: list[dict]) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        atomic_write(self.metrics, "".join(json.dumps(row) + "\n" for row in rows))

    def attempt(self, n: int) -> Path:
        return self.dir / f"attempt-{n}.json"

    def is_done(self) -> bool:
        return self.done.exists()

    def outputs(self) -> dict[str, int]:
        """The job's declared outputs and their sizes: result.json, metrics.jsonl and everything
        under artifacts/ (what the .done marker records, and what resume checks)."""
        out = {}
        for name in ("result.json", "metrics.jsonl"):
            try:
                out[name] = (self.dir / name).stat().st_size
            except FileNotFoundError:
                pass
        for folder, _, files in os.walk(self.artifacts):
            for f in files:
                full = os.path.join(folder, f)
                out[os.path.relpath(full, self.dir)] = os.stat(full).st_size
        return out

    def write_done(self, attempt: int) -> None:
        """The completion marker, written last, listing the outputs it vouches for."""
        atomic_write(self.done, json.dumps({"attempt": attempt, "finished": time.time(), "outputs": self.outputs()}))

    def done_problem(self) -> str | None:
        """None if the job is complete: its marker exists and every output it lists is there with
        the size it had; otherwise why not (said in the log when resume re-runs it)."""
        try:
            text = self.done.read_text()
        except FileNotFoundError:
            return "no .done marker"
        try:
            marker = json.loads(text)
        except ValueError:
            marker = {}
        outputs = marker.get("outputs") if isinstance(marker, dict) else None
        if not isinstance(outputs, dict):  # a marker from before outputs were listed
            outputs = {"result.json": None}
        for name, size in sorted(outputs.items()):
            try:
                now = (self.dir / name).stat().st_size
            except FileNotFoundError:
                return f"its .done marker lists {name}, which is missing"
            if size is not None and now != size:
                return f"{name} is {now} bytes, but its .done marker recorded {size}"
        return None

    def read_result(self) -> dict:
        """result.json, with the paths stored relative to the run folder made whole again."""
        if not self.result.exists():
            return {}
        return RunPaths(self.dir.parent.parent).from_relative(json.loads(self.result.read_text()))

    def clear_for_rerun(self) -> None:
        """Drop a stale result and marker of an unfinished attempt; keep logs and checkpoints."""
        for p in (self.done, self.result):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def check_free_space(output_dir: Path | str, need_bytes: float) -> None:
    """ConfigError when the file system of ``output_dir`` (or its nearest existing parent) has
    less than ``need_bytes`` free."""
    import shutil

    if need_bytes <= 0:
        return
    probe = Path(output_dir).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need_bytes:
        raise ConfigError(f"system.output_dir={str(output_dir)!r}: only {free / 2**30:.2f} GiB free on the file "
                          f"system of {probe}, and a run needs at least system.min_free_gb="
                          f"{need_bytes / 2**30:g} GiB; free space there, point system.output_dir at a larger "
                          f"disk, or lower system.min_free_gb")


NAME_MAX = 255  # bytes in one file or folder name (ext4, xfs, NFS, Lustre)
RELATIVE_KEY = "_run_relative"  # result.json: which values are paths relative to the run folder


class RunPaths:
    STAMP = "%Y-%m-%d_%H-%M-%S"

    def __init__(self, root: Path | str):
        # absolute: a later driver (resume_from=, a requeued one) matches its jobs' paths on it
        self.root = Path(root).absolute()

    @property
    def run_log(self) -> Path:
        return self.root / "run.log"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def results(self) -> Path:
        return self.root / "results"

    def job(self, job_id: str) -> JobPaths:
        return JobPaths(self.jobs_dir / job_id)

    @property
    def owner_lock(self) -> Path:
        return self.root / "owner.lock"

    def to_relative(self, result: dict) -> dict:
        """``result`` with every string that is a path inside this run folder made relative to it
        (listed under ``_run_relative``), so a moved run folder still resumes."""
        roots = sorted({str(self.root).rstrip(os.sep), os.path.abspath(self.root), os.path.realpath(self.root)},
                       key=len, reverse=True)
        found: list[list] = []

        def walk(x, where):
            if isinstance(x, str):
                for r in roots:
                    if x == r or x.startswith(r + os.sep):
                        found.append(where)
                        return os.path.relpath(x, r)
                return x
            if isinstance(x, dict):
                return {k: walk(v, where + [k]) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [walk(v, where + [i]) for i, v in enumerate(x)]
            return x

        out = walk(result, [])
        if found:
            out[RELATIVE_KEY] = found
        return out

    def from_relative(self, result: dict) -> dict:
        """Undo :meth:`to_relative` against this run folder, wherever it now is."""
        where_all = result.pop(RELATIVE_KEY, None) if isinstance(result, dict) else None
        for where in where_all or []:
            node = result
            for k in where[:-1]:
                node = node[k]
            node[where[-1]] = str(self.root / node[where[-1]])
        return result

    @staticmethod
    def check_name(name: str) -> None:
        if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("-"):
            raise ConfigError(f"experiment.name={name!r} must be a plain folder name (no '/', '\\', "
                              f"or leading '-'); for example experiment.name=my_experiment")
        if len(name.encode()) > NAME_MAX:
            raise ConfigError(f"experiment.name={name[:40] + '...'!r} is {len(name.encode())} bytes long; a folder name "
                              f"holds at most {NAME_MAX} bytes on common file systems: choose a shorter experiment.name")

    @classmethod
    def create(cls, output_dir: Path | str, experiment: str, now: float | None = None,
               min_free_bytes: float = 0) -> "RunPaths":
        """Make a new run folder ``<output_dir>/<experiment>/<stamp>`` (suffix _1, _2, ... on a clash).

        With ``min_free_bytes``, refuse (before creating anything) when the file system that would
        hold the run has less free space."""
        cls.check_name(experiment)
        check_free_space(output_dir, min_free_bytes)
        base = Path(output_dir) / experiment
        stamp = time.strftime(cls.STAMP, time.localtime(now if now is not None else time.time()))
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"system.output_dir={str(output_dir)!r}: cannot create {base} ({e.strerror}); "
                              f"choose a writable folder") from e
        for i in range(1000):
            root = base / (stamp if i == 0 else f"{stamp}_{i}")
            try:
                root.mkdir()
            except FileExistsError:
                continue
            except OSError as e:
                raise ConfigError(f"cannot create the run folder {root} ({e.strerror})") from e
            (root / "jobs").mkdir()
            (root / "results").mkdir()
            return cls(root)
        raise ConfigError(f"too many runs of {experiment!r} started at {stamp}")

    @classmethod
    def create_at(cls, root: Path | str, output_dir: Path | str | None = None, min_free_bytes: float = 0) -> "RunPaths":
        """Make the new run folder ``root`` itself (a sweep point's, named by its overrides); a
        ConfigError if it exists. ``output_dir`` is named in the messages (system.output_dir)."""
        root = Path(root)
        where = f"system.output_dir={str(output_dir)!r}: " if output_dir is not None else ""
        check_free_space(root.parent, min_free_bytes)
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            root.mkdir()
        except FileExistsError as e:
            raise ConfigError(f"the run folder {root} exists already; start the sweep again (a new sweep folder) "
                              f"or resume that run with resume_from={root}") from e
        except OSError as e:
            raise ConfigError(f"{where}cannot create the run folder {root} ({e.strerror}); choose a writable "
                              f"folder") from e
        (root / "jobs").mkdir()
        (root / "results").mkdir()
        return cls(root)

    @classmethod
    def open_existing(cls, root: Path | str, what: str = "resume_from") -> "RunPaths":
        """An earlier run's folder, for resume, status and report; ResumeError (resume) or
        ConfigError naming ``what`` (``resume_from``, ``pita status``, ``pita report``) when it is
        not one."""
        root = Path(root)
        shown = f"{what}={str(root)!r}" if what == "resume_from" else f"{what} {root}"

        def error(msg: str):
            return ResumeError(msg) if what == "resume_from" else ConfigError(msg, header=f"cannot read {root}")

        if not root.exists():
            raise error(f"{shown} does not exist; pass a run folder such as outputs/<experiment>/<YYYY-MM-DD_HH-MM-SS>")
        if not root.is_dir():
            raise error(f"{shown} is a file, not a run folder; pass the folder that holds state.json (e.g. {root.parent})")
        paths = cls(root)
        marks = [paths.state, paths.state.with_suffix(".db"), paths.config, paths.jobs_dir]
        if not any(p.exists() for p in marks):
            raise error(f"{shown} is not a run folder: it has none of state.db, state.json, config.yaml, jobs/; "
                        f"pass outputs/<experiment>/<YYYY-MM-DD_HH-MM-SS>")
        return paths
