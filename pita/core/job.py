"""Jobs: what runs, what it needs, and what it waits for.

A Job is plain data (it travels to worker processes as JSON):

    Job(id="pita.tiny.arith.r0.train", kind="algo.train", params={"batch_size": 16},
        deps=["pita.tiny.arith.r0.merge"], resources=Resources(devices=1, memory_gb=12.0))

``kind`` names a function registered with :func:`job_kind`; the function takes a
:class:`pita.core.context.JobContext` and returns a JSON-able dict (the job's ``result.json``).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable

from pita.core.names import Registry

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.SKIPPED)


@dataclass
class Resources:
    """``devices`` wanted at once (0 = a CPU-side job that holds no device) and the estimated
    peak memory on each of them, in GB (1e9 bytes); ``host_gb``: the host memory (RAM) the job
    holds at its peak over all its processes (GPU plans; 0 = not counted, pita/plans/host.py)."""

    devices: int = 1
    memory_gb: float = 0.0
    host_gb: float = 0.0

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


@dataclass
class RetryPolicy:
    """``oom_retries``: None takes ``executor.oom_retries``. Each OOM retry halves ``params[batch_param]``.
    ``crash_retries``: re-runs after a worker died (signal, non-zero exit without a report).
    ``timeout_s``: None takes ``executor.job_timeout_s`` (None there means no limit)."""

    oom_retries: int | None = None
    batch_param: str = "batch_size"
    crash_retries: int | None = None
    timeout_s: float | None = None


# A training job that runs out of memory is retried with its micro-batch halved; the job raises
# gradient accumulation to match, so the effective batch (the experiment) never changes
TRAINING_RETRY = RetryPolicy(batch_param="micro_batch_size")


@dataclass
class Job:
    id: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    deps: list[str] = field(default_factory=list)
    resources: Resources = field(default_factory=Resources)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    duration_hint: float = 1.0  # expected seconds: critical-path priority and reservations
    group: str = ""  # shown in progress ("round 0", "eval", ...)
    planned_s: float = 0.0  # the duration model's seconds before learned corrections (0: none)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Job":
        d = dict(d)
        d["resources"] = Resources(**d.get("resources", {}))
        d["retry"] = RetryPolicy(**d.get("retry", {}))
        return cls(**d)

    def fingerprint(self) -> dict:
        """What identifies the work: a resumed run must plan the same fingerprints."""
        return {"kind": self.kind, "params": self.params, "deps": sorted(self.deps)}


# ---------------------------------------------------------------- job kinds
JOB_KINDS: Registry[str] = Registry("job kind")
# Modules whose import registers kinds; workers import the one that holds their kind.
_KIND_MODULES = ["pita.core.synthetic_kinds"]


def job_kind(name: str) -> Callable[[Callable], Callable]:
    """Register ``fn(ctx) -> dict | None`` as job kind ``name``."""

    def deco(fn: Callable) -> Callable:
        JOB_KINDS.register(name)(f"{fn.__module__}:{fn.__qualname__}")
        return fn

    return deco


def add_kind_module(module: str) -> None:
    """Make the kinds registered by ``module`` known (imported lazily on first lookup)."""
    if module not in _KIND_MODULES:
        _KIND_MODULES.append(module)


def _load_kind_modules() -> None:
    for m in list(_KIND_MODULES):
        importlib.import_module(m)


def kind_target(name: str) -> str:
    """``module:qualname`` of a registered kind; ConfigError listing choices when unknown."""
    _load_kind_modules()
    return JOB_KINDS.get(name, field="job kind")


def known_kinds() -> list[str]:
    _load_kind_modules()
    return JOB_KINDS.names()


def resolve_target(target: str) -> Callable:
    module, _, qual = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj
