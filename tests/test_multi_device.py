"""The multi-device path on CPU: rank-local devices, an OOM on any rank, ports that cannot race."""

import json

import pytest

import pita.algos.rank_check  # noqa: F401  (registers synthetic.ranks, a k-device diagnostic kind)
from helpers import run_graph
from pita.core.job import Job, Resources, RetryPolicy


def test_each_rank_uses_its_own_gpu(monkeypatch):
    """Rank r of a k-device job sees the job's k GPUs; models it builds outside the trainer
    (reward models, proxies) must go to cuda:LOCAL_RANK, where accelerate puts that rank's inputs."""
    import torch

    from pita.models.lm import default_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert default_device() == "cuda:0"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert default_device() == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == "cpu"


def test_grpo_builds_its_reward_model_on_the_rank_device(monkeypatch, tmp_path):
    """GRPO's reward function, built before the trainer, takes the rank's device."""
    import torch

    import pita.rewards.reward_model as rm
    from pita.algos import grpo

    seen = {}

    class FakeScorer:
        def __init__(self, path, device="cpu", **kw):
            seen["device"] = device

    monkeypatch.setattr(rm, "RewardModelScorer", FakeScorer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    from pita.models.lm import default_device

    p = {"dataset": {"name": "sentiment", "toy_train_size": 4, "toy_test_size": 2}, "reward_model": "rm",
         "task": "reward", "correctness_bonus": 0.0}
    grpo.Rewards(p, None, default_device())
    assert seen["device"] == "cuda:1"


def test_the_ranks_meet_without_choosing_a_port():
    """torchrun's standalone rendezvous binds port 0 and keeps it: no free-port probe to race on."""
    from pathlib import Path

    from pita.core.ranks import launch_command

    cmd = launch_command(2, Path("spec.json"))
    assert "--standalone" in cmd and not any(c.startswith("--master_port") for c in cmd)


@pytest.mark.timeout(240)
def test_an_oom_on_any_rank_is_the_jobs_oom_and_two_jobs_start_together(tmp_path):
    """Two 2-rank jobs start at the same moment (no port race); in one of them rank 1 runs out of
    memory at micro-batch 4: the job is retried at 2 like a one-device OOM, not failed."""
    retry = RetryPolicy(batch_param="micro_batch_size")
    jobs = [Job("oom", "synthetic.ranks", params={"devices": 2, "oom_rank": 1, "micro_batch_size": 4, "fits": 2},
                resources=Resources(2, 0.5), retry=retry),
            Job("fine", "synthetic.ranks", params={"devices": 2, "micro_batch_size": 4}, resources=Resources(2, 0.5),
                retry=retry)]
    summary, state, run = run_graph(jobs, tmp_path, devices=4, worker_start="exec")
    a, b = state["jobs"]["oom"], state["jobs"]["fine"]
    assert [x["status"] for x in a["attempts"]] == ["oom", "ok"], a["attempts"]
    assert "rank 1 of 2" in a["attempts"][0]["error"]
    assert [x["micro_batch_size"] for x in a["attempts"]] == [4, 2]
    assert b["state"] == "COMPLETED" and [x["status"] for x in b["attempts"]] == ["ok"]
    res = json.loads((run.job("oom").result).read_text())
    assert res == {"rank": 0, "world": 2, "device": "cpu", "micro_batch_size": 2}
    log = run.job("oom").log.read_text()
    assert "[rank 1] devices: CUDA_VISIBLE_DEVICES=" in log and "LOCAL_RANK=1" in log


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", ["SIGUSR1", "SIGTERM"])
def test_slurms_warning_to_a_k_device_jobs_worker_reaches_every_rank_which_saves_and_runs_again(tmp_path,
                                                                                               monkeypatch, sig):
    """Under Slurm (PITA_SLURM_SIGNALS=1) USR1 or TERM reach the batch process: the worker of a
    2-rank job. It forwards the signal to both ranks (not to torchrun's agent), each saves and
    stops; the attempt ends "requeue" with the ranks' word, and the next attempt completes."""
    import signal
    import threading

    from tests.helpers import wait_for, workers_of

    monkeypatch.setenv("PITA_SLURM_SIGNALS", "1")
    from pita.core.paths import RunPaths

    run = RunPaths.create(tmp_path, "t")
    job = Job("ranks", "synthetic.ranks", params={"devices": 2, "save_on_signal": True}, resources=Resources(2, 0.5))
    folder = run.job("ranks").dir
    sent = []

    def signal_when_training():
        if wait_for(lambda: (folder / "rank0.training").exists() and (folder / "rank1.training").exists(), 180):
            [w] = workers_of(run.root)
            w.send_signal(getattr(signal, sig))
            sent.append(w.pid)

    t = threading.Thread(target=signal_when_training, daemon=True)
    t.start()
    summary, state, _ = run_graph([job], tmp_path, devices=2, worker_start="exec", run=run)
    t.join(5)
    attempts = state["jobs"]["ranks"]["attempts"]
    assert sent and [a["status"] for a in attempts] == ["requeue", "ok"], attempts
    assert f"{sig} received: rank" in attempts[0]["error"] and "saved at step" in attempts[0]["error"]
    log = run.job("ranks").log.read_text()
    assert f"{sig} received: forwarded to the job's 2 rank(s)" in log
