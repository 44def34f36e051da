"""The console while the live progress table runs: it must redraw in place on a terminal."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections import Counter

from pita.core.logs import setup_logging
from pita.core.progress import Progress


# ---------------------------------------------------------------- the live table on a terminal
class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


_SEQ = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|[\r\n]|[^\x1b\r\n]+")


def terminal_screen(text: str, height: int) -> list[str]:
    """What a terminal of ``height`` rows shows (screen and scrollback) after ``text``: the control
    sequences rich's Live uses (cursor up, erase line, carriage return); cursor up stops at the
    top of the screen, as on a real terminal."""
    lines, row, col = [""], 0, 0
    for m in _SEQ.finditer(text):
        s = m.group(0)
        if s == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif s == "\r":
            col = 0
        elif s.startswith("\x1b"):
            arg, cmd = m.group(1), m.group(2)
            if cmd == "A":
                row = max(len(lines) - height, 0, row - int(arg or 1))
            elif cmd == "K":
                lines[row] = "" if arg == "2" else lines[row][:col]
        else:
            old = lines[row].ljust(col)
            lines[row] = old[:col] + s + old[col + len(s):]
            col += len(s)
    return [ln.rstrip() for ln in lines]


def test_the_live_table_redraws_in_place_while_the_run_logs_to_the_console(monkeypatch):
    """Warnings and the final summary line are logged to the console while the table is live; each
    must appear once, above the table, and the terminal must end with exactly one table."""
    from rich.console import Console

    height = 24
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    setup_logging(None, console=True)
    log = logging.getLogger("pita.executor")
    try:
        p = Progress("rich", console=Console(stderr=True, force_terminal=True, width=100, height=height,
                                             color_system=None))
        p.start()
        for i in range(6):
            groups = {"base": Counter(COMPLETED=min(i, 4), PENDING=4 - min(i, 4)),
                      "round 0": Counter(COMPLETED=i, RUNNING=1, PENDING=9 - i)}
            p.update(groups, ["CPU 0 (CPU (2 cores)): 0.43 GB RSS of its jobs, 11.67 GB total, 1 job"])
            log.warning("job %d ran out of memory on cpu0; retrying with batch_size=4", i)
        p.update({"base": Counter(COMPLETED=4), "round 0": Counter(COMPLETED=10)}, ["CPU 0 (x): 0 jobs"], force=True)
        log.info("finished after 19.8s: 14 completed, 0 failed, 0 skipped, 0 not run")
        p.stop()
    finally:
        setup_logging(None, console=False)
    screen = terminal_screen(tty.getvalue(), height)
    assert [ln.split()[0] for ln in screen if ln.split()[:1] == ["group"]] == ["group"], "\n".join(screen)
    for i in range(6):
        assert sum(f"job {i} ran out of memory" in ln for ln in screen) == 1, "\n".join(screen)
    [done] = [n for n, ln in enumerate(screen) if ln == "INFO finished after 19.8s: 14 completed, 0 failed, 0 skipped, 0 not run"]
    [header] = [n for n, ln in enumerate(screen) if ln.split()[:1] == ["group"]]
    assert done < header and "14/14" in screen[header + 1]  # the lines above, the last frame below
