"""Experiment trackers (pita/tracking.py): TensorBoard offline end to end on a tiny value
model, TRL's report_to from the config, the config check, wandb offline when it is installed.

    .venv/bin/python -m pytest -q tests/test_tracker.py
"""

import importlib.util
import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from pita.core.paths import RunPaths

HAS_TB = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None


def _ctx(tmp_path, tracker: str, job_id="PITA.tiny.arith.r0.train"):
    run = RunPaths(tmp_path / "exp" / "2026-01-01_00-00-00")
    run.root.mkdir(parents=True)
    cfg = OmegaConf.create({"logging": {"tracker": tracker, "project": "pita-tests"}})
    return SimpleNamespace(cfg=cfg, run=run, job=SimpleNamespace(id=job_id))


def _scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_no_tracker_is_the_default_and_sends_nothing(tmp_path):
    from pita.tracking import TrackerSettings, prepare_trl, settings_for, tracker_settings

    ctx = _ctx(tmp_path, "none")
    assert tracker_settings(ctx) == TrackerSettings() and prepare_trl(tracker_settings(ctx)) == {"report_to": []}
    assert settings_for(OmegaConf.create({}), ctx.run, "x").kind == "none"  # a config older than logging.*
    assert not (ctx.run.root / "tensorboard").exists()


@pytest.mark.skipif(not HAS_TB, reason="tensorboard not installed")
def test_value_model_training_writes_every_step_to_tensorboard(tmp_path):
    """A tiny value model trained for 2 epochs: the event file holds one loss per optimizer step,
    equal to the curve the job writes to metrics.jsonl."""
    import torch

    from pita.guidance.train import SeqExample, TrainSettings, train
    from pita.tracking import tracker_settings

    class Tiny(torch.nn.Module):  # what train() needs of a value model: parameters, token_scores, spec
        spec = SimpleNamespace(loss="bce")

        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(16, 4)
            self.head = torch.nn.Linear(4, 1)

        def token_scores(self, ids, mask):
            return self.head(self.emb(ids[:, :-1]))

    ctx = _ctx(tmp_path, "tensorboard")
    examples = [SeqExample([1, 2, 3, 4, 5], 2, float(i % 2)) for i in range(8)]
    curve = train(Tiny(), examples, TrainSettings(epochs=2, lr=1e-2, token_budget=20, batch_size=4, seed=0),
                  logging.getLogger("t"), tracker=tracker_settings(ctx))
    folder = ctx.run.root / "tensorboard" / "PITA.tiny.arith.r0.train"
    got = _scalars(folder, "train/loss")
    assert [s for s, _ in got] == [c["step"] for c in curve] and len(got) == 4
    assert [v for _, v in got] == pytest.approx([c["loss"] for c in curve], rel=1e-6)


@pytest.mark.skipif(not HAS_TB, reason="tensorboard not installed")
def test_trl_reports_to_the_configured_tracker(tmp_path, monkeypatch):
    from trl import DPOConfig

    from pita.training.arguments import training_args
    from pita.tracking import tracker_settings

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    p = {"dtype": "float32", "batch_size": 4, "devices": 1, "gradient_accumulation_steps": 1, "tf32": False,
         "compile": False, "lr": 1e-4, "beta": 0.1, "gradient_checkpointing": False, "seed": 0}
    off = training_args(DPOConfig, p, str(tmp_path / "a"), False, tracker_settings(_ctx(tmp_path / "n", "none")))
    assert off.report_to in ([], "none", ["none"])
    ctx = _ctx(tmp_path, "tensorboard", "DPO.tiny.arith.r0.train")
    on = training_args(DPOConfig, p, str(tmp_path / "b"), False, tracker_settings(ctx))
    assert on.report_to == ["tensorboard"] and on.run_name == "DPO.tiny.arith.r0.train"
    import os

    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(ctx.run.root / "tensorboard" / "DPO.tiny.arith.r0.train")


@pytest.mark.skipif(not HAS_TB, reason="tensorboard not installed")
def test_the_final_results_go_to_tensorboard_when_results_are_written(tmp_path):
    from pita.report.results import send_results

    run = RunPaths(tmp_path / "exp" / "t")
    run.root.mkdir(parents=True)
    run.config.write_text("logging:\n  tracker: tensorboard\n")
    rows = [{"algorithm": "base", "family": "tiny", "train_dataset": "arith", "round": 0, "eval_dataset": "arith",
             "eta": 0.0, "pass@1": 0.25, "kl": 0.0, "prompts": 8, "n": 4},
            *[{"algorithm": "DPO", "family": "tiny", "train_dataset": "arith", "round": r, "eval_dataset": "arith",
               "eta": 0.0, "selected": True, "pass@1": 0.3 + 0.1 * r, "kl": 0.1, "gain": 0.05 + 0.1 * r,
               "prompts": 8, "n": 4} for r in (0, 1)]]
    send_results(run, rows)
    folder = run.root / "tensorboard" / "results"
    assert _scalars(folder, "arith/DPO/pass@1") == [(0, pytest.approx(0.3)), (1, pytest.approx(0.4))]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    assert "results/headline/text_summary" in acc.Tags()["tensors"]


def test_wandb_without_wandb_is_refused_with_the_fix():
    from pita.tracking import check_tracker

    (msg,) = check_tracker("wandb", wandb_available=False)
    assert "logging.tracker" in msg and "pip install wandb" in msg and "logging.tracker=tensorboard" in msg
    (msg,) = check_tracker("tensorbord")
    assert "tensorboard" in msg  # did you mean
    assert check_tracker("none") == []


@pytest.mark.skipif(HAS_WANDB, reason="wandb is installed here")
def test_the_cli_refuses_logging_tracker_wandb_when_wandb_is_missing(tmp_path):
    r = subprocess.run([sys.executable, "run_parallel.py", "logging.tracker=wandb", f"system.output_dir={tmp_path}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "logging.tracker" in r.stderr and "pip install wandb" in r.stderr


@pytest.mark.skipif(not HAS_WANDB, reason="wandb not installed")
def test_wandb_logs_offline(tmp_path, monkeypatch):
    from pita.tracking import open_tracker, tracker_settings

    monkeypatch.setenv("WANDB_MODE", "offline")
    ctx = _ctx(tmp_path, "wandb")
    with open_tracker(tracker_settings(ctx)) as t:
        t.log({"train/loss": 0.5}, 1)
    assert any((ctx.run.root / "wandb").glob("offline-run-*"))

