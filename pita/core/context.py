"""What a job function receives: its params, config, folders, devices and its dependencies' results."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from pita.core.job import Job
from pita.core.paths import JobPaths, RunPaths


@dataclass
class JobContext:
    job: Job
    attempt: int
    paths: JobPaths
    run: RunPaths
    cfg: Any  # omegaconf.DictConfig rebuilt from the plain dict sent by the parent
    devices: list[dict]
    log: logging.Logger
    declared_peak_bytes: int | None = None

    def report_peak(self, nbytes: float) -> None:
        """Declare the job's peak memory per device, in the unit of its device's capacity (GPU
        memory on GPUs, host memory on CPU devices). Memory learning (pita/core/memlearn.py) then
        takes it instead of what the worker measures: for jobs whose work happens where the
        worker cannot see it, and for the synthetic stand-ins, whose peaks are declared."""
        if not (isinstance(nbytes, (int, float)) and nbytes >= 0):
            raise ValueError(f"report_peak({nbytes!r}): the peak must be a number of bytes >= 0")
        self.declared_peak_bytes = int(nbytes)

    @property
    def params(self) -> dict:
        return self.job.params

    def dep_result(self, job_id: str) -> dict:
        """``result.json`` of a dependency (it is COMPLETED, so the file exists); paths inside the
        run folder, stored relative to it, come back whole for where the folder is now."""
        if job_id not in self.job.deps:
            raise KeyError(f"{job_id!r} is not a dependency of {self.job.id!r}")
        return self.run.from_relative(json.loads(self.run.job(job_id).result.read_text()))
