"""Faults through the real executor and command line: stubborn and stopped jobs, escaped children,
a locked state store, one owner per run folder, damaged and moved run folders, a full disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers import ROOT, cli, final_state, only_run, run_graph, wait_for, workers_of
from pita.core.job import Job, Resources

pytestmark = pytest.mark.integration

SMALL = ["synthetic.algos=[PITA,DPO]", "synthetic.datasets=[arith]", "synthetic.rounds=2"]


def J(id, kind="synthetic.work", deps=(), **params):
    return Job(id=id, kind=kind, deps=list(deps), params=params, resources=Resources(1, 0.5))




def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def status(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pita", "status", str(run)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)


def start(tmp_path, args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "run_parallel.py"), f"system.output_dir={tmp_path}",
                             "executor.progress=plain", "experiment.workload=synthetic", *args], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# ---------------------------------------------------------------- 1. faults that hung or leaked
@pytest.mark.parametrize("stop", [False, True], ids=["ignores-TERM", "SIGSTOPped"])
def test_a_timed_out_job_that_ignores_term_is_killed_after_the_grace(tmp_path, stop):
    t0 = time.time()
    summary, state, run = run_graph([Job("s", "synthetic.stubborn", params={"stop": stop}), J("ok", seconds=0)],
                                    tmp_path, job_timeout_s=1.0, kill_grace_s=1.0)
    assert time.time() - t0 < 20
    e = state["jobs"]["s"]
    assert e["state"] == "FAILED" and "timed out after 1s" in e["error"]
    assert "killed (SIGKILL)" in e["error"]
    assert state["jobs"]["ok"]["state"] == "COMPLETED"
    text = run.run_log.read_text()
    assert text.count("ran past its timeout") == 1  # TERM once, not on every poll
    assert workers_of(run.root) == []


@pytest.mark.parametrize("then,timeout", [("return", None), ("hang", 2.0), ("die", None)])
def test_a_child_in_its_own_session_does_not_outlive_its_job(tmp_path, then, timeout):
    summary, state, run = run_graph([Job("sp", "synthetic.spawn", params={"then": then})], tmp_path,
                                    job_timeout_s=timeout)
    pid = int((run.job("sp").artifacts / "child.pid").read_text())
    assert wait_for(lambda: gone(pid), 5), f"the job's setsid child {pid} outlived the job ({then})"
    assert state["jobs"]["sp"]["state"] == ("COMPLETED" if then == "return" else "FAILED")


def test_a_locked_state_store_makes_the_run_wait_without_losing_results(tmp_path):
    """Another process holds state.db's write lock for 4 s mid-run: jobs go on, their results are
    written once the lock is released, and the run says what it waits for."""
    from pita.core.paths import RunPaths

    run = RunPaths.create(tmp_path, "t")
    held = {}

    def hold():
        db = run.state.with_suffix(".db")
        if not wait_for(lambda: sum(1 for _ in run.jobs_dir.glob("*/.done")) >= 2, 30):
            return
        p = subprocess.Popen([sys.executable, "-c", (
            "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(4); c.execute('COMMIT')"), str(db)],
            stdout=subprocess.PIPE, text=True)
        p.stdout.readline()
        held["done_at_lock"] = sum(1 for _ in run.jobs_dir.glob("*/.done"))
        p.wait(30)
        held["done_at_release"] = sum(1 for _ in run.jobs_dir.glob("*/.done"))

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    jobs = [J(f"j{i}", seconds=0.3) for i in range(40)]
    summary, state, _ = run_graph(jobs, tmp_path, run=run)
    t.join(30)
    assert held, "the lock was never taken"
    assert held["done_at_release"] > held["done_at_lock"], "jobs stopped while the state store was locked"
    assert summary.exit_code == 0
    assert all(e["state"] == "COMPLETED" and len(e["attempts"]) == 1 for e in state["jobs"].values())
    assert "the state store is locked by another process" in run.run_log.read_text()


# ---------------------------------------------------------------- 2. one owner per run folder
def test_one_orchestrator_owns_a_run_and_status_tells_running_from_stopped(tmp_path):
    p = start(tmp_path, ["experiment.name=own", "synthetic.job_seconds=1", *SMALL])
    base = tmp_path / "own"
    assert wait_for(lambda: base.exists() and any(base.iterdir()), 30)
    run = only_run(tmp_path, "own")
    assert wait_for(lambda: len(workers_of(run)) >= 1, 30), "workers never started"
    # held still while it is asked about: alive and owning the run, but it cannot finish the run
    # before the SIGKILL (on a loaded machine the two commands below took longer than the run)
    p.send_signal(signal.SIGSTOP)
    second = cli([f"resume_from={run}"], tmp_path)
    assert second.returncode == 2, second.stderr
    assert "in use by another orchestrator" in second.stderr and f"pid {p.pid}" in second.stderr
    s = status(run)
    assert s.returncode == 0 and f"running: pid {p.pid}" in s.stdout

    p.send_signal(signal.SIGKILL)
    p.wait(10)
    s = status(run)
    assert "stopped" in s.stdout and "running:" not in s.stdout, s.stdout
    r = cli([f"resume_from={run}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ended without releasing it" in r.stderr and "taking over" in r.stderr
    assert "finished" in status(run).stdout


def test_two_resumes_at_once_run_each_job_once(tmp_path):
    p = start(tmp_path, ["experiment.name=two", "synthetic.job_seconds=0.5", *SMALL])
    base = tmp_path / "two"
    assert wait_for(lambda: base.exists() and any(base.iterdir()), 30)
    run = only_run(tmp_path, "two")
    assert wait_for(lambda: sum(1 for _ in run.glob("jobs/*/.done")) >= 2, 60)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    a, b = (start(tmp_path, [f"resume_from={run}"]) for _ in range(2))
    outs = [x.communicate(timeout=120) for x in (a, b)]
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 2], (codes, outs)
    assert "in use by another orchestrator" in [o for (_, o), x in zip(outs, (a, b)) if x.returncode == 2][0]
    jobs = json.loads((run / "state.json").read_text())["jobs"]
    assert all(e["state"] == "COMPLETED" for e in jobs.values())
    # no job ran twice to completion (one that finished just before the SIGKILL may have no record)
    assert all(sum(a["status"] == "ok" for a in e.get("attempts", [])) <= 1 for e in jobs.values())
    assert all(len(e.get("attempts", [])) <= 1 for e in jobs.values())


# ---------------------------------------------------------------- 3. resume that checks its facts
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("done")
    r = cli(["experiment.name=ref", "synthetic.job_seconds=0", *SMALL], base)
    assert r.returncode == 0, r.stderr
    run = only_run(base, "ref")
    return run, final_state(run)


def _copy(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    (dest / "owner.lock").unlink()
    return dest


def test_resume_reruns_a_done_job_whose_outputs_are_gone(tmp_path, finished_run):
    ref, expected = finished_run
    run = _copy(ref, tmp_path / "run")
    (run / "jobs" / "PITA.tiny.arith.r0.train" / "result.json").unlink()
    (run / "jobs" / "DPO.tiny.arith.r0.gen.s0" / "artifacts" / "output.txt").unlink()
    r = cli([f"resume_from={run}"], tmp_path)
    assert r.returncode == 0, r.stderr
    log = (run / "run.log").read_text()
    assert "re-running PITA.tiny.arith.r0.train: its .done marker lists result.json, which is missing" in log
    assert "re-running DPO.tiny.arith.r0.gen.s0: its .done marker lists artifacts/output.txt, which is missing" in log
    assert final_state(run) == expected


def test_resume_rebuilds_a_damaged_state_and_a_missing_config(tmp_path, finished_run):
    ref, expected = finished_run
    run = _copy(ref, tmp_path / "run")
    for j in ("PITA.tiny.arith.r1.train", "PITA.tiny.arith.r1.eval.merge", "DPO.tiny.arith.r1.gen.s1"):
        (run / "jobs" / j / ".done").unlink()  # unfinished when the state was lost
    (run / "state.db").write_bytes(b"this is not a database" * 100)
    (run / "state.json").write_text("{not json")
    (run / "config.yaml").unlink()
    r = cli([f"resume_from={run}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rebuilt it from the jobs' launch.json files" in r.stderr and "using the config its jobs ran with" in r.stderr
    assert final_state(run) == expected
    assert "resume: 28 of 31 jobs already completed" in (run / "run.log").read_text()
    assert list(run.glob("state.db.damaged-*"))  # kept, for a post-mortem


def test_a_moved_run_folder_resumes(tmp_path):
    r = cli(["experiment.name=mv", "synthetic.job_seconds=0", *SMALL], tmp_path / "a")
    assert r.returncode == 0, r.stderr
    first = only_run(tmp_path / "a", "mv")
    expected = final_state(first)
    result = json.loads((first / "jobs" / "PITA.tiny.arith.r0.train" / "result.json").read_text())
    assert result["output"] == "jobs/PITA.tiny.arith.r0.train/artifacts/output.txt"  # relative to the run
    run = tmp_path / "b" / "run"
    run.parent.mkdir()
    os.rename(first, run)
    for j in ("PITA.tiny.arith.r0.gen.merge", "PITA.tiny.arith.r1.gen.s0"):  # r1 reads r0.train's output file
        (run / "jobs" / j / ".done").unlink()
    r = cli([f"resume_from={run}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert final_state(run) == expected


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt && echo ok"],
                       capture_output=True, text=True)
    return r.stdout.strip() == "ok"


needs_tmpfs = pytest.mark.skipif(not _unshare_works(), reason="needs unshare -rm to mount a small tmpfs")


def _in_small_disk(tmp_path, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) where $DISK is a tmpfs of the size the script mounts (a private mount
    namespace: nothing outside sees it); $PY runs run_parallel.py; $KEEP is a folder outside."""
    disk, keep = tmp_path / "disk", tmp_path / "keep"
    disk.mkdir()
    keep.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), DISK=str(disk), KEEP=str(keep),
               PY=f"{sys.executable} {ROOT / 'run_parallel.py'}")
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@needs_tmpfs
def test_a_disk_that_fills_mid_run_stops_cleanly_and_resumes_once_freed(tmp_path):
    r = _in_small_disk(tmp_path, """
        mount -t tmpfs -o size=1m none "$DISK" || exit 90
        $PY system.output_dir="$DISK" experiment.workload=synthetic experiment.name=full synthetic.job_seconds=0 \
            synthetic.rounds=2 system.min_free_gb=0 executor.progress=plain > "$KEEP/out1" 2> "$KEEP/err1"
        echo $? > "$KEEP/rc1"
        find "$DISK" -name .done | wc -l > "$KEEP/done1"
        mount -o remount,size=64m "$DISK"
        $PY resume_from="$(ls -d "$DISK"/full/*)" > "$KEEP/out2" 2> "$KEEP/err2"
        echo $? > "$KEEP/rc2"
        cp -r "$DISK/full" "$KEEP/full"
    """)
    keep = tmp_path / "keep"
    assert r.returncode == 0, r.stderr
    rc1, err1 = int((keep / "rc1").read_text()), (keep / "err1").read_text()
    assert rc1 == 1, err1[-3000:]
    assert "no space left on the file system of" in err1 and "Free at least" in err1 and "resume_from=" in err1
    assert "Traceback" not in err1, err1[-3000:]
    assert int((keep / "done1").read_text()) > 0  # it filled mid-run, not at the start
    assert int((keep / "rc2").read_text()) == 0, (keep / "err2").read_text()[-3000:]
    jobs = json.loads(next((keep / "full").iterdir()).joinpath("state.json").read_text())["jobs"]
    assert jobs and all(e["state"] == "COMPLETED" for e in jobs.values())


@needs_tmpfs
def test_a_full_disk_at_start_is_a_clear_error_that_leaves_nothing(tmp_path):
    r = _in_small_disk(tmp_path, """
        mount -t tmpfs -o size=4k none "$DISK" || exit 90
        head -c 4096 /dev/zero > "$DISK/filler" 2>/dev/null
        $PY system.output_dir="$DISK" experiment.workload=synthetic experiment.name=start system.min_free_gb=0 \
            > "$KEEP/out1" 2> "$KEEP/err1"
        echo $? > "$KEEP/rc1"
        ls -R "$DISK" > "$KEEP/ls1"
        rm "$DISK/filler"; mount -o remount,size=64m "$DISK"
        $PY system.output_dir="$DISK" experiment.workload=synthetic experiment.name=start synthetic.job_seconds=0 system.min_free_gb=0 \
            synthetic.rounds=1 > "$KEEP/out2" 2> "$KEEP/err2"
        echo $? > "$KEEP/rc2"
    """)
    keep = tmp_path / "keep"
    assert r.returncode == 0, r.stderr
    err1 = (keep / "err1").read_text()
    assert int((keep / "rc1").read_text()) == 2, err1[-3000:]
    assert "is full" in err1 and "system.min_free_gb" in err1 and "Traceback" not in err1, err1[-3000:]
    assert "state.db" not in (keep / "ls1").read_text() and "config.yaml" not in (keep / "ls1").read_text()
    assert int((keep / "rc2").read_text()) == 0, (keep / "err2").read_text()[-3000:]


# ---------------------------------------------------------------- 5. the rest
def test_status_piped_into_head_ends_quietly(tmp_path):
    run = tmp_path / "big" / "2026-01-01_00-00-00"
    (run / "jobs").mkdir(parents=True)
    jobs = {f"job.{i:05d}": {"state": "COMPLETED", "group": "g", "devices": [{"label": "cpu0"}], "attempts": []}
            for i in range(5000)}
    (run / "state.json").write_text(json.dumps({"jobs": jobs}))
    r = subprocess.run(f"{sys.executable} -m pita status {run} --all | head -2", shell=True, cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_a_value_head_file_cannot_run_code(tmp_path, tiny, monkeypatch):
    """A guidance checkpoint is loaded with weights_only: a pickled call in it is refused, not run.
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD gives torch the default of the versions before 2.6 (which
    pyproject allows), where a load that does not ask for weights_only unpickles anything."""
    import torch

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

    from pita.guidance.value_model import HEAD_FILE, ValueModel

    ValueModel.create(tiny["guidance"], loss="bce").save(tmp_path / "ck")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"w": Payload()}, tmp_path / "ck" / HEAD_FILE)
    with pytest.raises(Exception, match="[Ww]eights only"):
        ValueModel.load(tmp_path / "ck")
    assert not marker.exists()


def test_status_beside_a_driver_on_another_host_reads_its_snapshot_never_its_database(tmp_path):
    """A driver on a compute node owns the run folder (a process of its own holds owner.lock's lock
    and the record names another host); `pita status` from here, another process that does not
    share the database's lock, reads state.json and says so. The database is garbage here: had
    status opened it, it would have failed. The same folder once the driver is gone reads the
    database again (its owner released nothing, but holds no lock)."""
    import json
    import subprocess
    import sys

    from pita.core.paths import RunPaths
    from pita.core.state import StateStore

    run = RunPaths.create(tmp_path, "remote")
    store = StateStore(run.state)
    store.apply({"a": {"state": "COMPLETED"}, "b": {"state": "RUNNING"}})
    store.write_snapshot()
    store.close()
    snapshot = run.state.read_text()
    (run.root / "state.db").write_bytes(b"not a database" * 100)
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, json, os, sys, time
fd = os.open({str(run.root / 'owner.lock')!r}, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.pwrite(fd, json.dumps({{"pid": 4242, "host": "gpu-node-07", "started": time.time()}}).encode(), 0)
print("held", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = subprocess.run([sys.executable, "-m", "pita", "status", str(run.root)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "running: pid 4242 on host gpu-node-07" in r.stdout, r.stdout
        assert "read from state.json" in r.stdout and "driver is on host gpu-node-07" in r.stdout, r.stdout
        assert "completed 1" in r.stdout and "running 1" in r.stdout, r.stdout
        assert run.state.read_text() == snapshot and not (run.root / "state.db-shm").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    r = subprocess.run([sys.executable, "-m", "pita", "status", str(run.root)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 2 and "corrupt" in r.stderr, r.stdout + r.stderr  # the driver gone: the database
