"""What a user sees from their own folder: the version, provenance, messages that point at the
fix, the resume hint that works where it was printed, and Ctrl-C at any moment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, only_run, wait_for

pytestmark = pytest.mark.integration
PITA = str(Path(sys.executable).parent / "pita")
SYN = ["experiment.workload=synthetic", "synthetic.algos=[PITA]", "synthetic.datasets=[arith]", "synthetic.rounds=1"]


def env() -> dict:
    e = dict(os.environ)
    e.pop("PYTHONPATH", None)  # the installed pita, as a user has it
    return e


def test_version_and_the_software_that_made_a_run(tmp_path):
    r = subprocess.run([PITA, "--version"], cwd=tmp_path, capture_output=True, text=True, env=env())
    assert r.returncode == 0 and r.stdout.startswith("pita 0.")
    import pita

    assert pita.__version__ in r.stdout
    if (ROOT / ".git").exists():
        assert "(commit " in r.stdout
    r = subprocess.run([PITA, "run", "experiment.name=v", "synthetic.job_seconds=0", *SYN, "executor.progress=off"],
                       cwd=tmp_path, capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    run = only_run(tmp_path / "outputs", "v")
    version_line = subprocess.run([PITA, "-V"], capture_output=True, text=True, env=env()).stdout.strip()
    assert (run / "config.yaml").read_text().splitlines()[0] == f"# written by {version_line}"
    import json

    assert json.loads((run / "state.json").read_text())["runs"][0]["pita"]["version"] == pita.__version__


@pytest.mark.parametrize("args, want, not_want", [
    (["status", "/nope"], "cannot read /nope: pita status /nope does not exist", "resume"),
    (["report", "/"], "pita report / is not a run folder", "resume"),
    (["plan", "experiment=smoke", "algos.PITA.etas=0.5"], "write 'algos.PITA.etas=[0.5]'", "ListConfig"),
    (["plan", "experiment=smoke", "algos.PITA.etas=[0,-1]"], "algos.PITA.etas=[0.0, -1.0] must all be >= 0",
     "algos.PITA.eta="),
    (["plan", "experiment=smoke", "datasets.mymath.path=x.jsonl"],
     "datasets.mymath is not a dataset yet; add yours built on one pita knows", "not in struct"),
    (["plan", "experiment=smoke", "+datasets.mymath.path=x.jsonl"], "+dataset@datasets.mymath=<", "subclass"),
    (["plan", "experiment=smoke", "experiment.datasets=[mymath]"], "a dataset of your own: +dataset@datasets.mymath=",
     "Traceback"),
    (["plan", "resume_from=outputs/x/2026-01-01_00-00-00"], "plans a configuration, not a run folder", "Traceback"),
])
def test_messages_name_the_fix(tmp_path, args, want, not_want):
    r = subprocess.run([PITA, *args], cwd=tmp_path, capture_output=True, text=True, env=env(), timeout=120)
    assert r.returncode == 2, r.stderr
    assert want in r.stderr and not_want not in r.stderr, r.stderr


@pytest.mark.parametrize("how", ["pita", pytest.param("script", marks=pytest.mark.slow)])
def test_the_resume_hint_is_the_command_that_started_the_run_and_works_where_it_was_printed(tmp_path, how):
    """Started as `pita run` (by its path: a venv not activated) or as `python <checkout>/run_parallel.py`
    from a folder outside the checkout; Ctrl-C mid-run: one line, exit 130, and the printed hint,
    run as it is in that folder, finishes the run."""
    start = [PITA, "run"] if how == "pita" else [sys.executable, str(ROOT / "run_parallel.py")]
    p = subprocess.Popen([*start, "experiment.name=h", "synthetic.job_seconds=1", *SYN, "executor.progress=off",
                          "executor.kill_grace_s=2"], cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: (tmp_path / "outputs" / "h").is_dir() and any((tmp_path / "outputs" / "h").iterdir()), 60)
    run = only_run(tmp_path / "outputs", "h")
    assert wait_for(lambda: (run / "run.log").exists() and " start " in (run / "run.log").read_text(), 60)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "leaked semaphore" not in err, err[-3000:]
    [hint] = [ln.split("resume with: ", 1)[1] for ln in out.splitlines() if "resume with: " in ln]
    assert hint.startswith(f"{PITA} run " if how == "pita" else f"{sys.executable} {ROOT / 'run_parallel.py'} "), hint
    assert hint.endswith(f"resume_from={run.resolve()}")
    r = subprocess.run(hint, shell=True, cwd=tmp_path, env=env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("after_s", [0.3, 1.5])
def test_ctrl_c_at_any_moment_is_short_and_exit_130(tmp_path, after_s):
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group (the orchestrator, its
    warm fork server, the workers), while Hydra composes (0.3 s) or as jobs start (1.5 s). The
    command starts as a terminal's foreground job does, with SIGINT at its default: a suite
    started in the background of a script inherits SIGINT ignored, and Python then keeps ignoring
    it until pita's executor installs its own handler."""
    p = subprocess.Popen([PITA, "run", "experiment.name=early", "synthetic.job_seconds=30", *SYN],
                         cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after_s)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "leaked semaphore" not in err and "KeyboardInterrupt" not in err, err[-3000:]


def test_plan_help_reads_as_plain_text(tmp_path):
    r = subprocess.run([PITA, "plan", "--help"], cwd=tmp_path, capture_output=True, text=True, env=env())
    assert r.returncode == 0 and "system.inventory" in r.stdout and "``" not in r.stdout
