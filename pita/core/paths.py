"""RunPaths and JobPaths: the one place that knows where a run's files live. Atomic writes.

    outputs/<experiment.name>/<YYYY-MM-DD_HH-MM-SS>/
      run.log  config.yaml  state.json
      jobs/<job-id>/  job.log  launch.json  attempt-<n>.json  result.json  artifacts/  .done
      results/
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pita.core.errors import ConfigError, ResumeError


def atomic_write(path: Path | str, data: str | bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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

    def write_metrics(self, rows: list[dict]) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        atomic_write(self.metrics, "".join(json.dumps(row) + "\n" for row in rows))

    def attempt(self, n: int) -> Path:
        return self.dir / f"attempt-{n}.json"

    def is_done(self) -> bool:
        return self.done.exists()

    def read_result(self) -> dict:
        return json.loads(self.result.read_text()) if self.result.exists() else {}

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


class RunPaths:
    STAMP = "%Y-%m-%d_%H-%M-%S"

    def __init__(self, root: Path | str):
        self.root = Path(root)

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

    @staticmethod
    def check_name(name: str) -> None:
        if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("-"):
            raise ConfigError(f"experiment.name={name!r} must be a plain folder name (no '/', '\\', "
                              f"or leading '-'); for example experiment.name=my_experiment")

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
    def open_existing(cls, root: Path | str) -> "RunPaths":
        """An earlier run's folder, for resume and status; ResumeError when it is not one."""
        root = Path(root)
        if not root.exists():
            raise ResumeError(f"resume_from={str(root)!r} does not exist; pass a run folder such as "
                              f"outputs/<experiment>/<YYYY-MM-DD_HH-MM-SS>")
        if not root.is_dir():
            raise ResumeError(f"resume_from={str(root)!r} is a file, not a run folder; pass the folder that "
                              f"holds state.json (e.g. {root.parent})")
        paths = cls(root)
        missing = [p.name for p in (paths.state, paths.config) if not p.exists()]
        if missing:
            raise ResumeError(f"resume_from={str(root)!r} is not a run folder: {', '.join(missing)} missing; "
                              f"pass outputs/<experiment>/<YYYY-MM-DD_HH-MM-SS>")
        return paths
