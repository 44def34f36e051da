"""Experiment trackers: training metrics (and, from the report, the final results table) to
TensorBoard or Weights & Biases. A component the training jobs use, below the algorithms.

    logging.tracker=none          nothing (the default); metrics.jsonl and results/ as always
    logging.tracker=tensorboard   event files under <run>/tensorboard/<job id>/ and <run>/tensorboard/results/;
                                  offline; view with: tensorboard --logdir <run>/tensorboard
    logging.tracker=wandb         one wandb run per training job and one for the results, grouped by
                                  the run folder, project logging.project (needs `pip install wandb`;
                                  WANDB_MODE=offline keeps it on disk under <run>/wandb)

A training job gets its settings with ``tracker_settings(ctx)`` (from the run's config, so
changing the tracker never changes a job's fingerprint): TRL jobs pass them to
``training_args`` (TRL's ``report_to``), value-model and proxy training to
``pita.guidance.train.train``, which writes each optimizer step. ``pita.report.results.send_results``
logs the final table when results are written. A tracker that cannot be opened is logged and skipped: the
run's own files are the record.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pita.core.paths import RunPaths

log = logging.getLogger(__name__)

TRACKERS = ("none", "tensorboard", "wandb")


@dataclass(frozen=True)
class TrackerSettings:
    """Where one job's (or the results') metrics go; plain data, picklable into a worker."""

    kind: str = "none"  # none | tensorboard | wandb
    dir: str = ""  # tensorboard: the event folder; wandb: the folder wandb writes under
    name: str = ""  # the job id, or "results"
    group: str = ""  # the run: <experiment>/<time>
    project: str = "pita"  # wandb project

    @property
    def report_to(self) -> list[str]:
        """TRL / transformers' ``report_to``."""
        return [] if self.kind == "none" else [self.kind]


def check_tracker(kind: str, wandb_available: bool | None = None) -> list[str]:
    """Problems with ``logging.tracker`` (empty when fine), for the config validation."""
    from pita.core.names import unknown_name

    if kind not in TRACKERS:
        return [unknown_name("logging.tracker", kind, TRACKERS)]
    if wandb_available is None:
        import importlib.util

        wandb_available = importlib.util.find_spec("wandb") is not None
    if kind == "wandb" and not wandb_available:
        return ["logging.tracker='wandb' needs wandb, which is not installed: pip install wandb "
                "(or set logging.tracker=tensorboard, which works offline)"]
    if kind == "tensorboard":
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            return ["logging.tracker='tensorboard' needs the tensorboard package: pip install tensorboard "
                    "(or set logging.tracker=none)"]
    return []


def settings_for(cfg, run: RunPaths, name: str) -> TrackerSettings:
    """The tracker settings of ``name`` (a job id, or "results") in ``run``, from the config's
    ``logging`` section (absent in configs older than it: no tracker)."""
    section = cfg.get("logging") if cfg is not None else None
    kind = str(section.get("tracker", "none")) if section else "none"
    if kind == "none":
        return TrackerSettings()
    folder = run.root / "tensorboard" / name if kind == "tensorboard" else run.root
    return TrackerSettings(kind=kind, dir=str(folder), name=name, group=f"{run.root.parent.name}/{run.root.name}",
                           project=str(section.get("project", "pita")))


def tracker_settings(ctx) -> TrackerSettings:
    """A job's tracker settings: its run's ``logging.*``, named by its job id. A rank of a
    data-parallel job gets them from its launcher (``ctx.tracker``); a context without a run
    config (a job function called directly) has no tracker."""
    given = getattr(ctx, "tracker", None)
    if isinstance(given, dict):  # as a rank's launcher sent it (pita.core.ranks)
        return TrackerSettings(**given)
    if given is not None:
        return given
    if getattr(ctx, "cfg", None) is None or getattr(ctx, "run", None) is None:
        return TrackerSettings()
    return settings_for(ctx.cfg, ctx.run, ctx.job.id)


class Tracker:
    """No tracker: every call does nothing. Use as a context manager; ``close`` flushes."""

    def log(self, metrics: dict, step: int) -> None:
        pass

    def text(self, tag: str, text: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TensorBoardTracker(Tracker):
    def __init__(self, s: TrackerSettings):
        from torch.utils.tensorboard import SummaryWriter

        Path(s.dir).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=s.dir)

    def log(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(k, v, step)

    def text(self, tag: str, text: str) -> None:
        self.writer.add_text(tag, text)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbTracker(Tracker):
    def __init__(self, s: TrackerSettings):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=s.project, name=s.name, group=s.group, dir=s.dir)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
                     step=step)

    def text(self, tag: str, text: str) -> None:
        self.run.log({tag: self.wandb.Html(f"<pre>{text}</pre>")})

    def close(self) -> None:
        self.run.finish()


def open_tracker(s: TrackerSettings | None) -> Tracker:
    """The tracker for ``s``; a no-op tracker for none, or when it cannot be opened (logged)."""
    if s is None or s.kind == "none":
        return Tracker()
    try:
        return TensorBoardTracker(s) if s.kind == "tensorboard" else WandbTracker(s)
    except Exception as e:  # noqa: BLE001 - a tracker is a copy of what the run writes to disk anyway
        log.warning("logging.tracker=%s could not be opened (%s: %s); its metrics stay in metrics.jsonl only",
                    s.kind, type(e).__name__, e)
        return Tracker()


def prepare_trl(s: TrackerSettings | None) -> dict:
    """TrainingArguments keys for TRL's own reporting to the tracker (``report_to``, ``run_name``).

    transformers' TensorBoard callback takes its folder from ``TENSORBOARD_LOGGING_DIR`` and its
    wandb callback its project and group from ``WANDB_PROJECT`` / ``WANDB_RUN_GROUP``: they are set
    here, in the training job's own process, right before the trainer is built."""
    if s is None or s.kind == "none":
        return {"report_to": []}
    if s.kind == "tensorboard":
        os.environ["TENSORBOARD_LOGGING_DIR"] = s.dir
    else:
        os.environ["WANDB_PROJECT"] = s.project
        os.environ["WANDB_RUN_GROUP"] = s.group
        os.environ.setdefault("WANDB_DIR", s.dir)
    return {"report_to": s.report_to, "run_name": s.name}
