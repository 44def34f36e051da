"""executor.backend=slurm: each job attempt a Slurm job, on a real one-node Slurm started by
tools/slurm.sh (make slurm-up: slurmctld, slurmd and munge from the distribution, 2 count-only
GPUs). The end-to-end tests skip, saying why, where that cluster is not up."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pita.core.backends.slurm import SlurmBackend, SlurmSettings, gres_gpus, time_limit
from tests.helpers import ROOT, cli

SLURM_CONF = os.environ.get("PITA_SLURM_CONF", "/var/tmp/pita-slurm/slurm.conf")


def _cluster_up() -> str:
    """'' when the test cluster answers, else why not."""
    if not Path(SLURM_CONF).exists():
        return f"no Slurm test cluster ({SLURM_CONF} missing): make slurm-up starts one"
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=dict(os.environ, SLURM_CONF=SLURM_CONF),
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo did not answer ({e}): make slurm-up"
    if out.returncode != 0 or not any(s.strip() in ("idle", "mix", "alloc") for s in out.stdout.split()):
        return f"the Slurm test cluster is not up ({out.stdout.strip() or out.stderr.strip()}): make slurm-up"
    return ""


needs_slurm = pytest.mark.skipif(bool(_cluster_up()), reason=_cluster_up() or "up")


def _launch(tmp_path, devices, resources, hint=100.0):
    from pita.core.paths import JobPaths

    return SimpleNamespace(job={"id": "DPO.f.d.r0.train", "resources": resources, "duration_hint": hint},
                           job_id="DPO.f.d.r0.train", devices=devices, attempt=1, env={"CUDA_VISIBLE_DEVICES": "0,1",
                                                                                       "OMP_NUM_THREADS": "4"},
                           paths=JobPaths(tmp_path / "job"))


def test_an_attempt_asks_slurm_for_what_the_plan_gives_its_job(tmp_path):
    be = SlurmBackend(SlurmSettings(partition="gpu", account="lab", qos="high", constraint="h100",
                                    sbatch_args=["--exclusive"], cpus_per_job=8))
    gpu = [{"kind": "cuda"}, {"kind": "cuda"}]
    args = be.request(_launch(tmp_path, gpu, {"devices": 2, "memory_gb": 70.0, "host_gb": 61.2}, hint=3600))
    assert args[:2] == ["-J", "pita:DPO.f.d.r0.train"] and "--gres=gpu:2" in args and "--mem=62G" in args
    assert "-c" in args and args[args.index("-c") + 1] == "16"
    assert "--time=0-02:00:00" in args  # 1 h expected x the margin of 2
    for flag, v in (("-p", "gpu"), ("-A", "lab"), ("-q", "high"), ("-C", "h100")):
        assert args[args.index(flag) + 1] == v
    assert args[-1] == "--exclusive"
    script = be.script(_launch(tmp_path, gpu, {}), gpus=2)
    assert "CUDA_VISIBLE_DEVICES" not in script and "export OMP_NUM_THREADS=4" in script  # Slurm sets the GPUs
    assert "-m pita.core.worker" in script
    cpu = be.request(_launch(tmp_path, [{"kind": "cpu"}], {"devices": 1, "memory_gb": 3.0}, hint=5))
    assert not any(a.startswith("--gres") for a in cpu) and "--mem=3G" in cpu and "--time=0-00:10:00" in cpu


def test_slurms_formats_are_read_as_slurm_writes_them():
    assert time_limit(90061, 1.0, 1) == "1-01:01:01"
    assert gres_gpus("gpu:2") == 2 and gres_gpus("gpu:h100:8(S:0-1)") == 8 and gres_gpus("gpu:a100:4,shard:8") == 4
    assert gres_gpus("(null)") == 0


def _slurm_env():
    return dict(os.environ, SLURM_CONF=SLURM_CONF)


@pytest.fixture(autouse=True)
def _slurm_conf(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", SLURM_CONF)


SYNTH = ["experiment.workload=synthetic", "synthetic.algos=[A,B]", "synthetic.families=[f]", "synthetic.datasets=[d]",
         "synthetic.rounds=1", "synthetic.gen_shards=1", "synthetic.eval_shards=1", "executor.backend=slurm",
         "executor.slurm.gpu_card=H100", "executor.slurm.poll_interval_s=0.5", "executor.slurm.min_minutes=2"]


@needs_slurm
def test_a_grid_runs_as_slurm_jobs_named_by_their_pita_ids(tmp_path):
    r = cli([*SYNTH, "synthetic.job_seconds=1", "experiment.name=sl"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = next((tmp_path / "sl").iterdir())
    state = json.loads((run / "state.json").read_text())
    attempts = [a for j in state["jobs"].values() for a in j["attempts"]]
    assert attempts and all(a["status"] == "ok" for a in attempts)
    device_jobs = [a for a in attempts if a.get("slurm_job")]
    assert device_jobs and all(a["slurm_state"] == "COMPLETED" for a in device_jobs)
    # each asked for one count-only GPU, and Slurm's GRES set CUDA_VISIBLE_DEVICES for it
    script = next(run.glob("jobs/*/slurm-1.sh")).read_text()
    assert "CUDA_VISIBLE_DEVICES" not in script


@needs_slurm
def test_a_partition_the_cluster_lacks_is_exit_2_before_anything_is_submitted(tmp_path):
    r = cli([*SYNTH, "executor.slurm.partition=gpuz", "experiment.name=bad"], tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "executor.slurm.partition" in r.stderr and "gpuz" in r.stderr and "debug" in r.stderr
    assert not (tmp_path / "bad").exists()


@needs_slurm
def test_a_job_scancelled_outside_pita_is_submitted_again_and_the_run_ends_0(tmp_path):
    env = _slurm_env()
    proc = subprocess.Popen([os.sys.executable, str(ROOT / "run_parallel.py"), *SYNTH, "synthetic.algos=[A]",
                             "synthetic.job_seconds=8", "experiment.name=cancel", f"system.output_dir={tmp_path}",
                             "executor.progress=plain"], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cancelled = None
    deadline = time.time() + 240
    while cancelled is None and time.time() < deadline:
        out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i|%j"], env=env, capture_output=True, text=True)
        for line in out.stdout.splitlines():
            sid, name = line.split("|", 1)
            if name.startswith("pita:") and ".gen" in name:
                subprocess.run(["scancel", sid], env=env)
                cancelled = name[len("pita:"):]
                break
        time.sleep(0.3)
    text, _ = proc.communicate(timeout=600)
    assert cancelled, text[-3000:]
    assert proc.returncode == 0, text[-3000:]
    run = next((tmp_path / "cancel").iterdir())
    state = json.loads((run / "state.json").read_text())
    attempts = state["jobs"][cancelled]["attempts"]
    assert [a["status"] for a in attempts] == ["lost", "ok"], attempts
    assert attempts[0]["slurm_state"] == "CANCELLED" and "cancelled outside pita" in attempts[0]["error"]


@needs_slurm
def test_ctrl_c_of_the_driver_cancels_its_slurm_jobs(tmp_path):
    import signal

    env = _slurm_env()
    proc = subprocess.Popen([os.sys.executable, str(ROOT / "run_parallel.py"), *SYNTH, "synthetic.job_seconds=30",
                             "experiment.name=intr", f"system.output_dir={tmp_path}", "executor.progress=plain"],
                            cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

    def ours():
        out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], env=env, capture_output=True, text=True)
        return [line for line in out.stdout.splitlines() if "|pita:" in line]

    deadline = time.time() + 120
    while not any(line.endswith("|RUNNING") for line in ours()) and time.time() < deadline:
        time.sleep(0.3)
    assert ours(), "no Slurm job started"
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, text[-3000:]
    deadline = time.time() + 30
    while ours() and time.time() < deadline:
        time.sleep(0.5)
    assert not ours(), ours()


def test_the_plan_prints_the_sbatch_request_of_each_job_kind(capsys):
    """pita plan executor.backend=slurm: per kind, the sbatch options its jobs are submitted with
    (GPUs, CPUs, memory, a time limit from the plan's seconds), and the makespan with one job per GPU."""
    from pita.cli.plan import plan_main

    args = ["--json", "experiment=paper_math", "gpu=auto", "model=qwen3", "system.inventory=8xH100",
            "system.host_ram=2TB", "experiment.algos=[GRPO]", "executor.backend=slurm",
            "executor.slurm.partition=gpu", "executor.slurm.cpus_per_job=8"]
    assert plan_main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    grpo = plan["slurm_requests"]["GRPO algo.grpo_train"]
    k = plan["training"]["GRPO"]["devices"]
    assert f"--gres=gpu:{k}" in grpo and f"-c {8 * k}" in grpo and "-p gpu" in grpo and "--time=" in grpo
    assert "--mem=" in grpo
    shard = plan["slurm_requests"]["base eval.shard (reference)"]
    assert "--gres=gpu:1" in shard
