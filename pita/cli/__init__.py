"""The command line: plan the experiment, validate everything, run it, report.

    pita run experiment.name=NAME [key=value ...]                   (Hydra main -> run_experiment)
    pita plan [--json] [key=value ...] [system.inventory=8x80GB]    (the plan, nothing run: plan_main)
    python run_parallel.py experiment.name=NAME [key=value ...]     (the same: run_main)
    pita run resume_from=outputs/NAME/<time>                        (re-run unfinished jobs)
    pita status outputs/NAME/<time>                                 (jobs by state, live or not)
    pita report outputs/NAME/<time>                                 (re-render results/report.md)
    pita seeds K [key=value ...]                                    (K seeds run, then pooled: seeds_main)

``pita`` is also ``python -m pita``. One module per command: ``run`` (with ``resume``),
``status``, ``report``, ``help``; ``overrides`` checks the command line before Hydra composes it.

Exit codes: 0 all jobs completed; 1 some job failed or was skipped (or the disk filled); 2 bad
configuration or input (nothing ran); 130 interrupted (state saved; resume with resume_from=).
"""

from __future__ import annotations

import sys

from pita.cli.help import EXIT_CODES, HELP_KEYS, help_text
from pita.cli.overrides import (CONF_DIR, GROUPS, algo_key_problem, check_cli_overrides, check_overrides,
                                normalize_argv)
from pita.cli.report import report_main
from pita.cli.resume import EXECUTION_KEYS, RESUME_KEYS
from pita.cli.run import run_experiment, run_main
from pita.cli.status import status_main

__all__ = ["CONF_DIR", "EXECUTION_KEYS", "EXIT_CODES", "GROUPS", "HELP_KEYS", "RESUME_KEYS", "algo_key_problem",
           "check_cli_overrides", "check_overrides", "console_main", "help_text", "normalize_argv", "report_main",
           "run_experiment", "run_main", "status_main"]


def console_main(argv: list[str] | None = None) -> int:
    import argparse
    import signal

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # the experiment itself: Hydra's command line, not argparse's
        return run_main(argv[1:], prog="pita run")
    if argv[:1] == ["seeds"]:  # K runs of one experiment, pooled
        from pita.cli.seeds import seeds_main

        return seeds_main(argv[1:])
    if argv[:1] == ["plan"]:  # the same command line, planned and not run
        from pita.cli.plan import plan_main

        return plan_main(argv[1:], prog="pita plan")
    # Output piped into `head` and the like: end quietly when the reader goes away, as Unix tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if argv[:1] in (["-h"], ["--help"]):
        print(help_text("pita run"))
        return 0
    if argv[:1] in (["-V"], ["--version"]):
        from pita.core.provenance import source_line

        print(source_line())
        return 0
    ap = argparse.ArgumentParser(prog="pita", description="Run pita experiments and inspect their runs "
                                 "(pita --help: the whole page).")
    ap.add_argument("-V", "--version", action="store_true", help="pita's version (and commit, from a checkout)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="run an experiment: pita run key=value ... (pita run --help)")
    sub.add_parser("plan", help="the plan a run would make (jobs, memory, makespan), on this machine or "
                   "system.inventory=8x80GB; --json for scripts")
    st = sub.add_parser("status", help="jobs by state, devices, failures and their logs")
    st.add_argument("run_dir")
    st.add_argument("--all", action="store_true", help="every job, not only running / failed / skipped ones")
    sub.add_parser("seeds", help="run one experiment with K seeds, then pool them: pita seeds K key=value ...")
    rp = sub.add_parser("report", help="re-render results/report.md and its plots from the saved results")
    rp.add_argument("run_dir", nargs="+", help="a run folder; several (one per seed of the same experiment): "
                    "also the KL-matched comparison pooled over them")
    rp.add_argument("--out", help="one run: write its report, tables and plots to the folder OUT, leaving the run's "
                    "files as they are; several runs: write the pooled comparison to OUT.md and OUT.json")
    rp.add_argument("--kl-budgets", metavar="B1,B2,...", help="read the KL-matched comparison at these budgets "
                    "(nats per sequence) instead of the runs' eval.kl_budgets; the rows are the same")
    args = ap.parse_args(argv)
    if args.cmd == "status":
        return status_main(args.run_dir, show_all=args.all)
    if args.cmd == "report":
        return report_main(args.run_dir, out=args.out, kl_budgets=args.kl_budgets)
    return 2

