"""The project's small exception hierarchy.

Every message names the field, the value and the fix. ``ConfigError`` (and its subclasses)
means "bad input, nothing ran": the command line turns it into exit code 2.
"""

from __future__ import annotations


class PitaError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(PitaError):
    """Bad configuration or input, found before any work started (exit code 2).

    ``problems`` holds one line per problem so that all of them are reported at once.
    """

    def __init__(self, problems: str | list[str], header: str = "invalid configuration"):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        self.header = header
        if len(self.problems) == 1:
            msg = f"{header}: {self.problems[0]}"
        else:
            msg = f"{header} ({len(self.problems)} problems):\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(msg)


class PlanError(ConfigError):
    """The job graph is invalid (duplicate ids, unknown deps, cycles, unsatisfiable requests)."""

    def __init__(self, problems: str | list[str]):
        super().__init__(problems, header="invalid job graph")


class ResumeError(ConfigError):
    """``resume_from`` does not point at a usable run directory, or overrides change the plan."""

    def __init__(self, problems: str | list[str]):
        super().__init__(problems, header="cannot resume")


class JobError(PitaError):
    """Raised inside a job to fail it with a message (the traceback still goes to its log)."""


class DeviceOutOfMemory(PitaError, RuntimeError):
    """A device ran out of memory in a process below the job (a rank of a k-device job): the
    executor treats it as the job's own CUDA out-of-memory (a retry at half the batch)."""
