"""The backend interface: start an attempt, poll for finished attempts, kill one, shut down."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from pita.core.paths import JobPaths


@dataclass
class Launch:
    """One attempt of one job, fully described (the worker reads this as launch.json)."""

    job: dict
    target: str  # "module:function" of the job kind
    attempt: int
    run_dir: str
    config: dict
    devices: list[dict]  # Device.describe() + label, for each assigned device
    env: dict[str, str]  # CUDA_VISIBLE_DEVICES and friends
    paths: JobPaths
    tag: str  # "[job-id gpu0]" prefix for run.log
    fingerprint: dict | None = None  # the planned job's identity (kind, params, deps): rebuilds state

    @property
    def job_id(self) -> str:
        return self.job["id"]

    def to_json(self, parent_pid: int | None = None) -> dict:
        return {"job": self.job, "target": self.target, "attempt": self.attempt, "run_dir": self.run_dir,
                "config": self.config, "devices": self.devices, "parent_pid": parent_pid,
                "fingerprint": self.fingerprint}


@dataclass
class Finished:
    """How an attempt ended.

    status: ok | error (the job raised) | oom | died (signal or exit without a report) |
            timeout | cancelled | nospace (the disk filled: the job re-runs once space is freed)
    """

    job_id: str
    attempt: int
    status: str
    exit_code: int | None = None
    error: str = ""
    traceback: str = ""
    extra: dict = field(default_factory=dict)  # duration_s, peak memory, ...


class Backend(abc.ABC):
    name = "?"
    outlives_driver = False  # attempts go on when the driver dies (Slurm jobs): a resume adopts them

    @abc.abstractmethod
    def start(self, launch: Launch) -> None:
        """Begin the attempt; must not block for its duration (inline is the exception)."""

    @abc.abstractmethod
    def poll(self, timeout: float = 0.0) -> list[Finished]:
        """Attempts that ended since the last call (waits up to ``timeout`` seconds for one)."""

    @abc.abstractmethod
    def kill(self, job_id: str, status: str = "cancelled", reason: str = "", grace_s: float | None = None) -> None:
        """End an attempt: TERM now, KILL (every process of the attempt) ``grace_s`` later if it is
        still there (None: the backend's own grace). Calling it again changes nothing. The attempt
        is reported by ``poll`` with ``status``."""

    @abc.abstractmethod
    def shutdown(self, grace_s: float = 10.0) -> None:
        """Terminate everything still running (TERM, then KILL after ``grace_s``); wait for it."""

    def close(self) -> None:
        """The run is over (nothing is running): release what the backend holds between attempts."""

    def pids(self, job_id: str) -> set[int]:
        """Process ids of a running attempt (for per-process GPU memory); empty if unknown."""
        return set()

    def running(self) -> list[str]:
        return []

    def log_path(self, launch: Launch):
        """The file an attempt's output goes to while it runs (the job's ``job.log`` unless the
        backend gives each attempt its own)."""
        return launch.paths.log

    def driver_leaving(self, signum: int) -> str | None:
        """On a signal to the driver: why its attempts should go on without it (a requeued driver
        takes them over), or None to end them as the driver stops."""
        return None

    def detach(self) -> list[str]:
        """The driver leaves its attempts running (``driver_leaving``): the jobs left."""
        return []

    def ended_unwatched(self, job_paths, attempt: int, handle: dict) -> dict:
        """An attempt that ended while no driver ran (``handle`` from the state): what the backend
        adds to its record."""
        return dict(handle)

    def after_detach(self, signum: int) -> None:
        """Once the run state is saved after ``detach``: what the driver does before it exits."""

    # An attempt that outlives its driver (a Slurm job) is found again by a resumed one: the
    # executor keeps ``handle`` in the job's state while it runs and offers it to ``adopt``.
    def handle(self, job_id: str) -> dict:
        """What a later driver of the run needs to find this running attempt again ({}: nothing,
        the attempt ends with its driver)."""
        return {}

    def adopt(self, launch: Launch, handle: dict) -> str:
        """Follow an attempt an earlier driver started, as if started here: "" when taken over,
        else why not (the job then runs again)."""
        return f"the {self.name} backend cannot take over an earlier driver's attempts"

    def queued(self) -> dict[str, tuple[str, float]]:
        """Attempts started but still waiting for a cluster's scheduler: job -> (why, in the
        scheduler's words with what it means; seconds waited)."""
        return {}

    def end_strays(self, run_root: str) -> list[str]:
        """After adoption: end what earlier drivers of the run left running and nothing took over
        (it would run twice otherwise); a line for the log each."""
        return []
