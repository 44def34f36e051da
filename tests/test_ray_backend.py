"""executor.backend=ray on a local Ray instance declaring logical GPUs (CPU machine): placement
and CUDA_VISIBLE_DEVICES, GPU sharing by memory, dependency order, failures, a killed worker,
Ctrl-C, and resume across the local and ray backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, cli, wait_for, workers_of

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.integration

SMALL = ["experiment.workload=synthetic", "synthetic.algos=[PITA,DPO]", "synthetic.datasets=[arith]",
         "synthetic.rounds=2"]


def ray_args(gpus=4, **kw):
    extra = [f"executor.ray.{k}={v}" for k, v in kw.items()]
    return ["executor.backend=ray", f"executor.ray.num_gpus={gpus}", "executor.ray.num_cpus=4", *extra]


@pytest.fixture(autouse=True)
def _ray_home(tmp_path, monkeypatch):
    """Ray keeps its session files and any token under HOME / its temp dir: keep them in the test."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    (tmp_path / "home").mkdir()


def only_run(base: Path, name: str) -> Path:
    [run] = list((base / name).iterdir())
    return run


def states(run: Path) -> dict:
    return json.loads((run / "state.json").read_text())["jobs"]


def test_jobs_spread_over_the_logical_gpus_with_their_own_cuda_visible_devices(tmp_path):
    r = cli(["experiment.name=spread", "synthetic.job_seconds=0.3", *SMALL, *ray_args(4)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path, "spread")
    jobs = states(run)
    used = set()
    for jid, e in jobs.items():
        assert e["state"] == "COMPLETED", jid
        last = e["attempts"][-1]
        assert last["node_ip"]
        if e["devices"]:
            [d] = e["devices"]
            res = json.loads((run / "jobs" / jid / "result.json").read_text())
            if "cuda_visible_devices" in res:  # synthetic.work reports what its worker saw
                assert res["cuda_visible_devices"] == str(d["index"]) == last["gpu_ids"][0], jid
            used.add(d["index"])
        else:
            assert last["gpu_ids"] == []
    assert used == {0, 1, 2, 3}
    log = (run / "run.log").read_text()
    assert "with the ray backend" in log and "[ray] node" in log
    # dependencies first: nothing started before every one of its dependencies finished
    graph = dict(jobs)
    for jid, e in graph.items():
        launch = json.loads((run / "jobs" / jid / "launch.json").read_text())
        for d in launch["job"]["deps"]:
            assert graph[d]["finished"] <= e["started"] + 1e-3, (d, jid)


@pytest.mark.slow  # sharing by memory in the default tier: tests/test_scheduler.py, test_memory_learning.py
def test_small_jobs_share_a_gpu_as_far_as_its_memory_goes(tmp_path):
    """One logical GPU of 1 GiB, jobs of 0.4 GB: two at a time on it, never three."""
    r = cli(["experiment.name=share", "synthetic.job_seconds=0.5", "synthetic.memory_gb=0.4", *SMALL,
             *ray_args(1, gpu_memory_gb=1.0)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = states(only_run(tmp_path, "share"))
    spans = [(e["started"], e["finished"]) for e in jobs.values() if e["devices"]]
    most = max(sum(1 for s, f in spans if s <= t < f) for t, _ in spans)
    assert most == 2


@pytest.mark.slow  # the same rule on the local backend: tests/test_cli_runs.py
def test_an_exception_fails_the_job_with_its_traceback_and_skips_its_dependents(tmp_path):
    r = cli(["experiment.name=f", "synthetic.job_seconds=0", *SMALL, "synthetic.fail=[PITA.tiny.arith.r0.train]",
             *ray_args(2)], tmp_path, timeout=300)
    assert r.returncode == 1
    run = only_run(tmp_path, "f")
    jobs = states(run)
    assert jobs["PITA.tiny.arith.r0.train"]["state"] == "FAILED"
    assert "configured to fail" in jobs["PITA.tiny.arith.r0.train"]["error"]
    assert "Traceback" in (run / "jobs" / "PITA.tiny.arith.r0.train" / "job.log").read_text()
    assert jobs["PITA.tiny.arith.r1.train"]["state"] == "SKIPPED"
    assert jobs["DPO.tiny.arith.r1.train"]["state"] == "COMPLETED"


def _start(tmp_path, name, extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(ROOT / "run_parallel.py"), f"system.output_dir={tmp_path}",
                             "executor.progress=plain", f"experiment.name={name}", *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_worker_fails_its_job_and_the_run_goes_on(tmp_path):
    p = _start(tmp_path, "kill", ["synthetic.job_seconds=1.5", *SMALL, *ray_args(2)])
    assert wait_for(lambda: (tmp_path / "kill").exists() and any((tmp_path / "kill").iterdir()), 60)
    run = only_run(tmp_path, "kill")
    assert wait_for(lambda: len(workers_of(run)) >= 1, 60), "no worker started"
    victim = workers_of(run)[0]
    cmd = " ".join(victim.cmdline())
    victim.send_signal(signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, err[-3000:]
    jobs = states(run)
    failed = [j for j, e in jobs.items() if e["state"] == "FAILED"]
    assert len(failed) == 1 and failed[0] in cmd
    assert "SIGKILL" in jobs[failed[0]]["error"]
    assert sum(e["state"] == "COMPLETED" for e in jobs.values()) > 0


@pytest.mark.slow  # Ctrl-C on the local backend: tests/test_cli_runs.py
def test_ctrl_c_cancels_the_ray_work_leaves_no_worker_and_saves_state(tmp_path):
    p = _start(tmp_path, "int", ["synthetic.job_seconds=60", *SMALL, *ray_args(2), "executor.kill_grace_s=2"])
    assert wait_for(lambda: (tmp_path / "int").exists() and any((tmp_path / "int").iterdir()), 60)
    run = only_run(tmp_path, "int")
    assert wait_for(lambda: len(workers_of(run)) >= 2, 60), "workers never started"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-3000:]
    assert wait_for(lambda: workers_of(run) == [], 10), "worker processes survived Ctrl-C"
    state = json.loads((run / "state.json").read_text())
    assert state["interrupted"] is True
    assert not [j for j, e in state["jobs"].items() if e["state"] == "RUNNING"]


@pytest.mark.parametrize("first, then", [("local", "ray"), pytest.param("ray", "local", marks=pytest.mark.slow)])
def test_a_run_started_on_one_backend_resumes_on_the_other(tmp_path, first, then):
    backend = (lambda b: ray_args(2) if b == "ray" else ["executor.backend=local"])
    p = _start(tmp_path, "res", ["synthetic.job_seconds=0.4", *SMALL, *backend(first), "executor.kill_grace_s=2"])
    assert wait_for(lambda: (tmp_path / "res").exists() and any((tmp_path / "res").iterdir()), 60)
    run = only_run(tmp_path, "res")
    assert wait_for(lambda: sum(1 for _ in run.glob("jobs/*/.done")) >= 4, 120)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    done_before = sum(1 for _ in run.glob("jobs/*/.done"))
    r = cli([f"resume_from={run}", *backend(then)], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = states(run)
    assert all(e["state"] == "COMPLETED" for e in jobs.values())
    assert f"resume: {done_before} of {len(jobs)} jobs already completed" in (run / "run.log").read_text()


def test_without_ray_the_backend_says_how_to_install_it(monkeypatch):
    from pita.core.backends import ray as rb
    from pita.core.errors import ConfigError

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        rb.import_ray()


def test_a_node_that_cannot_see_the_run_folder_is_reported(tmp_path):
    from pita.core.backends.ray import DeviceRunner

    out = DeviceRunner().run("j", str(tmp_path / "nowhere" / "launch.json"), str(tmp_path / "log"), {}, [])
    assert out["rc"] is None and out["missing"].endswith("launch.json") and out["node_ip"]


def test_on_a_cluster_of_two_gpu_nodes_k_device_jobs_get_one_nodes_gpus(tmp_path):
    """ray.cluster_utils.Cluster: a head without GPUs and two nodes of 2 logical GPUs each (one
    machine, so one address: nodes told apart by Ray's node id). Three 2-GPU jobs and two 1-GPU
    jobs run through the executor and the Ray backend: every 2-GPU job's GPUs are on one node,
    and a job asking for 3 is refused naming the largest node."""
    from ray.cluster_utils import Cluster

    from pita.core.backends.ray import RayBackend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.job import Job, Resources
    from pita.core.paths import RunPaths
    from pita.plans.fit import node_problems

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2, num_gpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        backend = RayBackend()
        gpus = GPUManager(backend.devices(int(80e9)), source="ray")
        nodes = [d.node for d in gpus.devices]
        assert len(set(nodes)) == 2 and sorted(nodes.count(n) for n in set(nodes)) == [2, 2]
        jobs = [Job(f"pair{i}", "synthetic.work", params={"seconds": 0.3}, resources=Resources(2, 1.0))
                for i in range(3)]
        jobs += [Job(f"one{i}", "synthetic.work", params={"seconds": 0.3}, resources=Resources(1, 1.0))
                 for i in range(2)]
        [problem] = node_problems([Job("GRPO.x.r0.train", "algo.grpo_train", resources=Resources(3, 1.0))],
                                  gpus.devices)
        assert "needs 3 GPUs of one node" in problem and "has 2" in problem
        run = RunPaths.create(tmp_path, "nodes")
        s = ExecutorSettings(progress="off", poll_interval_s=0.05, learn_memory=False)
        summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus, backend, run,
                           s).run()
        assert summary.exit_code == 0, summary.failures
        state = json.loads((run.root / "state.json").read_text())["jobs"]
        for i in range(3):
            used = {d["node"] for d in state[f"pair{i}"]["devices"]}
            assert len(state[f"pair{i}"]["devices"]) == 2 and len(used) == 1, state[f"pair{i}"]["devices"]
    finally:
        ray.shutdown()
        cluster.shutdown()
