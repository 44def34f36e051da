"""The GPU check's own parts that run without a GPU: its memory estimate and the two checks that
take CUDA's code path on the CPU too (``--cpu``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_memory_checks_estimate_is_a_1b_models_training_step():
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.gpu_check import LLAMA_1B, memory_estimate

    torch = pytest.importorskip("torch")
    cfg = LlamaConfig(**LLAMA_1B)
    with torch.device("meta"):
        n = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    est = memory_estimate(cfg, n)
    # 1.1B parameters at fp32 weights + grads + AdamW (16 bytes each) and the activations on top
    assert 16 * n < est < 16 * n + 20e9, (n, est)


@pytest.mark.slow  # the long tier: the GPU check's benchmark script, run whole
@pytest.mark.integration
def test_gpu_check_runs_its_cpu_checks_and_reports_each(tiny_cache, tmp_path):
    env = dict(os.environ, PITA_TEST_CACHE=str(tiny_cache), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--cpu", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    results = {x["check"]: x["status"] for x in json.loads(r.stdout.strip().splitlines()[-1])["results"]}
    assert results["reference"] == results["fsdp_1gpu"] == "PASS", results
    training = {"fsdp_accumulation", "logprob_dtype", "grpo_sampling", "checkpoint_host"}
    assert set(results) == {"setup", "isolation", "memory", "oom_retry", "reference", "fsdp_1gpu", *training}
    # the training runtime's checks need a GPU here (their own CPU run: python -m bench.gpu_training --cpu)
    assert {results[name] for name in training} == {"SKIP"}, results
