"""``pita report RUN``: re-render a run's results and report; and what a run prints at its end."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

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


def parse_budgets(text: str | None) -> tuple[list[float] | None, list[str]]:
    """``--kl-budgets 0.01,0.05,0.1``: the budgets, or the problems with them."""
    from pita.eval.metrics import budget_problems

    if text is None:
        return None, []
    try:
        budgets = [float(x) for x in text.split(",")]
    except ValueError:
        return None, [f"--kl-budgets={text!r}: not a comma-separated list of numbers; e.g. --kl-budgets 0.05,0.1,0.25"]
    problems = budget_problems(budgets, "--kl-budgets")
    return (None if problems else budgets), problems


REPORT_FILES = ("report.md", "final_results.json", "results.csv")


def _read(path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _snapshot(run) -> dict:
    return {n: _read(run.results / n) for n in REPORT_FILES}


def _keep(run, before: dict, changed: list[str]):
    """The run's report files as they were, kept under results/previous/<time>/."""
    import time

    from pita.core.paths import atomic_write

    dest = run.results / "previous" / time.strftime("%Y-%m-%d_%H-%M-%S")
    for n in changed:
        atomic_write(dest / n, before[n])
    return dest


def results_in(run, folder: Path):
    """``run`` with its results (report.md, tables, plots) read from and written to ``folder``."""
    from pita.core.paths import RunPaths

    class Elsewhere(RunPaths):
        @property
        def results(self):
            return folder

    folder.mkdir(parents=True, exist_ok=True)
    return Elsewhere(run.root)


def headline(report: Path) -> list[str]:
    """The report's headline: the equal-KL tables (their headings and rows, not the prose)."""
    try:
        lines = report.read_text().splitlines()
    except OSError:
        return []
    out, inside = [], False
    for line in lines:
        if line.startswith("### "):
            inside = line.startswith("### Headline")
            if inside:
                out.append(line)
            continue
        if inside and (line.startswith("#### ") or line.startswith("|")):
            if line.startswith("#### "):
                out.append("")
            out.append(line)
    return out


def report_main(run_dirs: str | list[str], out: str | None = None, kl_budgets: str | None = None) -> int:
    """Re-render each run's results and report, print its headline (the equal-KL tables) and say
    which of the run's files changed (the previous ones kept in results/previous/<time>/). One run
    with ``out``: the report goes to the folder ``out`` and the run's files stay as they are. With
    several runs (one per seed), also print the KL-matched comparison pooled over them (and write
    it to ``out``.md / .json). ``kl_budgets`` (comma-separated) reads the same rows at other
    budgets than the runs' ``eval.kl_budgets``."""
    from pita.core.paths import RunPaths
    from pita.report.report import render
    from pita.report.results import write

    budgets, problems = parse_budgets(kl_budgets)
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    dirs = [run_dirs] if isinstance(run_dirs, str) else list(run_dirs)
    try:
        runs = [RunPaths.open_existing(d, "pita report") for d in dirs]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    roster = algorithm_roster()
    written = []
    if out and len(runs) == 1:  # one run: its report re-read into OUT, the run's own files untouched
        target = results_in(runs[0], Path(out))
        rows = write(target, roster, budgets)
        path = render(target, rows or None, roster)
        print("\n".join(headline(path)))
        print(f"written: {path} with results.csv, final_results.json and plots/ in {target.results} "
              f"({runs[0].results} is unchanged)")
        return 0
    for run in runs:
        before = _snapshot(run)
        rows = write(run, roster, budgets)
        path = render(run, rows or None, roster)
        changed = [n for n, b in before.items() if b is not None and _read(run.results / n) != b]
        print("\n".join(headline(path)))
        if changed:
            kept = _keep(run, before, changed)
            print(f"re-read {run.root}: {', '.join(changed)} changed (e.g. --kl-budgets, or a newer pita); the "
                  f"previous files are in {kept}; pita report RUN --out DIR leaves a run's files as they are")
        print(path)
        written.append(rows)
    if len(runs) > 1:
        problems = pooling_problems(runs)
        if problems:
            print("error: " + "\n  ".join(problems), file=sys.stderr)
            return 2
        return pooled_report(runs, written, roster, out, budgets)
    return 0


# what must be equal for runs to be seeds of one experiment (the seed itself must differ)
SAME_IN_POOLED = ("model.name", "experiment.algos", "experiment.datasets", "experiment.rounds", "eval.split")


def pooling_problems(runs) -> list[str]:
    """Why ``runs`` cannot be pooled as seeds of one experiment: two runs with the same
    ``system.seed`` are one draw counted twice (their intervals would be too narrow), and runs
    that differ in model, algorithms, datasets (or their files), rounds or split are not one
    experiment. Empty when they can."""
    from omegaconf import OmegaConf

    def get(cfg, key):
        v = OmegaConf.select(cfg, key)
        return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v

    cfgs = []
    for run in runs:
        if not run.config.exists():
            return [f"{run.root} has no config.yaml, so it cannot be checked to be a seed of the same experiment"]
        cfgs.append(OmegaConf.load(run.config))
    problems = []
    seeds: dict = {}
    for run, cfg in zip(runs, cfgs):
        seeds.setdefault(get(cfg, "system.seed"), []).append(str(run.root))
    for seed, roots in seeds.items():
        if len(roots) > 1:
            problems.append(f"system.seed={seed} in {len(roots)} runs ({', '.join(roots)}): one draw counted "
                            f"{len(roots)} times makes the pooled intervals too narrow; pool runs of the experiment "
                            f"made with different seeds (pita run ... system.seed=1, =2, ...)")
    for key in SAME_IN_POOLED:
        vals = [get(c, key) for c in cfgs]
        if any(v != vals[0] for v in vals):
            problems.append(f"{key} differs between the runs ({'; '.join(f'{r.root}: {v}' for r, v in zip(runs, vals))}); "
                            f"pool only runs of one experiment that differ in system.seed")
    names = get(cfgs[0], "experiment.datasets") or []
    for name in names:
        files = [get(c, f"datasets.{name}.path") for c in cfgs]
        if any(f != files[0] for f in files):
            problems.append(f"datasets.{name}.path differs between the runs ({'; '.join(map(str, files))}): "
                            f"the runs were not evaluated on the same data")
    return problems


def unfinished(run) -> tuple[str, set]:
    """Why ``run`` is not a whole seed yet ("" when every job completed), and the algorithms
    whose evaluations it has not all completed (their rows there are partial: a learning-rate arm
    or an η missing would move the frontier)."""
    from collections import Counter

    from pita.core.owner import describe, probe
    from pita.core.state import for_reading

    store, _ = for_reading(run.root)  # a driver on another host: its snapshot, never its database
    try:
        jobs = store.read()["jobs"] if store.exists() else {}
    except Exception:  # noqa: BLE001 - a state that cannot be read: the results alone are pooled
        return "", set()
    finally:
        store.close()
    counts = Counter(j.get("state", "PENDING") for j in jobs.values())
    if not jobs or counts.get("COMPLETED", 0) == len(jobs):
        return "", set()

    def algorithm(job_id: str, j: dict):  # its evaluations' label; else the id's head (older states)
        label = ((j.get("fingerprint") or {}).get("params") or {}).get("labels", {}).get("algorithm")
        head = job_id.split(".", 1)[0]
        return label or (head if head not in ("data", "control", "model", "family") else None)

    partial = {algorithm(jid, j) for jid, j in jobs.items() if j.get("state") != "COMPLETED"} - {None}
    owned, owner = probe(run.root)
    now = f"running now ({describe(owner)})" if owned else "not running (resume it, or pool it once it has finished)"
    rest = ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()) if k != "COMPLETED")
    left = (f"{', '.join(sorted(partial))}: evaluations not all done there, so left out of the pool for this run, "
            f"and their rows say over how many seeds they average") if partial else "every evaluation is done"
    return f"{run.root}: {counts.get('COMPLETED', 0)} of {len(jobs)} jobs completed ({rest}); {now}. {left}", partial


def run_seed(run):
    """A run's ``system.seed`` (its config.yaml), what pairs its rows with other runs' in a pool."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(OmegaConf.load(run.config), "system.seed")
    except Exception:  # noqa: BLE001 - a run without a readable config is paired by position
        return None


def pooled_report(runs, rows_per_run: list[list[dict]], roster, out: str | None,
                  override: list[float] | None = None) -> int:
    """The KL-matched comparison over several runs of one experiment (one per seed)."""
    import json
    from pathlib import Path

    from pita.report.intervals import RecordStore
    from pita.report.matched import differences, matched_cells, matched_tables, public
    from pita.report.results import kl_budgets, read_validation, wide_ratio

    budgets = [kl_budgets(r) for r in runs] if override is None else [override] * len(runs)
    if any(b != budgets[0] for b in budgets):
        print(f"error: the runs' eval.kl_budgets differ ({budgets}); pool runs made with the same budgets, "
              "or read them all at one list with --kl-budgets", file=sys.stderr)
        return 2
    empty = [str(r.root) for r, rows in zip(runs, rows_per_run) if not rows]
    if empty:
        print(f"error: no evaluation finished in {', '.join(empty)}; pool runs that have results", file=sys.stderr)
        return 2
    states = [unfinished(r) for r in runs]
    partial = [w for w, _ in states if w]
    for w in partial:
        print(f"warning: {w}", file=sys.stderr)
    no_base = [str(r.root) for r, (_, algos) in zip(runs, states) if "base" in algos]
    if no_base:
        print(f"error: the base model's evaluations are not done in {', '.join(no_base)}: every gain is measured "
              f"against them; pool those runs once they have finished", file=sys.stderr)
        return 2
    seed_ids = [run_seed(r) for r in runs]
    cells = matched_cells([([x for x in rows if x.get("algorithm") not in algos],
                            [x for x in read_validation(r) if x.get("algorithm") not in algos], RecordStore(r), sid)
                           for r, rows, (_, algos), sid in zip(runs, rows_per_run, states, seed_ids)], budgets[0],
                          keep_draws=True, wide_ratio=wide_ratio(runs[0]))
    order = roster.order({c["algorithm"] for c in cells})
    diffs = differences(cells, order)
    k = len(runs)
    lines = [f"# KL-matched comparison over {k} runs", "",
             *[f"- `{r.root}` (system.seed={sid})" for r, sid in zip(runs, seed_ids)], "",
             "Values: the mean over the runs of each run's value at the budget (reached only when every run reaches "
             "it; a cell's kind is the weakest of the runs'). "
             f"Seeds: the {k} runs differ in system.seed only, which varies training and sampling; every run is "
             "evaluated on the same test prompts, so the prompts' luck is shared by the seeds and does not average "
             f"out over them. Intervals: 95%, seed-level: the seeds' spread with {k - 1} degree{'s' if k != 2 else ''} "
             "of freedom (a t interval over the seeds' values) combined with the shared prompts' part (the covariance "
             "of the seeds' values over resampled prompts): the larger of Welch-Satterthwaite's t half-width for the "
             "sum and the seeds' part's own t half-width; with this few seeds "
             "they are wide by design. A method's gain and a difference of two methods are paired by seed id; a seed "
             "one of the two lacks is left out of that pair.", "",
             *[f"- **Not finished:** {w}" for w in partial], *([""] if partial else []),
             *matched_tables(cells, order, diffs)]
    text = "\n".join(lines)
    print(text)
    if out:
        Path(f"{out}.md").write_text(text)
        Path(f"{out}.json").write_text(json.dumps({"runs": [str(r.root) for r in runs], "budgets": budgets[0],
                                                   "cells": public(cells), "differences": diffs}, indent=1))
        print(f"written: {out}.md, {out}.json")
    return 0


def print_summary(summary, run, command: str = "pita run") -> None:
    c = summary.counts
    print(f"\n{c['COMPLETED']} completed, {c['FAILED']} failed, {c['SKIPPED']} skipped, "
          f"{c['PENDING'] + c['RUNNING']} not run, in {summary.wall_s:.1f}s")
    for f in summary.failures:
        print(f"  FAILED {f['job']} on {f['device']}: {f['error']}\n         log: {f['log']}")
    if summary.interrupted:
        print(f"interrupted; resume with: {command} resume_from={run.root.resolve()}")
    print(f"run folder: {_here(run.root)}  (log: {_here(run.run_log)})")


def _here(path) -> str:
    """``path`` relative to the current folder when it lies below it (shorter to read and paste),
    else as it is."""
    import os
    from pathlib import Path

    try:
        return str(Path(path).relative_to(Path(os.getcwd())))
    except ValueError:
        return str(path)

