"""Live progress: a rich display on a terminal, plain periodic lines otherwise.

The live table redraws itself in place: each frame moves the cursor up by the height of the last
one. Anything written to the terminal under it meanwhile would shift it down and leave rows of old
frames behind, so while it runs every console line must reach the terminal through rich (it
replaces ``sys.stderr`` with a proxy that prints above the table): the console log handler looks
``sys.stderr`` up per record (:class:`pita.core.logs.ConsoleHandler`) for that reason.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter

log = logging.getLogger("pita.progress")


class Progress:
    def __init__(self, mode: str = "auto", interval_s: float = 30.0, console=None):
        tty = sys.stderr.isatty()
        self.rich = mode == "rich" or (mode == "auto" and tty)
        self.enabled = mode != "off"
        self.interval_s = interval_s
        self._last = 0.0
        self._last_live = 0.0
        self._live = None
        self._console = console  # a rich Console (tests); default: one on stderr

    def start(self) -> None:
        if self.enabled and self.rich:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=self._console or Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.start()

    def due(self) -> bool:
        """Whether an update would show anything now (counting jobs by group is a pass over all of
        them, so the executor asks first: a live table at most 4 times a second, plain lines every
        ``interval_s``)."""
        if not self.enabled:
            return False
        now = time.time()
        if self._live is not None:
            if now - self._last_live < 0.25:
                return False
            self._last_live = now
            return True
        return now - self._last >= self.interval_s

    def update(self, groups: dict[str, Counter], devices: list[str], force: bool = False) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(self._table(groups, devices), refresh=True)
            return
        now = time.time()
        if force or now - self._last >= self.interval_s:
            self._last = now
            total = sum(groups.values(), Counter())
            n = sum(total.values())
            log.info("progress: %d/%d done, %d running, %d failed, %d skipped, %d pending | %s",
                     total["COMPLETED"], n, total["RUNNING"], total["FAILED"], total["SKIPPED"],
                     total["PENDING"], "; ".join(devices))

    def _table(self, groups: dict[str, Counter], devices: list[str]):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        t = Table(show_header=True, header_style="bold", box=None)
        for col in ("group", "", "done", "running", "failed", "skipped", "pending"):
            t.add_column(col)
        total = sum(groups.values(), Counter())
        for name, c in [("overall", total)] + sorted(groups.items()):
            n = sum(c.values())
            t.add_row(name, ProgressBar(total=max(n, 1), completed=c["COMPLETED"] + c["FAILED"] + c["SKIPPED"], width=30),
                      f"{c['COMPLETED']}/{n}", str(c["RUNNING"]), str(c["FAILED"]), str(c["SKIPPED"]), str(c["PENDING"]))
        d = Table(show_header=False, box=None)
        for line in devices:
            d.add_row(line)
        return Group(t, d)

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
