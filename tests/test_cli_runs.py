"""Whole runs through run_parallel.py: exit codes, Ctrl-C, SIGKILL then resume, resume checks."""

from __future__ import annotations

import csv
import json
import math
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import SMOKE_ARGS
from helpers import ROOT, cli, final_state, only_run, wait_for, workers_of

pytestmark = pytest.mark.integration

SMALL = ["synthetic.algos=[PITA,DPO]", "synthetic.datasets=[arith]", "synthetic.rounds=2"]




def test_demo_style_run_completes(tmp_path):
    r = cli(["experiment.name=ok", "synthetic.job_seconds=0", *SMALL], tmp_path)
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path, "ok")
    assert all(s == "COMPLETED" for s, _ in final_state(run).values())
    assert (run / "config.yaml").exists() and "run folder:" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["foo=1"], "unknown key 'foo'"),
    (["synthetic.algoss=[PITA]"], "did you mean 'algos'"),
    (["executor.oom_retries=abc"], "executor.oom_retries"),
    (["executor.backend=nope"], "executor.backend='nope' is not known"),
    (["executor.worker_start=forksever"], "did you mean 'forkserver'"),
    (["system.devices=[7]"], "system.devices"),
    (["experiment.name=a/b"], "experiment.name"),
    (["executor.memory_margin=-1", "synthetic.rounds=0"], "2 problems"),
    (["resume_from=/nonexistent/run"], "does not exist"),
    (["experiment.name=" + "x" * 300], "is 300 bytes long"),
    (["experiment.name=café"], "quote it, e.g. 'experiment.name=\"café\"'"),
    (["synthetic.memory_gb=1000"], "synthetic.memory_gb=1000: every stand-in job"),
    (["synthetic.fail=[PITA.tiny.arith.r0.trian]"], "did you mean 'PITA.tiny.arith.r0.train'"),
    (["synthetic.job_seconds=1e308"], "synthetic.job_seconds=1e+308"),
    (["synthetic.rounds=100000"], "more than executor.max_jobs=100000"),
    (["experiment.workload=experiment", "experiment.rounds=100000"], "experiment.rounds=100000 with 6 algorithms"),
])
def test_bad_input_exits_2_and_names_the_key(tmp_path, args, needle):
    r = cli(args, tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr
    assert not any(tmp_path.rglob("state.json"))  # nothing started


def test_eval_settings_are_blamed_on_eval(tmp_path):
    r = cli(["eval.temperature=-1", "eval.top_p=0", "eval.batch_size=0", "eval.max_new_tokens=0"], tmp_path)
    assert r.returncode == 2, r.stderr
    for needle in ("eval.temperature=-1.0: must be >= 0", "eval.top_p=0.0: must be in (0, 1]",
                   "eval.batch_size=0: must be a positive integer", "eval.max_new_tokens=0: must be a positive"):
        assert needle in r.stderr
    assert "data_collection" not in r.stderr and not any(tmp_path.rglob("state.*"))


def test_resume_from_a_file_or_a_folder_that_is_no_run(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    r = cli([f"resume_from={f}"], tmp_path)
    assert r.returncode == 2 and "is a file" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli([f"resume_from={tmp_path / 'empty'}"], tmp_path)
    assert r.returncode == 2 and "is not a run folder" in r.stderr


def test_failure_exit_code_and_summary(tmp_path):
    r = cli(["experiment.name=f", "synthetic.job_seconds=0", *SMALL, "synthetic.fail=[PITA.tiny.arith.r0.train]"],
            tmp_path)
    assert r.returncode == 1
    assert "FAILED PITA.tiny.arith.r0.train" in r.stdout and "job.log" in r.stdout
    st = final_state(only_run(tmp_path, "f"))
    assert st["PITA.tiny.arith.r1.train"][0] == "SKIPPED" and st["DPO.tiny.arith.r1.train"][0] == "COMPLETED"
    # pita status: counts by state and round, the failure with its error and log, what was skipped
    s = subprocess.run([sys.executable, "-m", "pita", "status", str(only_run(tmp_path, "f"))], cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert s.returncode == 0, s.stderr
    assert "failed 1" in s.stdout and "round 1" in s.stdout
    assert "FAILED    PITA.tiny.arith.r0.train  on cpu" in s.stdout and "jobs/PITA.tiny.arith.r0.train/job.log" in s.stdout
    assert "SKIPPED   PITA.tiny.arith.r1.train" in s.stdout


def _start(tmp_path, name, extra=()):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(ROOT / "run_parallel.py"), f"system.output_dir={tmp_path}",
                             "executor.progress=plain", "experiment.workload=synthetic", f"experiment.name={name}",
                             *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigint_stops_everything_and_saves_state(tmp_path):
    p = _start(tmp_path, "int", ["synthetic.job_seconds=30", *SMALL, "executor.kill_grace_s=2"])
    assert wait_for(lambda: (tmp_path / "int").exists() and any((tmp_path / "int").iterdir()), 30)
    run = only_run(tmp_path, "int")
    assert wait_for(lambda: len(workers_of(run)) >= 2, 30), "workers never started"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert wait_for(lambda: workers_of(run) == [], 5), "worker processes survived Ctrl-C"
    state = json.loads((run / "state.json").read_text())
    assert state["interrupted"] is True
    assert not [j for j, e in state["jobs"].items() if e["state"] == "RUNNING"]
    assert "resume_from=" in out


def test_sigkill_then_resume_reaches_the_same_final_state(tmp_path):
    args = ["synthetic.job_seconds=0.3", *SMALL]
    ref = cli(["experiment.name=ref", *args], tmp_path / "a")
    assert ref.returncode == 0, ref.stderr
    expected = final_state(only_run(tmp_path / "a", "ref"))

    p = _start(tmp_path / "b", "k", args)
    base = tmp_path / "b" / "k"
    assert wait_for(lambda: base.exists() and any(base.iterdir()), 30)
    run = only_run(tmp_path / "b", "k")
    assert wait_for(lambda: sum(1 for _ in run.glob("jobs/*/.done")) >= 4, 60)
    warm = [c for c in psutil.Process(p.pid).children() if "multiprocessing.forkserver" in " ".join(c.cmdline())]
    assert len(warm) == 1, "CPU runs fork their workers from one fork server"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    assert wait_for(lambda: workers_of(run) == [], 5), "orphan workers outlived the orchestrator"
    assert wait_for(lambda: not warm[0].is_running() or warm[0].status() == psutil.STATUS_ZOMBIE, 5), \
        "the fork server outlived the orchestrator"
    done_before = sum(1 for _ in run.glob("jobs/*/.done"))
    assert 0 < done_before < len(expected)

    r = cli([f"resume_from={run}"], tmp_path / "b")
    assert r.returncode == 0, r.stderr
    assert final_state(run) == expected
    assert f"resume: {done_before} of {len(expected)} jobs already completed" in (run / "run.log").read_text()


# A run killed at a moment of its start-up: the function named is patched to SIGKILL the process
# (after the original ran, where "after"), then the command runs as a user types it.
_DIE = """
import os, signal, sys
from pita.cli import run_main
what, when = sys.argv[1], sys.argv[2]
mod_name, attr = what.split(":")
import importlib
owner = importlib.import_module(mod_name)
if "." in attr:
    cls_name, attr = attr.split(".")
    owner = getattr(owner, cls_name)
orig = owner.__dict__[attr]
fn = orig.__func__ if isinstance(orig, classmethod) else orig
def dying(*a, **k):
    if when == "after":
        fn(*a, **k)
    elif when == "connect":
        a[0]._connect()
    os.kill(os.getpid(), signal.SIGKILL)
setattr(owner, attr, classmethod(dying) if isinstance(orig, classmethod) else dying)
sys.exit(run_main(sys.argv[3:], prog="python run_parallel.py"))
"""


@pytest.fixture(scope="module")
def small_run_state(tmp_path_factory):
    """The final state of the SMALL synthetic run, uninterrupted: what a resumed one must reach."""
    out = tmp_path_factory.mktemp("ref")
    ref = cli(["experiment.name=ref", "synthetic.job_seconds=0", *SMALL], out)
    assert ref.returncode == 0, ref.stderr[-3000:]
    return final_state(only_run(out, "ref"))


@pytest.mark.parametrize("moment,fresh", [
    (("pita.core.logs:setup_logging", "before"), True),  # config.yaml written, no state
    (("pita.core.state:StateStore.update", "connect"), True),  # an empty state database: 0 jobs recorded
    (("pita.core.executor:Executor._launch", "before"), False),  # every job recorded, none started
])
def test_a_run_killed_during_start_up_resumes(tmp_path, moment, fresh, small_run_state):
    """SIGKILLed before it recorded its jobs, a run has computed nothing: resume starts it afresh
    with its saved config (and says so) instead of blaming overrides nobody gave."""
    args = ["experiment.name=k", "synthetic.job_seconds=0", *SMALL, "experiment.workload=synthetic",
            f"system.output_dir={tmp_path / 'b'}", "executor.progress=plain"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _DIE, *moment, *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = only_run(tmp_path / "b", "k")
    assert not list(run.glob("jobs/*/launch.json"))  # no job started
    if moment[1] == "connect":
        assert (run / "state.db").exists()  # the state the run left: a database with 0 jobs
    again = cli([f"resume_from={run}"], tmp_path / "b")
    assert again.returncode == 0, again.stderr[-3000:]
    assert ("starts afresh with its saved config" in again.stderr) == fresh
    assert "differ" not in again.stderr
    assert final_state(run) == small_run_state


def test_a_run_killed_as_its_folder_was_made_says_nothing_was_lost(tmp_path):
    args = ["experiment.name=k", "synthetic.job_seconds=0", *SMALL, "experiment.workload=synthetic",
            f"system.output_dir={tmp_path}", "executor.progress=plain"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _DIE, "pita.core.paths:RunPaths.create", "after", *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    run = only_run(tmp_path, "k")
    again = cli([f"resume_from={run}"], tmp_path)
    assert again.returncode == 2
    assert "nothing was computed and nothing can be lost" in again.stderr and "Start the run again" in again.stderr


def test_a_graph_that_differs_with_no_key_changed_is_not_blamed_on_overrides(tmp_path):
    r = cli(["experiment.name=g", "synthetic.job_seconds=0", *SMALL], tmp_path)
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path, "g")
    from pita.core.state import StateStore

    store = StateStore(run / "state.json")  # as if another pita had planned the first job otherwise
    first = sorted(store.read()["jobs"])[0]
    store.apply({first: {"fingerprint": "planned-elsewhere"}})
    store.close()
    again = cli([f"resume_from={run}"], tmp_path)
    assert again.returncode == 2
    assert "though no key differs from its saved config" in again.stderr and "overrides" not in again.stderr


def test_resume_refuses_graph_changes_unless_forced(tmp_path):
    r = cli(["experiment.name=g", "synthetic.job_seconds=0", *SMALL], tmp_path)
    run = only_run(tmp_path, "g")
    r = cli([f"resume_from={run}", "synthetic.rounds=3"], tmp_path)
    assert r.returncode == 2 and "synthetic.rounds" in r.stderr and "resume_force=true" in r.stderr
    r = cli([f"resume_from={run}", "executor.oom_retries=5"], tmp_path)  # execution-only: allowed
    assert r.returncode == 0, r.stderr
    r = cli([f"resume_from={run}", "synthetic.rounds=3", "resume_force=true"], tmp_path)
    assert r.returncode == 0, r.stderr
    st = final_state(run)
    assert st["PITA.tiny.arith.r2.train"][0] == "COMPLETED"


def test_test_parallel_setup_passes_here(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "test_parallel_setup.py")], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200"))
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert "CPU mode" in last and "No GPU check ran" in last  # a laptop passes, and is told what was not checked


def test_setup_check_compares_each_workers_cuda_uuid_with_its_assignment():
    from pita.setup_check import check_worker_devices

    ok = {"uuid": "GPU-a", "current_device": 0, "LOCAL_RANK": None, "allocated_bytes": 2**28, "nvml_sees_bytes": 2**28}
    assert check_worker_devices([ok], ["GPU-a"]) == ([], [])
    problems, _ = check_worker_devices([dict(ok, uuid="GPU-b")], ["GPU-a"])
    assert "assigned GPU-a but CUDA gave it GPU-b" in problems[0]
    problems, _ = check_worker_devices([dict(ok, nvml_sees_bytes=0)], ["GPU-a"])
    assert "NVML attributes 0 MiB to its pid" in problems[0]
    problems, notes = check_worker_devices([dict(ok, nvml_sees_bytes=None)], ["GPU-a"])
    assert problems == [] and "container" in notes[0]  # NVML with host pids: said, not failed
    problems, _ = check_worker_devices([dict(ok, current_device=1, LOCAL_RANK="1")], ["GPU-a"])
    assert len(problems) == 2


def test_setup_check_flags_duplicate_assignments():
    from pita.setup_check import check_assignments

    bad = check_assignments(["0", "0", "1", "1"], ["0", "1", "2", "3"], True, [1, 1, 1, 1])
    assert any("duplicate" in p for p in bad)
    assert check_assignments(["0", "1", "2", "3"], ["0", "1", "2", "3"], True, [1, 1, 1, 1]) == []
    assert check_assignments(["0", "1"], ["0", "1"], True, [1, 2])  # a worker saw two devices


def _sweep_folder(base: Path) -> Path:
    [sweep] = list(base.iterdir())
    assert sweep.name.startswith("sweep-"), sweep
    return sweep


def _summary(sweep: Path) -> list[dict]:
    with open(sweep / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_multirun_runs_every_sweep_point(tmp_path):
    r = cli(["-m", "experiment.name=mr", "synthetic.rounds=1,2", "synthetic.job_seconds=0",
             "synthetic.algos=[PITA]", "synthetic.datasets=[arith]"], tmp_path)
    assert r.returncode == 0, r.stderr
    sweep = _sweep_folder(tmp_path / "mr")
    runs = {p.name: p for p in sweep.iterdir() if p.is_dir()}
    assert sorted(runs) == ["synthetic.rounds-1", "synthetic.rounds-2"]  # named by what the sweep varies
    assert len(final_state(runs["synthetic.rounds-1"])) == 10  # base eval 3 + 7 per round
    assert len(final_state(runs["synthetic.rounds-2"])) == 17
    assert (sweep / "multirun.yaml").exists()
    rows = _summary(sweep)
    assert [(x["point"], x["overrides"], x["exit_code"], x["outcome"]) for x in rows] == [
        ("1", "synthetic.rounds=1", "0", "completed"), ("2", "synthetic.rounds=2", "0", "completed")]
    assert [Path(x["run_folder"]) for x in rows] == [runs["synthetic.rounds-1"], runs["synthetic.rounds-2"]]
    for i, x in enumerate(rows, 1):  # a line as each point starts and ends, and the table at the end
        assert f"sweep point {i}/2: {x['overrides']} -> {x['run_folder']}" in r.stdout
        assert f"sweep point {i}/2: exit 0 (completed); run folder: {x['run_folder']}" in r.stdout
    table = r.stdout.split("sweep: 2 of 2 point(s) ran; summary: ", 1)[1]
    assert str(sweep / "summary.csv") in table and "synthetic.rounds=2" in table


def test_hydra_cfg_flag_prints_the_config(tmp_path):
    r = cli(["--cfg", "job"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "oom_retries: 2" in r.stdout


def test_without_parallel_execution_jobs_run_one_at_a_time_on_one_device(tmp_path):
    r = cli(["experiment.name=serial", "experiment.workload=synthetic", "synthetic.job_seconds=0.05",
             "system.use_parallel_execution=false", "system.cpu_devices=2", *SMALL], tmp_path)
    assert r.returncode == 0, r.stderr
    jobs = json.loads((only_run(tmp_path, "serial") / "state.json").read_text())["jobs"]
    spans = sorted((e["started"], e["finished"]) for e in jobs.values())
    assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:])), "two jobs overlapped"
    assert {d["label"] for e in jobs.values() for d in e["devices"]} <= {"cpu0"}


def test_the_smoke_preset_runs_all_six_algorithms_and_writes_the_report(tmp_path, tiny_cache, smoke_run, capsys):
    """experiment=smoke: the whole pipeline at its smallest (tiny family, arith, six algorithms,
    one round, base evaluation), ending with the results table and the report with its plots.
    (That the same config gives the same numbers twice: the long tier's fresh-workers test.)"""
    run, stdout = smoke_run
    from pita.report.results import read_results

    rows, extras = read_results(run / "results" / "final_results.json")
    assert {x["algorithm"] for x in rows} == {"base", "PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF",
                                              "control: temperature", "control: best-of-n",
                                              "control: best-of-n by value", "control: best-of-n by log-prob",
                                              "control: majority vote"}
    report = (run / "results" / "report.md").read_text()
    # the headline compares at equal KL: every method at every budget, a value or "not reached"
    cells = extras["kl_matched"]["cells"]
    # ... and the two controls computed from the base model alone
    methods = ("PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF", "control: temperature", "control: best-of-n",
               "control: best-of-n by value", "control: best-of-n by log-prob", "control: majority vote")
    assert {(c["algorithm"], c["kl_budget"]) for c in cells} == {(a, b) for a in methods
                                                                 for b in (0.05, 0.1, 0.25, 0.5, 1.0)}
    for c in cells:  # each cell says what it is, and its value agrees
        b, top = c["kl_budget"], max(c["max_kl"])  # the largest validation KL of the method's series
        assert c["selected_on"] == "validation"
        assert c["reached"] == (c["kind"] != "not reached") == (c["value"] is not None)
        assert (c["ci_lo"] is not None) == c["reached"]  # every value read has its interval
        if c["kind"] in ("interpolated", "wide interpolation", "chord from base"):
            assert top >= b and c["validation"][0]["value"] is not None
        elif c["kind"] == "measured":
            assert top >= 0.9 * b
        else:  # not reached: no series of the method gets to the budget on validation
            assert top < 1.1 * b
    bon = [x for x in rows if x["algorithm"].startswith("control: best-of-n")]
    assert sorted(x["variant"] for x in bon) == ["n=2"] * 3 + ["n=4"] * 3
    assert {x["scored_by"] for x in bon} == {"proxy reward model of QSharp-HF.tiny.arith.r0.proxy",
                                             "value model of QSharp.tiny.arith.r0.train",
                                             "the base model's log-probability per token"}
    vote = [x for x in rows if x["algorithm"] == "control: majority vote"]
    assert sorted(x["n"] for x in vote) == [2, 4] and all(0 <= x["pass@1"] <= 1 and x["kl"] >= 0 for x in vote)
    # best-of-n at its measured KL: never above the bound, which stays beside it
    assert all(x["kl_estimator"] == "best-of-n over the pool" and 0 <= x["kl"] <= x["kl_bound"] + 1e-9
               and x["kl_bound"] == pytest.approx(math.log(x["n"]) - (x["n"] - 1) / x["n"]) for x in bon)
    # the baselines along training (eval.checkpoints: [0.5]): their halfway snapshots are frontier points too
    along = [x for x in rows if x.get("variant") == "at 50%"]
    assert {x["algorithm"] for x in along} == {"DPO", "GRPO", "GRPO-HF"} and all(x["kl"] >= 0 for x in along)
    snap = json.loads((run / "jobs" / "DPO.tiny.arith.r0.train" / "result.json").read_text())["snapshots"]
    assert set(snap) == {"0.5"} and 1 <= snap["0.5"]["step"] < 3
    colder = [x for x in rows if x["algorithm"] == "control: temperature"]
    # the preset's one colder temperature, then those the control's search added on validation
    assert "T=0.6" in [x["variant"] for x in colder] and len(colder) > 1 and all(x["kl"] > 0 for x in colder)
    assert {b["algorithm"] for b in extras["budgets"]} == {"PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"}
    assert all(b["optimizer_steps"] >= 1 and b["sequences"] > 0 and b["labels"] > 0 for b in extras["budgets"])
    assert "### What each method received" in report
    assert report.index("Headline: every method at equal KL") < report.index("η chosen on validation")
    assert all(x["kl"] >= 0 and x["kl_estimator"] == "exact per-step" for x in rows if x not in bon + vote)
    assert "### What each learned scorer can tell apart" in report
    assert {s["job"] for s in extras["scorers"]} >= {"PITA.tiny.arith.r0.train", "QSharp.tiny.arith.r0.train",
                                                      "QSharp-HF.tiny.arith.r0.proxy", "QSharp-HF.tiny.arith.r0.train"}
    quality = {q["recipe"]: q for q in extras["label_quality"]}
    assert {"preference_pairs", "value_rollouts", "proxy"} <= set(quality) and "### Label quality" in report
    assert 0 <= quality["preference_pairs"]["ties"] <= 1 and quality["proxy"]["heldout_pairs"] >= 1
    for png in ("frontier_arith", "rounds_arith", "timeline"):
        assert (run / "results" / "plots" / f"{png}.png").exists() and f"plots/{png}.png" in report
    assert "| generation |" in report and "report: " in stdout and "pass@1" in stdout
    # where the numbers were computed: every attempt records its platform, the report names it
    from pita.core.provenance import cpu_model

    attempt = json.loads((run / "jobs" / "DPO.tiny.arith.r0.train" / "attempt-1.json").read_text())
    assert attempt["platform"]["torch"]["cpu_capability"] and attempt["platform"]["cpu"]["model"] == cpu_model()
    assert "- platform" in report and f"{cpu_model()}, {attempt['platform']['torch']['cpu_capability']} kernels" in report
    # run.log is for people: the jobs' progress bars and TRL's per-step dicts stay in their job.log
    text = (run / "run.log").read_text()
    dpo = (run / "jobs" / "DPO.tiny.arith.r0.train" / "job.log").read_bytes().decode()  # "\r" kept
    assert "Loading weights: 100%" in dpo and "{'loss': " in dpo and "\r" in dpo
    for noise in ("Loading weights", "Saving the dataset", "it/s]", "examples/s]", "{'loss': ", "{'train_runtime': ",
                  ", params {",  # each job's parameters: in its launch.json, not a kilobyte line per job
                  "FutureWarning", "Timeout is disabled"):  # deprecations and math-verify's timeouts, fixed at source
        assert noise not in text, noise
    assert "INFO pita.job: DPO from" in text and "[DPO.tiny.arith.r0.train cpu" in text  # the jobs' own lines
    tokens = sum(json.loads((j / "result.json").read_text()).get("tokens", 0)
                 for j in (run / "jobs").glob("*.s[0-9]*")  # data collection shards (round 0: data.*)
                 if ".eval" not in j.name and ".val" not in j.name and (j / "result.json").exists())
    assert tokens > 0
    # durations that learn: every completed attempt records its planned and measured seconds, the
    # cache keeps measured / planned per kind, the report shows both, and a plan calibrated on
    # this run expects about what the run took
    state = json.loads((run / "state.json").read_text())
    done = [a for e in state["jobs"].values() for a in e["attempts"] if a["status"] == "ok"]
    assert all(a["planned_s"] > 0 and a["seconds"] > 0 and a["duration_key"] for a in done)
    learned = json.loads((Path(tiny_cache) / "durations.json").read_text())["cpu/tiny"]
    assert {"algo.dpo_train", "algo.value_train", "eval.shard (guided)"} <= set(learned)
    assert "### Durations: planned against measured" in report
    took = float(re.search(r"finished after ([\d.]+)s", text).group(1))
    p = subprocess.run([sys.executable, str(ROOT / "run_parallel.py"), "--plan", "--json", *SMOKE_ARGS,
                        f"system.cache_dir={tiny_cache}", "--calibrate", str(run)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    plan = json.loads(p.stdout)
    assert plan["duration_corrections"]["algo.dpo_train"]["jobs"] >= 1
    assert took / 3 < plan["makespan_s"] < took * 3, (plan["makespan_s"], took)  # the roofline alone: ~4x off
    # a run made before attempts recorded their plan: its config.yaml is planned again, its jobs
    # matched by id, and the corrections come out as from the recorded plan
    from pita.cli.plan import plan_main

    old = tmp_path / "before" / "run"
    old.mkdir(parents=True)
    (old / "config.yaml").write_text((run / "config.yaml").read_text())
    for e in state["jobs"].values():
        for a in e["attempts"]:
            for k in ("planned_s", "seconds", "expected_s", "duration_key"):
                a.pop(k, None)
    (old / "state.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert plan_main(["--json", *SMOKE_ARGS, f"system.cache_dir={tiny_cache}", "--calibrate", str(old)]) == 0
    again = json.loads(capsys.readouterr().out)
    n = len(state["jobs"])
    assert f"config.yaml was planned again: {n} of its {n} jobs matched" in again["durations"]
    for kind, c in plan["duration_corrections"].items():
        assert again["duration_corrections"][kind]["measured_over_planned"] == pytest.approx(
            c["measured_over_planned"], rel=0.5), kind
    # a CPU run says nothing about a GPU's speed
    assert plan_main(["experiment=smoke", "system.inventory=8xH100", "--calibrate", str(run)]) == 2
    assert "ran on cpu devices and this plan is for cuda devices" in capsys.readouterr().err


def _metrics(rows):
    keys = ("algorithm", "round", "eta", "pass@1", "kl", "mean_reward")
    return sorted(json.dumps({k: x.get(k) for k in keys}, sort_keys=True) for x in rows)


def _smoke_metrics(out, cache, *args):
    from pita.report.results import read_results

    r = cli([*SMOKE_ARGS, f"system.cache_dir={cache}", *args], out, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return _metrics(read_results(only_run(out, "smoke") / "results" / "final_results.json")[0])


@pytest.mark.slow
def test_the_smoke_preset_gives_the_same_numbers_with_fresh_workers(tmp_path, tiny_cache, smoke_run):
    """Workers started fresh (a minute more: every attempt imports torch and TRL) give the numbers
    of the session's smoke run, whose workers were forked from the warm process: the same config
    run twice gives the same numbers (seeded head initialisation, the same thread count per job),
    since the same ops on the same inputs repeat bit for bit on one machine."""
    from pita.report.results import read_results

    forked = _metrics(read_results(smoke_run[0] / "results" / "final_results.json")[0])
    assert _smoke_metrics(tmp_path / "fresh", tiny_cache, "executor.worker_start=exec") == forked


@pytest.mark.parametrize("args,needle", [
    (["experiment.datasets=[arith,", "sentiment]"], "the shell split this list at its spaces; quote it "
                                                     "('experiment.datasets=[arith, sentiment]')"),
    (["synthetic.datasets=a,b"], "a comma list without brackets is a sweep (one run per value); for one run with a "
                                 "list write 'synthetic.datasets=[a,b]', to sweep add --multirun"),
    (["hydra.run.dir=/tmp/x"], "hydra.run.dir: pita makes its own run folder"),
    (["experiment.algos=[pita]", "experiment.workload=experiment"], "did you mean 'PITA'"),
])
def test_command_line_slips_exit_2_within_seconds_and_say_what_to_type(tmp_path, args, needle):
    t = time.time()
    r = cli(["experiment.name=slip", *args], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert needle in r.stderr
    assert time.time() - t < 30 and not (tmp_path / "slip").exists()


def test_multirun_flag_after_the_overrides_and_status_of_a_folder_of_runs(tmp_path):
    r = cli(["experiment.name=late", "synthetic.rounds=1,2", "synthetic.job_seconds=0", "synthetic.algos=[A]",
             "synthetic.datasets=[d]", "experiment.workload=synthetic", "--multirun"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = sorted(p for p in _sweep_folder(tmp_path / "late").iterdir() if p.is_dir())
    assert len(runs) == 2
    for folder in (tmp_path / "late", runs[0].parent):  # the experiment's folder, and the sweep's
        s = subprocess.run([sys.executable, "-m", "pita", "status", str(folder)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert s.returncode == 0 and "holds 2 run(s)" in s.stdout and all(str(x) in s.stdout for x in runs)


SWEEP = ["experiment.workload=synthetic", "synthetic.job_seconds=0", "synthetic.algos=[PITA]",
         "synthetic.datasets=[arith]", "executor.progress=off"]


def test_a_sweep_leaves_only_its_own_folder_and_its_points_resume_as_printed(tmp_path):
    """From a folder of its own (outputs relative to it): the sweep folder holds Hydra's
    multirun.yaml, the summary and the points; nothing else appears (no outputs/.multirun/N)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "pita", "run", "experiment.name=tidy", *SWEEP,
                        "synthetic.rounds=1,2", "-m"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [p.name for p in tmp_path.iterdir()] == ["outputs"]
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == ["tidy"]
    sweep = _sweep_folder(tmp_path / "outputs" / "tidy")
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml", "summary.csv", "synthetic.rounds-1",
                                                       "synthetic.rounds-2"]
    folder = _summary(sweep)[1]["run_folder"]  # relative to the folder the sweep ran in, as printed
    assert folder == f"outputs/tidy/{sweep.name}/synthetic.rounds-2"
    again = subprocess.run([sys.executable, "-m", "pita", "run", f"resume_from={folder}"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "17 of 17 jobs already completed" in (tmp_path / folder / "run.log").read_text()


def test_a_sweep_reports_each_point_exit_and_keeps_no_empty_folders(tmp_path):
    """A point that is refused (exit 2) makes no folder; points under their own experiment.name go to
    their own sweep folder; the sweep exits with the worst code and its summary lists every point."""
    r = cli(["-m", *SWEEP, "experiment.name=p,q", "synthetic.rounds=1,100000"], tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "more than executor.max_jobs=100000" in r.stderr
    sweep = _sweep_folder(tmp_path / "default")  # the summary goes where the sweep's own name puts it
    rows = _summary(sweep)
    assert [(x["overrides"], x["exit_code"], bool(x["run_folder"])) for x in rows] == [
        ("experiment.name=p synthetic.rounds=1", "0", True), ("experiment.name=p synthetic.rounds=100000", "2", False),
        ("experiment.name=q synthetic.rounds=1", "0", True), ("experiment.name=q synthetic.rounds=100000", "2", False)]
    assert Path(rows[0]["run_folder"]) == tmp_path / "p" / sweep.name / "experiment.name-p__synthetic.rounds-1"
    assert "sweep point 2/4: exit 2 (bad configuration); run folder: none (nothing ran)" in r.stdout
    for d in tmp_path.rglob("*"):
        assert not d.is_dir() or any(d.iterdir()), f"empty folder left behind: {d}"


def test_a_sweep_with_a_bad_value_exits_2_naming_it_before_any_folder_exists(tmp_path):
    r = cli(["-m", *SWEEP, "experiment.name=bad", "executor.oom_retries=1,abc", "synthetic.rounds=1,2"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "executor.oom_retries=abc:" in r.stderr and "'abc'" in r.stderr
    r = cli(["-m", *SWEEP, "experiment.name=ok,a/b", "synthetic.rounds=1"], tmp_path)
    assert r.returncode == 2 and "experiment.name='a/b' must be a plain folder name" in r.stderr
    assert not any(tmp_path.iterdir())


def test_ctrl_c_ends_the_sweep_and_its_summary_lists_the_points_not_run(tmp_path):
    p = subprocess.Popen([sys.executable, str(ROOT / "run_parallel.py"), "-m", f"system.output_dir={tmp_path}",
                          "experiment.name=stop", *SWEEP, "synthetic.job_seconds=30", "synthetic.rounds=1,2,3",
                          "executor.kill_grace_s=2"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: any((tmp_path / "stop").rglob("jobs/*/launch.json")), 60), "no job started"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-2000:]
    rows = _summary(_sweep_folder(tmp_path / "stop"))
    assert [(x["exit_code"], x["outcome"]) for x in rows] == [
        ("130", "interrupted"), ("", "not run: the sweep was interrupted"), ("", "not run: the sweep was interrupted")]
    assert "sweep: 1 of 3 point(s) ran" in out and "sweep point 2/3" not in out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a CPU affinity mask and at least 2 cores")
def test_a_run_confined_to_one_core_counts_one_core(tmp_path):
    """``taskset -c 0 pita run ...`` on a shared machine: one CPU device and one thread per job, not
    the machine's core count (two runs side by side would otherwise each start 2 threads per job
    and thrash)."""
    r = cli(["experiment.name=one", "synthetic.job_seconds=0", "synthetic.algos=[PITA]", "synthetic.datasets=[arith]",
             "synthetic.rounds=1"], tmp_path, preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    assert r.returncode == 0, r.stderr
    log = (only_run(tmp_path, "one") / "run.log").read_text()
    assert "on 1 device(s) [cpu]" in log and "CPU 0 (1 core)" in log
    code = ("import os; from pita.core.gpu_manager import usable_cores; os.sched_setaffinity(0, {0}); "
            "print(usable_cores())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "1", out.stderr
