"""Memory estimates that learn (pita.core.memlearn): the estimator by hand, its key, its units,
and the executor using it: learning, ignoring failures and OOM retries, falling back after an
OOM, the switch, the state and resume."""

from __future__ import annotations

import json
import math

import pytest

from helpers import run_graph
from pita.core.graph import JobGraph
from pita.core.job import Job, Resources
from pita.core.memlearn import (CUDA_CONTEXT_BYTES, LEARN_QUANTUM_BYTES, MemoryLearner, device_peak,
                                learned_estimate, memory_key)

GB = 10**9


def J(jid, mem_gb=40.0, kind="synthetic.work", devices=1, deps=(), **params):
    return Job(id=jid, kind=kind, deps=list(deps), params=params, resources=Resources(devices, mem_gb))


def learner(jobs, cap_gb=95.0, unit="gpu", **kw):
    return MemoryLearner(JobGraph(jobs).validate(check_kinds=False), unit, int(cap_gb * GB), **kw)


def by_hand(peak_bytes):
    """max peak x 1.2 + 256 MiB, rounded up to 64 MiB."""
    return math.ceil((peak_bytes * 1.2 + 256 * 2**20) / (64 * 2**20)) * 64 * 2**20


# ---------------------------------------------------------------- the estimator
def test_two_measured_jobs_lower_the_estimate_with_the_margin():
    m = learner([J(f"j{i}", 40) for i in range(4)])
    assert m.observe("j0", 9 * GB) is None  # one job may raise an estimate, not lower it
    assert m.estimate("j3") == 40 * GB
    c = m.observe("j1", 10 * GB)
    assert (c.old, c.new, c.jobs, c.max_peak) == (40 * GB, by_hand(10 * GB), 2, 10 * GB)
    assert m.estimate("j2") == m.estimate("j3") == by_hand(10 * GB) == 12_280_922_112
    assert m.is_lowered("j2")
    assert "40.00 -> 12.28 GB, learned from 2 finished jobs" in c.line()
    assert m.observe("j1", 30 * GB) is None  # the same job counts once
    assert m.estimate("j2") == by_hand(10 * GB)


def test_a_larger_peak_raises_the_estimate_at_once():
    m = learner([J(f"j{i}", 10) for i in range(3)])
    c = m.observe("j0", 12 * GB)
    assert c.new == by_hand(12 * GB) > 10 * GB and m.estimate("j1") == c.new and not m.is_lowered("j1")


def test_learned_estimates_keep_a_floor_and_a_cap():
    m = learner([J(f"j{i}", 40) for i in range(3)], cap_gb=50)
    m.observe("j0", 1)
    m.observe("j1", 1)
    assert m.estimate("j2") == 10 * GB  # a quarter of the planned 40 GB, however small the peaks
    assert learned_estimate(1, 0, 10**12) == 5 * LEARN_QUANTUM_BYTES  # 256 MiB + 1.2 bytes, rounded up
    m2 = learner([J(f"j{i}", 40) for i in range(2)], cap_gb=50)
    m2.observe("j0", 70 * GB)
    assert m2.estimate("j1") == 50 * GB  # never above the largest device's usable memory


def test_learning_off_measures_but_keeps_the_planned_estimate():
    m = learner([J(f"j{i}", 40) for i in range(3)], enabled=False)
    assert m.observe("j0", 5 * GB) is None and m.observe("j1", 5 * GB) is None
    assert m.estimate("j2") == 40 * GB
    [entry] = m.summary().values()
    assert entry["jobs"] == 2 and entry["estimate_gb"] == 40 and "off" in entry["status"]


def test_an_oom_on_a_lowered_estimate_goes_back_to_the_planned_one_for_good():
    m = learner([J(f"j{i}", 40) for i in range(5)])
    m.observe("j0", 10 * GB)
    m.observe("j1", 10 * GB)
    assert m.is_lowered("j2")
    c = m.distrust("j2")
    assert (c.old, c.new, c.why) == (by_hand(10 * GB), 40 * GB, "oom") and "back to the planned 40.00 GB" in c.line()
    assert m.estimate("j3") == 40 * GB
    assert m.observe("j3", 10 * GB) is None and m.estimate("j4") == 40 * GB  # never lowered again
    assert m.observe("j2", 45 * GB).new == by_hand(45 * GB)  # but a peak above the plan still raises it
    assert "ran out of memory" not in m.summary()[m.key_of["j4"]]["status"]  # now: raised


def test_jobs_on_several_devices_and_host_jobs_keep_their_plan():
    m = learner([J("gang", 40, devices=2), J("host", 0, devices=0)])
    assert m.key_of == {"gang": None, "host": None}
    assert m.observe("gang", GB) is None and m.estimate("gang") == 40 * GB


# ---------------------------------------------------------------- the key
def _key(job, **kinds):
    return memory_key(job, "gpu", kinds)


def test_memory_key_separates_what_drives_memory():
    base = J("a", 10, request={"policy": {"model": "/m/ref"}, "dataset": {"name": "gsm8k"}}, batch_size=8, seed=1)
    same = J("b", 10, request={"policy": {"model": "/m/ref"}, "dataset": {"name": "gsm8k"}}, batch_size=8, seed=2,
             chunks=[3, 4], n_examples=7)
    assert _key(base) == _key(same)  # seeds, shard ranges and sizes of the data do not change memory
    for other in [J("c", 10, request={"policy": {"model": "/m/big"}, "dataset": {"name": "gsm8k"}}, batch_size=8),
                  J("d", 10, request={"policy": {"model": "/m/ref"}, "dataset": {"name": "tldr"}}, batch_size=8),
                  J("e", 10, request={"policy": {"model": "/m/ref"}, "dataset": {"name": "gsm8k"}}, batch_size=16),
                  J("f", 12, request={"policy": {"model": "/m/ref"}, "dataset": {"name": "gsm8k"}}, batch_size=8),
                  J("g", 10, kind="synthetic.merge", request={"policy": {"model": "/m/ref"},
                                                              "dataset": {"name": "gsm8k"}}, batch_size=8)]:
        assert _key(other) != _key(base), other.id
    assert memory_key(base, "gpu") != memory_key(base, "rss")  # another unit is another measurement


def test_a_model_trained_by_an_earlier_job_counts_as_that_jobs_kind():
    r0 = J("DPO.r0.eval.s0", 10, request={"policy": {"model_from_job": "DPO.r0.train"}})
    r1 = J("DPO.r1.eval.s0", 10, request={"policy": {"model_from_job": "DPO.r1.train"}})
    grpo = J("GRPO.r0.eval.s0", 10, request={"policy": {"model_from_job": "GRPO.r0.train"}})
    kinds = {"DPO.r0.train": "algo.dpo_train", "DPO.r1.train": "algo.dpo_train", "GRPO.r0.train": "algo.grpo_train"}
    assert memory_key(r0, "gpu", kinds) == memory_key(r1, "gpu", kinds) != memory_key(grpo, "gpu", kinds)


# ---------------------------------------------------------------- units
def test_device_peak_uses_the_unit_of_the_devices_capacity():
    gpu = {"peak_gpu_bytes": 3 * GB, "peak_gpu_reserved_bytes": 4 * GB, "peak_rss_bytes": 9 * GB}
    assert device_peak(gpu, "gpu") == 4 * GB + CUDA_CONTEXT_BYTES  # reserved, plus the context torch omits
    assert device_peak(gpu, "gpu", sampled_bytes=6 * GB) == 6 * GB  # NVML saw more (a child process)
    assert device_peak({"peak_gpu_bytes": 3 * GB}, "gpu") == 3 * GB + CUDA_CONTEXT_BYTES  # older records
    assert device_peak({"peak_rss_bytes": 9 * GB}, "gpu") is None  # host memory says nothing of a GPU's
    assert device_peak({"peak_rss_bytes": 2 * GB, "peak_rss_children_bytes": 3 * GB}, "rss") == 3 * GB
    assert device_peak(dict(gpu, peak_declared_bytes=GB), "gpu") == GB
    assert device_peak({}, "rss") is None


# ---------------------------------------------------------------- the executor
def _jobs(n, planned=4.0, peak=1.0, seconds=0.0, **params):
    return [J(f"j{i}", planned, seconds=seconds, peak_gb=peak, **params) for i in range(n)]


def _mem(state, jid):
    return [a.get("memory") for a in state["jobs"][jid]["attempts"]]


def test_executor_co_places_later_jobs_once_learned_and_says_so(tmp_path):
    """One 8 GB device (7.6 usable), jobs planned at 4 GB that peak at 1 GB (declared by the job,
    through the worker's outcome): the first two run one at a time, the other four together."""
    jobs = _jobs(6, seconds=1.5)
    summary, state, run = run_graph(jobs, tmp_path, devices=1)
    assert summary.exit_code == 0
    reserved = {j: _mem(state, j)[0]["reserved_bytes"] for j in state["jobs"]}
    assert reserved["j0"] == reserved["j1"] == 4 * GB
    assert {reserved[f"j{i}"] for i in range(2, 6)} == {by_hand(GB)}
    assert _mem(state, "j0")[0] == {"key": _mem(state, "j0")[0]["key"], "reserved_bytes": 4 * GB, "lowered": False,
                                    "peak_bytes": GB, "unit": "rss", "learn": True}
    starts = sorted(state["jobs"][f"j{i}"]["attempts"][0]["start"] for i in range(2, 6))
    ends = sorted(state["jobs"][f"j{i}"]["attempts"][0]["end"] for i in range(2, 6))
    assert starts[-1] < ends[0]  # the four overlapped
    text = run.run_log.read_text()
    assert "memory estimate for synthetic.work jobs like j0: 4.00 -> 1.48 GB, learned from 2 finished jobs" in text
    assert "reserving 1.48 GB per device (learned; planned 4.00 GB)" in text
    [entry] = state["memory_estimates"].values()
    assert (entry["planned_gb"], entry["estimate_gb"], entry["jobs"], entry["status"]) == (4.0, 1.476, 6, "learned")
    assert state["memory_learning"] == {"enabled": True, "unit": "rss"}


def test_failed_and_oom_retried_jobs_teach_nothing(tmp_path):
    """``bad0`` and ``bad1`` (longer critical path: they run first) fail after declaring their
    peak, ``o`` completes only after OOM retries: none of them is measured, so ``j0`` and ``j1``
    still reserve the planned estimate."""
    bad = [Job(f"bad{i}", "synthetic.work", params={"peak_gb": 0.5, "fail": True}, duration_hint=5.0,
               resources=Resources(1, 4.0)) for i in range(2)]
    o = Job("o", "synthetic.oom", params={"batch_size": 8, "fits": 2, "peak_gb": 0.5}, duration_hint=5.0,
            resources=Resources(1, 4.0))
    o2 = Job("o2", "synthetic.oom", params={"batch_size": 8, "fits": 8, "peak_gb": 0.5}, deps=["o"],
             resources=Resources(1, 4.0))
    jobs = bad + [o, o2] + [J(f"j{i}", 4.0, peak_gb=0.5) for i in range(2)]
    summary, state, run = run_graph(jobs, tmp_path, backend="inline", devices=1)
    assert [state["jobs"][f"bad{i}"]["state"] for i in range(2)] == ["FAILED", "FAILED"]
    assert [m["learn"] for m in _mem(state, "bad0")] == [False]
    assert [(m["learn"], a["batch_size"]) for m, a in zip(_mem(state, "o"), state["jobs"]["o"]["attempts"])] == \
        [(False, 8), (False, 4), (False, 2)]
    assert _mem(state, "o2")[0]["reserved_bytes"] == 4 * GB  # o taught its key nothing
    for j in ("j0", "j1"):
        assert _mem(state, j)[0]["reserved_bytes"] == 4 * GB
    work = [e for e in state["memory_estimates"].values() if e["kind"] == "synthetic.work"]
    assert [e["jobs"] for e in work] == [2]  # j0 and j1 only


def test_an_oom_on_a_learned_estimate_retries_as_planned_then_keeps_the_plan(tmp_path):
    jobs = [Job(f"a{i}", "synthetic.oom", params={"batch_size": 4, "fits": 4, "peak_gb": 1.0},
                resources=Resources(1, 4.0)) for i in range(2)]
    jobs.append(Job("b", "synthetic.oom", params={"batch_size": 4, "fits": 4, "peak_gb": 1.0, "oom_attempts": 1},
                    deps=["a0", "a1"], resources=Resources(1, 4.0)))
    jobs.append(Job("c", "synthetic.oom", params={"batch_size": 4, "fits": 4, "peak_gb": 1.0}, deps=["b"],
                    resources=Resources(1, 4.0)))
    summary, state, run = run_graph(jobs, tmp_path, backend="inline", devices=1)
    assert summary.exit_code == 0
    b = state["jobs"]["b"]["attempts"]
    assert [(a["status"], a["batch_size"], a["memory"]["reserved_bytes"], a["memory"]["lowered"]) for a in b] == \
        [("oom", 4, by_hand(GB), True), ("ok", 4, 4 * GB, False)]  # same batch, planned estimate
    assert b[1]["memory"]["learn"] is False
    assert _mem(state, "c")[0]["reserved_bytes"] == 4 * GB
    text = run.run_log.read_text()
    assert "back to the planned 4.00 GB" in text and "retrying with the planned 4.00 GB and the same batch_size" in text
    [entry] = state["memory_estimates"].values()
    assert entry["estimate_gb"] == 4.0 and "ran out of memory" in entry["status"]


def test_a_sigkill_on_a_learned_estimate_also_puts_the_plan_back(tmp_path):
    """On host memory the OOM killer's SIGKILL is what running out looks like: ``b`` is killed
    while admitted on the lowered estimate, its key goes back to the plan, and the crash rules
    retry it (at the planned estimate); ``c`` then reserves the plan too."""
    def K(jid, deps=(), **p):
        return Job(jid, "synthetic.kill", params={"peak_gb": 1.0, "kill_attempts": 0, **p}, deps=list(deps),
                   resources=Resources(1, 4.0))

    jobs = [K("a0"), K("a1"), K("b", ["a0", "a1"], kill_attempts=1), K("c", ["b"])]
    summary, state, run = run_graph(jobs, tmp_path, devices=1, crash_retries=1)
    assert summary.exit_code == 0
    b = state["jobs"]["b"]["attempts"]
    assert [(a["status"], a["exit_code"], a["memory"]["reserved_bytes"]) for a in b] == \
        [("died", -9, by_hand(GB)), ("ok", 0, 4 * GB)]
    assert _mem(state, "c")[0]["reserved_bytes"] == 4 * GB
    assert "back to the planned 4.00 GB" in run.run_log.read_text()


def test_learn_memory_false_reserves_the_planned_estimates(tmp_path):
    summary, state, run = run_graph(_jobs(4), tmp_path, backend="inline", devices=1, learn_memory=False)
    assert {_mem(state, j)[0]["reserved_bytes"] for j in state["jobs"]} == {4 * GB}
    assert state["memory_learning"]["enabled"] is False
    assert "memory estimate for" not in run.run_log.read_text()


def test_learned_estimates_come_back_from_the_store_on_resume(tmp_path, capsys):
    """The first run finishes j0 and j1; the resumed one (the same folder, two more jobs) starts
    with the estimate their recorded peaks give, and pita status shows it."""
    summary, state, run = run_graph(_jobs(2), tmp_path, backend="inline", devices=1)
    assert summary.exit_code == 0
    summary, state, run = run_graph(_jobs(4), tmp_path, backend="inline", devices=1, run=run)
    assert len(state["jobs"]["j0"]["attempts"]) == 1  # not re-run
    for j in ("j2", "j3"):
        assert _mem(state, j)[0]["reserved_bytes"] == by_hand(GB)
    assert "learned from 2 job(s) of the earlier run(s) of this folder" in run.run_log.read_text()
    from pita.cli import status_main

    assert status_main(str(run.root)) == 0
    out = capsys.readouterr().out
    assert "memory estimates (learned from measured peaks" in out
    assert "synthetic.work like j0: planned 4.00 GB, now 1.48 GB, max peak 1.00 GB over 4 job(s) (learned)" in out


def test_resume_keeps_an_oom_on_a_lowered_estimate():
    jobs = [J(f"j{i}", 40) for i in range(4)]
    m = learner(jobs)
    key = m.key_of["j0"]
    ok = {"status": "ok", "memory": {"key": key, "peak_bytes": 10 * GB, "learn": True}}
    saved = {"j0": {"attempts": [ok]}, "j1": {"attempts": [ok]},
             "j2": {"attempts": [{"status": "oom", "memory": {"key": key, "lowered": True}}]},
             "j3": {"attempts": [{"status": "died", "exit_code": -9, "memory": {"key": key, "lowered": True}}]},
             "gone": {"attempts": [ok]}}
    assert m.restore(saved) == []  # learned, then back to the plan: nothing moved in the end
    assert m.estimate("j3") == 40 * GB
    m2 = learner(jobs)
    [c] = m2.restore({k: v for k, v in saved.items() if k not in ("j2", "j3")})
    assert (c.new, c.jobs, c.why) == (by_hand(10 * GB), 2, "restored")
    assert learner(jobs, unit="rss").restore(saved) == []  # measured in another unit
    m3 = learner(jobs)
    assert m3.restore({k: v for k, v in saved.items() if k != "j2"}) == []  # SIGKILLed, as the OOM killer does
    assert m3.estimate("j3") == 40 * GB


# ---------------------------------------------------------------- configuration
def test_bad_values_name_the_key():
    from pita.cli import check_overrides
    from pita.core.errors import ConfigError

    with pytest.raises(ConfigError) as ei:
        check_overrides(["executor.learn_memory=maybe"])
    assert "executor.learn_memory" in str(ei.value) and "maybe" in str(ei.value)
    check_overrides(["executor.learn_memory=false"])

    from omegaconf import OmegaConf

    from pita.config.schema import PitaConfig
    from pita.config.validate import validate_config

    cfg = OmegaConf.merge(OmegaConf.structured(PitaConfig), {"synthetic": {"peak_gb": -1.0}})
    with pytest.raises(ConfigError) as ei:
        validate_config(cfg)
    assert "synthetic.peak_gb=-1.0: must be >= 0" in str(ei.value)


def test_synthetic_peak_gb_reaches_every_device_job():
    from pita.plans.synthetic import demo_grid

    jobs = demo_grid(["PITA"], ["tiny"], ["arith"], 1, 1, 1, 0.0, 2.0, peak_gb=1.0)
    assert {j.params.get("peak_gb") for j in jobs if j.resources.devices} == {1.0}
    assert all("peak_gb" not in j.params for j in jobs if not j.resources.devices)
    plain = demo_grid(["PITA"], ["tiny"], ["arith"], 1, 1, 1, 0.0, 2.0)
    assert all("peak_gb" not in j.params for j in plain)  # no change to the plan's fingerprints
    json.dumps([j.to_dict() for j in jobs])
