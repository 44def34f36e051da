"""state.json under concurrent writers; OOM recognition; atomic writes."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest

from pita.core.errors import ResumeError
from pita.core.paths import atomic_write
from pita.core.state import StateStore
from pita.core.worker import is_oom


def _writer(path, who, n):
    store = StateStore(path)
    for i in range(n):
        store.update_jobs({f"{who}.{i}": {"state": "COMPLETED", "by": who}})


def test_concurrent_updates_are_never_lost(tmp_path):
    path = tmp_path / "state.json"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), f"w{k}", 40)) for k in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    jobs = StateStore(path).read()["jobs"]
    assert len(jobs) == 120
    assert {j["by"] for j in jobs.values()} == {"w0", "w1", "w2"}


def test_corrupt_state_is_a_resume_error(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"jobs": ')
    with pytest.raises(ResumeError, match="corrupt"):
        StateStore(path).read()
    path.write_text('["not", "a", "table"]')
    with pytest.raises(ResumeError, match="corrupt"):
        StateStore(path).read()


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "f.json"
    atomic_write(target, "old")

    class Boom:
        def encode(self):
            raise RuntimeError("disk full")

    with pytest.raises(Exception):
        atomic_write(target, Boom())  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


def test_is_oom_recognises_cuda_out_of_memory_only():
    import torch

    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(MemoryError("host"))
    assert not is_oom(ValueError("CUDA out of memory"))  # only the runtime's own error types


def test_a_state_change_writes_only_the_rows_it_touches(tmp_path):
    """The cost of a change must not grow with the run: one job's change rewrites that job's row
    (and the run's 'updated' field), whether the run has 10 jobs or 5,000."""
    store = StateStore(tmp_path / "state.json")
    for n in (10, 5000):
        store.apply({f"j{i}": {"state": "PENDING"} for i in range(n)})
        conn = store._connect()
        before = conn.total_changes
        store.apply({"j3": {"state": "RUNNING"}}, attempts={"j3": [{"n": n}]})
        assert conn.total_changes - before == 2
    assert store.job("j3")["attempts"] == [{"n": 10}, {"n": 5000}] and store.read()["jobs"]["j4"]["state"] == "PENDING"
    store.write_snapshot()
    assert json.loads((tmp_path / "state.json").read_text())["jobs"]["j3"]["state"] == "RUNNING"
