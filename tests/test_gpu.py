"""GPU tier: real devices, real NVML, real CUDA OOM. Skipped where CUDA is not available.

    python -m pytest -m gpu
"""

from __future__ import annotations

import pytest

from helpers import run_graph
from pita.core.job import Job, Resources

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_nvml_inventory_matches_torch():
    from pita.core.gpu_manager import GPUManager

    mgr = GPUManager.detect("auto")
    assert mgr.source in ("nvml", "torch")
    assert len(mgr.devices) == torch.cuda.device_count()
    for d in mgr.devices:
        assert d.uuid.startswith(("GPU-", "MIG-")) and d.total_bytes > 1e9 and d.used_bytes <= d.total_bytes
    assert mgr.summary()[0].startswith("GPU ")


def _gpu_run(jobs, tmp_path, **kw):
    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths
    import json

    gpus = GPUManager.detect("auto")
    run = RunPaths.create(tmp_path, "gpu")
    setup_logging(run.run_log, console=False)
    s = ExecutorSettings(progress="off", poll_interval_s=0.05, **kw)
    summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus,
                       make_backend("local"), run, s).run()
    return summary, json.loads(run.state.read_text()), run, gpus


def test_each_worker_sees_only_its_gpu(tmp_path):
    n = torch.cuda.device_count()
    jobs = [Job(f"e{i}", "synthetic.env", resources=Resources(1, 1.0)) for i in range(n)]
    summary, state, run, gpus = _gpu_run(jobs, tmp_path, max_jobs_per_device=1)
    seen = [run.job(f"e{i}").read_result() for i in range(n)]
    assert all(s["device_count"] == 1 for s in seen)
    assert sorted(s["CUDA_VISIBLE_DEVICES"] for s in seen) == sorted(str(d.index) for d in gpus.devices)


def test_real_cuda_oom_is_retried_with_half_the_batch(tmp_path):
    total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    start = 2 * int(total_gb // 10 + 1)  # 2x the device at 10 GB per item: 1 halving (maybe 2) fits
    jobs = [Job("big", "synthetic.alloc", params={"batch_size": start, "gb_per_item": 10.0, "seconds": 0.1},
                resources=Resources(1, 1.0))]
    summary, state, run, _ = _gpu_run(jobs, tmp_path, oom_retries=3)
    e = state["jobs"]["big"]
    assert e["state"] == "COMPLETED", e
    assert e["attempts"][0]["status"] == "oom"
    assert e["attempts"][-1]["batch_size"] < start
    assert e["attempts"][-1]["peak_gpu_bytes"] > 1e9


def test_small_jobs_share_a_gpu(tmp_path):
    jobs = [Job(f"s{i}", "synthetic.alloc", params={"batch_size": 1, "gb_per_item": 1.0, "seconds": 2.0},
                resources=Resources(1, 2.0)) for i in range(4)]
    summary, state, run, gpus = _gpu_run(jobs, tmp_path, max_jobs_per_device=None)
    starts = sorted(state["jobs"][f"s{i}"]["attempts"][0]["start"] for i in range(4))
    ends = sorted(state["jobs"][f"s{i}"]["attempts"][0]["end"] for i in range(4))
    assert summary.exit_code == 0
    assert starts[-1] < ends[0]  # all four were running at once
