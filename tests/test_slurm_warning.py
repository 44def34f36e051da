"""Slurm's warning (USR1, ``--signal=B:USR1@<margin>``) never ends an attempt, whenever it comes:
sent here without stop from the first instant each process of an attempt exists to its last, to
a batch script as Slurm starts it, to the children a job starts, to an attempt a pack hands over,
and to every process of a k-device job. A job that cannot save runs on; one that heard the warning
before it could save saves at its first step. No cluster: the default tier (the real cluster's
version, a time limit barely above the margin, is in tests/test_slurm.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from pita.core.backends.slurm import SlurmBackend, SlurmSettings, attempt_log, warning_margin
from tests.helpers import ROOT, wait_for
from tests.test_slurm_pack import _done, _hand, _launch

USR1_BIT = 1 << (signal.SIGUSR1 - 1)


def _mask(pid: int, field: str) -> int:
    """A signal mask of /proc/<pid>/status (SigIgn, SigBlk, ...); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


class Storm:
    """USR1, again and again (every ``every_s``) until stopped, to the processes ``targets()``
    names; counts what it sent and to how many processes."""

    def __init__(self, targets, every_s: float = 0.005):
        self.targets, self.every_s = targets, every_s
        self.sent, self.reached = 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for pid in self.targets():
                try:
                    os.kill(pid, signal.SIGUSR1)
                    self.sent += 1
                    self.reached.add(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def _tree(pid: int, itself: bool = True) -> list[int]:
    """``pid`` (where ``itself``) and every process below it, as they are now."""
    try:
        root = psutil.Process(pid)
        return ([pid] if itself else []) + [c.pid for c in root.children(recursive=True)]
    except psutil.Error:
        return []


def test_the_warning_margin_is_a_share_of_the_attempts_own_limit(tmp_path):
    """A margin as long as the limit would warn at once; Slurm may send it a minute early."""
    assert warning_margin(600, 120) == 120  # the default: 10 minutes, 2 of them the margin
    assert warning_margin(120, 110) == 30  # barely above: a quarter of the limit
    assert warning_margin(120, 10) == 10
    assert warning_margin(100, 120) is None  # 25 s, up to a minute early: within the first quarter
    assert warning_margin(3600, 120) == 120
    be = SlurmBackend(SlurmSettings(min_minutes=2, signal_margin_s=110))
    launch = _launch(tmp_path, "A.f.d.r0.eval.s0")
    args = be.request(launch)
    assert "--time=0-00:02:00" in args and "--signal=B:USR1@30" in args
    short = SlurmBackend(SlurmSettings(min_minutes=1)).request(launch)
    assert "--time=0-00:01:00" in short and not any(a.startswith("--signal") for a in short)


def test_a_batch_script_ignores_the_warning_from_its_first_command(tmp_path):
    """The attempt's batch script, run as slurmd runs it: USR1 ignored from its first command
    (the trap comes before anything else), through the exec into the worker and the interpreter's
    start-up, then held by the worker; sent every 5 ms from then to the end, to the batch process
    and to every child the job starts: the children and the attempt run to their end, once."""
    launch = _launch(tmp_path, "A.f.d.r0.eval.s0", kind="children", children=2, seconds=3.0)
    be = SlurmBackend(SlurmSettings(min_minutes=2))
    args = be.request(launch)
    script = tmp_path / "slurm-1.sh"
    script.write_text(be.script(launch, 0, args))
    lines = script.read_text().splitlines()
    assert lines[:2] == ["#!/bin/bash", "trap '' USR1"]
    log = attempt_log(launch)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(["bash", str(script)], cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        # from the moment the shell has run its first command (the kernel says it ignores USR1)
        assert wait_for(lambda: _mask(proc.pid, "SigIgn") & USR1_BIT or proc.poll() is not None, timeout=10, step=0.0005)
        with Storm(lambda: _tree(proc.pid)) as storm:
            rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    outcome = json.loads(launch.paths.attempt(1).read_text())
    assert outcome["status"] == "ok", outcome
    assert json.loads(launch.paths.result.read_text())["codes"] == [0, 0]
    assert storm.sent > 100 and len(storm.reached) >= 3  # the worker and both children heard it
    assert "SIGUSR1 received (the time limit is near)" in text and "it runs on" in text


def test_a_warning_before_training_starts_saves_at_the_first_step_and_reaches_the_processes_it_starts():
    """In a Slurm attempt's process (PITA_SLURM_SIGNALS=1): USR1 sent before the job could save
    is remembered, so the training that starts later saves at once; a process the job starts
    afterwards (here a plain ``python -c``, which knows nothing of pita) holds the signal from
    its first instant and is not ended by it."""
    code = """
import os, signal, subprocess, sys, time
from pita.core import preempt
preempt.hold()
preempt.install(lambda s, f: sys.exit(9))
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.5)
assert preempt.requested() == "SIGUSR1", preempt.requested()
child = subprocess.Popen([sys.executable, "-c", "import os, signal, time; os.kill(os.getpid(), signal.SIGUSR1); "
                          "time.sleep(0.3); print('child ran on')"], stdout=subprocess.PIPE, text=True)
out = child.communicate(timeout=30)[0]
assert child.returncode == 0 and "child ran on" in out, (child.returncode, out)
with preempt.saving():
    assert preempt.requested() == "SIGUSR1"
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), PITA_SLURM_SIGNALS="1"))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    assert "SIGUSR1 received (the time limit is near)" in r.stdout


def _pack(folder: Path) -> subprocess.Popen:
    """A pack started as its batch script starts it (USR1 ignored, PITA_SLURM_SIGNALS=1)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PITA_SLURM_SIGNALS="1")
    cmd = f"trap '' USR1\nexec {sys.executable} -m pita.core.backends.pack {folder} 60"
    return subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=open(folder / "pack.log", "ab"),
                            stderr=subprocess.STDOUT)


def test_an_attempt_a_pack_hands_over_holds_the_warning_from_its_fork(tmp_path):
    """The pack forks the attempt: USR1 sent to the attempt from the instant it exists (every
    process below the pack, every 5 ms, through the fork, the worker's start and the job's own
    children), and then to the pack itself, which passes it to the running attempt's worker and
    takes nothing more: the attempt and its children run to their end; the pack leaves after."""
    folder = tmp_path / "pack-1"
    proc = _pack(folder)
    try:
        assert wait_for((folder / "started").exists, timeout=120), (folder / "pack.log").read_text()
        first = _launch(tmp_path, "A.f.d.r0.gen.s0", kind="children", children=2, seconds=2.0)
        with Storm(lambda: _tree(proc.pid, itself=False), every_s=0.001) as storm:
            _hand(folder, first, env={"PITA_SLURM_SIGNALS": "1"})
            done = _done(folder, first)
        assert done["rc"] == 0, attempt_log(first).read_text()[-3000:]
        assert storm.sent > 100 and len(storm.reached) >= 3
        second = _launch(tmp_path, "B.f.d.r0.gen.s0", seconds=3.0)
        _hand(folder, second, env={"PITA_SLURM_SIGNALS": "1"})
        assert wait_for((folder / "running.json").exists, timeout=30)
        with Storm(lambda: [proc.pid], every_s=0.01):
            done = _done(folder, second)
            assert proc.wait(timeout=30) == 0
        assert done["rc"] == 0, attempt_log(second).read_text()[-3000:]
        third = _launch(tmp_path, "C.f.d.r0.gen.s0")
        _hand(folder, third)
        time.sleep(0.5)
        assert (folder / "task.json").exists()  # left for the driver to hand to another pack
    finally:
        if proc.poll() is None:
            proc.kill()
    for launch in (first, second):
        assert json.loads(launch.paths.attempt(1).read_text())["status"] == "ok"
    assert "it runs on" in attempt_log(second).read_text()
    log = (folder / "pack.log").read_text()
    assert (folder / "closed").read_text().startswith("SIGUSR1 received")
    assert "SIGUSR1 received: forwarded to B.f.d.r0.gen.s0; taking nothing more" in log


@pytest.mark.timeout(240)
def test_every_process_of_a_k_device_job_holds_the_warning_all_its_life(tmp_path):
    """A 2-rank job that cannot save, its batch script run as slurmd runs it: USR1 every 5 ms to
    the batch process and everything below it (the worker, torchrun's agent, both ranks while
    they start and run), from the script's first command to the end: the attempt completes."""
    launch = _launch(tmp_path, "A.f.d.r0.train", kind="ranks", devices=2)
    launch.target = "pita.algos.rank_check:ranks"
    launch.job["kind"] = "synthetic.ranks"
    launch.devices = [{"kind": "cpu", "label": "cpu0"}, {"kind": "cpu", "label": "cpu1"}]
    launch.env["OMP_NUM_THREADS"] = "2"
    from pita.core.paths import atomic_write_json

    atomic_write_json(launch.paths.launch, launch.to_json())
    be = SlurmBackend(SlurmSettings(min_minutes=2))
    script = tmp_path / "slurm-1.sh"
    script.write_text(be.script(launch, 0, be.request(launch)))
    log = attempt_log(launch)
    proc = subprocess.Popen(["bash", str(script)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    seen: set = set()

    def targets():
        pids = _tree(proc.pid)
        seen.update(pids)
        return pids

    try:
        assert wait_for(lambda: _mask(proc.pid, "SigIgn") & USR1_BIT or proc.poll() is not None, timeout=10, step=0.0005)
        with Storm(targets) as storm:
            rc = proc.wait(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert json.loads(launch.paths.attempt(1).read_text())["status"] == "ok"
    assert json.loads(launch.paths.result.read_text())["world"] == 2
    assert storm.sent > 100 and len(seen) >= 4, seen  # worker, agent and two ranks
    assert "[rank 1]" in text
