"""Packs (executor.slurm.pack_below_s): short attempts run one after another in one Slurm job
that imported torch once (pita/core/backends/pack.py). The pack process runs here for real; Slurm
is the stand-in commands of tests/test_slurm_faults.py, whose sbatch starts the batch script in
the background as slurmd would. The real cluster's run of the smoke preset in packs is in
tests/test_slurm.py (long tier)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pita.core.backends import slurm
from pita.core.backends.pack import done_name
from pita.core.backends.slurm import SlurmBackend, SlurmSettings, pack_key, pack_mem_gb
from tests.helpers import ROOT, wait_for
from tests.test_slurm_faults import FakeSlurm


def _launch(tmp_path, job_id, kind="work", attempt=1, **params):
    from pita.core.backends.base import Launch
    from pita.core.paths import RunPaths, atomic_write_json

    run = RunPaths(tmp_path / "run")
    launch = Launch(job={"id": job_id, "kind": f"synthetic.{kind}", "resources": {"devices": 1, "memory_gb": 2.0},
                         "duration_hint": 5.0, "params": params, "deps": []},
                    target=f"pita.core.synthetic_kinds:{kind}", attempt=attempt, run_dir=str(run.root), config={},
                    devices=[{"kind": "cpu", "label": "cpu0"}], env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
                    paths=run.job(job_id), tag=job_id, fingerprint="x")
    launch.paths.dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(launch.paths.launch, launch.to_json())
    return launch


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def _pack(folder: Path, idle_s: float = 30.0) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "pita.core.backends.pack", str(folder), str(idle_s)], cwd=ROOT,
                            env=_env(), stdout=open(folder / "pack.log", "ab"), stderr=subprocess.STDOUT)


def _hand(folder: Path, launch, env=None) -> None:
    from pita.core.backends.slurm import attempt_log
    from pita.core.paths import atomic_write_json

    atomic_write_json(folder / "task.json", {"job_id": launch.job_id, "attempt": launch.attempt,
                                             "launch": str(launch.paths.launch), "log": str(attempt_log(launch)),
                                             "env": dict(launch.env, **(env or {})), "cwd": str(ROOT)})


def _done(folder: Path, launch) -> dict:
    path = folder / done_name(launch.job_id, launch.attempt)
    assert wait_for(path.exists, timeout=60), (folder / "pack.log").read_text()
    return json.loads(path.read_text())


def test_a_pack_runs_attempts_one_after_another_forked_from_one_interpreter_then_leaves_idle(tmp_path):
    """Two attempts handed one after the other: each is taken (task.json -> running.json), runs
    as a child of the pack in a session of its own, writes its own outcome and log, and the pack
    writes its exit code; once idle for idle_s the pack says it is closed and exits 0."""
    folder = tmp_path / "pack-1"
    proc = _pack(folder, idle_s=2.0)
    try:
        assert wait_for((folder / "started").exists, timeout=120)
        pids = []
        for name in ("A.f.d.r0.gen.s0", "B.f.d.r0.gen.s0"):
            launch = _launch(tmp_path, name, seconds=0.2)
            _hand(folder, launch)
            done = _done(folder, launch)
            assert done["rc"] == 0 and done["ended"] >= done["started"]
            outcome = json.loads(launch.paths.attempt(1).read_text())
            assert outcome["status"] == "ok", outcome
            assert "working for 0.20s" in (launch.paths.dir / "attempt-1.log").read_text()
            pids.append(outcome["process_started"])
        assert pids[0] < pids[1]  # two processes, one after the other
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (folder / "closed").read_text().startswith("idle for 2s")
    log = (folder / "pack.log").read_text()
    assert log.count("started (pid") == 2 and "leaving (idle for 2s)" in log


def test_a_kill_request_ends_the_running_attempt_and_usr1_is_forwarded_then_the_pack_leaves(tmp_path):
    """kill.json: the hanging attempt gets TERM (its worker ends its children and dies of it), its
    done file records the signal, and the pack takes the next attempt. USR1 to the pack (Slurm's
    warning before its limit) is passed to the running attempt, which runs on (no process of an
    attempt dies of the warning: tests/test_slurm_warning.py), and the pack takes nothing more: a
    task handed after it is left untaken, and the pack leaves once the attempt ends."""
    folder = tmp_path / "pack-1"
    proc = _pack(folder, idle_s=60.0)
    try:
        assert wait_for((folder / "started").exists, timeout=120)
        hang = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="hang")
        _hand(folder, hang)
        assert wait_for((folder / "running.json").exists, timeout=30)
        time.sleep(1.0)
        (folder / "kill.json").write_text(json.dumps({"job_id": hang.job_id, "attempt": 1, "grace_s": 5}))
        assert _done(folder, hang)["rc"] == -signal.SIGTERM
        second = _launch(tmp_path, "B.f.d.r0.gen.s0", kind="hang")
        _hand(folder, second)
        assert wait_for((folder / "running.json").exists, timeout=30)
        time.sleep(1.0)
        proc.send_signal(signal.SIGUSR1)
        assert wait_for((folder / "closed").exists, timeout=1) is False  # leaves only once the attempt ends
        assert wait_for(lambda: "SIGUSR1 received" in (folder / "pack.log").read_text(), timeout=10)
        time.sleep(1.0)
        assert not (folder / done_name(second.job_id, 1)).exists()  # it runs on
        third = _launch(tmp_path, "C.f.d.r0.gen.s0")
        _hand(folder, third)
        (folder / "kill.json").write_text(json.dumps({"job_id": second.job_id, "attempt": 1, "grace_s": 5}))
        assert _done(folder, second)["rc"] == -signal.SIGTERM
        assert proc.wait(timeout=30) == 0
        assert (folder / "task.json").exists() and not (folder / done_name(third.job_id, 1)).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (folder / "closed").read_text().startswith("SIGUSR1 received")
    assert "SIGUSR1 received: forwarded to B.f.d.r0.gen.s0" in (folder / "pack.log").read_text()


def test_packs_are_keyed_by_shape_and_sized_in_powers_of_two():
    a = ["-J", "pita:x", "-o", "/l", "--open-mode=append", "-N", "1", "-n", "1", "-c", "2", "--time=0-00:10:00",
         "--signal=B:USR1@120", "--mem=3G", "--gres=gpu:1", "-p", "debug"]
    b = [x.replace("pita:x", "pita:y").replace("--mem=3G", "--mem=5G").replace("00:10", "00:20") for x in a]
    assert pack_key(a) == pack_key(b) == ("-N", "1", "-n", "1", "-c", "2", "--gres=gpu:1", "-p", "debug")
    assert pack_key(a) != pack_key([x.replace("gpu:1", "gpu:2") for x in a])
    assert [pack_mem_gb(m) for m in (0.5, 1, 3, 4, 5.5)] == [1, 1, 4, 4, 8]
    assert pack_mem_gb(5.5, cap_gb=6.0) == 6


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """Stand-in Slurm whose sbatch runs the batch script in the background (as slurmd would) and
    whose squeue lists those jobs RUNNING while their process lives, then COMPLETED, or the end
    state a test wrote in ``states/<id>`` (what the controller would say: PREEMPTED, CANCELLED)."""
    f = FakeSlurm(tmp_path)
    jobs = f.dir / "jobs"
    jobs.mkdir()
    (f.dir / "states").mkdir()
    (f.dir / "sbatch").write_text(f"""#!/bin/bash
echo "sbatch $*" >> {f.dir}/calls
n=$(( $(ls {jobs} | wc -l) + 501 ))
script="${{@: -1}}"
SLURM_JOB_ID=$n nohup bash "$script" > /dev/null 2>&1 &
echo $! > {jobs}/$n
echo $n
""")
    (f.dir / "squeue").write_text(f"""#!/bin/bash
echo "squeue $*" >> {f.dir}/calls
for j in {jobs}/*; do [ -e "$j" ] || continue; id=$(basename $j)
  if kill -0 $(cat $j) 2>/dev/null; then echo "$id|RUNNING|None|0"
  elif [ -f {f.dir}/states/$id ]; then echo "$id|$(cat {f.dir}/states/$id)|None|0"
  else echo "$id|COMPLETED|None|0"; fi; done
""")
    (f.dir / "scancel").write_text(f"""#!/bin/bash
echo "scancel $*" >> {f.dir}/calls
for a in "$@"; do [ -f {jobs}/$a ] && kill $(cat {jobs}/$a) 2>/dev/null; done; exit 0
""")
    monkeypatch.setenv("PATH", f"{f.dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setattr(slurm, "QUERY_TIMEOUT_S", 5.0)
    yield f
    for j in jobs.iterdir():
        try:
            os.kill(int(j.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _until_taken(be: SlurmBackend, pack: Path, timeout: float = 120.0) -> None:
    """Poll the driver until ``pack`` has taken its attempt (renamed task.json to running.json)."""
    t0 = time.time()
    while not (pack / "running.json").exists() and time.time() - t0 < timeout:
        be.poll(0.2)


def _until_ended(be: SlurmBackend, n: int, timeout: float = 120.0) -> list:
    out, t = [], time.time()
    while len(out) < n and time.time() - t < timeout:
        out += be.poll(0.2)
    return out


def test_short_attempts_share_one_pack_and_a_long_one_is_a_slurm_job_of_its_own(tmp_path, cluster):
    """pack_below_s=60: two 5-second attempts run in one pack (one sbatch for both, the second
    handed to the pack the first left idle), each reported ok with the pack's Slurm job and its
    log gathered into job.log; a job planned longer than the threshold is submitted alone.
    Closing the run stops the pack and cancels it."""
    be = SlurmBackend(SlurmSettings(pack_below_s=60, pack_idle_s=30, poll_interval_s=0.2, max_poll_interval_s=1.0,
                                    outcome_wait_s=0.0))
    first = _launch(tmp_path, "A.f.d.r0.gen.s0", seconds=0.1)
    be.start(first)
    assert list(be.tasks) == [first.job_id] and len(be.packs) == 1 and not be.subs
    [f1] = _until_ended(be, 1)
    second = _launch(tmp_path, "B.f.d.r0.gen.s0", seconds=0.1)
    be.start(second)
    [f2] = _until_ended(be, 1)
    assert [(f.job_id, f.status) for f in (f1, f2)] == [(first.job_id, "ok"), (second.job_id, "ok")]
    assert f1.extra["slurm_job"] == f2.extra["slurm_job"] and f1.extra["slurm_pack"] == f2.extra["slurm_pack"] == "pack-1"
    assert len(cluster.calls("sbatch")) == 1 and "--no-requeue" in cluster.calls("sbatch")[0]
    assert "=== attempt 1: Slurm job" in second.paths.log.read_text()
    long = _launch(tmp_path, "C.f.d.r0.train", seconds=0.1)
    long.job["duration_hint"] = 600.0
    be.start(long)
    assert long.job_id in be.subs and long.job_id not in be.tasks
    be.kill(long.job_id)
    _until_ended(be, 1, timeout=30)
    be.close()
    pack = tmp_path / "run" / "slurm-packs" / "pack-1"
    assert (pack / "stop").exists() and any("scancel" in c for c in cluster.calls("scancel"))


def test_a_packed_attempt_killed_by_the_driver_ends_cancelled_and_one_whose_pack_died_runs_alone_next(tmp_path, cluster):
    """kill(): the running packed attempt is ended by its pack and reported with the driver's
    status. A pack that dies under an attempt (SIGKILL, as a node failure or TIMEOUT does) makes
    the attempt lost, and its next attempt is a Slurm job of its own."""
    be = SlurmBackend(SlurmSettings(pack_below_s=60, pack_idle_s=30, poll_interval_s=0.2, max_poll_interval_s=1.0,
                                    outcome_wait_s=0.0), kill_grace_s=2.0)
    hang = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="hang")
    be.start(hang)
    pack = tmp_path / "run" / "slurm-packs" / "pack-1"
    _until_taken(be, pack)
    be.kill(hang.job_id, "timeout", "over its limit")
    [f] = _until_ended(be, 1, timeout=60)
    assert (f.status, f.error) == ("timeout", "over its limit")
    again = _launch(tmp_path, "B.f.d.r0.gen.s0", kind="hang")
    be.start(again)
    _until_taken(be, pack, timeout=60)
    pid = json.loads((pack / "started").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    [f] = _until_ended(be, 1, timeout=60)
    assert f.status == "lost" and "its pack (pack-1" in f.error and "runs again as a Slurm job of its own" in f.error
    retry = _launch(tmp_path, "B.f.d.r0.gen.s0", attempt=2, seconds=0.1)
    be.start(retry)
    assert retry.job_id in be.subs  # not packed again
    be.shutdown(1.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_an_attempt_past_its_own_limit_in_a_pack_is_warned_then_ended_and_what_it_left_is_killed(tmp_path):
    """task.json's limit_s / warn_s / grace_s: the pack warns the attempt (USR1, which it runs on
    through) warn_s before its limit, TERMs its session at the limit and records ended_by
    "timeout". An attempt that leaves a process behind in a session of its own (orphaned to the
    pack, its subreaper) has it killed before the pack takes the next attempt."""
    folder = tmp_path / "pack-1"
    proc = _pack(folder, idle_s=30.0)
    try:
        assert wait_for((folder / "started").exists, timeout=120)
        hang = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="hang")
        path = folder / "task.json"
        _hand(folder, hang)
        task = json.loads(path.read_text())
        task.update(limit_s=4.0, warn_s=2.0, grace_s=3.0)
        path.write_text(json.dumps(task))
        t0 = time.time()
        done = _done(folder, hang)
        assert (done["rc"], done["ended_by"], done["signals"]) == (-signal.SIGTERM, "timeout", [])
        assert 4.0 <= done["ended"] - done["started"] < 30.0 and time.time() - t0 < 60
        log = (folder / "pack.log").read_text()
        assert "is 2s from its limit (4s): warned (USR1)" in log and "reached its limit (4s)" in log
        spawner = _launch(tmp_path, "B.f.d.r0.gen.s0", kind="spawn")
        _hand(folder, spawner)
        done = _done(folder, spawner)
        assert done["rc"] == 0 and done["ended_by"] == ""
        child = int((spawner.paths.artifacts / "child.pid").read_text())
        assert wait_for(lambda: not _alive(child), timeout=15), "the attempt's leftover process still runs"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_oom_killer_in_the_packs_cgroup_reads_as_out_of_memory(tmp_path):
    """The pack reads its cgroup's oom_kill count (here a stand-in memory.events) before and after
    each attempt: an attempt SIGKILLed while the count rose ended "oom"."""
    folder = tmp_path / "pack-1"
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n")
    folder.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-m", "pita.core.backends.pack", str(folder), "30"], cwd=ROOT,
                            env=dict(_env(), PITA_PACK_MEMORY_EVENTS=str(events)),
                            stdout=open(folder / "pack.log", "ab"), stderr=subprocess.STDOUT)
    try:
        assert wait_for((folder / "started").exists, timeout=120)
        hang = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="hang")
        _hand(folder, hang)
        assert wait_for(lambda: "hanging" in (hang.paths.dir / "attempt-1.log").read_text()
                        if (hang.paths.dir / "attempt-1.log").exists() else False, timeout=60)
        events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
        os.killpg(_pgid_of_attempt(folder), signal.SIGKILL)  # what the kernel's OOM killer does
        done = _done(folder, hang)
        assert (done["rc"], done["ended_by"]) == (-signal.SIGKILL, "oom")
    finally:
        if proc.poll() is None:
            proc.kill()


def _pgid_of_attempt(folder: Path) -> int:
    """The running attempt's pid (its session's id), from the pack's log."""
    import re

    return int(re.findall(r"started \(pid (\d+)\)", (folder / "pack.log").read_text())[-1])


@pytest.mark.parametrize("state", ["PREEMPTED", "CANCELLED", "NODE_FAIL", None])
def test_a_packed_attempt_that_slurm_ended_with_its_pack_ends_as_a_job_of_its_own_would(tmp_path, cluster, state):
    """Slurm TERMs the pack (preemption, scancel, a failing node) and the attempt, which cannot
    save, dies of it. Its done file says the pack was signalled, so the driver waits for Slurm's
    word on the pack and reads the attempt as a Slurm job of its own in that state: lost, to run
    again (as a job of its own), never died/FAILED; a person's scancel (CANCELLED) is final, as for
    a job of its own. A pack signalled outside Slurm that then ends COMPLETED (None here) is lost."""
    be = SlurmBackend(SlurmSettings(pack_below_s=60, pack_idle_s=30, poll_interval_s=0.2, max_poll_interval_s=1.0,
                                    outcome_wait_s=0.0))
    hang = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="hang")
    be.start(hang)
    pack = tmp_path / "run" / "slurm-packs" / "pack-1"
    _until_taken(be, pack)
    assert wait_for(lambda: (hang.paths.dir / "attempt-1.log").exists()
                    and "hanging" in (hang.paths.dir / "attempt-1.log").read_text(), timeout=60)
    slurm_id = be.packs["pack-1"].slurm_id
    if state:
        (cluster.dir / "states" / slurm_id).write_text(state)
    os.kill(json.loads((pack / "started").read_text())["pid"], signal.SIGTERM)
    [f] = _until_ended(be, 1, timeout=60)
    done = json.loads((pack / done_name(hang.job_id, 1)).read_text())
    assert done["signals"] == ["SIGTERM"] and done["rc"] == -signal.SIGTERM
    if state == "CANCELLED":  # a person's scancel of the pack: final for its attempt, as for a job of its own
        assert f.status == "cancelled" and f"in its pack (pack-1, Slurm job {slurm_id}) was cancelled by a person" \
            in f.error and f.extra["cancelled_by"], (f.status, f.error)
    else:
        assert f.status == "lost", (f.status, f.error)
    if state:
        assert f"in its pack (pack-1, Slurm job {slurm_id})" in f.error and f.extra["slurm_state"] == state
        assert state == "CANCELLED" or f", {state}" in f.error
    else:
        assert "was sent SIGTERM while it ran and ended COMPLETED" in f.error
    assert hang.job_id in be.no_pack
    be.shutdown(1.0)


def test_a_packed_attempt_over_its_own_limit_reads_as_timeout_and_gets_twice_as_long(tmp_path, cluster):
    """The attempt's own limit inside the pack is the --time a job of its own would ask (here
    duration_hint 5 s x time_margin 0.6 = 3 s, min_minutes 0): the pack ends it there, the driver
    reads TIMEOUT (lost, twice the limit next time), and the pack lives on for the next attempt."""
    be = SlurmBackend(SlurmSettings(pack_below_s=60, pack_idle_s=30, poll_interval_s=0.2, max_poll_interval_s=1.0,
                                    outcome_wait_s=0.0, min_minutes=0, time_margin=0.6))
    hang = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="hang")
    be.start(hang)
    assert be.tasks[hang.job_id].limit_s == 3.0
    [f] = _until_ended(be, 1, timeout=120)
    assert f.status == "lost" and "TIMEOUT: it hit its own time limit in the pack" in f.error, f.error
    assert be.time_factor[hang.job_id] == 2.0 and be.packs["pack-1"].end is None
    be.shutdown(1.0)


def test_a_failed_packed_attempt_waits_for_its_outcome_file_as_a_job_of_its_own_does(tmp_path, cluster):
    """An attempt whose pack says it exited non-zero while its outcome file is not there yet (a
    shared file system shows it late) is read only after outcome_wait_s, as for a job of its own."""
    be = SlurmBackend(SlurmSettings(pack_below_s=60, pack_idle_s=30, poll_interval_s=0.2, max_poll_interval_s=1.0,
                                    outcome_wait_s=4.0))
    quit_ = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="kill_self")
    be.start(quit_)
    pack = tmp_path / "run" / "slurm-packs" / "pack-1"
    done = pack / done_name(quit_.job_id, 1)
    t0 = time.time()
    seen = None
    out = []
    while not out and time.time() - t0 < 120:
        out += be.poll(0.2)
        if seen is None and done.exists():
            seen = time.time()
    [f] = out
    assert f.status == "died" and seen is not None and time.time() - seen >= 3.0, (f.status, f.error)
    be.shutdown(1.0)


def test_a_persons_cancel_fails_the_job_with_the_command_that_runs_it_again(tmp_path, cluster):
    """Through the executor, each attempt a Slurm job of its own whose worker really runs: the job a
    person scancel'ed is FAILED and never submitted again, its dependent SKIPPED, the job beside it
    completes, and the error names who cancelled it and the command that runs it again."""
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.job import Job, Resources
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths

    sbatch = cluster.dir / "sbatch"
    jobs_dir = cluster.dir / "jobs"
    sbatch.write_text(f"""#!/bin/bash
echo "sbatch $*" >> {cluster.dir}/calls
n=$(( $(ls {jobs_dir} | wc -l) + 501 ))
script="${{@: -1}}"
case "$*" in *pita:A.f.d.r0.train*) echo CANCELLED > {cluster.dir}/states/$n; echo 999999 > {jobs_dir}/$n;;
  *) SLURM_JOB_ID=$n nohup bash "$script" > /dev/null 2>&1 & echo $! > {jobs_dir}/$n;; esac
echo $n
""")
    cluster.set("sacct", "CANCELLED by 0")
    jobs = [Job(i, "synthetic.work", deps=list(d), params={"seconds": 0}, resources=Resources(1, 0.5))
            for i, d in (("A.f.d.r0.train", ()), ("A.f.d.r0.eval", ("A.f.d.r0.train",)), ("B.f.d.r0.train", ()))]
    gpus = GPUManager.from_inventory(2, 8e9, kind="cpu")
    run = RunPaths.create(tmp_path, "t")
    setup_logging(run.run_log, console=False)
    be = SlurmBackend(SlurmSettings(poll_interval_s=0.2, max_poll_interval_s=1.0, outcome_wait_s=0.0))
    s = ExecutorSettings(progress="off", poll_interval_s=0.05, kill_grace_s=2, command="pita run")
    summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus, be, run, s).run()
    state = json.loads(run.state.read_text())["jobs"]
    assert {k: v["state"] for k, v in state.items()} == {"A.f.d.r0.train": "FAILED", "A.f.d.r0.eval": "SKIPPED",
                                                         "B.f.d.r0.train": "COMPLETED"}, state
    [a] = state["A.f.d.r0.train"]["attempts"]
    assert a["status"] == "cancelled" and "was cancelled by uid 0 (root) (scancel), not by pita" in a["error"], a
    assert f"to run it again: pita run resume_from={run.root}" in a["error"]
    assert len([c for c in cluster.calls("sbatch") if "pita:A.f.d.r0.train" in c]) == 1  # never submitted again
    assert summary.exit_code == 1 and "was cancelled by uid 0" in run.run_log.read_text()
