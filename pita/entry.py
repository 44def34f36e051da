"""The command's first module: Ctrl-C from its first instant is one line and exit 130.

``pita`` (the console script), ``python -m pita`` and ``run_parallel.py`` start here, before the
command line modules (Hydra, OmegaConf, torch on some paths) are imported: an interrupt while
they load, or while Hydra composes, would otherwise end in a traceback of the import machinery
and the death-by-signal exit status. The executor installs its own handler once a run starts
(state saved, workers ended, the resume command printed)."""

from __future__ import annotations

import sys


def _interrupted() -> int:
    print("interrupted (nothing had started)", file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    """``pita ...`` and ``python -m pita ...``."""
    try:
        from pita.cli import console_main

        return console_main(argv)
    except KeyboardInterrupt:
        return _interrupted()


def run_parallel(argv: list[str] | None = None) -> int:
    """``python run_parallel.py ...``."""
    try:
        from pita.cli import run_main

        return run_main(sys.argv[1:] if argv is None else argv, prog="python run_parallel.py")
    except KeyboardInterrupt:
        return _interrupted()
