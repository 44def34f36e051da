"""Sweeps (``-m`` / ``--multirun``): one run folder per point, named by the overrides the sweep
varies; a line per point as it starts and ends; one summary across the points.

    <system.output_dir>/<experiment.name>/sweep-<YYYY-MM-DD_HH-MM-SS>/
      multirun.yaml            the sweep's config and command line (written by Hydra)
      summary.csv              one row per point: overrides, exit code, run folder, headline metrics
      <point>/                 a point's run folder (run.log, config.yaml, jobs/, results/, ...),
                               e.g. model-llama__experiment.rounds-2

Hydra's sweep folder is this one (``hydra.sweep.dir`` in pita/conf/config.yaml, with
``subdir: .``), so Hydra makes no folder of its own. :class:`SweepCallback` (``hydra.callbacks``)
sees the sweep start, each point start and end, and the sweep end; the task function asks
:func:`current` where its point's run goes. A point whose experiment.name or system.output_dir is
swept goes under its own ``<output_dir>/<name>/sweep-<time>/``; the summary stays in the first.
After an interrupted point (exit 130) the remaining points are not run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback

NAME_BYTES = 160  # a point folder's name at most (a file system allows 255): longer ones are cut and hashed
# Characters a folder name may keep: safe in a shell and in an unquoted Hydra value, so that
# resume_from=<point folder> can be typed as it is printed ('=' and ',' are neither).
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@-]+")
OUTCOMES = {0: "completed", 1: "failed", 2: "bad configuration", 130: "interrupted"}


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def point_name(overrides: list[str], swept: set[str]) -> str:
    """A folder name for the point from the overrides the sweep varies: ``key-value`` pairs
    joined by ``__``, list items by ``+``, brackets and quotes dropped, every other character
    outside ``A-Za-z0-9._+@-`` replaced by ``_`` (``model-llama__experiment.datasets-gsm8k+math500``).
    When a character had to be replaced, or the name is too long, a hash of the exact overrides
    follows, so two points never share a name."""
    parts, exact = [], []
    for o in overrides:
        if _key(o) not in swept:
            continue
        value = o.partition("=")[2]
        exact.append(f"{_key(o)}={value}")
        value = "".join(c for c in value.replace(",", "+") if c not in "[]{}()'\"")
        parts.append(f"{_key(o)}-{value}")
    text = "__".join(parts)
    name = _UNSAFE.sub("_", text)
    if name != text or len(name.encode()) > NAME_BYTES:
        name = f"{name[:NAME_BYTES]}-{hashlib.sha1(','.join(exact).encode()).hexdigest()[:8]}"
    return name or "point"


@dataclass
class Point:
    num: int  # 1-based, in sweep order
    overrides: list[str]  # the point's overrides that the sweep varies
    name: str  # its folder's name
    folder: Path | None = None  # where its run folder goes (set when it starts)
    run_folder: Path | None = None  # the run folder it made (or resumed); None: nothing ran
    code: int | None = None  # exit code; None: not run
    note: str = ""
    skip: bool = False

    @property
    def outcome(self) -> str:
        if self.code is None:
            return self.note or "not run"
        return OUTCOMES.get(self.code, f"exit {self.code}") + (f": {self.note}" if self.note else "")


def headline(run_folder: Path | None) -> dict[str, float]:
    """The run's headline numbers from ``results/final_results.json``: per evaluation dataset and
    algorithm the last round at the eta chosen on validation (as the report's headline table),
    its metric and, for trained policies, its KL. Empty when the run wrote no results."""
    if run_folder is None:
        return {}
    path = Path(run_folder) / "results" / "final_results.json"
    from pita.report.results import read_results

    try:
        rows, _ = read_results(path)
    except (OSError, ValueError, AttributeError):
        return {}
    from pita.report.intervals import metric_of
    from pita.report.report import headline_rows

    try:
        head = headline_rows(rows)
    except (KeyError, TypeError, ValueError):
        return {}
    families = len({r.get("family") for r in head}) > 1
    out: dict[str, float] = {}
    for r in head:
        label = f"{r['algorithm']} {r['eval_dataset']}"
        if r["algorithm"] != "base" and r.get("train_dataset") not in (None, r["eval_dataset"]):
            label += f" (trained on {r['train_dataset']})"
        if families:
            label += f" [{r['family']}]"
        m = metric_of(r)
        if r.get(m) is not None:
            out[f"{label} {m}"] = r[m]
        if r["algorithm"] != "base" and r.get("kl") is not None:
            out[f"{label} kl"] = r["kl"]
    return out


class Sweep:
    """The points of one sweep and what became of each."""

    def __init__(self, root: Path, swept: list[str], points: list[list[str]]):
        self.root = root
        self.swept = swept
        self.points: list[Point] = []
        seen: set[str] = set()
        for i, p in enumerate(points, 1):
            name = point_name(p, set(swept))
            if name in seen:  # the same name twice (only if the same values are swept twice)
                name = f"{name}-{i}"
            seen.add(name)
            self.points.append(Point(i, [o for o in p if _key(o) in swept], name))
        self.current: Point | None = None
        self.stopped = False

    @property
    def summary_path(self) -> Path:
        return self.root / "summary.csv"

    def label(self, p: Point) -> str:
        return f"sweep point {p.num}/{len(self.points)}"

    def start(self, num: int, sweep_dir: Path) -> Point:
        p = self.points[num] if num < len(self.points) else None
        if p is None:  # a launcher that numbers jobs differently: still one folder per point
            p = Point(num + 1, [], f"point-{num + 1}")
            self.points.append(p)
        self.current = p
        if self.stopped:
            p.skip, p.note = True, "not run: the sweep was interrupted"
            return p
        folder, i = sweep_dir / p.name, 0
        while folder.exists():  # another sweep started in the same second
            i += 1
            folder = sweep_dir / f"{p.name}_{i}"
        p.folder = folder
        print(f"{self.label(p)}: {' '.join(p.overrides) or '(no swept key)'} -> {folder}", flush=True)
        return p

    def end(self, p: Point, code: int | None, error: BaseException | None, resumed: str | None) -> None:
        if p.skip:
            return
        p.code = code if error is None else 1
        if error is not None:
            p.note = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if p.folder is not None and p.folder.is_dir():
            p.run_folder = p.folder
        elif resumed:
            p.run_folder = Path(resumed)
        if p.code == 130:
            self.stopped = True
        where = p.run_folder if p.run_folder is not None else "none (nothing ran)"
        print(f"{self.label(p)}: exit {p.code} ({p.outcome}); run folder: {where}", flush=True)
        self.write_summary()

    def rows(self) -> tuple[list[str], list[dict]]:
        rows, metrics = [], []
        for p in self.points:
            h = headline(p.run_folder)
            metrics += [k for k in h if k not in metrics]
            rows.append({"point": p.num, "overrides": " ".join(p.overrides), "exit_code": "" if p.code is None else p.code,
                         "outcome": p.outcome, "run_folder": "" if p.run_folder is None else str(p.run_folder), **h})
        return ["point", "overrides", "exit_code", "outcome", "run_folder", *metrics], rows

    def write_summary(self) -> None:
        """summary.csv, rewritten after every point: a sweep that stops half-way still has one."""
        from pita.core.paths import atomic_write

        header, rows = self.rows()
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=header)
        w.writeheader()
        w.writerows(rows)
        try:
            atomic_write(self.summary_path, buf.getvalue())
        except OSError as e:  # a full disk: the runs themselves say what to do
            print(f"warning: cannot write {self.summary_path} ({e.strerror})", flush=True)

    def table(self) -> str:
        header, rows = self.rows()
        ran = [p for p in self.points if p.code is not None]
        lines = [f"sweep: {len(ran)} of {len(self.points)} point(s) ran; summary: {self.summary_path}"]
        cols = [("#", "point"), ("exit", "exit_code"), ("outcome", "outcome"), ("overrides", "overrides"),
                ("run folder", "run_folder")]
        widths = [max(len(t), *(len(str(r[k])) for r in rows)) for t, k in cols]
        lines.append("  " + "  ".join(t.ljust(w) for (t, _), w in zip(cols, widths)).rstrip())
        for r in rows:
            lines.append("  " + "  ".join(str(r[k]).ljust(w) for (_, k), w in zip(cols, widths)).rstrip())
        metrics = header[5:]
        if metrics:
            lines.append("headline metrics (last round, eta chosen on validation; columns: points):")
            mw = max(len(m) for m in metrics)
            lines.append("  " + " " * mw + "".join(f"{'#' + str(r['point']):>9}" for r in rows))
            for m in metrics:
                cells = "".join(f"{r[m]:>9.3f}" if isinstance(r.get(m), (int, float)) else f"{'-':>9}" for r in rows)
                lines.append(f"  {m:<{mw}}{cells}")
        return "\n".join(lines)


_active: Sweep | None = None


def current() -> Point | None:
    """The sweep point being run now (None outside a sweep)."""
    return _active.current if _active is not None else None


def close(interrupted: bool = False) -> None:
    """End the sweep, if one is open: its summary is written and its table printed (also after
    an interruption or an error, with the points that did not run marked so)."""
    global _active
    if _active is None:
        return
    sweep, _active = _active, None
    p = sweep.current
    if interrupted and p is not None and p.code is None and not p.skip:  # Ctrl-C outside the executor
        p.code, p.run_folder = 130, p.folder if p.folder is not None and p.folder.is_dir() else None
    if interrupted or sweep.stopped:
        for q in sweep.points:
            if q.code is None:
                q.note = "not run: the sweep was interrupted"
    sweep.write_summary()
    print("\n" + sweep.table(), flush=True)


class SweepCallback(Callback):
    """Hydra's hooks around a multirun (configured under ``hydra.callbacks`` in config.yaml)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        global _active
        # Hydra's launcher logs each point's whole command line; the lines below say it per point
        logging.getLogger("hydra").setLevel(logging.WARNING)
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        swept = [o.key_or_group for o in parsed if o.is_sweep_override()]
        points = [p for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]
        _active = Sweep(Path(str(config.hydra.sweep.dir)), swept, points)
        print(f"sweep: {len(points)} point(s) over {', '.join(swept) or '(no swept key)'}, one after the other; "
              f"sweep folder: {_active.root}", flush=True)

    def on_job_start(self, config, **kwargs) -> None:
        if _active is not None:
            _active.start(int(config.hydra.job.num), Path(str(config.hydra.sweep.dir)))

    def on_job_end(self, config, job_return, **kwargs) -> None:
        from hydra.core.utils import JobStatus

        if _active is None or _active.current is None:
            return
        p = _active.current
        failed = job_return.status == JobStatus.FAILED
        error = job_return._return_value if failed else None  # .return_value would raise it
        code = None if failed else job_return.return_value
        _active.end(p, code, error, config.get("resume_from"))
        _active.current = None
        # A point under another experiment.name / output_dir: Hydra made its sweep folder; drop it
        # (and the experiment folder) again if the point left nothing there.
        here = Path(str(config.hydra.sweep.dir))
        if here.resolve() != _active.root.resolve():
            for d in (here, here.parent):
                try:
                    d.rmdir()
                except OSError:
                    break

    def on_multirun_end(self, config, **kwargs) -> None:
        close()
