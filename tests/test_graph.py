"""pita.core.graph.JobGraph: validation (every problem in one error), critical path, ordering."""

from __future__ import annotations

import pytest

from pita.core.errors import ConfigError, PlanError
from pita.core.graph import JobGraph
from pita.core.job import Job, Resources

GB = 10**9


def job(jid, kind="synthetic.work", deps=(), devices=1, mem_gb=1.0, dur=1.0, params=None):
    return Job(id=jid, kind=kind, deps=list(deps), params=dict(params or {}),
               resources=Resources(devices=devices, memory_gb=mem_gb), duration_hint=dur)


# ---------------------------------------------------------------- validation
def test_validate_returns_self_for_a_sound_graph():
    g = JobGraph([job("a"), job("b", deps=["a"]), job("merge", kind="synthetic.merge", deps=["b"], devices=0)])
    assert g.validate([80 * GB, 80 * GB], 0.05) is g


def test_validate_reports_every_problem_in_one_error():
    jobs = [
        job("a"),
        job("a"),                                               # duplicate id
        job("train"),
        job("b", deps=["a", "trian"]),                          # unknown dep, close to "train"
        job("c1", deps=["c2"]),                                 # cycle c1 -> c2 -> c1
        job("c2", deps=["c1"]),
        job("bad/id"),                                          # '/' in id
        job("neg", mem_gb=-1.0),                                # negative memory
        job("wide", devices=4),                                 # 4 devices, 2 exist
        job("huge", mem_gb=100.0),                              # > 76 GB usable
        job("typo", kind="synthetic.wrok"),                     # unknown kind
        job("bs0", params={"batch_size": 0}),                   # non-positive batch size
        job("bsstr", params={"batch_size": "8"}),               # not an integer
        job("bsbool", params={"batch_size": True}),             # bool is not a batch size
        job("self", deps=["self"]),                             # self-dependency
    ]
    with pytest.raises(PlanError) as ei:
        JobGraph(jobs).validate([80 * GB, 80 * GB], memory_margin=0.05)
    e = ei.value
    assert isinstance(e, ConfigError)  # exit code 2 in the CLI
    probs = e.problems
    expected = [
        "duplicate job id 'a'",
        "job 'b': unknown dependency 'trian' (did you mean 'train'?)",
        "dependency cycle: c1 -> c2 -> c1",
        "job id 'bad/id' may hold only letters",
        "job 'neg': resources.memory_gb=-1.0 must be >= 0",
        "job 'wide' asks for 4 devices but only 2 exist",
        "job 'huge' needs 100.00 GB on each of 1 device(s) but the largest usable is 76.00 GB",
        "job 'typo': kind 'synthetic.wrok' is not registered (did you mean 'synthetic.work'?)",
        "job 'bs0': params.batch_size=0 must be a positive integer",
        "job 'bsstr': params.batch_size='8' must be a positive integer",
        "job 'bsbool': params.batch_size=True must be a positive integer",
        "job 'self' depends on itself",
    ]
    for frag in expected:
        assert sum(frag in p for p in probs) == 1, (frag, probs)
    assert len(probs) == len(expected), probs
    text = str(e)
    assert text.startswith(f"invalid job graph ({len(expected)} problems):")
    assert all(frag in text for frag in expected)


def test_self_dependency_alone():
    with pytest.raises(PlanError) as ei:
        JobGraph([job("s", deps=["s"])]).validate()
    assert any("job 's' depends on itself" in p for p in ei.value.problems)


def test_gang_memory_checked_against_the_kth_largest_device():
    # 2 devices of 80 and 40 GB, margin 0: a 2-device job is limited by the 40 GB one.
    g = JobGraph([job("pair", devices=2, mem_gb=50.0)])
    with pytest.raises(PlanError) as ei:
        g.validate([80 * GB, 40 * GB], 0.0)
    assert "largest usable is 40.00 GB" in str(ei.value)
    JobGraph([job("pair", devices=2, mem_gb=40.0)]).validate([80 * GB, 40 * GB], 0.0)
    JobGraph([job("one", devices=1, mem_gb=80.0)]).validate([80 * GB, 40 * GB], 0.0)


def test_cpu_jobs_and_no_inventory_skip_device_checks():
    # devices=0: no device memory check; no device_totals: no count or size check.
    JobGraph([job("m", devices=0, mem_gb=500.0)]).validate([1 * GB])
    JobGraph([job("w", devices=16, mem_gb=500.0)]).validate()


def test_negative_device_count_is_reported():
    with pytest.raises(PlanError) as ei:
        JobGraph([job("n", devices=-1)]).validate()
    assert "resources.devices=-1 must be an integer >= 0" in str(ei.value)


def test_check_kinds_false_accepts_unregistered_kinds():
    JobGraph([job("x", kind="barrier")]).validate(check_kinds=False)
    with pytest.raises(PlanError):
        JobGraph([job("x", kind="barrier")]).validate()


def test_find_cycle_longer_and_none():
    g = JobGraph([job("a", deps=["c"]), job("b", deps=["a"]), job("c", deps=["b"])])
    [cyc] = g.find_cycles()
    assert cyc[0] == cyc[-1] and len(cyc) == 4
    for x, y in zip(cyc, cyc[1:]):
        assert y in g[x].deps  # each step follows a dependency edge
    assert JobGraph([job("a"), job("b", deps=["a", "zzz"])]).find_cycles() == []


# ---------------------------------------------------------------- priority and order
def diamond():
    """a -> (b, c) -> d, plus an independent e.  Durations: a=1, b=2, c=5, d=1, e=4.

    Critical path by hand (own duration + longest path after it):
        d = 1
        b = 2 + d = 3
        c = 5 + d = 6
        a = 1 + max(b, c) = 7
        e = 4
    """
    return JobGraph([
        job("a", dur=1.0), job("b", deps=["a"], dur=2.0), job("c", deps=["a"], dur=5.0),
        job("d", deps=["b", "c"], dur=1.0), job("e", dur=4.0),
    ])


def test_priority_is_the_critical_path_by_hand():
    g = diamond()
    assert g.priority == {"a": 7.0, "b": 3.0, "c": 6.0, "d": 1.0, "e": 4.0}
    assert g.critical_path_length() == 7.0


def test_topological_order_respects_every_dependency():
    g = diamond()
    order = [j.id for j in g.topological()]
    assert sorted(order) == ["a", "b", "c", "d", "e"]
    pos = {jid: i for i, jid in enumerate(order)}
    for j in g.jobs:
        for d in j.deps:
            assert pos[d] < pos[j.id]


def test_descendants_are_transitive_and_unique():
    g = diamond()
    assert sorted(g.descendants("a")) == ["b", "c", "d"]
    assert len(g.descendants("a")) == 3  # d reached twice, listed once
    assert g.descendants("b") == ["d"]
    assert g.descendants("d") == []
    assert g.descendants("e") == []


def test_fingerprint_ignores_dep_order_and_resources():
    a = Job("x", "synthetic.work", params={"k": 1}, deps=["p", "q"], resources=Resources(1, 5.0))
    b = Job("x", "synthetic.work", params={"k": 1}, deps=["q", "p"], resources=Resources(2, 9.0))
    c = Job("x", "synthetic.work", params={"k": 2}, deps=["q", "p"])
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != c.fingerprint()


def test_two_independent_cycles_are_both_reported():
    jobs = [job("x1", deps=["x2"]), job("x2", deps=["x1"]), job("c1", deps=["c2"]), job("c2", deps=["c1"])]
    with pytest.raises(PlanError) as ei:
        JobGraph(jobs).validate()
    text = str(ei.value)
    assert "x1 -> x2 -> x1" in text
    assert "c1 -> c2 -> c1" in text


def test_self_dependency_does_not_hide_another_cycle():
    jobs = [job("s", deps=["s"]), job("c1", deps=["c2"]), job("c2", deps=["c1"])]
    with pytest.raises(PlanError) as ei:
        JobGraph(jobs).validate()
    assert "dependency cycle: c1 -> c2 -> c1" in str(ei.value)
    assert "s -> s" not in str(ei.value) and "job 's' depends on itself" in str(ei.value)
