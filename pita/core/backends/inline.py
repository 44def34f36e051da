"""The inline backend: runs each attempt in this process, one at a time, as soon as it starts.

For debugging (breakpoints work) and fast tests. It cannot isolate devices (no
``CUDA_VISIBLE_DEVICES`` per job), cannot enforce timeouts, and a job that kills its process
kills the run: use ``local`` for anything real.
"""

from __future__ import annotations

import contextlib
import logging

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.worker import execute


class InlineBackend(Backend):
    name = "inline"

    def __init__(self):
        self._done: list[Finished] = []

    def start(self, launch: Launch) -> None:
        p = launch.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        logger = logging.getLogger(f"pita.inline.{launch.job_id}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        with open(p.log, "a") as f:
            handler = logging.StreamHandler(f)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)
            try:
                with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                    outcome = execute(launch.to_json(), logger)
            finally:
                logger.removeHandler(handler)
        if outcome["status"] == "cancelled":
            raise KeyboardInterrupt
        extra = {k: v for k, v in outcome.items() if k not in ("status", "error", "traceback")}
        self._done.append(Finished(launch.job_id, launch.attempt, outcome["status"], None,
                                   outcome.get("error", ""), outcome.get("traceback", ""), extra))

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        out, self._done = self._done, []
        return out

    def kill(self, job_id: str, status: str = "cancelled", reason: str = "", grace_s: float | None = None) -> None:
        pass  # attempts finish inside start()

    def shutdown(self, grace_s: float = 10.0) -> list[Finished]:
        return self.poll()
