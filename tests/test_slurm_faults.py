"""The Slurm backend against Slurm's failures, with stand-in commands on PATH (squeue, sacct,
scontrol, sbatch, scancel: shell scripts whose answers each test sets). No cluster: the default
tier. The real cluster's versions of these are in tests/test_slurm.py (long tier)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from pita.core.backends import slurm
from pita.core.backends.slurm import SlurmBackend, SlurmSettings, node_usable

TOOLS = ("squeue", "sacct", "scontrol", "sbatch", "scancel")


class FakeSlurm:
    """Each command prints ``<dir>/<cmd>.out``, exits with ``<dir>/<cmd>.rc`` (0 when absent),
    sleeps ``<dir>/<cmd>.sleep`` seconds first, and logs its arguments to ``<dir>/calls``."""

    def __init__(self, root: Path):
        self.dir = root / "fake-slurm"
        self.dir.mkdir()
        for tool in TOOLS:
            script = self.dir / tool
            script.write_text(f"""#!/bin/sh
echo "{tool} $*" >> {self.dir}/calls
[ -f {self.dir}/{tool}.sleep ] && sleep "$(cat {self.dir}/{tool}.sleep)"
[ -f {self.dir}/{tool}.out ] && cat {self.dir}/{tool}.out
[ -f {self.dir}/{tool}.err ] && cat {self.dir}/{tool}.err >&2
exit "$(cat {self.dir}/{tool}.rc 2>/dev/null || echo 0)"
""")
            script.chmod(0o755)
        self.set("sbatch", "101")

    def set(self, tool: str, out: str = "", rc: int = 0, err: str = "", sleep: float | None = None) -> None:
        (self.dir / f"{tool}.out").write_text(out + ("\n" if out else ""))
        (self.dir / f"{tool}.rc").write_text(str(rc))
        (self.dir / f"{tool}.err").write_text(err)
        if sleep is None:
            (self.dir / f"{tool}.sleep").unlink(missing_ok=True)
        else:
            (self.dir / f"{tool}.sleep").write_text(str(sleep))

    def calls(self, tool: str | None = None) -> list[str]:
        path = self.dir / "calls"
        lines = path.read_text().splitlines() if path.exists() else []
        return [ln for ln in lines if tool is None or ln.startswith(tool + " ")]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    f = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", f"{f.dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "QUERY_TIMEOUT_S", 0.5)
    monkeypatch.setattr(slurm, "OUTCOME_LOOK_S", 0.0)
    return f


def _launch(tmp_path, job_id="DPO.f.d.r0.train", attempt=1):
    from pita.core.backends.base import Launch
    from pita.core.paths import RunPaths

    run = RunPaths(tmp_path / "run")
    return Launch(job={"id": job_id, "kind": "synthetic.work", "resources": {"devices": 1, "memory_gb": 2.0},
                       "duration_hint": 30.0, "params": {}},
                  target="pita.core.synthetic_kinds:work", attempt=attempt, run_dir=str(run.root), config={},
                  devices=[{"kind": "cuda", "label": "gpu0"}], env={"OMP_NUM_THREADS": "4"}, paths=run.job(job_id),
                  tag=job_id, fingerprint="x")


def _backend(**kw) -> SlurmBackend:
    return SlurmBackend(SlurmSettings(poll_interval_s=0.01, max_poll_interval_s=0.05, outcome_wait_s=0.0, **kw))


def _poll(be: SlurmBackend, times: int = 1) -> list:
    out = []
    for _ in range(times):
        be._next_query = 0.0
        out += be.poll()
    return out


def _two_started(be, fake, tmp_path, first: str, second: str):
    """Jobs A and B started on ``be``, sbatch answering Slurm job ids ``first`` and ``second``."""
    launches = _launch(tmp_path, "A.f.d.r0.train"), _launch(tmp_path, "B.f.d.r0.train")
    for launch, sid in zip(launches, (first, second)):
        fake.set("sbatch", sid)
        be.start(launch)
    return launches


def _finish_outcome(launch, status="ok"):
    launch.paths.dir.mkdir(parents=True, exist_ok=True)
    launch.paths.attempt(launch.attempt).write_text(json.dumps({"status": status, "duration_s": 1.0}))


def test_a_controller_that_fails_or_hangs_changes_no_jobs_state(tmp_path, fake):
    """squeue exiting 1 (slurm_load_jobs error), then hanging past the query timeout, then sacct and
    scontrol failing too: the job stays in flight with the state it had, nothing raises, and the
    interval grows. Once squeue answers, its end is read from the same one call."""
    be = _backend()
    launch = _launch(tmp_path)
    be.start(launch)
    fake.set("squeue", "101|RUNNING|None|0")
    assert _poll(be) == [] and be.subs["DPO.f.d.r0.train"].state == "RUNNING"
    fake.set("squeue", rc=1, err="slurm_load_jobs error: Unable to contact slurm controller")
    fake.set("sacct", rc=1)
    fake.set("scontrol", rc=1)
    assert _poll(be, 3) == [] and be.subs["DPO.f.d.r0.train"].state == "RUNNING"
    fake.set("squeue", "101|COMPLETED|None|0", sleep=2)  # slower than the query timeout: no answer
    assert _poll(be) == [] and be.running() == ["DPO.f.d.r0.train"]
    assert be.stats["failed_queries"] == 4 and be._interval == be.s.max_poll_interval_s
    fake.set("squeue", "101|COMPLETED|None|0")
    _finish_outcome(launch)
    [f] = _poll(be)
    assert (f.job_id, f.status, f.extra["slurm_state"]) == ("DPO.f.d.r0.train", "ok", "COMPLETED")
    # one squeue per poll, for this user's jobs (never the whole table), and no per-job scontrol
    squeues = fake.calls("squeue")
    assert all(" -u " in c and " -j " not in c for c in squeues), squeues
    assert not [c for c in fake.calls("scontrol") if "show job" in c]


def test_a_job_no_command_knows_keeps_its_state_until_its_outcome_or_a_long_silence(tmp_path, fake):
    """squeue answers without the job (MinJobAge passed) and neither sacct nor scontrol knows it:
    it is not ended on that. Its outcome file ends it with the worker's own status; with no
    outcome it is lost only after unknown_s of silence."""
    be = _backend(unknown_s=3600)
    launch = _launch(tmp_path)
    be.start(launch)
    fake.set("squeue", "")
    fake.set("sacct", "")
    fake.set("scontrol", rc=1, err="slurm_load_jobs error: Invalid job id specified")
    assert _poll(be, 3) == [] and be.running() == ["DPO.f.d.r0.train"]
    _finish_outcome(launch)
    [f] = _poll(be)
    assert f.status == "ok" and f.extra["slurm_state"] == "COMPLETED"
    be2 = _backend(unknown_s=0.0)
    other = _launch(tmp_path, "B.f.d.r0.train")
    be2.start(other)
    [g] = _poll(be2, 2)
    assert g.status == "died" and g.extra["slurm_state"] == "UNKNOWN"


def test_sacct_reads_the_end_of_every_forgotten_job_in_one_call(tmp_path, fake):
    be = _backend()
    a, b = _two_started(be, fake, tmp_path, "201", "202")
    fake.set("squeue", "")
    fake.set("sacct", "201|COMPLETED|0:0\n202|FAILED|1:0")
    _finish_outcome(a)
    ended = {f.job_id: f for f in _poll(be)}
    assert ended["A.f.d.r0.train"].status == "ok" and ended["B.f.d.r0.train"].status == "died"
    assert ended["B.f.d.r0.train"].exit_code == 1
    [call] = fake.calls("sacct")
    assert "-j 201,202" in call


def test_an_sbatch_refusal_for_a_limit_is_retried_and_a_final_one_fails_the_job(tmp_path, fake):
    be = _backend()
    launch = _launch(tmp_path)
    fake.set("sbatch", rc=1, err="sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission "
             "failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)")
    be.start(launch)  # no exception: held, to be tried again
    assert be.running() == ["DPO.f.d.r0.train"] and not be.subs
    why, _ = be.queued()["DPO.f.d.r0.train"]
    assert "QOSMaxSubmitJobPerUserLimit" in why and "trying again in 10s" in why
    fake.set("sbatch", "303")
    be.held["DPO.f.d.r0.train"].next_try = 0.0
    fake.set("squeue", "303|PENDING|Priority|0")
    assert _poll(be) == [] and be.subs["DPO.f.d.r0.train"].slurm_id == "303" and not be.held
    fake.set("sbatch", rc=1, err="sbatch: error: Batch job submission failed: Invalid account or account/partition "
             "combination specified")
    with pytest.raises(RuntimeError, match="Invalid account"):
        be.start(_launch(tmp_path, "B.f.d.r0.train"))


def test_jobs_in_flight_stop_at_the_limit_and_the_rest_wait_in_pita(tmp_path, fake):
    be = _backend(max_jobs=1)
    a, b = _launch(tmp_path, "A.f.d.r0.train"), _launch(tmp_path, "B.f.d.r0.train")
    be.start(a)
    be.start(b)
    assert list(be.subs) == ["A.f.d.r0.train"] and list(be.held) == ["B.f.d.r0.train"]
    assert "executor.slurm.max_jobs: 1" in be.queued()["B.f.d.r0.train"][0]
    fake.set("squeue", "101|COMPLETED|None|0")
    _finish_outcome(a)
    fake.set("sbatch", "102")
    [f] = _poll(be)
    assert f.job_id == "A.f.d.r0.train" and list(be.subs) == ["B.f.d.r0.train"] and not be.held
    assert len(fake.calls("sbatch")) == 2


def test_out_of_memory_runs_again_with_more_memory_then_fails_naming_the_keys(tmp_path, fake):
    be = _backend(oom_mem_retries=2, oom_mem_factor=1.5)
    mems = []
    for attempt in (1, 2, 3):
        launch = _launch(tmp_path, attempt=attempt)
        be.start(launch)
        mems.append(be.subs["DPO.f.d.r0.train"].mem_gb)
        fake.set("squeue", "101|OUT_OF_MEMORY|OutOfMemory|9")
        [f] = _poll(be)
        if attempt < 3:
            assert f.status == "lost" and "ran out of host memory" in f.error and f"{attempt} of" in f.error
    assert mems == [4.0, 6.0, 9.0]  # executor.slurm.mem_gb, then 1.5x each time
    assert f.status == "error" and "executor.slurm.oom_mem_retries" in f.error


def test_a_pending_reason_that_never_clears_ends_the_job_with_it(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(slurm, "NEVER_CLEARS_AFTER_S", 0.0)
    be = _backend()
    be.start(_launch(tmp_path))
    fake.set("squeue", "101|PENDING|BadConstraints|0")
    assert _poll(be) == []
    assert any(c == "scancel 101" for c in fake.calls("scancel"))
    fake.set("squeue", "101|CANCELLED|BadConstraints|15")
    [f] = _poll(be)
    assert f.status == "error" and "never clears" in f.error and "BadConstraints" in f.error


@pytest.mark.parametrize("state,status", [("PREEMPTED", "lost"), ("NODE_FAIL", "lost"), ("BOOT_FAIL", "lost"),
                                          ("DEADLINE", "lost"), ("SPECIAL_EXIT", "lost"), ("TIMEOUT", "lost")])
def test_every_slurm_end_state_is_mapped(tmp_path, fake, state, status):
    be = _backend()
    be.start(_launch(tmp_path))
    fake.set("squeue", f"101|{state}|None|0")
    [f] = _poll(be)
    assert f.status == status and state in f.error


def test_a_persons_scancel_is_final_and_names_who_while_pitas_own_cancel_is_not_theirs(tmp_path, fake):
    """CANCELLED that pita did not send: "cancelled", with sacct's "CANCELLED by <uid>" read as the
    uid and its name; where sacct does not say, "by a person". A job pita itself killed ends with
    pita's status and no cancelled_by (it is not a person's word)."""
    import pwd

    be = _backend()
    be.start(_launch(tmp_path))
    fake.set("squeue", "101|CANCELLED|None|0")
    fake.set("sacct", f"CANCELLED by {os.getuid()}")
    [f] = _poll(be)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert f.status == "cancelled" and f.extra["cancelled_by"] == f"by uid {os.getuid()} ({me})", f.extra
    assert f"Slurm job 101 was cancelled by uid {os.getuid()} ({me}) (scancel), not by pita: final" in f.error
    be2 = _backend()
    be2.start(_launch(tmp_path, "B.f.d.r0.train"))
    fake.set("sacct", "")
    [g] = _poll(be2)
    assert g.status == "cancelled" and g.extra["cancelled_by"] == "by a person (sacct does not say who)"
    be3 = _backend()
    be3.start(_launch(tmp_path, "C.f.d.r0.train"))
    fake.set("squeue", "101|RUNNING|None|0")
    _poll(be3)
    be3.kill("C.f.d.r0.train", status="timeout", reason="timed out after 5s")
    fake.set("squeue", "101|CANCELLED|None|0")
    [h] = _poll(be3)
    assert h.status == "timeout" and "cancelled_by" not in h.extra


@pytest.mark.parametrize("state", ["SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING", "COMPLETING", "STOPPED"])
def test_states_that_go_on_keep_the_job_in_flight(tmp_path, fake, state):
    be = _backend()
    be.start(_launch(tmp_path))
    fake.set("squeue", f"101|{state}|None|0")
    assert _poll(be, 2) == [] and be.subs["DPO.f.d.r0.train"].state == state


def test_an_attempt_asks_for_a_warning_before_its_limit_and_its_own_log_and_threads(tmp_path, fake):
    be = _backend(cpus_per_job=3, signal_margin_s=120)
    launch = _launch(tmp_path)
    be.start(launch)
    script = (launch.paths.dir / "slurm-1.sh").read_text()
    assert "--signal=B:USR1@120" in script and f"-o {launch.paths.dir}/attempt-1.log" in script
    assert "export OMP_NUM_THREADS=3" in script and "export PITA_SLURM_SIGNALS=1" in script
    (launch.paths.dir / "attempt-1.log").write_text("line of attempt 1\n")
    fake.set("squeue", "101|COMPLETED|None|0")
    _finish_outcome(launch)
    _poll(be)
    assert "=== attempt 1: Slurm job 101, COMPLETED" in launch.paths.log.read_text()
    assert "line of attempt 1" in launch.paths.log.read_text()


def test_the_poll_interval_grows_while_nothing_changes_and_returns_after_a_submission(tmp_path, fake):
    be = SlurmBackend(SlurmSettings(poll_interval_s=5, max_poll_interval_s=60))
    be.start(_launch(tmp_path))
    fake.set("squeue", "101|PENDING|Priority|0")
    seen = []
    for _ in range(6):
        be._next_query = 0.0
        be.poll()
        seen.append(be._interval)
    assert seen == [10, 20, 40, 60, 60, 60]
    be.start(_launch(tmp_path, "B.f.d.r0.train"))
    assert be._interval == 5


def test_a_driver_in_a_slurm_job_leaves_its_jobs_running_only_when_slurm_requeues_it(fake, monkeypatch):
    be = _backend()
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert be.driver_leaving(signal.SIGTERM) is None  # not a Slurm job: a stop ends the jobs
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    fake.set("scontrol", "JobId=77 JobState=COMPLETING Restarts=0")
    assert be.driver_leaving(signal.SIGTERM) is None  # scancel
    assert be.driver_leaving(signal.SIGINT) is None
    fake.set("scontrol", "JobId=77 JobState=RUNNING Restarts=0 PreemptTime=None")
    assert be.driver_leaving(signal.SIGTERM) is None  # a scancel sets no PreemptTime
    fake.set("scontrol", "JobId=77 JobState=RUNNING Restarts=0 PreemptTime=2026-12-03T10:00:00")
    assert "PreemptMode=CANCEL" in be.driver_leaving(signal.SIGTERM)  # preempted, not requeued: jobs go on
    fake.set("scontrol", "JobId=77 JobState=COMPLETING Restarts=1")
    assert "requeues" in be.driver_leaving(signal.SIGTERM)
    assert "time limit" in be.driver_leaving(signal.SIGUSR1)
    fake.set("scontrol", rc=1)
    assert "does not answer" in be.driver_leaving(signal.SIGTERM)


def test_out_of_service_nodes_and_exit_statuses_are_read_as_slurm_writes_them():
    assert [node_usable(s) for s in ("idle", "mix", "alloc", "idle*", "drain", "drng", "down*", "maint", "fail")] == [
        True, True, True, True, False, False, False, False, False]
    assert [slurm._wait_status(c) for c in ("0", "768", "9", "3:0", "0:15", "")] == [0, 3, -9, 3, -15, None]


def test_a_timeout_asks_twice_the_limit_once_a_resume_keeps_it_and_a_second_fails(tmp_path, fake):
    """The first TIMEOUT: lost, the next attempt asks twice the limit; a new driver of the run (a
    resume: a new backend) asks the doubled limit too (slurm-sizing.json in the job's folder); a
    second TIMEOUT fails the job naming the keys, instead of doubling again (a hung job would cost
    63x its first limit)."""
    be = _backend(min_minutes=10)
    be.start(_launch(tmp_path))
    first = slurm.slurm_seconds(be.subs["DPO.f.d.r0.train"].time_limit)
    fake.set("squeue", "101|TIMEOUT|TimeLimit|15")
    [f] = _poll(be)
    assert f.status == "lost" and "time limit" in f.error and "once" in f.error
    resumed = _backend(min_minutes=10)
    resumed.start(_launch(tmp_path, attempt=2))
    assert slurm.slurm_seconds(resumed.subs["DPO.f.d.r0.train"].time_limit) == 2 * first
    [g] = _poll(resumed)
    assert g.status == "error" and "again, after its limit was doubled once" in g.error, g.error
    assert "executor.slurm.time_margin" in g.error
    resumed.start(_launch(tmp_path, attempt=3))  # run again by hand (a resume): still twice, never 4x
    assert slurm.slurm_seconds(resumed.subs["DPO.f.d.r0.train"].time_limit) == 2 * first


def test_a_timeout_at_the_longest_limit_slurm_gives_fails_at_once(tmp_path, fake):
    be = _backend(min_minutes=10, max_time_s=600.0)  # MaxTime (or the QoS's MaxWall) is the 10 min asked
    be.start(_launch(tmp_path))
    assert be.subs["DPO.f.d.r0.train"].time_limit == "0-00:10:00"
    fake.set("squeue", "101|TIMEOUT|TimeLimit|15")
    [f] = _poll(be)
    assert f.status == "error" and "at the longest limit Slurm gives it (0-00:10:00" in f.error, f.error


def test_an_accounting_refusal_that_waiting_cannot_clear_fails_at_once_with_the_keys(tmp_path, fake):
    """Slurm's generic accounting refusal with nothing of the run in flight and no submit limit set
    (no accounting here): final, status "error" (no crash retry), naming what the request asked
    and the keys. A refusal naming a per-job limit is final too; with a job of the run in flight
    the generic one is held and tried again (a submit limit your jobs fill)."""
    generic = ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, "
               "user's size and/or time limits)")
    fake.set("scontrol", "AccountingStorageType = accounting_storage/none")
    be = _backend()
    fake.set("sbatch", rc=1, err=generic)
    with pytest.raises(slurm.SlurmRefused) as e:
        be.start(_launch(tmp_path))
    assert e.value.status == "error" and "no job of this run is in flight" in str(e.value)
    assert "--time=" in str(e.value) and "executor.slurm.qos" in str(e.value)
    fake.set("sbatch", rc=1, err="sbatch: error: QOSMaxWallDurationPerJobLimit\n" + generic)
    with pytest.raises(slurm.SlurmRefused, match="QOSMaxWallDurationPerJobLimit is a per-job limit"):
        be.start(_launch(tmp_path, "B.f.d.r0.train"))
    fake.set("sbatch", "301")
    be.start(_launch(tmp_path, "C.f.d.r0.train"))
    fake.set("sbatch", rc=1, err=generic)
    be.start(_launch(tmp_path, "D.f.d.r0.train"))  # C is in flight: held, tried again later
    assert "D.f.d.r0.train" in be.held and "trying again in" in be.queued()["D.f.d.r0.train"][0]


def _sacctmgr(fake, assoc: str, qos: str) -> None:
    (fake.dir / "sacctmgr").write_text(f"""#!/bin/sh
echo "sacctmgr $*" >> {fake.dir}/calls
case "$*" in *"show qos"*) printf '%s\\n' '{qos}';; *"show assoc"*) printf '%s\\n' '{assoc}';; esac
""")
    (fake.dir / "sacctmgr").chmod(0o755)
    fake.set("scontrol", "AccountingStorageType = accounting_storage/slurmdbd")


def test_the_associations_and_qos_limits_are_read_and_set_the_runs_limits(tmp_path, fake):
    """sacctmgr's MaxJobs, GrpTRES (GPUs), MaxTRESPU and MaxWall of the association and the QoS:
    the smallest of each applies; MaxWall below the partition's MaxTime caps --time."""
    _sacctmgr(fake, "acct||normal,long|long|||6||gres/gpu=16,cpu=64|2-00:00:00",
              "long||||||gres/gpu=8|12:00:00")
    s = SlurmSettings(account="acct", max_time_s=3 * 86400.0, max_jobs=100)  # MaxJobs lowers it
    lim = slurm.account_limits(s)
    assert lim.running == (6, "association acct's MaxJobs = 6")
    assert lim.gpus == (8, "QoS long's MaxTRESPerUser gres/gpu=8")
    assert lim.wall_s == (43200.0, "QoS long's MaxWall = 12:00:00") and lim.submit is None
    be = SlurmBackend(s)
    notes = slurm.in_flight_limits(be, [{"name": "n1", "gpus": 8, "usable": True}], cuda=True)
    assert s.max_time_s == 43200.0 and be.cap == 6 and be.gpu_cap == 8, notes
    assert any("--time at most 0-12:00:00 (QoS long's MaxWall" in n for n in notes)
    assert any("GPUs in flight at most 8" in n for n in notes)


def test_gpus_in_flight_stop_at_the_qos_limit_and_smaller_jobs_still_go(tmp_path, fake):
    be = _backend()
    be.set_gpu_limit(3, "QoS long's MaxTRESPerUser gres/gpu=3")

    def launch(job_id, gpus):
        la = _launch(tmp_path, job_id)
        la.devices = [{"kind": "cuda", "label": f"gpu{i}"} for i in range(gpus)]
        la.job["resources"]["devices"] = gpus
        return la

    fake.set("sbatch", "101")
    be.start(launch("A.f.d.r0.train", 2))
    fake.set("sbatch", "102")
    be.start(launch("B.f.d.r0.train", 2))  # 2 + 2 > 3: held by pita
    assert list(be.subs) == ["A.f.d.r0.train"] and "gres/gpu=3" in be.queued()["B.f.d.r0.train"][0]
    be.start(launch("C.f.d.r0.train", 1))  # 2 + 1 fits
    assert sorted(be.subs) == ["A.f.d.r0.train", "C.f.d.r0.train"]
    fake.set("squeue", "101|COMPLETED|None|0\n102|PENDING|None|0")
    _finish_outcome(be.subs["A.f.d.r0.train"].launch)
    _poll(be)
    assert "B.f.d.r0.train" in be.subs and not be.held


def test_the_default_jobs_in_flight_are_a_modest_share_of_the_partition(tmp_path, fake):
    fake.set("scontrol", "AccountingStorageType = accounting_storage/none")
    nodes = [{"name": f"n{i}", "gpus": 8, "usable": True} for i in range(8)]  # 64 GPUs
    be = SlurmBackend(SlurmSettings())
    notes = slurm.in_flight_limits(be, nodes, cuda=True)
    assert be.cap == 16 and "executor.slurm.max_share=0.25 of the partition's 64 usable devices" in be.cap_why, notes
    small = SlurmBackend(SlurmSettings())
    slurm.in_flight_limits(small, nodes[:1], cuda=True)
    assert small.cap == 4  # 8 GPUs: a quarter is 2, and never fewer than 4
    tiny = SlurmBackend(SlurmSettings())
    slurm.in_flight_limits(tiny, [{"name": "n0", "gpus": 4, "usable": True}], cuda=True)
    assert tiny.cap is None  # 4 GPUs: all may be in flight
    mine = SlurmBackend(SlurmSettings(max_jobs=40))
    slurm.in_flight_limits(mine, nodes, cuda=True)
    assert mine.cap == 40


def test_a_stopping_driver_cancels_every_job_in_one_call_without_waiting(tmp_path, fake):
    be = _backend()
    a, b = _two_started(be, fake, tmp_path, "401", "402")
    _finish_outcome(a)  # it finished as the driver stopped: it counts
    ended = {f.job_id: f.status for f in be.shutdown(grace_s=30)}
    assert ended == {"A.f.d.r0.train": "ok", "B.f.d.r0.train": "cancelled"}
    assert fake.calls("scancel") == ["scancel 401 402"] and not be.running()


def test_the_inventory_follows_nodes_that_drain_and_return(tmp_path, fake, monkeypatch):
    """follow_nodes + refresh: one sinfo every partition_refresh_s (none between); a node that
    drains takes its GPUs out of the inventory with the state named, one that returns adds new
    GPUs; a sinfo that does not answer changes nothing."""
    from pita.core.gpu_manager import GPUManager

    sinfo = fake.dir / "sinfo"
    sinfo.write_text(f"#!/bin/sh\necho \"sinfo $*\" >> {fake.dir}/calls\ncat {fake.dir}/sinfo.out\n"
                     f"exit \"$(cat {fake.dir}/sinfo.rc 2>/dev/null || echo 0)\"\n")
    sinfo.chmod(0o755)
    be = _backend(partition_refresh_s=60)
    gpus = GPUManager.from_inventory(4, 80e9)
    be.follow_nodes([{"name": "a", "gpus": 2, "usable": True, "state": "idle"},
                     {"name": "b", "gpus": 2, "usable": True, "state": "mix"},
                     {"name": "c", "gpus": 2, "usable": False, "state": "drain"}], gpus.devices)
    fake.set("sinfo", "a|idle|gpu:2\nb|drng|gpu:h100:2(S:0)\nc|drain|gpu:2")
    assert be.refresh() == ([], {})  # not yet: read at most every partition_refresh_s
    be._nodes_read = 0
    added, lost = be.refresh()
    assert added == [] and sorted(lost) == [2, 3] and "node b is drng" in lost[2]
    be._nodes_read = 0
    fake.set("sinfo", rc=1)
    assert be.refresh() == ([], {})
    be._nodes_read = 0
    fake.set("sinfo", "a|idle|gpu:2\nb|idle|gpu:2\nc|idle|gpu:2")
    added, lost = be.refresh()
    assert added == [4, 5, 6, 7] and lost == {}
    assert [d.ordinal for d in be.devices(ordinals=added)] == added and all(d.total_bytes == 80e9
                                                                           for d in be.devices(ordinals=added))
    assert len(fake.calls("sinfo")) == 3
