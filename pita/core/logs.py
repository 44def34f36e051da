"""One logging setup: console + run.log; and the pump that copies job logs into run.log.

Every line a job prints lands in its ``job.log`` (the worker's stdout and stderr), and the
orchestrator copies each complete line into ``run.log`` as ``[job-id gpu3] line`` as it comes,
so ``tail -f outputs/NAME/*/run.log`` follows the whole run. Orchestrator lines carry ``[main]``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FMT = "%(asctime)s %(levelname)s [main] %(message)s"
DATEFMT = "%Y-%m-%d %H:%M:%S"


def setup_logging(run_log: Path | None, console: bool = True, level: int = logging.INFO) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_pita", False):
            root.removeHandler(h)
            h.close()
    root.setLevel(level)
    fmt = logging.Formatter(FMT, DATEFMT)
    if console:
        ch = ConsoleHandler()
        ch.setFormatter(logging.Formatter("%(levelname)s %(message)s") if sys.stderr.isatty() else fmt)
        ch._pita = True
        ch.addFilter(lambda r: r.levelno >= logging.WARNING or not r.name.startswith("pita.executor.jobs"))
        root.addHandler(ch)
    if run_log is not None:
        fh = RunLogHandler(run_log, mode="a", encoding="utf-8")
        fh.setFormatter(fmt)
        fh._pita = True
        root.addHandler(fh)
    for noisy in ("filelock", "urllib3", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class ConsoleHandler(logging.StreamHandler):
    """stderr as it is when a record is written, not as it was when logging was set up: while the
    live progress table runs, rich puts a proxy there that prints the line above the table. A
    handler holding the terminal itself would write under the table, and the table's next redraw
    (which moves the cursor up by its own height) would leave stale rows of it behind."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it; the property decides
        pass


class RunLogHandler(logging.FileHandler):
    """run.log; on a full disk it says so once on stderr and drops lines (instead of a traceback
    per line): the executor notices the full disk itself and stops the run."""

    full = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.full:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        import errno

        e = sys.exc_info()[1]
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            self.full = True
            print(f"warning: {self.baseFilename}: no space left on device; log lines go to the console only",
                  file=sys.stderr)
            return
        super().handleError(record)


class LogPump:
    """Follows job logs and appends their new complete lines to run.log with a prefix."""

    def __init__(self, run_log: Path):
        self.out = open(run_log, "ab", buffering=0)
        self.follow: dict[str, tuple[Path, int, bytes]] = {}  # job -> (path, offset, prefix)

    def add(self, job_id: str, path: Path, tag: str) -> None:
        offset = path.stat().st_size if path.exists() else 0
        self.follow[job_id] = (path, offset, f"[{tag}] ".encode())

    def pump(self, job_id: str | None = None, final: bool = False) -> None:
        for jid in [job_id] if job_id else list(self.follow):
            if jid not in self.follow:
                continue
            path, offset, prefix = self.follow[jid]
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            if not data:
                continue
            cut = len(data) if final else data.rfind(b"\n") + 1
            if cut <= 0:
                continue
            chunk = data[:cut]
            lines = chunk.splitlines()
            self.out.write(b"".join(prefix + ln + b"\n" for ln in lines))
            self.follow[jid] = (path, offset + cut, prefix)

    def remove(self, job_id: str) -> None:
        try:
            self.pump(job_id, final=True)
        except OSError:  # a full disk: the lines stay in the job's own log
            pass
        self.follow.pop(job_id, None)

    def close(self) -> None:
        for jid in list(self.follow):
            self.remove(jid)
        try:
            self.out.close()
        except OSError:
            pass
