"""One logging setup: console + run.log; and the pump that copies job logs into run.log.

Every line a job prints lands in its ``job.log`` (the worker's stdout and stderr), and the
orchestrator copies each complete line into ``run.log`` as ``[job-id gpu3] line`` as it comes,
so ``tail -f outputs/NAME/*/run.log`` follows the whole run. Orchestrator lines carry ``[main]``.

run.log is for people, so the pump leaves out what only a machine or a terminal wants (see
:func:`keep_line`): progress bars (tqdm's ``Loading weights: 100%|███| 38/38 [00:00<00:00, ...]``
and each carriage-return redraw of one) and the metric dicts trainers print per logging step
(``{'loss': ..., 'grad_norm': ...}``, kept per step in ``jobs/<id>/metrics.jsonl``). Both stay
in the job's own ``job.log``; log records, warnings, tracebacks and anything else pass.
"""

from __future__ import annotations

import logging
import re
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


# A log record as the worker formats it ("2026-11-23 09:05:21,908 INFO pita.job: ...") is always kept.
_RECORD = re.compile(rb"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
# tqdm's statistics at the end of a bar: [elapsed<remaining, rate] (remaining and rate may be "?",
# the rate is "12.3it/s", "4.5 examples/s", "120MB/s" or "2.6s/it", a postfix may follow it):
#   Loading weights: 100%|██████████| 38/38 [00:00<00:00, 22410.51it/s]
#   Generating train split: 16 examples [00:00, 1532.45 examples/s]
_TQDM_STATS = re.compile(rb"\[(?:\d+:)?\d+:\d\d(?:<(?:(?:\d+:)?\d+:\d\d|\?))?,[^\]]*?(?:/s|s/\w+)\b[^\]]*\]\s*$")
_TQDM_BAR = re.compile(rb"\d{1,3}%\|[^|]*\|\s*[\d.?]+[kMGTP]?/[\d.?]+")  # 45%|████▌     | 45/100
# A metric dict as trainers print it each logging step: {'loss': '0.6931', 'grad_norm': '3.893', ...}
_METRIC_DICT = re.compile(rb"^\{\s*['\"][^'\"]+['\"]\s*:.*\}\s*$")
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def is_progress(segment: bytes) -> bool:
    """A progress bar's text (tqdm, Hugging Face's bars built on it)."""
    return bool(_TQDM_STATS.search(segment) or _TQDM_BAR.search(segment))


def keep_line(line: bytes) -> list[bytes]:
    """What of one line of a job's output goes to run.log: nothing for a progress bar (every
    carriage-return redraw of it too) or a metric dict, the line as it is otherwise. A line that
    mixes redraws with other text (a warning written over a bar) keeps that text."""
    if _RECORD.match(line):
        return [line]
    if b"\r" not in line and b"\x1b" not in line:
        return [] if is_progress(line) or _METRIC_DICT.match(line) else [line]
    out = []
    for seg in line.split(b"\r"):
        bare = _ANSI.sub(b"", seg)
        if bare.strip() and not is_progress(bare) and not _METRIC_DICT.match(bare):
            out.append(seg)
    return out


class LogPump:
    """Follows job logs and appends their new complete lines to run.log with a prefix, leaving out
    progress bars and metric dicts (:func:`keep_line`; the job's log keeps them)."""

    def __init__(self, run_log: Path, min_interval_s: float = 0.0):
        self.out = open(run_log, "ab", buffering=0)
        self.follow: dict[str, tuple[Path, int, bytes]] = {}  # job -> (path, offset, prefix)
        self.min_interval_s = min_interval_s  # pump() over every job at most this often
        self._last = 0.0

    def add(self, job_id: str, path: Path, tag: str) -> None:
        offset = path.stat().st_size if path.exists() else 0
        self.follow[job_id] = (path, offset, f"[{tag}] ".encode())

    def pump(self, job_id: str | None = None, final: bool = False) -> None:
        if job_id is None and self.min_interval_s:
            import time

            if time.monotonic() - self._last < self.min_interval_s:
                return
            self._last = time.monotonic()
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
            # Up to the last complete line, or the last carriage return that is not the final byte
            # (a progress bar redrawn for minutes without a newline is consumed as it goes; a final
            # "\r" may be the first half of "\r\n").
            cut = len(data) if final else max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1
            if cut <= 0:
                continue
            chunk = data[:cut].replace(b"\r\n", b"\n")
            if chunk.endswith(b"\n"):
                chunk = chunk[:-1]
            kept = [seg for ln in chunk.split(b"\n") for seg in keep_line(ln)]
            if kept:
                self.out.write(b"".join(prefix + ln + b"\n" for ln in kept))
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
