"""algos.<A>.sharding=fsdp: the policy's weights, gradients and AdamW state split over the job's
devices (FSDP2 through accelerate), trained on CPU with two gloo ranks through the job's code."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from pita.core.errors import ConfigError

pytestmark = pytest.mark.integration


def _pairs(tmp_path, n=32):
    from datasets import Dataset

    rows = [{"id": f"p{i}", "prompt": f"What is {i} + {i}?", "chosen": f"The answer is {2 * i}.",
             "rejected": f"It is {2 * i + 1}, I think.", "chosen_reward": 1.0, "rejected_reward": 0.0,
             "p_chosen": 0.7} for i in range(n)]
    path = tmp_path / "pairs"
    Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _dpo(tiny_cache, tmp_path, name, data, *overrides, job=None):
    """Round 0's DPO training job as the plan writes it, run through its own job function (``job``:
    another kind's function on the same params, e.g. plugins.cuda_branch_jobs')."""
    from pita.algos import dpo
    from pita.core.paths import JobPaths
    from pita.plans import build_plan
    from test_baselines import compose

    jobs = build_plan(compose(tiny_cache, "experiment.algos=[DPO]", "algos.DPO.batch_size=8", "algos.DPO.epochs=1",
                              "algos.DPO.lr=2e-4", "training.micro_batch_size=4", *overrides), [int(8e9)] * 2)
    params = next(j for j in jobs if j.id == "DPO.tiny.arith.r0.train").params
    ctx = SimpleNamespace(params=params, dep_result=lambda j: {"path": str(data)},
                          paths=JobPaths(tmp_path / name), log=logging.getLogger(f"test.{name}"))
    ctx.paths.dir.mkdir(parents=True)
    result = (job or dpo.dpo_train)(ctx)
    rows = [row for row in map(json.loads, ctx.paths.metrics.read_text().splitlines()) if "loss" in row]
    return params, result, rows


@pytest.mark.timeout(600)
def test_fsdp_on_two_gloo_ranks_splits_the_parameters_and_follows_the_unsharded_loss(tiny_cache, tiny, tmp_path,
                                                                                       monkeypatch):
    """The job on its CUDA branch (bench.cuda_branch: bf16 autocast, FSDP2's mixed-precision policy),
    sharded over two gloo ranks and unsharded in one process. FSDP casts every float of the root's
    output to its output dtype, and TRL sums the fused head's per-token log-probabilities from there:
    in bf16 a sum of 60 nats resolves a quarter nat, and the first step's loss, where the policy is
    the reference, was 0.6914 sharded against log 2 unsharded. Cast to fp32, both are log 2 to fp32
    tolerance and no summed log-probability is a bf16 number; the later steps follow each other
    within bf16 arithmetic (the sharded forward runs on bf16 weights, the unsharded on fp32 weights
    under autocast)."""
    import math
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    import plugins.cuda_branch_jobs as cuda_branch

    tests = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", f"{tests}:{tests.parent}")  # the ranks import the plugin's kind
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # one thread per rank
    from bench.cuda_branch import drive_cuda_branch

    drive_cuda_branch(monkeypatch)  # this process's unsharded run; each rank drives its own
    data = _pairs(tmp_path)
    # model.dtype=float32: autocast in bf16, the reference held like the policy (so they agree at step 0)
    params, sharded, rows_sharded = _dpo(tiny_cache, tmp_path, "fsdp", data, "algos.DPO.devices=2",
                                         "algos.DPO.sharding=fsdp", "model.dtype=float32",
                                         job=cuda_branch.dpo_on_cuda_branch)
    assert params["sharding"] == "fsdp" and params["devices"] == 2
    assert sharded["steps"] == 4 and len(rows_sharded) == 4
    total = sum(w.numel() for w in AutoModelForCausalLM.from_pretrained(tiny["reference"]).parameters())
    held = sharded["rank_params"]
    assert len(held) == 2 and sum(held) == total, (held, total)
    assert all(0.4 * total <= h <= 0.6 * total for h in held), (held, total)  # about half each
    # TRL's frozen reference is sharded per decoder layer like the policy (TRL alone shards its root
    # only, and each reference forward then gathers the whole model on every rank)
    layers = AutoModelForCausalLM.from_pretrained(tiny["reference"]).config.num_hidden_layers
    assert sharded["reference_units"] == sharded["policy_units"] > layers + 1, sharded
    # the policy rank 0 saved is the whole model, gathered from both ranks, and it moved
    saved = AutoModelForCausalLM.from_pretrained(sharded["checkpoint"])
    ref = AutoModelForCausalLM.from_pretrained(tiny["reference"])
    assert sum(w.numel() for w in saved.parameters()) == total
    assert any((a - b).abs().max() > 0 for a, b in zip(saved.parameters(), ref.parameters()))

    _, whole, rows_whole = _dpo(tiny_cache, tmp_path, "whole", data, "model.dtype=float32")  # the same effective batch
    assert whole["rank_params"] == [total]
    assert len(rows_whole) == len(rows_sharded)
    for rows in (rows_sharded, rows_whole):
        assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6), rows[0]
    sums = [r[k] for r in rows_sharded for k in ("logps/chosen", "logps/rejected")]
    assert not [x for x in sums if float(torch.tensor(x, dtype=torch.bfloat16)) == x], sums
    losses = [r["loss"] for r in rows_sharded], [r["loss"] for r in rows_whole]
    assert max(abs(a - b) for a, b in zip(*losses)) < 0.02, losses
    assert losses[1][-1] < losses[1][0] - 0.02  # the curve being compared is not flat


@pytest.mark.timeout(300)
def test_grpo_samples_and_trains_sharded(tiny_cache, tiny, tmp_path, monkeypatch):
    """GRPO generates its completions with the sharded policy (FSDP2 gathers each layer as it runs)."""
    from pita.algos import grpo
    from pita.core.paths import JobPaths
    from pita.plans import build_plan
    from test_baselines import compose

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    jobs = build_plan(compose(tiny_cache, "experiment.algos=[GRPO]", "algos.GRPO.batch_size=8",
                              "algos.GRPO.num_generations=4", "algos.GRPO.max_steps=2", "algos.GRPO.devices=2",
                              "algos.GRPO.sharding=fsdp", "data_collection.max_new_tokens=16",
                              "training.micro_batch_size=4"), [int(8e9)] * 2)
    params = next(j for j in jobs if j.id == "GRPO.tiny.arith.r0.train").params
    ctx = SimpleNamespace(params=params, dep_result=lambda j: None, paths=JobPaths(tmp_path / "g"),
                          log=logging.getLogger("test.grpo"))
    ctx.paths.dir.mkdir(parents=True)
    res = grpo.grpo_train(ctx)
    held = res["rank_params"]
    assert res["steps"] == 2 and len(held) == 2 and abs(held[0] - held[1]) <= 0.2 * held[0]
    assert res["kl_last"] is not None


@pytest.mark.parametrize("overrides, needle", [
    (["algos.DPO.sharding=fsdp"], "algos.DPO.sharding=fsdp with algos.DPO.devices=1: there is nothing to split"),
    (["algos.DPO.sharding=fsdp", "algos.DPO.devices=2", "algos.DPO.lora_r=8"],
     "algos.DPO.sharding=fsdp with algos.DPO.lora_r=8"),
    (["algos.GRPO.sharding=zero3"], "algos.GRPO.sharding"),
])
def test_bad_sharding_is_refused_with_the_key_and_the_fix(tiny_cache, overrides, needle):
    from pita.plans import build_plan
    from test_baselines import compose

    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, *overrides), [int(8e9)] * 2)
    assert needle in str(e.value)


def test_fsdp_on_a_torch_without_it_is_refused(tiny_cache, monkeypatch):
    import pita.algos.post_training as pt
    from pita.plans import build_plan
    from test_baselines import compose

    monkeypatch.setattr(pt, "fsdp_unavailable", lambda: "this torch was built without torch.distributed")
    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, "algos.DPO.sharding=fsdp", "algos.DPO.devices=2"), [int(8e9)] * 2)
    assert "algos.DPO.sharding=fsdp: this torch was built without torch.distributed; set algos.DPO.sharding=none" \
        in str(e.value)
