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


def _gpu_run(jobs, tmp_path, only=None, **kw):
    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths
    import json

    gpus = GPUManager.detect("auto")
    if only is not None:  # these devices alone (system.devices=[...])
        gpus = gpus.restrict(list(only))
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
    assert sorted(s["CUDA_VISIBLE_DEVICES"] for s in seen) == sorted(d.visible_id for d in gpus.devices)
    for i, s in enumerate(seen):
        assigned = state["jobs"][f"e{i}"]["devices"][0]["uuid"]
        assert s["uuid"] == assigned  # the device CUDA gave the worker is the one NVML said it would be
        assert s["current_device"] == 0 and s["device"] == "cuda:0" and s["LOCAL_RANK"] in (None, "0")
        if s["nvml_sees_bytes"] is not None:  # None: NVML reports host pids (a container)
            assert s["nvml_sees_bytes"] >= 0.9 * s["allocated_bytes"]
    log = run.job("e0").log.read_text()
    assert "devices: CUDA_VISIBLE_DEVICES=" in log and "LOCAL_RANK=" in log


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
    # one GPU only: on a node with several, the four jobs would run at once on four devices
    summary, state, run, gpus = _gpu_run(jobs, tmp_path, only=[0], max_jobs_per_device=None)
    assert len(gpus.devices) == 1
    starts = sorted(state["jobs"][f"s{i}"]["attempts"][0]["start"] for i in range(4))
    ends = sorted(state["jobs"][f"s{i}"]["attempts"][0]["end"] for i in range(4))
    assert summary.exit_code == 0
    assert starts[-1] < ends[0]  # all four were running at once, on the one device


# ---------------------------------------------------------------- the real GPU path
@pytest.mark.parametrize("attn", ["sdpa", "flash_attention_2"])
def test_a_llama_architecture_model_runs_on_cuda_in_bf16(tiny, attn):
    """The tiny family is a LlamaForCausalLM: loaded on CUDA in bf16 with the attention kernel asked for."""
    if attn == "flash_attention_2":
        pytest.importorskip("flash_attn")
    from pita.models.lm import LM

    lm = LM.load(tiny["reference"], device="cuda", dtype="bfloat16", attn_impl=attn)
    assert lm.model.dtype == torch.bfloat16 and lm.model.config._attn_implementation == attn
    ids = torch.tensor([lm.tok("What is 2 + 3?")["input_ids"]], device="cuda")
    with torch.no_grad():
        logits = lm.model(ids).logits
    assert logits.is_cuda and torch.isfinite(logits.float()).all()


def _cli_run(tmp_path, tiny_cache, *overrides):
    import json

    from helpers import cli

    r = cli(["experiment.name=gpu", "experiment.workload=experiment", "experiment.datasets=[arith]",
             "experiment.rounds=1", f"system.cache_dir={tiny_cache}", "model.dtype=bfloat16", "system.attn_impl=sdpa",
             "datasets.arith.toy_train_size=32", "datasets.arith.toy_test_size=8", "eval.n=2",
             "data_collection.max_new_tokens=24", "algos.GRPO.max_steps=4", "algos.GRPO-HF.max_steps=4", *overrides],
            tmp_path, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [run] = list((tmp_path / "gpu").iterdir())
    return run, json.loads((run / "state.json").read_text())


def test_every_job_kind_peaks_within_its_reservation_on_cuda(tmp_path, tiny_cache):
    """The embedded default's six algorithms on CUDA in bf16: each attempt's torch peak (the most on
    any of its devices) is at most what the scheduler reserved for it."""
    run, state = _cli_run(tmp_path, tiny_cache)
    checked = 0
    for jid, e in state["jobs"].items():
        for a in e.get("attempts", []):
            peak, mem = a.get("peak_gpu_bytes"), a.get("memory") or {}
            if peak and mem.get("reserved_bytes"):
                assert peak <= mem["reserved_bytes"], (jid, peak, mem)
                checked += 1
    assert checked >= 10
    text = (run / "run.log").read_text()
    assert "GPU utilization" in text or "GB used" in text


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_rank_nccl_dpo_and_grpo_hf(tmp_path, tiny_cache, sharding):
    import json

    run, state = _cli_run(tmp_path, tiny_cache, "experiment.algos=[DPO,GRPO-HF]", "algos.DPO.devices=2",
                          "algos.GRPO-HF.devices=2", f"algos.DPO.sharding={sharding}",
                          f"algos.GRPO-HF.sharding={sharding}")
    for algo in ("DPO", "GRPO-HF"):
        job = run / "jobs" / f"{algo}.tiny.arith.r0.train"
        res = json.loads((job / "result.json").read_text())
        held = res["rank_params"]
        assert len(held) == 2
        if sharding == "fsdp":
            assert abs(held[0] - held[1]) <= 0.2 * held[0]  # each rank holds about half
        else:
            assert held[0] == held[1]
        log = (job / "job.log").read_text()
        assert "[rank 1] devices: CUDA_VISIBLE_DEVICES=" in log and "LOCAL_RANK=1" in log and "device=cuda:1" in log
