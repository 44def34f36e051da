"""TRL training jobs checkpoint into their folder (training.save_steps) and a re-run attempt
continues from the last checkpoint: a DPO job killed mid-training (SIGKILL) resumes at the
checkpoint's step and ends with the steps of an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pita.core.errors import ConfigError

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]

# runs round 0's DPO job function in a fresh process; with a kill step, the process SIGKILLs
# itself right after the checkpoint of that step is written (before the next step starts)
RUNNER = """
import json, logging, os, signal, sys
from pathlib import Path
from types import SimpleNamespace
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
import transformers
from pita.algos import dpo
from pita.core.paths import JobPaths
params, data, job, kill_at = json.loads(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
if kill_at:
    save = transformers.Trainer._save_checkpoint
    def save_then_die(self, *a, **k):
        save(self, *a, **k)
        if self.state.global_step >= kill_at:
            print("killed after the checkpoint of step", self.state.global_step, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    transformers.Trainer._save_checkpoint = save_then_die
ctx = SimpleNamespace(params=params, dep_result=lambda j: {"path": data}, paths=JobPaths(job),
                      log=logging.getLogger("job"))
job.mkdir(parents=True, exist_ok=True)
print("RESULT " + json.dumps(dpo.dpo_train(ctx)), flush=True)
"""


def _run(params, data, job, kill_at=0):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", RUNNER, json.dumps(params), str(data), str(job), str(kill_at)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _result(r) -> dict:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])


def _losses(job: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}


@pytest.mark.timeout(600)
def test_a_killed_dpo_job_resumes_from_its_checkpoint_and_ends_with_the_same_steps(tiny_cache, tmp_path):
    from pita.plans import build_plan
    from test_baselines import compose
    from test_sharding import _pairs

    data = _pairs(tmp_path)
    jobs = build_plan(compose(tiny_cache, "experiment.algos=[DPO]", "algos.DPO.batch_size=4", "algos.DPO.epochs=1",
                              "algos.DPO.lr=2e-4", "training.save_steps=2"), [int(8e9)])
    params = next(j for j in jobs if j.id == "DPO.tiny.arith.r0.train").params
    assert params["save_steps"] == 2

    whole = _result(_run(params, data, tmp_path / "whole"))
    assert whole["steps"] == 8 and whole["resumed_from_step"] is None

    job = tmp_path / "killed"
    r = _run(params, data, job, kill_at=4)
    assert r.returncode == -9 and "killed after the checkpoint of step 4" in r.stdout, r.stdout[-2000:]
    assert [p.name for p in (job / "artifacts" / "trainer").glob("checkpoint-*")] == ["checkpoint-4"]  # the last kept

    half = job / "artifacts" / "trainer" / "checkpoint-6"  # as an attempt killed while saving step 6 leaves it
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"\0" * 64)
    r = _run(params, data, job)  # the re-run attempt
    again = _result(r)
    assert "checkpoint-6: an earlier attempt was stopped while writing it" in r.stdout
    assert "resuming from" in r.stdout and "checkpoint-4 (step 4" in r.stdout
    assert again["resumed_from_step"] == 4 and again["steps"] == whole["steps"]
    # the same data order and optimizer state: the resumed steps follow the uninterrupted run
    a, b = _losses(tmp_path / "whole"), _losses(job)
    assert set(b) >= {5, 6, 7, 8}
    assert max(abs(a[s] - b[s]) for s in (5, 6, 7, 8)) < 1e-3, (a, b)
    assert not list((job / "artifacts" / "trainer").glob("checkpoint-*"))  # a finished job keeps its policy only


@pytest.mark.parametrize("value", ["-1", "often", "1.5"])
def test_a_bad_save_steps_is_refused(tiny_cache, value):
    from pita.plans import build_plan
    from test_baselines import compose

    with pytest.raises(ConfigError, match=r"training.save_steps=.* must be an integer >= 0"):
        build_plan(compose(tiny_cache, "experiment.algos=[DPO]", f"training.save_steps={value}"), [int(8e9)])


def test_auto_checkpoints_cost_at_most_five_percent_of_the_training_time():
    """The pacer's interval: a checkpoint's cost over 5% of a step's time, agreed once per checkpoint."""
    from types import SimpleNamespace

    from pita.training.checkpoints import CHECKPOINT_SHARE, checkpoint_pacer

    pacer = checkpoint_pacer({"save_steps": "auto"}, n_params=10_000_000)
    pacer.step_s, pacer.cost = 0.5, 2.0  # 2 s to write, 0.5 s a step
    assert pacer._agree(SimpleNamespace()) == int(2.0 / (CHECKPOINT_SHARE * 0.5))  # 80 steps: 40 s per 2 s saved
    assert checkpoint_pacer({"save_steps": 10}, 1) is None and checkpoint_pacer({"save_steps": 0}, 1) is None


@pytest.mark.slow  # the long tier: two ranks trained, killed and resumed (the one-process kill and resume stays in the default tier)
@pytest.mark.timeout(600)
def test_a_sharded_job_killed_mid_training_resumes_on_both_ranks(tiny_cache, tmp_path, monkeypatch):
    """FSDP over two gloo ranks, the ranks SIGKILLed once checkpoint-4 is written: the re-run
    attempt resumes every rank from the last whole checkpoint and ends at the uninterrupted steps."""
    import logging
    import threading
    import time
    from types import SimpleNamespace

    import psutil

    from pita.algos import dpo
    from pita.core.errors import JobError
    from pita.core.paths import JobPaths
    from pita.plans import build_plan
    from test_baselines import compose
    from test_sharding import _pairs

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    data = _pairs(tmp_path, 64)
    jobs = build_plan(compose(tiny_cache, "experiment.algos=[DPO]", "algos.DPO.batch_size=8", "algos.DPO.epochs=1",
                              "algos.DPO.lr=2e-4", "training.micro_batch_size=4", "algos.DPO.devices=2",
                              "algos.DPO.sharding=fsdp", "training.save_steps=2"), [int(8e9)] * 2)
    params = next(j for j in jobs if j.id == "DPO.tiny.arith.r0.train").params
    job = tmp_path / "job"
    job.mkdir()
    trainer_dir = job / "artifacts" / "trainer"
    ctx = SimpleNamespace(params=params, dep_result=lambda j: {"path": str(data)}, paths=JobPaths(job),
                          log=logging.getLogger("test.fsdp-resume"))
    killed = []

    def kill_after_checkpoint_4():
        deadline = time.time() + 240
        while time.time() < deadline and not (trainer_dir / "checkpoint-4" / "trainer_state.json").exists():
            time.sleep(0.01)
        for p in psutil.Process().children(recursive=True):  # torchrun and both ranks
            try:
                p.kill()
                killed.append(p.pid)
            except psutil.Error:
                pass

    watcher = threading.Thread(target=kill_after_checkpoint_4, daemon=True)
    watcher.start()
    with pytest.raises(JobError, match="exited with code"):
        dpo.dpo_train(ctx)
    watcher.join(5)
    assert killed
    whole = [c for c in trainer_dir.glob("checkpoint-*") if (c / "trainer_state.json").exists()]
    last = max(int(c.name.split("-")[1]) for c in whole)
    assert 4 <= last < 8
    # each rank wrote its own shard of the weights and of the AdamW state; nothing was gathered whole
    ckpt = trainer_dir / f"checkpoint-{last}"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        shards = sorted(f.name for f in (ckpt / part).glob("*.distcp"))
        assert shards == ["__0_0.distcp", "__1_0.distcp"], (part, shards)
        sizes = [(ckpt / part / f).stat().st_size for f in shards]
        assert abs(sizes[0] - sizes[1]) <= 0.25 * max(sizes), (part, sizes)
        print(f"{ckpt.name}/{part}: bytes per rank {sizes}")  # shown with pytest -s
    assert not list(ckpt.glob("pytorch_model_fsdp.bin")) and not list(ckpt.glob("*.safetensors"))
    assert not list(ckpt.glob("optimizer.bin"))
    res = dpo.dpo_train(ctx)
    assert res["resumed_from_step"] == last and res["steps"] == 8
    held = res["rank_params"]
    assert len(held) == 2 and abs(held[0] - held[1]) <= 0.2 * held[0]
    # the final policy is one whole folder that loads as a plain model
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(res["checkpoint"])
    assert sum(w.numel() for w in saved.parameters()) == sum(held)


def test_value_training_stopped_after_a_checkpoint_continues_to_the_same_weights(tiny, tmp_path, monkeypatch):
    """The value trainer writes its state (every step here); a run stopped during step 8 (in its
    second epoch) and started again on a fresh model (as a re-attempt on another node would)
    continues after step 7, drawing the epoch's batches again, and ends with the uninterrupted run's loss curve and weights; the file is gone
    at the end."""
    import torch

    from pita.guidance import train as T
    from pita.guidance.value_model import ValueModel

    prompt = [5, 6, 7, 8]
    ex = [T.SeqExample(prompt + [20 + i % 7, 9, 9], 4, float(i % 2)) for i in range(40)]

    def model():
        torch.manual_seed(0)
        return ValueModel.create(tiny["guidance"], loss="bce")

    class Stop(Exception):
        pass

    class Tracker:  # stands in for the worker dying during step 8 (its state not yet written)
        def __init__(self, stop_at):
            self.stop_at = stop_at

        def log(self, metrics, step):
            if step == self.stop_at:
                raise Stop

    s = T.TrainSettings(epochs=3, lr=1e-3, token_budget=128, batch_size=8)
    whole = model()
    want = T._train(whole, ex, s, T.log, 0, "cpu", Tracker(None))
    ckpt = tmp_path / "train-state.pt"
    s2 = T.TrainSettings(epochs=3, lr=1e-3, token_budget=128, batch_size=8, checkpoint=str(ckpt))
    monkeypatch.setattr(T._Checkpoint, "due", lambda self: True)
    first = model()
    with pytest.raises(Stop):
        T._train(first, ex, s2, T.log, 0, "cpu", Tracker(8))
    assert ckpt.exists()
    saved = torch.load(ckpt, weights_only=False)
    assert saved["step"] == 7 and saved["epoch"] == 1  # the state before the stopped step, mid-epoch
    again = model()
    got = T._train(again, ex, s2, T.log, 0, "cpu", Tracker(None))
    assert [c["step"] for c in got] == [c["step"] for c in want]
    assert [round(c["loss"], 5) for c in got] == [round(c["loss"], 5) for c in want]
    for (n, a), (_, b) in zip(whole.state_dict().items(), again.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), n
    assert not ckpt.exists()
