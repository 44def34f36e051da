"""The executor with real spawned workers: each failure rule, logs, state, OOM retry, timeouts."""

from __future__ import annotations

import os
import time

import pytest

from helpers import run_graph, wait_for, workers_of
from pita.core.job import Job, Resources, RetryPolicy

pytestmark = pytest.mark.integration


def J(id, kind="synthetic.work", deps=(), **params):
    return Job(id=id, kind=kind, deps=list(deps), params=params, resources=Resources(1, 0.5))


START = pytest.mark.parametrize("start", ["forkserver", "exec"])


@START
def test_exception_fails_job_skips_dependents_and_others_continue(tmp_path, start):
    jobs = [J("a", seconds=0), J("bad", "synthetic.raise", ["a"], message="boom 42"),
            J("after_bad", deps=["bad"]), J("after_after", deps=["after_bad"]),
            J("independent", deps=["a"], seconds=0.2)]
    summary, state, run = run_graph(jobs, tmp_path, worker_start=start)
    st = {k: v["state"] for k, v in state["jobs"].items()}
    assert st == {"a": "COMPLETED", "bad": "FAILED", "after_bad": "SKIPPED", "after_after": "SKIPPED",
                  "independent": "COMPLETED"}
    assert summary.exit_code == 1
    assert "ValueError: boom 42" in state["jobs"]["bad"]["error"]
    assert state["jobs"]["after_after"]["reason"] == "dependency bad failed"
    log = run.job("bad").log.read_text()
    assert "Traceback" in log and "boom 42" in log
    [f] = summary.failures
    assert f["job"] == "bad" and f["log"] == str(run.job("bad").log) and f["device"].startswith("cpu")
    assert not run.job("bad").is_done() and run.job("independent").is_done()


def test_run_log_has_prefixed_job_lines_and_state_records_devices(tmp_path):
    summary, state, run = run_graph([J("x", seconds=0), J("y", deps=["x"], seconds=0)], tmp_path)
    text = run.run_log.read_text()
    assert "[x cpu" in text and "working for" in text
    assert any(line.startswith("[y cpu") for line in text.splitlines())
    entry = state["jobs"]["y"]
    assert entry["devices"][0]["uuid"].startswith("SIM-") and entry["attempts"][0]["status"] == "ok"
    assert entry["attempts"][0]["peak_rss_bytes"] > 0
    assert run.job("y").read_result()["digest"]


def test_oom_is_retried_with_halved_batch(tmp_path):
    jobs = [Job("o", "synthetic.oom", params={"batch_size": 8, "fits": 2}, resources=Resources(1, 0.5))]
    summary, state, run = run_graph(jobs, tmp_path, oom_retries=2)
    e = state["jobs"]["o"]
    assert e["state"] == "COMPLETED"
    assert [a["batch_size"] for a in e["attempts"]] == [8, 4, 2]
    assert [a["status"] for a in e["attempts"]] == ["oom", "oom", "ok"]
    assert run.job("o").read_result() == {"batch_size": 2}
    assert "retrying with batch_size=4" in run.run_log.read_text()


def test_a_training_oom_halves_the_micro_batch_never_the_batch_and_the_kind_remembers(tmp_path):
    """TRAINING_RETRY: micro_batch_size 8 -> 4 -> 2, batch_size stays 32; the next job of the same
    kind starts at 2 instead of failing twice first; the report lists both jobs as resized."""
    from pita.core.job import TRAINING_RETRY
    from pita.report.report import oom_lines

    def T(id, deps=()):
        return Job(id, "synthetic.oom", deps=list(deps), resources=Resources(1, 0.5), retry=TRAINING_RETRY,
                   params={"size_param": "micro_batch_size", "micro_batch_size": 8, "batch_size": 32, "fits": 2})

    summary, state, run = run_graph([T("a"), T("b", deps=["a"])], tmp_path, oom_retries=2)
    a, b = state["jobs"]["a"], state["jobs"]["b"]
    assert [x["micro_batch_size"] for x in a["attempts"]] == [8, 4, 2]
    assert [x["status"] for x in a["attempts"]] == ["oom", "oom", "ok"]
    assert [x["micro_batch_size"] for x in b["attempts"]] == [2] and b["attempts"][0]["status"] == "ok"
    assert b["attempts"][0]["oom_resized"] == {"param": "micro_batch_size", "planned": 8, "used": 2}
    text = run.run_log.read_text()
    assert "retrying with micro_batch_size=4" in text
    assert "b starts with micro_batch_size=2 instead of 8" in text
    lines = oom_lines(state)
    assert "2 jobs" in lines[0] and any("`a`: micro_batch_size 8 -> 2" in x for x in lines)


def test_device_steps_keep_the_effective_batch():
    from pita.training.arguments import device_steps

    base = {"batch_size": 32, "devices": 1, "gradient_accumulation_steps": 1}
    assert device_steps({**base, "micro_batch_size": 8}) == (8, 4)
    assert device_steps({**base, "micro_batch_size": 4}) == (4, 8)  # an OOM retry: accumulation doubles
    assert device_steps({**base, "batch_size": 18, "micro_batch_size": 4}) == (3, 6)  # the divisor below
    assert device_steps({**base, "micro_batch_size": 0, "gradient_accumulation_steps": 2}) == (16, 2)
    assert device_steps({**base, "devices": 2, "micro_batch_size": 2}) == (2, 8)


def test_oom_gives_up_after_the_limit(tmp_path):
    jobs = [Job("o", "synthetic.oom", params={"batch_size": 8, "fits": 1}, resources=Resources(1, 0.5),
                retry=RetryPolicy(oom_retries=1))]
    summary, state, _ = run_graph(jobs, tmp_path, oom_retries=5)
    e = state["jobs"]["o"]
    assert e["state"] == "FAILED" and len(e["attempts"]) == 2
    assert "OOM retries used" in e["error"] and "CUDA out of memory" in e["error"]


@START
@pytest.mark.parametrize("kind,params,expect", [
    ("synthetic.exit", {"code": 7}, "exited with code 7"),
    ("synthetic.kill", {}, "SIGKILL"),
])
def test_dead_worker_is_detected_quickly(tmp_path, kind, params, expect, start):
    t0 = time.time()
    summary, state, _ = run_graph([Job("d", kind, params=params), J("next", deps=["d"])], tmp_path,
                                  worker_start=start)
    assert time.time() - t0 < 15
    assert state["jobs"]["d"]["state"] == "FAILED" and expect in state["jobs"]["d"]["error"]
    assert state["jobs"]["next"]["state"] == "SKIPPED"


def test_crash_retry_reruns_a_dead_worker(tmp_path):
    summary, state, _ = run_graph([Job("d", "synthetic.exit", params={"code": 9})], tmp_path, crash_retries=2)
    assert state["jobs"]["d"]["state"] == "FAILED" and len(state["jobs"]["d"]["attempts"]) == 3


@START
def test_timeout_kills_the_job_and_leaves_no_process(tmp_path, start):
    t0 = time.time()
    summary, state, run = run_graph([Job("h", "synthetic.hang"), J("ok", seconds=0)], tmp_path, job_timeout_s=1.0,
                                    worker_start=start)
    assert time.time() - t0 < 15
    assert state["jobs"]["h"]["state"] == "FAILED" and "timed out after 1s" in state["jobs"]["h"]["error"]
    assert state["jobs"]["ok"]["state"] == "COMPLETED"
    assert workers_of(run.root) == []


def test_gang_job_gets_two_devices_with_both_visible(tmp_path):
    jobs = [Job("g", "synthetic.work", params={"seconds": 0}, resources=Resources(2, 0.5))]
    summary, state, run = run_graph(jobs, tmp_path, devices=3)
    assert len(state["jobs"]["g"]["devices"]) == 2


def test_inline_backend_runs_the_same_graph(tmp_path):
    jobs = [J("a", seconds=0), J("b", deps=["a"], seconds=0), J("bad", "synthetic.raise", ["a"]),
            Job("o", "synthetic.oom", params={"batch_size": 4, "fits": 1})]
    summary, state, run = run_graph(jobs, tmp_path, backend="inline")
    st = {k: v["state"] for k, v in state["jobs"].items()}
    assert st == {"a": "COMPLETED", "b": "COMPLETED", "bad": "FAILED", "o": "COMPLETED"}
    assert "Traceback" in run.job("bad").log.read_text()
    assert [a["batch_size"] for a in state["jobs"]["o"]["attempts"]] == [4, 2, 1]


def test_workers_see_only_their_device(tmp_path):
    from pita.core.gpu_manager import GPUManager

    env = GPUManager.from_inventory(4, 80e9).env_for([2, 3], threads=2)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    jobs = [Job(f"e{i}", "synthetic.env", resources=Resources(1, 0.0)) for i in range(2)]
    summary, state, run = run_graph(jobs, tmp_path, max_jobs_per_device=1)
    seen = [run.job(f"e{i}").read_result() for i in range(2)]
    assert all(s["CUDA_VISIBLE_DEVICES"] == "" and s["device_count"] == 0 for s in seen)
    assert sorted(state["jobs"][f"e{i}"]["devices"][0]["ordinal"] for i in range(2)) == [0, 1]


def _env_jobs(tmp_path, monkeypatch, start, **env):
    """Two synthetic.env jobs through a backend made *before* the environment and the working
    directory change: a worker must see the orchestrator's state when the job starts."""
    from pita.core.backends.local import LocalBackend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths

    backend = LocalBackend(worker_start=start, kill_grace_s=2)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PITA_TEST_VAR", "set-after-the-backend")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    gpus = GPUManager.from_inventory(2, 8e9, kind="cpu")
    run = RunPaths.create(tmp_path, "env")
    setup_logging(run.run_log, console=False)
    jobs = [Job(f"e{i}", "synthetic.env", resources=Resources(1, 0.0)) for i in range(2)]
    s = ExecutorSettings(progress="off", poll_interval_s=0.02, kill_grace_s=2, max_jobs_per_device=1,
                         threads_per_job=1)
    summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus, backend, run, s).run()
    assert summary.exit_code == 0, summary.failures
    return [run.job(f"e{i}").read_result() for i in range(2)], str(cwd)


@pytest.mark.parametrize("start,how", [("forkserver", "forked"), ("exec", "exec")])
def test_forked_and_fresh_workers_see_the_same_world(tmp_path, monkeypatch, start, how):
    seen, cwd = _env_jobs(tmp_path, monkeypatch, start)
    for s in seen:
        assert s["start"] == how
        assert s["CUDA_VISIBLE_DEVICES"] == "" and s["device_count"] == 0
        assert s["threads"] == 1  # OMP_NUM_THREADS of the job, even though the warm process imported torch
        assert s["cwd"] == cwd and s["PITA_TEST_VAR"] == "set-after-the-backend"
        assert s["blocked_signals"] == []  # the warm process's held SIGINT is lifted in each worker
    assert len({s["pid"] for s in seen}) == 2


def test_a_forked_worker_can_still_become_a_fresh_interpreter(tmp_path, monkeypatch):
    """The path a GPU job takes when the warm process had touched CUDA (forced here)."""
    seen, _ = _env_jobs(tmp_path, monkeypatch, "forkserver", PITA_FRESH_INTERPRETER="1")
    assert all(s["start"] == "exec" for s in seen)


def test_a_dead_warm_process_fails_its_workers_and_is_replaced(tmp_path):
    import threading

    import psutil

    from pita.core.paths import RunPaths

    run = RunPaths.create(tmp_path, "t")
    killed = []

    def kill_the_warm_process():
        if wait_for(lambda: workers_of(run.root), 30):
            [warm] = [c for c in psutil.Process().children() if "multiprocessing.forkserver" in " ".join(c.cmdline())]
            warm.kill()
            killed.append(warm.pid)

    t = threading.Thread(target=kill_the_warm_process, daemon=True)
    t.start()
    summary, state, _ = run_graph([J("w", seconds=5)], tmp_path, run=run, devices=1, crash_retries=1)
    t.join(5)
    assert killed, "the worker never started"
    e = state["jobs"]["w"]
    assert [a["status"] for a in e["attempts"]] == ["died", "ok"] and e["state"] == "COMPLETED"
    assert "SIGKILL" in e["attempts"][0]["error"]


def test_a_ctrl_c_while_the_warm_process_imports_is_held_for_the_orchestrator(tmp_path):
    """Ctrl-C reaches the whole process group, the warm process included, which the library
    protects from SIGINT only once its imports are done: before, it printed a traceback from
    the middle of importing torch. Here the imports take 1.5 s and SIGINT arrives after 0.3 s."""
    import signal
    import subprocess
    import sys

    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(1.5)\n")
    script = f"""
import os, signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda *a: got.append(1))
from multiprocessing import forkserver
from pita.core.backends.local import fork_server
fork_server(["slow_import"])
server = forkserver._forkserver._forkserver_pid
time.sleep(0.3)
os.killpg(0, signal.SIGINT)
time.sleep(2.5)
import psutil
print("server", psutil.Process(server).status(), "orchestrator saw", len(got))
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path)},
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal starts it
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "KeyboardInterrupt" not in p.stderr, p.stderr[-2000:]
    status = p.stdout.split()[1]
    assert status in ("sleeping", "running") and p.stdout.strip().endswith("orchestrator saw 1"), p.stdout


def test_a_cpu_job_holding_two_devices_gets_both_devices_threads(tmp_path):
    from pita.core.backends.local import LocalBackend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths

    gpus = GPUManager.from_inventory(2, 8e9, kind="cpu")
    run = RunPaths.create(tmp_path, "threads")
    setup_logging(run.run_log, console=False)
    jobs = [Job("both", "synthetic.env", resources=Resources(2, 0.0)),
            Job("one", "synthetic.env", deps=["both"], resources=Resources(1, 0.0))]
    s = ExecutorSettings(progress="off", poll_interval_s=0.02, kill_grace_s=2, threads_per_job=1)
    summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus,
                       LocalBackend(worker_start="forkserver", kill_grace_s=2), run, s).run()
    assert summary.exit_code == 0, summary.failures
    assert run.job("both").read_result()["threads"] == 2 and run.job("one").read_result()["threads"] == 1
