"""Placement decisions of pita.core.scheduler.Scheduler on hand-built inventories.

Memory is given in GB (1e9 bytes). With the default ``memory_margin=0.05`` a 100 GB device keeps
5 GB back, so 95 GB can be reserved.
"""

from __future__ import annotations

import pytest

from pita.core.graph import JobGraph
from pita.core.job import Job, JobState, Resources
from pita.core.scheduler import DeviceLoad, Scheduler

GB = 10**9


def job(jid: str, mem_gb: float = 1.0, devices: int = 1, deps=(), dur: float = 1.0) -> Job:
    return Job(id=jid, kind="synthetic.work", deps=list(deps),
               resources=Resources(devices=devices, memory_gb=mem_gb), duration_hint=dur)


def sched(jobs, totals_gb, **kw) -> Scheduler:
    graph = JobGraph(jobs).validate(check_kinds=False)
    return Scheduler(graph, [int(t * GB) for t in totals_gb], **kw)


def started_ids(result) -> list[str]:
    return sorted(j for j, _ in result)


# ---------------------------------------------------------------- sharing and waiting
def test_small_jobs_share_a_device_until_memory_runs_out():
    # 100 GB - 5 GB margin = 95 GB usable: three 30 GB jobs fit (90), the fourth (120) does not.
    s = sched([job(f"j{i}", 30) for i in range(4)], [100])
    out = s.schedule()
    assert out == [("j0", [0]), ("j1", [0]), ("j2", [0])]
    assert s.state["j3"] == JobState.PENDING
    assert s.jobs_on(0) == 3
    assert s.devices[0].available() == 5 * GB  # 95 - 90
    assert s.schedule() == []  # nothing changed, nothing starts
    s.mark_completed("j1")
    assert s.schedule() == [("j3", [0])]
    assert s.running() == ["j0", "j2", "j3"]


def test_large_job_waits_until_mark_completed_releases_memory():
    s = sched([job("small", 50, dur=2.0), job("large", 60)], [100])
    # small has the longer critical path so it is placed first; 45 GB are left, large needs 60.
    assert s.schedule() == [("small", [0])]
    assert s.schedule() == []
    assert s.state["large"] == JobState.PENDING
    s.mark_completed("small")
    assert s.devices[0].reserved == {}
    assert s.placement.get("small") is None
    assert s.schedule() == [("large", [0])]
    assert s.devices[0].reserved == {"large": 60 * GB}


def test_best_fit_picks_least_available_device_that_fits():
    # margin 0: available = total. A 30 GB job fits the 80 and 40 GB devices; best fit is the 40.
    s = sched([job("big", 30, dur=2.0), job("small", 20)], [80, 40, 24], memory_margin=0.0)
    out = dict(s.schedule())
    assert out["big"] == [1]
    # small (20 GB) then fits 80 (80), 40 (10 left: no) and 24 (24): best fit is the 24 GB device.
    assert out["small"] == [2]


def test_best_fit_tie_goes_to_lowest_ordinal():
    s = sched([job("a", 10)], [50, 50, 50], memory_margin=0.0)
    assert s.schedule() == [("a", [0])]


# ---------------------------------------------------------------- gang scheduling
def test_gang_job_gets_all_devices_at_once_or_none():
    s = sched([job("gang", 20, devices=2, dur=5.0), job("other", 5)], [40, 40], memory_margin=0.0)
    s.observe(1, 30 * GB)  # another process holds 30 GB of device 1: only 10 GB left there
    out = s.schedule()
    # gang fits only device 0: it gets nothing (and reserves nothing); the small job still runs.
    assert "gang" not in dict(out)
    assert s.state["gang"] == JobState.PENDING
    assert all("gang" not in d.reserved for d in s.devices)
    assert dict(out)["other"] == [1]  # best fit: 10 GB left on device 1 vs 40 on device 0
    s.mark_completed("other")
    s.observe(1, 0)
    assert s.schedule() == [("gang", [0, 1])]
    assert s.devices[0].reserved == {"gang": 20 * GB}
    assert s.devices[1].reserved == {"gang": 20 * GB}


def test_gang_job_takes_the_best_fitting_devices_in_ordinal_order():
    s = sched([job("gang", 20, devices=2)], [80, 30, 80, 25], memory_margin=0.0)
    assert s.schedule() == [("gang", [1, 3])]


# ---------------------------------------------------------------- order and dependencies
def test_critical_path_decides_who_gets_the_only_slot():
    # z1 -> z2 -> z3 is a chain of 3 (priority 3); "a" stands alone (priority 1) and would win on id.
    jobs = [job("z1"), job("z2", deps=["z1"]), job("z3", deps=["z2"]), job("a")]
    s = sched(jobs, [100], max_jobs_per_device=1)
    assert s.ready() == ["z1", "a"]
    assert s.schedule() == [("z1", [0])]
    assert s.state["a"] == JobState.PENDING


def test_equal_priority_ties_break_on_id():
    s = sched([job("b"), job("a"), job("c")], [100], max_jobs_per_device=1)
    assert s.schedule() == [("a", [0])]


def test_job_is_ready_only_when_every_dependency_completed():
    s = sched([job("a"), job("b"), job("c", deps=["a", "b"])], [100])
    assert started_ids(s.schedule()) == ["a", "b"]
    s.mark_completed("a")
    assert "c" not in s.ready()
    assert s.schedule() == []
    s.mark_completed("b")
    assert s.ready() == ["c"]
    assert s.schedule() == [("c", [0])]


def test_no_round_barriers():
    # r1.c depends only on r0.b; it must start while the unrelated (long) r0.a still runs.
    jobs = [job("r0.a", dur=10.0), job("r0.b"), job("r1.c", deps=["r0.b"])]
    s = sched(jobs, [100])
    assert started_ids(s.schedule()) == ["r0.a", "r0.b"]
    s.mark_completed("r0.b")
    assert s.schedule() == [("r1.c", [0])]
    assert s.state["r0.a"] == JobState.RUNNING


def test_mark_completed_twice_does_not_release_a_dependent_early():
    s = sched([job("a"), job("b"), job("c", deps=["a", "b"])], [100])
    s.schedule()
    s.mark_completed("a")
    s.mark_completed("a")  # idempotent (resume marks done jobs, the executor may repeat)
    assert "c" not in s.ready()


def test_mark_failed_skips_descendants_transitively_but_not_independent_jobs():
    jobs = [job("a", 40), job("b", deps=["a"]), job("c", deps=["b"]), job("x"),
            job("d", deps=["x", "c"]), job("y", deps=["x"])]
    s = sched(jobs, [100])
    assert started_ids(s.schedule()) == ["a", "x"]
    skipped = s.mark_failed("a", "boom")
    assert sorted(skipped) == ["b", "c", "d"]
    assert s.state["a"] == JobState.FAILED and s.reason["a"] == "boom"
    for d in ("b", "c", "d"):
        assert s.state[d] == JobState.SKIPPED
        assert s.reason[d] == "dependency a failed"
    assert s.state["x"] == JobState.RUNNING
    assert "a" not in s.devices[0].reserved  # its memory is released
    s.mark_completed("x")
    assert s.schedule() == [("y", [0])]  # y depends only on x: unaffected
    s.mark_completed("y")
    assert s.done()
    assert s.counts() == {"PENDING": 0, "RUNNING": 0, "COMPLETED": 2, "FAILED": 1, "SKIPPED": 3}


def test_requeue_puts_a_running_job_back():
    s = sched([job("a", 50)], [100])
    assert s.schedule() == [("a", [0])]
    s.requeue("a")
    assert s.state["a"] == JobState.PENDING
    assert s.ready() == ["a"]
    assert s.devices[0].reserved == {}
    assert "a" not in s.placement
    assert s.schedule() == [("a", [0])]
    assert s.state["a"] == JobState.RUNNING


def test_max_jobs_per_device_caps_the_count_even_when_memory_allows():
    s = sched([job(f"j{i}", 1) for i in range(5)], [100, 100], max_jobs_per_device=2)
    out = s.schedule()
    assert len(out) == 4
    assert s.jobs_on(0) == 2 and s.jobs_on(1) == 2
    assert s.state["j4"] == JobState.PENDING
    s.mark_completed(out[0][0])
    assert s.schedule() == [("j4", out[0][1])]


def test_cpu_jobs_use_host_slots_and_hold_no_device_memory():
    jobs = [job(f"m{i}", 50, devices=0) for i in range(3)] + [job("g", 90)]
    s = sched(jobs, [100], max_cpu_jobs=2)
    out = dict(s.schedule())
    assert out["g"] == [0]
    cpu = [j for j, devs in out.items() if devs == []]
    assert cpu == ["m0", "m1"]  # two slots; 50 GB each would never fit next to g anyway
    assert s.state["m2"] == JobState.PENDING
    assert s.jobs_on(0) == 1
    assert s.devices[0].reserved == {"g": 90 * GB}
    s.mark_completed("m0")
    assert s.schedule() == [("m2", [])]


def test_cpu_jobs_unlimited_when_max_cpu_jobs_is_none():
    s = sched([job(f"m{i}", devices=0) for i in range(6)], [10])
    assert len(s.schedule()) == 6


# ---------------------------------------------------------------- measured memory
def test_available_formula_by_hand():
    # total 100, margin 5, measured 40 of which job a uses 25: others = 15,
    # ours = max(20 reserved, 25 used) + max(10 reserved, unknown 0) = 35 -> 100 - 5 - 15 - 35 = 45
    d = DeviceLoad(100 * GB, 5 * GB, measured_used=40 * GB, reserved={"a": 20 * GB, "b": 10 * GB},
                   usage={"a": 25 * GB})
    assert d.available() == 45 * GB


def test_observe_other_processes_reduce_availability():
    s = sched([job("need70", 70, dur=2.0), job("need60", 60)], [100])
    s.observe(0, 30 * GB)  # 100 - 5 margin - 30 others = 65
    assert s.devices[0].available() == 65 * GB
    assert s.schedule() == [("need60", [0])]  # 70 does not fit, 60 does
    assert s.state["need70"] == JobState.PENDING


def test_observe_does_not_double_count_a_running_jobs_usage():
    s = sched([job("a", 20, dur=2.0), job("b", 50)], [100])
    assert dict(s.schedule()) == {"a": [0], "b": [0]}
    # device reports 90 GB used: a uses 25 (over its 20 reservation), b uses 30, others 35
    s.observe(0, 90 * GB, {"a": 25 * GB, "b": 30 * GB, "not-running": 7 * GB})
    assert set(s.devices[0].usage) == {"a", "b"}  # unknown jobs are ignored
    # 100 - 5 - 35 others - max(20, 25) - max(50, 30) = 100 - 5 - 35 - 25 - 50 = -15
    assert s.devices[0].available() == -15 * GB
    s.observe(0, 60 * GB, {"a": 10 * GB, "b": 30 * GB})  # others 20; ours max(20,10)+max(50,30)=70
    assert s.devices[0].available() == 5 * GB


def test_observe_with_no_per_job_usage_takes_our_jobs_at_their_reservations():
    s = sched([job("a", 20)], [100])
    s.schedule()
    s.observe(0, 30 * GB)  # per-job usage unknown (a container): 30 used, of which our job is taken as its 20
    assert s.devices[0].others() == 10 * GB
    assert s.devices[0].available() == (100 - 5 - 10 - 20) * GB


# ---------------------------------------------------------------- starvation guard
def _starvation_run(starvation_passes, max_completions=60, backfill=True):
    """Device 100 GB (95 usable). ``big`` (60 GB, critical path 10) becomes ready after a CPU gate
    while nine 10 GB small jobs (critical path 1) fill the device; 200 more small jobs are ready.
    Each step completes the oldest running small job, one time unit later, and schedules: the
    small jobs are expected to take 1 unit and each takes 9 (nine run at once), so every
    reservation made for ``big`` is overrun. Returns the number of completions after which big
    started, or None."""
    smalls = [job(f"s{i:03d}", 10) for i in range(200)]
    gate = job("gate", 0, devices=0)
    big = job("big", 60, deps=["gate"], dur=10.0)
    t = [0.0]
    s = sched([gate, big] + smalls, [100], starvation_passes=starvation_passes, clock=lambda: t[0],
              backfill=backfill)
    first = s.schedule()
    assert ("gate", []) in first
    assert len([j for j, d in first if d == [0]]) == 9  # 9 x 10 GB = 90 <= 95
    s.mark_completed("gate")
    running_small = [j for j, d in first if j.startswith("s")]
    for n in range(max_completions + 1):
        for jid, _ in s.schedule():
            if jid == "big":
                return n
            running_small.append(jid)
        t[0] += 1.0
        s.mark_completed(running_small.pop(0))
    return None


@pytest.mark.parametrize("backfill", [True, False])
def test_without_guard_small_jobs_starve_the_big_one(backfill):
    assert _starvation_run(None, max_completions=60, backfill=backfill) is None


@pytest.mark.parametrize("backfill", [True, False])
def test_starvation_guard_holds_a_device_for_the_big_job(backfill):
    """By hand: after the gate, 9 small jobs run (90 GB, 5 GB left). Completion 0 frees nothing
    yet; at passes 1 and 2 a small job takes the 15 GB hole ahead of big (passed over twice: with
    reservations, because the small jobs it waits for are past their expected ends, so its
    reservation is overdue). From pass 3 big holds the device, so nothing else starts: after
    pass n, 11 - n small jobs run. big needs 95 - 10 * (11 - n) >= 60, i.e. n >= 8."""
    assert _starvation_run(2, max_completions=60, backfill=backfill) == 8


def test_starvation_passes_zero_holds_at_once():
    """Held from the first pass after the gate (guard only): 9 - n small jobs run,
    95 - 10 * (9 - n) >= 60 at n = 6."""
    assert _starvation_run(0, max_completions=60, backfill=False) == 6


# ---------------------------------------------------------------- reservations (EASY backfilling)
def _clocked(jobs, totals_gb, **kw):
    t = [0.0]
    s = sched(jobs, totals_gb, clock=lambda: t[0], **kw)
    return s, t


def test_a_gang_job_is_reserved_the_devices_that_free_first_and_short_jobs_backfill_before_it():
    """Four 80 GB devices running jobs that end at 2, 4, 6 and 10. A 2-device job waits: its
    reservation is the devices of the jobs ending at 2 and 4, at time 4. When the first frees, a
    1-unit job (ends at 3) may take it; a 5-unit job may not start there before the gang job."""
    run = [job(f"r{i}", 70, dur=d) for i, d in enumerate([2, 4, 6, 10])]
    gate = job("gate", 0, devices=0, dur=0.0)
    gang = job("gang", 70, devices=2, deps=["gate"], dur=30.0)
    long_ = job("long", 70, deps=["gate"], dur=5.0)
    short = job("short", 70, deps=["gate"], dur=1.0)
    s, t = _clocked(run + [gate, gang, long_, short], [80] * 4)
    first = dict(s.schedule())
    assert sorted(first) == ["gate", "r0", "r1", "r2", "r3"]
    s.mark_completed("gate")
    assert s.schedule() == []  # every device full
    on = {r: first[r][0] for r in ("r0", "r1", "r2", "r3")}
    assert s.reservation.job == "gang" and s.reservation.at == 4
    assert sorted(s.reservation.spare) == sorted([on["r0"], on["r1"]])
    t[0] = 2.0
    s.mark_completed("r0")  # r0's device frees at 2: the gang job needs r1's too (free at 4)
    out = dict(s.schedule())
    assert out == {"short": [on["r0"]]}, out  # ends at 3 <= 4; "long" (ends at 7) would delay the gang job
    t[0] = 3.0
    s.mark_completed("short")
    assert s.schedule() == []
    t[0] = 4.0
    s.mark_completed("r1")
    assert dict(s.schedule()) == {"gang": sorted([on["r0"], on["r1"]])}


def test_a_backfilled_job_may_outlast_the_reservation_where_the_device_keeps_room_for_it():
    """One 100 GB device (95 usable) running a 50 GB job until 5; a 60 GB job waits (reserved at
    5). A 30 GB job of 10 units starts now: at 5 the device holds it and the 60 GB job (90 <= 95).
    A second one would not leave room (120), so it waits."""
    gate = job("gate", 0, devices=0, dur=0.0)
    jobs = [job("first", 50, dur=5.0), gate, job("big", 60, deps=["gate"], dur=20.0),
            job("side1", 30, deps=["gate"], dur=10.0), job("side2", 10, deps=["gate"], dur=10.0)]
    s, t = _clocked(jobs, [100])
    s.schedule()
    s.mark_completed("gate")
    out = dict(s.schedule())
    assert out == {"side1": [0]}, out  # side2 (10 GB) fits now (95-80) but not beside big at 5 (95-90 < 10)
    assert s.reservation.job == "big" and s.reservation.at == 5.0
    t[0] = 5.0
    s.mark_completed("first")
    assert "big" in dict(s.schedule())


def test_the_plan_and_the_run_order_jobs_by_the_same_expected_seconds(tmp_path):
    """pita plan and a run build the same graph with the same durations (pita/plans/durations.py),
    so their priorities (longest remaining path) are the same."""
    from pita.cli.plan import compose, make_plan
    from pita.plans import build_plan

    cfg = compose(["experiment=smoke", f"system.cache_dir={tmp_path}", "system.cpu_devices=2"])
    planned = {j["id"]: j["seconds"] for j in make_plan(cfg)["jobs"]}
    run = build_plan(cfg, [int(8e9)] * 2, cuda=False)
    assert planned == {j.id: round(j.duration_hint, 1) for j in run}
    # the roofline's seconds (pita/plans/durations.py), not the builders' placeholder hints
    hints = {j.kind: j.duration_hint for j in run}
    assert hints["algo.dpo_train"] != 4.0 and hints["algo.value_train"] != 3.0, hints


def test_small_jobs_spread_over_idle_devices_before_sharing_one():
    """Two 1 GB jobs, two empty 80 GB devices: one each (sharing would halve each job's compute).
    A third goes to the device whose memory fits it best among the least busy (both hold one job)."""
    from pita.core.graph import JobGraph
    from pita.core.job import Job, Resources
    from pita.core.scheduler import Scheduler

    jobs = [Job(f"j{i}", "synthetic.work", resources=Resources(1, m)) for i, m in enumerate([1.0, 1.0, 1.0])]
    sched = Scheduler(JobGraph(jobs), [int(80e9), int(80e9)], memory_margin=0.0)
    out = dict(sched.schedule())
    assert sorted(out["j0"] + out["j1"]) == [0, 1]
    assert len(out["j2"]) == 1


# ---------------------------------------------------------------- learned estimates
def test_later_jobs_are_co_placed_once_their_estimate_is_learned():
    """Six 40 GB jobs on a 100 GB device (95 usable): two fit at once as planned. Each really
    peaks at 10 GB; once two have finished, the learned estimate (10 x 1.2 + 0.27 GB, rounded up
    to 64 MiB: 12.3 GB) lets the other four start together."""
    from pita.core.memlearn import MemoryLearner

    jobs = [job(f"j{i}", 40) for i in range(6)]
    graph = JobGraph(jobs).validate(check_kinds=False)
    learner = MemoryLearner(graph, "gpu", 95 * GB)
    s = Scheduler(graph, [100 * GB], estimate=learner.estimate)
    assert started_ids(s.schedule()) == ["j0", "j1"]
    s.mark_completed("j0")
    assert learner.observe("j0", 10 * GB) is None  # one measurement does not lower an estimate
    assert started_ids(s.schedule()) == ["j2"]  # as planned: 40 + 40 <= 95, a third would not fit
    s.mark_completed("j1")
    change = learner.observe("j1", 10 * GB)
    assert (change.old, change.jobs) == (40 * GB, 2) and 12.2 * GB < change.new < 12.4 * GB
    assert started_ids(s.schedule()) == ["j3", "j4", "j5"]  # 40 (j2, planned) + 3 x 12.3
    assert s.devices[0].reserved["j2"] == 40 * GB and s.devices[0].reserved["j5"] == change.new


def test_without_a_learner_the_planned_estimate_is_reserved():
    s = sched([job("a", 30)], [100])
    s.schedule()
    assert s.devices[0].reserved == {"a": 30 * GB}


def test_jobs_wait_for_host_memory_as_for_device_memory():
    """Two jobs with room on the devices but 60 GB of host memory each, on a 100 GB node: one at a time."""
    a, b = job("a", 10), job("b", 10)
    a.resources.host_gb = b.resources.host_gb = 60
    s = sched([a, b], [100, 100], host_bytes=100 * GB)
    first = s.schedule()
    assert len(first) == 1 and s.host_used() == 60 * GB
    assert s.schedule() == []
    s.mark_completed(first[0][0])
    second = s.schedule()
    assert len(second) == 1 and second[0][0] != first[0][0]
    # uncounted (CPU devices, or no host estimate): both at once
    assert len(sched([job("c", 10), job("d", 10)], [100, 100], host_bytes=100 * GB).schedule()) == 2


def test_a_foreign_tenant_is_seen_in_a_container_while_our_jobs_sit_below_their_reservations():
    """NVML attributes nothing to our workers (host pids in a container). Our job reserved 40 GB
    and uses 20 (torch's own report); another tenant holds 15: 35 GB used on the device. Taken at
    its reservation our job would hide the tenant (35 - 40 -> 0); from its torch report, 15 GB."""
    from pita.core.executor import torch_usage
    from pita.core.memory import CUDA_CONTEXT_BYTES

    dev = DeviceLoad(100 * GB, 5 * GB, reserved={"a": 40 * GB})
    dev.measured_used = 35 * GB
    dev.usage = {"a": 0}
    assert dev.others() == 0  # the reservation hides the tenant
    dev.usage = torch_usage({"a": 0}, dev.reserved, {"a": 20 * GB - CUDA_CONTEXT_BYTES}, 0, {"a": [0]})
    assert dev.usage == {"a": 20 * GB}
    assert dev.others() == 15 * GB
    assert dev.available() == (100 - 5 - 15 - 40) * GB  # our job may still grow to its reservation
    # no report yet: every job at its reservation, as before
    assert torch_usage({"a": 0}, dev.reserved, {}, 0, {"a": [0]}) == {"a": 0}


# ---------------------------------------------------------------- several nodes
def test_a_k_device_job_gets_k_devices_of_one_node_and_is_reserved_on_one():
    """Two nodes of two devices (80 and 100 GB each). Two 70 GB jobs take the 80 GB devices (best
    fit), one per node: a 2-device job cannot start though two devices are free (one per node);
    it is reserved the node that frees first, and starts there on both of that node's devices."""
    from pita.core.graph import JobGraph

    jobs = [job("a", 70, dur=2.0), job("b", 70, dur=5.0), job("gate", 0, devices=0, dur=0.0),
            job("pair", 70, devices=2, deps=["gate"], dur=10.0)]
    t = [0.0]
    s = Scheduler(JobGraph(jobs).validate(check_kinds=False), [int(g * GB) for g in (80, 100, 100, 80)],
                  clock=lambda: t[0], device_nodes=["n1", "n1", "n2", "n2"])
    first = dict(s.schedule())
    s.mark_completed("gate")
    assert sorted(first["a"] + first["b"]) == [0, 3]  # one per node: each node has one free device
    assert s.schedule() == []
    node_a = s.nodes[first["a"][0]]
    assert s.reservation.job == "pair" and s.reservation.at == 2.0
    assert {s.nodes[o] for o in s.reservation.spare} == {node_a}
    t[0] = 2.0
    s.mark_completed("a")
    [(jid, devs)] = s.schedule()
    assert jid == "pair" and {s.nodes[o] for o in devs} == {node_a} and len(devs) == 2


def test_a_job_needing_more_gpus_than_any_node_has_is_refused_naming_the_largest_node():
    from types import SimpleNamespace

    from pita.plans.fit import node_problems

    devs = [SimpleNamespace(node=n) for n in ("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2")]
    jobs = [Job("GRPO.tiny.arith.r0.train", "algo.grpo_train", resources=Resources(3, 1.0)),
            Job("DPO.tiny.arith.r0.train", "algo.dpo_train", resources=Resources(2, 1.0))]
    [p] = node_problems(jobs, devs)
    assert p.startswith("algos.GRPO.devices=3: GRPO.tiny.arith.r0.train needs 3 GPUs of one node")
    assert "largest node of the cluster (node 10.0.0.2) has 2" in p and "algos.GRPO.devices=2" in p
    assert node_problems(jobs, [SimpleNamespace(node="")] * 4) == []  # one machine: validate() says it
