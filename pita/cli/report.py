"""``pita report RUN``: re-render a run's results and report; and what a run prints at its end."""

from __future__ import annotations

import logging
import sys

from pita.core.errors import ConfigError

log = logging.getLogger("pita")


def algorithm_roster():
    """The report's roster from the algorithm registry: its order (plug-ins included) and which
    algorithms learn from labelled preference pairs. Built here, above both layers, so the
    report imports no algorithm."""
    from pita.algos import ALGORITHMS
    from pita.report.roster import Roster

    names = tuple(ALGORITHMS.names(ordered=True))
    return Roster(names, frozenset(n for n in names if ALGORITHMS.get(n).uses_preference_pairs))


def write_report(run, rows) -> None:
    """The report is a view of saved results: a failure to draw it is said, and loses nothing."""
    from pita.report.report import render

    try:
        print(f"report: {render(run, rows or None, algorithm_roster())}")
    except Exception as e:  # noqa: BLE001 - the run's results are already on disk
        log.warning("the report could not be rendered (%s: %s); results are in %s; retry with: "
                    "python -m pita report %s", type(e).__name__, e, run.results, run.root)


def report_main(run_dir: str) -> int:
    from pita.core.paths import RunPaths
    from pita.report.report import render
    from pita.report.results import write

    try:
        run = RunPaths.open_existing(run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    roster = algorithm_roster()
    rows = write(run, roster)
    print(render(run, rows or None, roster))
    return 0


def print_summary(summary, run) -> None:
    c = summary.counts
    print(f"\n{c['COMPLETED']} completed, {c['FAILED']} failed, {c['SKIPPED']} skipped, "
          f"{c['PENDING'] + c['RUNNING']} not run, in {summary.wall_s:.1f}s")
    for f in summary.failures:
        print(f"  FAILED {f['job']} on {f['device']}: {f['error']}\n         log: {f['log']}")
    if summary.interrupted:
        print(f"interrupted; resume with: python run_parallel.py resume_from={run.root}")
    print(f"run folder: {run.root}  (log: {run.run_log})")

