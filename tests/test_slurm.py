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

from pita.core.backends.slurm import (SlurmBackend, SlurmSettings, access_problems, attempt_log, gres_gpus,
                                      pending_reason, slurm_seconds, time_limit)
from tests.helpers import ROOT, cli, only_run, wait_for

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


_skip_without_cluster = pytest.mark.skipif(bool(_cluster_up()), reason=_cluster_up() or "up")


def needs_slurm(test):
    """A test against the real cluster: the long tier (``make test-long``), skipped, saying why,
    where the cluster is not up. They share one cluster, so this file's tests run one after
    another on one pytest-xdist worker (``--dist loadfile``), beside the long tier's other tests."""
    return pytest.mark.slow(_skip_without_cluster(test))


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
    # after a TIMEOUT the next attempt asks twice the last limit (not twice the expected seconds,
    # which the shortest limit would swallow), and never more than the partition's MaxTime
    assert time_limit(5, 2.0, 10, factor=2.0) == "0-00:20:00" and time_limit(5, 2.0, 10, 900, 2.0) == "0-00:15:00"
    assert [slurm_seconds(t) for t in ("UNLIMITED", "30", "30:00", "1:00:00", "2-00:00:00", "1-12")] == [
        None, 1800.0, 1800.0, 3600.0, 172800.0, 129600.0]
    assert pending_reason("Resources").startswith("Resources (the partition's nodes are busy")
    assert "executor.slurm.time_margin" in pending_reason("PartitionTimeLimit") and pending_reason("Odd") == "Odd"
    assert gres_gpus("gpu:2") == 2 and gres_gpus("gpu:h100:8(S:0-1)") == 8 and gres_gpus("gpu:a100:4,shard:8") == 4
    assert gres_gpus("(null)") == 0


def _slurm_env():
    return dict(os.environ, SLURM_CONF=SLURM_CONF)


@pytest.fixture(autouse=True)
def _slurm_conf(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", SLURM_CONF)


SYNTH = ["experiment.workload=synthetic", "synthetic.algos=[A,B]", "synthetic.families=[f]", "synthetic.datasets=[d]",
         "synthetic.rounds=1", "synthetic.gen_shards=1", "synthetic.eval_shards=1", "executor.backend=slurm",
         "executor.slurm.gpu_card=H100", "executor.slurm.poll_interval_s=0.5", "executor.slurm.min_minutes=2",
         "executor.slurm.pack_below_s=0"]  # these tests follow each attempt as a Slurm job of its own


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
def test_a_job_a_person_scancels_stays_cancelled_and_the_resume_it_names_runs_it(tmp_path):
    """A person's scancel of a running generation job: the job FAILED with who cancelled it (sacct's
    uid) and the command that runs it again, never submitted again by pita, its dependents skipped,
    the run exits 1; that command (resume_from=) then runs the rest and exits 0."""
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
    assert proc.returncode == 1, text[-3000:]
    run = next((tmp_path / "cancel").iterdir())
    state = json.loads((run / "state.json").read_text())
    job = state["jobs"][cancelled]
    [a] = job["attempts"]
    assert job["state"] == "FAILED" and a["status"] == "cancelled" and a["slurm_state"] == "CANCELLED", a
    assert "was cancelled by uid 0 (root) (scancel), not by pita" in a["error"], a["error"]
    assert any(e["state"] == "SKIPPED" for e in state["jobs"].values())
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", a["slurm_job"], "-o", "JobID,JobName,State"], env=env,
                           capture_output=True, text=True).stdout.strip()
    print(f"cancelled by a person: sacct {sacct}; one attempt, {a['status']}")
    again = a["error"].split("to run it again: ", 1)[1]
    assert again.endswith(f"resume_from={run}"), again
    r = cli([f"resume_from={run}"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    state = json.loads((run / "state.json").read_text())
    assert all(e["state"] == "COMPLETED" for e in state["jobs"].values())


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


def test_an_account_or_qos_the_partition_or_the_associations_refuse_names_the_key():
    """Read before anything is submitted: the partition's Allow/Deny lists (scontrol show
    partition) and, where the cluster keeps accounting, the user's associations (sacctmgr)."""
    part = {"PartitionName": "gpu", "AllowAccounts": "lab,other", "AllowQos": "ALL", "DenyQos": "free"}
    [p] = access_problems(SlurmSettings(account="mine"), part)
    assert p.startswith("executor.slurm.account='mine'") and "lab, other" in p
    [p] = access_problems(SlurmSettings(account="lab", qos="free"), part)
    assert p.startswith("executor.slurm.qos='free'") and "denies" in p
    assert access_problems(SlurmSettings(account="lab", qos="high"), part) == []
    assoc = [{"Account": "lab", "Partition": "", "QOS": "normal,high"}, {"Account": "x", "Partition": "cpu", "QOS": ""}]
    [p] = access_problems(SlurmSettings(account="x"), {"PartitionName": "gpu"}, assoc)
    assert p.startswith("executor.slurm.account='x'") and "lab" in p
    [p] = access_problems(SlurmSettings(account="lab", qos="urgent"), {"PartitionName": "gpu"}, assoc)
    assert p.startswith("executor.slurm.qos='urgent'") and "high, normal" in p
    assert access_problems(SlurmSettings(account="lab", qos="high"), {"PartitionName": "gpu"}, assoc) == []


@needs_slurm
@pytest.mark.parametrize("override,key", [("executor.slurm.cpus_per_job=4", "executor.slurm.cpus_per_job=4"),
                                          ("executor.slurm.constraint=nvlink", "executor.slurm.constraint"),
                                          ("executor.slurm.sbatch_args=[--mem=900G]", "--mem=900G")])
def test_a_request_the_cluster_cannot_satisfy_is_exit_2_before_anything_is_submitted(tmp_path, override, key):
    """Each kind's largest request is tried with sbatch --test-only: 4 CPUs per job on 2-CPU nodes,
    a feature no node has, an extra option no node satisfies."""
    r = cli([*SYNTH, override, "experiment.name=bad"], tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert key in r.stderr, r.stderr
    assert not (tmp_path / "bad").exists()


def _ours(env, run=None):
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T|%o"], env=env, capture_output=True, text=True)
    return [line.split("|") for line in out.stdout.splitlines() if "|pita:" in line and (run is None or str(run) in line)]


@needs_slurm
def test_a_driver_killed_and_resumed_takes_over_its_slurm_jobs_and_submits_the_rest(tmp_path):
    """SIGKILL of the driver leaves its Slurm jobs running; resume_from= follows them by the ids
    the state recorded (or, for an attempt whose id was never recorded, by its batch script in the
    job's folder) instead of submitting them again, and submits what had not started."""
    import signal

    from pita.core.state import StateStore

    env = _slurm_env()
    proc = subprocess.Popen([os.sys.executable, str(ROOT / "run_parallel.py"), *SYNTH, "synthetic.algos=[A]",
                             "synthetic.job_seconds=20", "experiment.name=kill", f"system.output_dir={tmp_path}",
                             "executor.progress=plain"], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(_ours(env)) < 2 and time.time() < deadline:
        time.sleep(0.3)
    time.sleep(1.0)  # the state has recorded both
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    run = only_run(tmp_path, "kill")
    before = {row[1][len("pita:"):]: row[0] for row in _ours(env, run)}
    assert len(before) == 2, before
    store = StateStore(run / "state.db")
    saved = store.read()["jobs"]
    assert {j: saved[j]["handle"]["slurm_job"] for j in before} == before
    unrecorded = sorted(before)[0]  # as if the driver died between sbatch and writing the state
    store.apply({unrecorded: {"handle": None, "state": "PENDING"}})
    store.close()
    r = cli([f"resume_from={run}", "executor.progress=plain"], tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    state = json.loads((run / "state.json").read_text())
    assert all(e["state"] == "COMPLETED" for e in state["jobs"].values())
    for jid, sid in before.items():  # one attempt each: the Slurm job the killed driver submitted
        assert [(a["status"], a["slurm_job"]) for a in state["jobs"][jid]["attempts"]] == [("ok", sid)], jid
    log = (run / "run.log").read_text()
    assert log.count("taken over from the earlier driver") == 2
    later = [a for j, e in state["jobs"].items() if j not in before for a in e["attempts"] if a.get("slurm_job")]
    assert later and all(int(a["slurm_job"]) > max(map(int, before.values())) for a in later)
    assert not _ours(env, run)


@needs_slurm
def test_a_job_kept_in_the_queue_is_reported_with_slurms_reason(tmp_path):
    """Both GPUs held by another user's job: pita's jobs wait in Slurm's queue, and the run says
    why (squeue's reason and what it means) once they have waited executor.slurm.pending_report_s.
    The other job holds the GPUs until the run has said it (not for a fixed time: on a loaded
    machine pita's start alone took longer than a 12 s job), then it is cancelled and the run ends."""
    import re
    import sys

    env = _slurm_env()
    hog = subprocess.run(["sbatch", "--parsable", "-J", "other", "--gres=gpu:2", "-o", "/dev/null", "--wrap",
                          "sleep 600"], env=env, capture_output=True, text=True)
    assert hog.returncode == 0, hog.stderr
    said = "in the cluster's queue: Slurm job"
    args = [*SYNTH, "synthetic.algos=[A]", "synthetic.job_seconds=1", "executor.slurm.pending_report_s=3",
            "experiment.name=wait", f"system.output_dir={tmp_path}", "executor.progress=plain"]
    with open(tmp_path / "stdout.txt", "w") as outf, open(tmp_path / "stderr.txt", "w") as errf:
        p = subprocess.Popen([sys.executable, str(ROOT / "run_parallel.py"), *args], cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=outf, stderr=errf, text=True)
    try:
        wait_for(lambda: p.poll() is not None or any(said in f.read_text() for f in tmp_path.glob("wait/*/run.log")),
                 timeout=240, step=0.5)
    finally:
        subprocess.run(["scancel", hog.stdout.strip()], env=env)
    try:
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    out, err = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    assert p.returncode == 0, out[-3000:] + err[-3000:]
    log = (only_run(tmp_path, "wait") / "run.log").read_text()
    # Resources while the other job runs (Priority if it was still queued itself when pita's came)
    assert said in log and re.search(
        r"pending, reason (Resources \(the partition's nodes are busy|Priority \(jobs of higher priority)", log), log[-3000:]


NON_TIMING = ("train_device_s", "eval_device_s")  # device seconds: how long, not what


def _rows(run):
    import csv

    with open(run / "results" / "results.csv") as f:
        return [{k: v for k, v in row.items() if k not in NON_TIMING} for row in csv.DictReader(f)]


@needs_slurm
@pytest.mark.timeout(1800)  # two whole smoke runs: beside a 2-thread load on a 2-core EPYC they passed 900 s
def test_the_smoke_preset_through_slurm_gives_the_local_backends_results(tmp_path, tiny_cache):
    """experiment=smoke on CPU devices, once through Slurm (its short attempts in packs: a few
    Slurm jobs, each importing torch once) and once with local workers: every column of
    results.csv but the device seconds is the same (same jobs, same thread budget per job, same
    seeds)."""
    common = ["experiment=smoke", f"system.cache_dir={tiny_cache}", "system.devices=cpu", "executor.progress=plain"]
    t = time.time()
    r = cli([*common, "executor.backend=slurm", "executor.slurm.poll_interval_s=0.5", "experiment.name=viaslurm"],
            tmp_path, timeout=900)
    slurm_s = time.time() - t
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    t = time.time()
    r = cli([*common, "experiment.name=vialocal"], tmp_path, timeout=600)
    local_s = time.time() - t
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    via_slurm, via_local = only_run(tmp_path, "viaslurm"), only_run(tmp_path, "vialocal")
    assert _rows(via_slurm) == _rows(via_local) and len(_rows(via_local)) > 20
    state = json.loads((via_slurm / "state.json").read_text())
    device = [a for e in state["jobs"].values() for a in e["attempts"] if a.get("devices")]
    assert device and all(a["slurm_state"] == "COMPLETED" and a["slurm_job"] for a in device)
    packs = {a["slurm_pack"] for a in device if a.get("slurm_pack")}
    assert packs and len({a["slurm_job"] for a in device}) < len(device) / 4, packs  # several attempts per pack
    print(f"smoke: {len(state['jobs'])} jobs, {len(device)} device attempts in {len(packs)} packs "
          f"({len({a['slurm_job'] for a in device})} Slurm jobs); wall {slurm_s:.0f}s through Slurm, "
          f"{local_s:.0f}s with local workers ({slurm_s / local_s:.1f}x)")


def _loss_lines(path: Path) -> int:
    """Training steps logged in an attempt's log so far."""
    try:
        return path.read_text(errors="replace").count("{'loss'")
    except OSError:
        return 0


def _dpo_run(tmp_path, tiny_cache, name: str, epochs: int, packs: bool = False):
    return subprocess.Popen([os.sys.executable, str(ROOT / "run_parallel.py"), "experiment=smoke",
                             "experiment.algos=[DPO]", f"algos.DPO.epochs={epochs}", f"system.cache_dir={tiny_cache}",
                             "system.devices=cpu", "executor.backend=slurm", "executor.slurm.poll_interval_s=0.5",
                             "executor.slurm.min_minutes=10",
                             f"executor.slurm.pack_below_s={1500 if packs else 0}", f"experiment.name={name}",
                             f"system.output_dir={tmp_path}", "executor.progress=plain"],
                            cwd=ROOT, env=dict(_slurm_env(), PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _preempted_dpo_run(tmp_path, tiny_cache, name: str, job: str, packs: bool) -> None:
    """A DPO run through Slurm whose training job, once it has trained a few steps, is preempted
    by a job on partition urgent (which takes the node's CPUs); the run must then end 0."""
    env = _slurm_env()
    proc = _dpo_run(tmp_path, tiny_cache, name, 150, packs=packs)
    urgent = None
    deadline = time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None and urgent is None:
            folder = next((tmp_path / name).glob("*/jobs/" + job), None) if (tmp_path / name).exists() else None
            if folder is not None and _loss_lines(folder / "attempt-1.log") >= 3:
                out = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "-J", "urgent", "-c", "2", "--mem=1G",
                                      "-o", "/dev/null", "--wrap", "sleep 5"], env=env, capture_output=True, text=True)
                assert out.returncode == 0, out.stderr
                urgent = out.stdout.strip()
            time.sleep(0.5)
        text, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert urgent, text[-3000:]
    assert proc.returncode == 0, text[-3000:]


@needs_slurm
def test_a_training_job_told_its_limit_is_near_saves_and_runs_again_from_the_save(tmp_path, tiny_cache):
    """Every attempt asks --signal=B:USR1@<margin>. USR1 reaches the DPO job's worker once it has
    trained a few steps (sent as Slurm sends it at the margin: scancel --signal=USR1 --batch): it
    saves a checkpoint at the end of its step and exits as "requeue me"; pita submits it again with
    the same time limit, and the next attempt resumes from that save. The driver is then stopped."""
    import re
    import signal

    env = _slurm_env()
    job = "DPO.tiny.arith.r0.train"
    proc = _dpo_run(tmp_path, tiny_cache, "limit", 5000)
    signalled = resumed = None
    deadline = time.time() + 600
    try:
        while time.time() < deadline and proc.poll() is None and not resumed:
            folder = next((tmp_path / "limit").glob("*/jobs/" + job), None) if (tmp_path / "limit").exists() else None
            if folder is not None and signalled is None and _loss_lines(folder / "attempt-1.log") >= 3:
                [sid] = [row[0] for row in _ours(env, folder)]
                subprocess.run(["scancel", "--signal=USR1", "--batch", sid], env=env, check=True)
                signalled = sid
            if folder is not None and (folder / "attempt-2.log").exists():
                resumed = re.search(r"resuming from \S+checkpoint-(\d+)", (folder / "attempt-2.log").read_text(errors="replace"))
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=180)
    assert signalled and resumed, text[-3000:]
    assert proc.returncode == 130, text[-3000:]
    run = only_run(tmp_path, "limit")
    first = json.loads((run / "state.json").read_text())["jobs"][job]["attempts"][0]
    assert first["status"] == "requeue" and "SIGUSR1 received: saved a checkpoint at step" in first["error"], first
    assert int(re.search(r"at step (\d+)", first["error"]).group(1)) == int(resumed.group(1)) >= 3
    scripts = [(run / "jobs" / job / f"slurm-{n}.sh").read_text() for n in (1, 2)]
    asked = [re.search(r"--time=(\S+)", t).group(1) for t in scripts]
    assert asked[0] == asked[1] == first["slurm_time"]  # the same limit: it continues, it did not run out
    assert all("--signal=B:USR1@120" in t for t in scripts)
    log = (run / "jobs" / job / "job.log").read_text(errors="replace")
    assert "=== attempt 1: Slurm job" in log and "=== attempt 2: Slurm job" in log  # each attempt's own log, gathered
    assert not _ours(env, tmp_path)


@needs_slurm
def test_a_time_limit_barely_above_the_margin_warns_running_attempts_which_run_on(tmp_path):
    """executor.slurm.signal_margin_s=110 under 2-minute limits: asked as it is, Slurm would warn
    every attempt in its first seconds (it may send the signal up to a minute early). The margin
    is held to a quarter of the limit (30 s), and the attempts, which cannot save and outlast the
    warning (one a Slurm job of its own, one in a pack that planned it at 5 s and finds it runs for
    90), hear it while they run, run on, and end ok with their child processes; the pack takes
    nothing more after it."""
    from tests.test_slurm_pack import _launch as launch_of

    be = SlurmBackend(SlurmSettings(min_minutes=2, signal_margin_s=110, pack_below_s=10, pack_time_s=120,
                                    pack_idle_s=30, poll_interval_s=0.5, max_poll_interval_s=2.0))
    own = launch_of(tmp_path, "A.f.d.r0.eval.s0", kind="children", children=1, seconds=90.0)
    own.job["duration_hint"] = 30.0  # over pack_below_s: a Slurm job of its own (limit: min_minutes)
    packed = launch_of(tmp_path, "B.f.d.r0.eval.s0", kind="children", children=1, seconds=90.0)
    be.start(own)
    be.start(packed)
    assert own.job_id in be.subs and packed.job_id in be.tasks
    out, t0 = [], time.time()
    try:
        while len(out) < 2 and time.time() - t0 < 400:
            out += be.poll(0.5)
    finally:
        be.shutdown(1.0)
    assert sorted((f.job_id, f.status) for f in out) == [(own.job_id, "ok"), (packed.job_id, "ok")], \
        [(f.job_id, f.status, f.error) for f in out]
    script = (own.paths.dir / "slurm-1.sh").read_text()
    assert "--time=0-00:02:00" in script and "--signal=B:USR1@30" in script
    pack = tmp_path / "run" / "slurm-packs" / "pack-1"
    assert "--signal=B:USR1@30" in (pack / "pack.sh").read_text()
    for launch in (own, packed):
        log = attempt_log(launch).read_text()
        assert "SIGUSR1 received (the time limit is near)" in log and "it runs on" in log, log[-2000:]
        assert json.loads(launch.paths.result.read_text())["codes"] == [0]
    assert (pack / "closed").read_text().startswith("SIGUSR1 received")


@needs_slurm
@pytest.mark.parametrize("event", ["scancel", "preempt", "node_fail"])
def test_a_pack_cancelled_or_preempted_under_an_attempt_that_cannot_save_fails_nothing(tmp_path, event):
    """A generation-like attempt (it cannot save) runs in a pack when the pack is scancel'ed (as an
    admin would), preempted by a job on partition urgent (PreemptMode=REQUEUE, GraceTime 30 s; a
    pack is --no-requeue), or its node is set down (then resumed). The attempt dies with its pack;
    it is read as a Slurm job of its own in that state would be, never died or FAILED: lost when
    preempted or its node failed, cancelled (a person's word, with sacct's uid) when scancel'ed. Its
    next attempt (a resume's, for the cancelled one), a Slurm job of its own, ends ok."""
    from tests.test_slurm_pack import _launch as launch_of

    env = _slurm_env()
    be = SlurmBackend(SlurmSettings(min_minutes=2, pack_below_s=60, pack_idle_s=30, poll_interval_s=0.5,
                                    max_poll_interval_s=2.0))
    hang = launch_of(tmp_path, "A.f.d.r0.gen.s0", kind="hang")
    be.start(hang)
    assert hang.job_id in be.tasks
    out, t0, urgent = [], time.time(), None
    try:
        while not out and time.time() - t0 < 400:
            out += be.poll(0.5)
            log = attempt_log(hang)
            if urgent is None and log.exists() and "hanging" in log.read_text():
                pack_id = be.packs["pack-1"].slurm_id
                if event == "scancel":
                    subprocess.run(["scancel", pack_id], env=env, check=True)
                    urgent = pack_id
                elif event == "node_fail":
                    node = subprocess.run(["squeue", "-h", "-j", pack_id, "-o", "%N"], env=env, capture_output=True,
                                          text=True).stdout.strip()
                    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=pita-test"],
                                   env=env, check=True)
                    urgent = node
                else:
                    r = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "-J", "urgent", "-c", "2", "--mem=1G",
                                        "-o", "/dev/null", "--wrap", "sleep 5"], env=env, capture_output=True, text=True)
                    assert r.returncode == 0, r.stderr
                    urgent = r.stdout.strip()
        assert urgent, "the attempt never ran"
        [f] = out
        if event == "node_fail":
            # a node that came back by itself (ReturnToService) refuses resume: either way it must be idle
            subprocess.run(["scontrol", "update", f"nodename={urgent}", "state=resume"], env=env, capture_output=True)
            wait_for(lambda: "idle" in subprocess.run(["sinfo", "-h", "-n", urgent, "-o", "%t"], env=env,
                                                      capture_output=True, text=True).stdout, timeout=120)
        state = {"scancel": "CANCELLED", "preempt": "PREEMPTED", "node_fail": "NODE_FAIL"}[event]
        if event == "scancel":  # a person's word: final for the attempt it ran (a resume runs it again)
            assert f.status == "cancelled" and "was cancelled by uid" in f.error, (f.status, f.error)
            assert f.extra["slurm_state"] == state and f.extra["cancelled_by"].startswith("by uid ")
        else:
            assert f.status == "lost" and f", {state}" in f.error and f.extra["slurm_state"] == state, (f.status, f.error)
        assert hang.job_id in be.no_pack
        retry = launch_of(tmp_path, "A.f.d.r0.gen.s0", attempt=2, seconds=0.2)
        be.start(retry)
        assert retry.job_id in be.subs  # a Slurm job of its own
        out, t0 = [], time.time()
        while not out and time.time() - t0 < 300:
            out += be.poll(0.5)
        assert [(x.job_id, x.status) for x in out] == [(retry.job_id, "ok")], [(x.status, x.error) for x in out]
    finally:
        be.shutdown(1.0)
        if event == "node_fail" and urgent:  # never leave the test cluster's node down
            subprocess.run(["scontrol", "update", f"nodename={urgent}", "state=resume"], env=env, capture_output=True)
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", f.extra["slurm_job"], "-o", "JobID,State"], env=env,
                           capture_output=True, text=True).stdout.split()
    print(f"pack {f.extra['slurm_job']} {event}: sacct {sacct}; attempt 1 {f.status} ({f.error}); attempt 2 ok "
          f"as Slurm job {out[0].extra.get('slurm_job')}")


@needs_slurm
def test_a_preempted_training_job_saves_and_resumes_and_the_run_completes(tmp_path, tiny_cache):
    """The test cluster's partition urgent preempts debug (PreemptMode=REQUEUE, GraceTime 30 s).
    Once the DPO job has trained a few steps, a job on urgent takes the node's CPUs: Slurm sends the
    DPO job TERM, its worker saves a checkpoint and exits, Slurm puts it back in the queue and runs
    it again, and it resumes from the save. The run completes with DPO's rows."""
    import csv
    import re

    job = "DPO.tiny.arith.r0.train"
    _preempted_dpo_run(tmp_path, tiny_cache, "preempt", job, packs=False)
    run = only_run(tmp_path, "preempt")
    folder = run / "jobs" / job
    log = (folder / "attempt-1.log").read_text(errors="replace")
    assert "DUE TO PREEMPTION" in log and "SIGTERM received: saving a checkpoint" in log, log[-3000:]
    saved = re.search(r"saved a checkpoint at step (\d+)", log)
    resumed = re.search(r"resuming from \S+checkpoint-(\d+)", log)
    assert saved and resumed and saved.group(1) == resumed.group(1), log[-3000:]
    result = json.loads((folder / "result.json").read_text())
    assert result["resumed_from_step"] == int(saved.group(1)) and result["steps"] > int(saved.group(1))
    with open(run / "results" / "results.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("algorithm") == "DPO"]
    assert rows, (run / "results" / "results.csv").read_text()
    attempts = json.loads((run / "state.json").read_text())["jobs"][job]["attempts"]
    assert [a["status"] for a in attempts] == ["ok"]  # one attempt, run twice by Slurm: not a failure
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", attempts[0]["slurm_job"], "-o", "State"], env=_slurm_env(),
                         capture_output=True, text=True)
    print(f"preempted job {attempts[0]['slurm_job']}: sacct {out.stdout.split()}, saved and resumed at step "
          f"{saved.group(1)} of {result['steps']}")


@needs_slurm
def test_a_preempted_pack_passes_term_to_its_training_job_which_saves_and_resumes(tmp_path, tiny_cache):
    """Every job in packs (pack_below_s=1500): once the DPO job has trained a few steps in its
    pack, a job on urgent preempts the pack. The pack forwards TERM to the attempt, whose worker
    saves and stops ("requeue"); the pack (--no-requeue) ends, and the next attempt, in a new pack,
    resumes from that save. The run completes with DPO's rows."""
    import csv
    import re

    job = "DPO.tiny.arith.r0.train"
    _preempted_dpo_run(tmp_path, tiny_cache, "packpre", job, packs=True)
    run = only_run(tmp_path, "packpre")
    attempts = json.loads((run / "state.json").read_text())["jobs"][job]["attempts"]
    assert [a["status"] for a in attempts] == ["requeue", "ok"], attempts
    assert all(a.get("slurm_pack") for a in attempts) and attempts[0]["slurm_pack"] != attempts[1]["slurm_pack"]
    saved = re.search(r"SIGTERM received: saved a checkpoint at step (\d+)", attempts[0]["error"])
    resumed = re.search(r"resuming from \S+checkpoint-(\d+)", (run / "jobs" / job / "attempt-2.log").read_text())
    assert saved and resumed and saved.group(1) == resumed.group(1), (attempts[0]["error"], resumed)
    pack_log = (run / "slurm-packs" / attempts[0]["slurm_pack"] / "pack.log").read_text()
    assert f"SIGTERM received: forwarded to {job}" in pack_log, pack_log[-2000:]
    with open(run / "results" / "results.csv") as f:
        assert [r for r in csv.DictReader(f) if r.get("algorithm") == "DPO"]
    print(f"packed DPO job preempted in {attempts[0]['slurm_pack']} at step {saved.group(1)}, resumed in "
          f"{attempts[1]['slurm_pack']}")


@needs_slurm
def test_a_controller_away_for_40_seconds_fails_nothing(tmp_path):
    """slurmctld stopped for 40 s while jobs run and queue: every query fails meanwhile; the jobs
    keep their state, the run ends 0 with every job COMPLETED on its first attempt, and run.log
    says the controller was away."""
    env = _slurm_env()
    proc = subprocess.Popen([os.sys.executable, str(ROOT / "run_parallel.py"), *SYNTH, "synthetic.job_seconds=15",
                             "experiment.name=away", f"system.output_dir={tmp_path}", "executor.progress=plain"],
                            cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not any(row[2] == "RUNNING" for row in _ours(env)) and time.time() < deadline:
        time.sleep(0.3)
    assert _ours(env), "no Slurm job started"
    slurm_sh = str(ROOT / "tools" / "slurm.sh")
    subprocess.run([slurm_sh, "stop-ctld"], env=env, check=True)
    try:
        time.sleep(40)
    finally:
        subprocess.run([slurm_sh, "start-ctld"], env=env, check=True)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-3000:]
    run = only_run(tmp_path, "away")
    state = json.loads((run / "state.json").read_text())
    assert all(e["state"] == "COMPLETED" for e in state["jobs"].values())
    assert all(len(e["attempts"]) == 1 for e in state["jobs"].values()), {j: e["attempts"] for j, e in state["jobs"].items()
                                                                         if len(e["attempts"]) != 1}
    assert "squeue does not answer" in (run / "run.log").read_text() and "squeue answers again" in (run / "run.log").read_text()


@needs_slurm
def test_a_qos_submit_limit_holds_jobs_in_pita_and_a_refusal_is_retried(tmp_path):
    """QoS tiny allows one queued or running job per user (MaxSubmitJobsPerUser=1, from sacctmgr).
    A job of the user's own already holds it when the run starts: pita's first sbatch is refused
    and tried again with backoff, never a failure; after, one pita job is in flight at a time.
    The other job holds the QoS until the run has said it was refused (not for a fixed time: on a
    loaded machine pita's start took longer than a 12 s job, and nothing was refused)."""
    import sys

    env = _slurm_env()
    other = subprocess.run(["sbatch", "--parsable", "-q", "tiny", "-J", "other", "-o", "/dev/null", "--wrap",
                            "sleep 600"], env=env, capture_output=True, text=True)
    assert other.returncode == 0, other.stderr
    args = [*SYNTH, "synthetic.job_seconds=2", "executor.slurm.qos=tiny", "experiment.name=qos",
            f"system.output_dir={tmp_path}", "executor.progress=plain"]
    with open(tmp_path / "stdout.txt", "w") as outf, open(tmp_path / "stderr.txt", "w") as errf:
        p = subprocess.Popen([sys.executable, str(ROOT / "run_parallel.py"), *args], cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=outf, stderr=errf, text=True)
    try:
        wait_for(lambda: p.poll() is not None or any("trying again in" in f.read_text()
                                                     for f in tmp_path.glob("qos/*/run.log")), timeout=300, step=0.5)
    finally:
        subprocess.run(["scancel", other.stdout.strip()], env=env)
    try:
        p.wait(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
    out, err = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    assert p.returncode == 0, out[-3000:] + err[-3000:]
    run = only_run(tmp_path, "qos")
    log = (run / "run.log").read_text()
    assert "jobs in flight at most 1 (QoS tiny's MaxSubmitJobsPerUser = 1" in log, log[:3000]
    assert "QOSMaxSubmitJobPerUserLimit" in log and "trying again in" in log, log[-3000:]
    state = json.loads((run / "state.json").read_text())
    assert all(e["state"] == "COMPLETED" and len(e["attempts"]) == 1 for e in state["jobs"].values())
    ids = [a["slurm_job"] for e in state["jobs"].values() for a in e["attempts"] if a.get("slurm_job")]
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "Submit,End"], env=env,
                         capture_output=True, text=True)
    spans = sorted(tuple(line.split("|")) for line in out.stdout.splitlines())  # ISO times sort as text
    assert len(spans) == len(ids) and all(b[0] >= a[1] for a, b in zip(spans, spans[1:])), spans  # one in flight


@needs_slurm
def test_a_qos_maxwall_is_read_and_respected(tmp_path):
    """QoS brief: MaxWall 4 min. pita would ask 10 min (min_minutes): it reads the QoS before its
    first sbatch, says so, and every attempt asks 4 min (never pending on
    QOSMaxWallDurationPerJobLimit). GPU limits (GrpTRES, MaxTRESPerUser) are the stand-in tests'
    (tests/test_slurm_faults.py): this cluster does not account gres/gpu."""
    env = _slurm_env()
    r = cli([*SYNTH, "synthetic.job_seconds=2", "executor.slurm.qos=brief", "executor.slurm.min_minutes=10",
             "experiment.name=brief"], tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = only_run(tmp_path, "brief")
    log = (run / "run.log").read_text()
    assert "--time at most 0-00:04:00 (QoS brief's MaxWall = 00:04:00)" in log, log[:3000]
    state = json.loads((run / "state.json").read_text())
    ids = [a["slurm_job"] for e in state["jobs"].values() for a in e["attempts"] if a.get("slurm_job")]
    assert all(a.get("slurm_time") == "0-00:04:00" for e in state["jobs"].values() for a in e["attempts"]
               if a.get("slurm_job")), state
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,Timelimit,Start,End,State"],
                         env=env, capture_output=True, text=True).stdout.split()
    rows = sorted(tuple(line.split("|")) for line in out)
    assert len(rows) == len(ids) and all(row[1] == "00:04:00" for row in rows), rows
    print(f"QoS brief: {len(ids)} Slurm jobs, each Timelimit 00:04:00: {rows}")


@needs_slurm
def test_a_jobs_end_is_read_from_sacct_once_the_controller_is_gone(tmp_path):
    """With the controller stopped (so neither squeue nor scontrol answers), a finished job's end
    state and exit code still come from slurmdbd, in one sacct call for every job asked about."""
    env = _slurm_env()
    ids = []
    for code in (0, 3):
        out = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", f"exit {code}"], env=env,
                             capture_output=True, text=True)
        ids.append(out.stdout.strip())
    for sid in ids:
        _wait_gone_or_ended(env, sid)
    deadline = time.time() + 60
    while time.time() < deadline:  # slurmdbd learns the end a moment after the controller does
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "State"], env=env,
                             capture_output=True, text=True)
        if out.stdout.split() == ["COMPLETED", "FAILED"]:
            break
        time.sleep(1)
    slurm_sh = str(ROOT / "tools" / "slurm.sh")
    subprocess.run([slurm_sh, "stop-ctld"], env=env, check=True)
    try:
        be = SlurmBackend(SlurmSettings())
        assert be._query() is None  # squeue does not answer
        assert be._forgotten(ids) == {ids[0]: ("COMPLETED", 0), ids[1]: ("FAILED", 3)}
        assert be.stats["sacct"] == 1 and be.stats["scontrol"] == 0
    finally:
        subprocess.run([slurm_sh, "start-ctld"], env=env, check=True)


def _wait_gone_or_ended(env, sid: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-j", sid, "-o", "%T"], env=env, capture_output=True,
                             text=True)
        if out.stdout.strip() not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return
        time.sleep(0.5)
    raise AssertionError(f"Slurm job {sid} did not end within {timeout:.0f}s")


def _return_to_service(env, node: str) -> None:
    """The drained node back: Slurm 22.05 takes RESUME or UNDRAIN depending on the state it has
    reached (idle+drain, drained, not responding a moment), so both are tried until sinfo shows it
    usable."""
    if subprocess.run(["scontrol", "update", f"nodename={node}", "state=undrain"], env=env,
                      capture_output=True).returncode != 0:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env, capture_output=True)
    _wait_node_up(env, node)


def _wait_node_up(env, node: str, timeout: float = 120) -> None:
    """Until sinfo shows the node usable and responding (idle, mix or alloc, no '*')."""
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
        state = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True).stdout
        if state.split() and all(s in ("idle", "mix", "alloc") for s in state.split()):
            return
        time.sleep(1.0)
    raise AssertionError(f"node {node} is not in service: sinfo says {state.split()}")


@needs_slurm
def test_a_drained_node_is_not_in_the_inventory(tmp_path):
    env = _slurm_env()
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True).stdout.split()[0]
    _wait_node_up(env, node)  # a node not responding (a controller just restarted) cannot be drained and undrained
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=pita-test"], env=env, check=True)
    try:
        drained = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True).stdout
        r = cli([*SYNTH, "synthetic.job_seconds=1", "experiment.name=drained"], tmp_path, timeout=120)
    finally:
        _return_to_service(env, node)
    assert "drain" in drained, drained
    assert r.returncode == 2, r.stdout + r.stderr
    assert "every node is out of service" in r.stderr and f"{node} drain" in r.stderr, r.stderr
    assert not (tmp_path / "drained").exists()


def _guide_block(marker: str) -> str:
    text = (ROOT / "docs" / "guide.md").read_text()
    return text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def _wait_gone(env, sid: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", sid, "-o", "%T"], env=env, capture_output=True, text=True)
        if not out.stdout.strip():
            return
        time.sleep(1.0)
    raise AssertionError(f"Slurm job {sid} still queued after {timeout:.0f}s")


RECIPE_WORK = ("experiment.workload=synthetic synthetic.algos=[A] synthetic.families=[f] synthetic.datasets=[d] "
               "synthetic.rounds=1 synthetic.gen_shards=1 synthetic.eval_shards=1 executor.slurm.poll_interval_s=0.5 "
               "executor.slurm.min_minutes=2 executor.slurm.pack_below_s=0 executor.progress=plain")


@needs_slurm
def test_the_guides_slurm_recipe_runs_as_written(tmp_path):
    """docs/guide.md's Slurm recipe, command by command, with the synthetic workload added and the
    test cluster's partition for `gpu`: the driver from a login node; the driver as a Slurm job,
    scancelled mid-run (its jobs are cancelled with it, the state saved); squeue; and the driver
    submitted again on the run folder, which finishes the grid."""
    import re
    import shlex

    block = _guide_block("slurm-recipe")
    commands = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.startswith(("#", "`"))]
    assert [c.split(" ")[0] for c in commands] == ["pita", "sbatch", "squeue", "sbatch"]
    env = dict(_slurm_env(), PATH=f"{Path(os.sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT))

    def adapt(cmd: str, seconds: int) -> str:
        cmd = cmd.replace("partition=gpu", "partition=debug").replace("$USER", os.environ.get("USER", "root"))
        work = f"{RECIPE_WORK} synthetic.job_seconds={seconds}"
        if cmd.startswith("sbatch"):  # inside --wrap "...": the run's own overrides
            return re.sub(r'--wrap "([^"]*)"', lambda m: f'--wrap "{m.group(1)} {work}"', cmd)
        return f"{cmd} {work}" if cmd.startswith("pita") else cmd

    r = subprocess.run(adapt(commands[0], 1), shell=True, env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    first = only_run(tmp_path / "outputs", "grid")
    assert all(e["state"] == "COMPLETED" for e in json.loads((first / "state.json").read_text())["jobs"].values())
    import shutil

    shutil.rmtree(tmp_path / "outputs")
    r = subprocess.run(adapt(commands[1], 15), shell=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    driver = re.search(r"Submitted batch job (\d+)", r.stdout).group(1)
    deadline = time.time() + 180
    while not any(row[2] == "RUNNING" for row in _ours(env)) and time.time() < deadline:
        time.sleep(0.5)
    assert _ours(env), "the driver submitted no job"
    subprocess.run(["scancel", driver], env=env, check=True)  # SIGTERM to the driver
    _wait_gone(env, driver, 120)
    deadline = time.time() + 60
    while _ours(env) and time.time() < deadline:
        time.sleep(0.5)
    assert not _ours(env), "the stopped driver left its jobs queued"
    r = subprocess.run(adapt(commands[2], 0), shell=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "outputs", "grid")
    stopped = json.loads((run / "state.json").read_text())
    assert stopped.get("interrupted") and not all(e["state"] == "COMPLETED" for e in stopped["jobs"].values())
    resume = adapt(commands[3], 15).replace("outputs/grid/<time>", shlex.quote(str(run)))
    r = subprocess.run(resume, shell=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    again = re.search(r"Submitted batch job (\d+)", r.stdout).group(1)
    _wait_gone(env, again, 600)
    state = json.loads((run / "state.json").read_text())
    log = (tmp_path / f"pita-driver-{again}.log").read_text()
    assert all(e["state"] == "COMPLETED" for e in state["jobs"].values()), log[-3000:]
    assert "resuming" in log and "0 failed" in log


@needs_slurm
def test_a_requeued_driver_leaves_its_jobs_running_and_continues_its_run_folder(tmp_path):
    # one job in flight: the test node's 2 CPUs leave one for the driver to start again on
    run, running = _requeue_the_driver(tmp_path, job_seconds=45, more="executor.slurm.max_jobs=1")
    assert (run / "run.log").read_text().count("taken over from the earlier driver") >= len(running)


def _requeue_the_driver(tmp_path, job_seconds: int, more: str = ""):
    """The guide's driver job (--requeue --signal=B:USR1@...) requeued mid-run (scontrol requeue,
    as a preemption does): it leaves its Slurm jobs running; when Slurm starts it again it continues
    the same run folder without resume_from, takes the running jobs over (each keeps one attempt)
    and finishes the grid."""
    import re

    block = _guide_block("slurm-recipe")
    [submit] = [ln.strip() for ln in block.splitlines() if ln.startswith("sbatch") and "experiment.name=grid" in ln]
    assert "--requeue" in submit and "--signal=B:USR1@" in submit and '--wrap "exec pita run' in submit
    env = dict(_slurm_env(), PATH=f"{Path(os.sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT))
    cmd = submit.replace("partition=gpu", "partition=debug")
    cmd = re.sub(r'--wrap "([^"]*)"',
                 lambda m: f'--wrap "{m.group(1)} {RECIPE_WORK} synthetic.job_seconds={job_seconds} {more}"', cmd)
    r = subprocess.run(cmd, shell=True, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    driver = re.search(r"Submitted batch job (\d+)", r.stdout).group(1)
    deadline = time.time() + 180
    while not any(row[2] == "RUNNING" for row in _ours(env)) and time.time() < deadline:
        time.sleep(0.5)
    running = {row[0]: row[1] for row in _ours(env) if row[2] == "RUNNING"}
    assert running, "the driver started no job"
    subprocess.run(["scontrol", "requeue", driver], env=env, check=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", driver, "-o", "%T"], env=env, capture_output=True, text=True)
        if out.stdout.strip() == "PENDING":
            break
        time.sleep(0.5)
    still = {row[0] for row in _ours(env)}
    assert set(running) <= still, (running, still)  # the requeued driver cancelled nothing
    subprocess.run(["scontrol", "update", f"JobId={driver}", "StartTime=now"], env=env, check=True)  # not 120 s
    _wait_gone(env, driver, 600)
    [run] = list((tmp_path / "outputs" / "grid").iterdir())  # one run folder: the same one, continued
    state = json.loads((run / "state.json").read_text())
    log = (tmp_path / f"pita-driver-{driver}.log").read_text()
    assert all(e["state"] == "COMPLETED" for e in state["jobs"].values()), log[-3000:]
    assert "leaves" in log and "running for the next driver" in log and f"continuing {run}" in log, log[-3000:]
    for sid, name in running.items():  # taken over (or, if it ended meanwhile, recorded): not submitted again
        attempts = state["jobs"][name[len("pita:"):]]["attempts"]
        assert [(a["status"], a["slurm_job"]) for a in attempts] == [("ok", sid)], attempts
    assert "0 failed" in log
    return run, running


@pytest.mark.solo  # its job takes the whole node, and its `ray stop` ends every Ray process here
@needs_slurm
def test_the_guides_ray_in_slurm_script_runs_as_written(tmp_path):
    """docs/guide.md's batch script for Ray inside a Slurm allocation, submitted on one node with the
    test cluster's 2 GPUs and 2 CPUs (the synthetic workload added to its pita line): Ray starts on
    the allocation, the grid runs on its GPUs, Ray stops, and the job ends COMPLETED."""
    pytest.importorskip("ray")
    script = _guide_block("slurm-ray-recipe").split("```sh", 1)[1].split("```", 1)[0].lstrip("\n")
    assert script.startswith("#!/bin/bash") and "ray start --head" in script and "ray stop" in script
    script = script.replace("executor.ray.address=auto", "executor.ray.address=auto "
                            + RECIPE_WORK.replace(" executor.slurm.poll_interval_s=0.5 executor.slurm.min_minutes=2", "")
                            + " synthetic.job_seconds=1")
    (tmp_path / "ray-grid.sh").write_text(script)
    home = tmp_path / "home"
    home.mkdir()
    env = dict(_slurm_env(), PATH=f"{Path(os.sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT), HOME=str(home), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    r = subprocess.run(["sbatch", "--parsable", "-N", "1", "--gres=gpu:2", "-c", "2", "-o", "ray-%j.log",
                        "ray-grid.sh"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip().split(";")[0]
    _wait_gone(env, sid, 600)
    from pita.core.backends.slurm import SlurmBackend

    log = (tmp_path / f"ray-{sid}.log").read_text()
    assert SlurmBackend.end_state(sid) == ("COMPLETED", 0), log[-3000:]
    state = json.loads((only_run(tmp_path / "outputs", "grid") / "state.json").read_text())
    assert all(e["state"] == "COMPLETED" for e in state["jobs"].values())
    assert len([d for d in state["devices"] if d.get("kind") == "cuda"]) == 2
