"""ParallelDataGenerator: deterministic merge across worker counts, resume of a killed shard,
the recipes' record schemas, and bad requests."""

from __future__ import annotations

import threading
import time

import pytest
from datasets import load_from_disk

from helpers import run_graph, workers_of
from pita.core.errors import ConfigError
from pita.datasets.config import dataset_config
from pita.generation.parallel import ParallelDataGenerator, check_request

pytestmark = pytest.mark.integration


def request(tiny, recipe="samples", dataset="arith", size=48, n=2, **over):
    from omegaconf import OmegaConf

    ds = dataset_config(dataset, toy_train_size=size)
    req = {"recipe": recipe, "dataset": OmegaConf.to_container(OmegaConf.structured(ds)), "split": "train",
           "policy": {"model": tiny["reference"], "dtype": "float32", "guidance": None}, "n": n, "chunk_size": 8,
           "seed": 0, "attn_impl": "sdpa",
           "sampling": {"max_new_tokens": 24, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "batch_size": 8},
           "scoring": {"reward_model": tiny["reward_sentiment"] if dataset == "sentiment" else None,
                       "reward_batch_size": 32, "correctness_bonus": 1.0},
           "preferences": {"beta": 1.0, "sampling": True},
           "rollouts": {"cut_points": 2, "continuations": 2, "mode": "sampled"}}
    for k, v in over.items():
        req[k] = v
    return req


def merged(run, prefix):
    return load_from_disk(str(run.job(f"{prefix}.merge").artifacts / "data")).to_list()


def test_shards_follow_capacity_and_chunks_never_split():
    gen = ParallelDataGenerator([80e9, 40e9, 40e9])
    assert gen.shard_chunks(100, 10) == [(0, 5), (5, 8), (8, 10)]
    assert ParallelDataGenerator([1, 1, 1, 1]).shard_chunks(10, 8) == [(0, 1), (1, 2)]  # 2 chunks: 2 shards


def test_merged_data_is_identical_for_one_and_two_workers(tiny, tmp_path):
    req = request(tiny, size=24)
    one = ParallelDataGenerator([1]).plan(req, "g", 24)
    two = ParallelDataGenerator([1, 1]).plan(req, "g", 24)
    assert len(one) == 2 and len(two) == 3
    s1, _, r1 = run_graph(one, tmp_path / "a", devices=1)
    s2, state2, r2 = run_graph(two, tmp_path / "b", devices=2)
    assert s1.exit_code == 0 and s2.exit_code == 0
    a, b = merged(r1, "g"), merged(r2, "g")
    # bit for bit: each chunk is sampled in the same batches (keyed by example, fixed chunks) by a
    # worker at the same thread count (torch's default here), so the same ops on the same inputs;
    # torch's CPU kernels repeat their results at a fixed thread count (no atomics on CPU)
    assert a == b and len(a) == 48
    assert {r["id"] for r in a} == {f"arith-train-{i:05d}" for i in range(24)} or len({r["id"] for r in a}) == 24
    assert {state2["jobs"]["g.s0"]["devices"][0]["ordinal"], state2["jobs"]["g.s1"]["devices"][0]["ordinal"]} == {0, 1}
    assert (r1.job("g.merge").artifacts / "preview.csv").read_text().startswith("completion,correct,extracted")
    res = r1.job("g.merge").read_result()
    assert res["records"] == 48 and 0.0 < res["accuracy"] < 1.0


def test_a_killed_shard_resumes_after_its_last_chunk(tiny, tmp_path):
    req = request(tiny, size=48)
    jobs = ParallelDataGenerator([1]).plan(req, "g", 48)
    _, _, ref_run = run_graph(jobs, tmp_path / "ref", devices=1)
    expected = merged(ref_run, "g")

    from pita.core.paths import RunPaths

    run = RunPaths.create(tmp_path / "k", "t")
    first = run.job("g.s0").checkpoints / "chunk-00000.jsonl"

    def killer():
        end = time.time() + 120
        while time.time() < end and not first.exists():
            time.sleep(0.02)
        for p in workers_of(run.root):
            p.kill()

    t = threading.Thread(target=killer)
    t.start()
    summary, state, _ = run_graph(jobs, tmp_path / "k", devices=1, run=run)
    t.join()
    assert state["jobs"]["g.s0"]["state"] == "FAILED" and "SIGKILL" in state["jobs"]["g.s0"]["error"]
    done = sorted(p.name for p in run.job("g.s0").checkpoints.iterdir())
    assert 1 <= len(done) < 6
    summary, state, _ = run_graph(jobs, tmp_path / "k", devices=1, run=run)
    assert summary.exit_code == 0
    assert "already done earlier" in run.job("g.s0").log.read_text()
    assert merged(run, "g") == expected  # the chunks redone are the same ops on the same inputs: same bits


def test_recipes_write_their_documented_records(tiny, tmp_path):
    jobs = []
    jobs += ParallelDataGenerator([1]).plan(request(tiny, "preference_pairs", size=8, n=3), "pp", 8)
    jobs += ParallelDataGenerator([1]).plan(request(tiny, "prompts", size=8), "pr", 8)
    jobs += ParallelDataGenerator([1]).plan(request(tiny, "value_rollouts", size=4), "vr", 4)
    jobs += ParallelDataGenerator([1]).plan(
        request(tiny, "value_rollouts", size=4, rollouts={"cut_points": 3, "continuations": 1,
                                                          "mode": "greedy_vs_sampled"}), "vg", 4)
    jobs += ParallelDataGenerator([1]).plan(request(tiny, "samples", dataset="sentiment", size=8), "se", 8)
    summary, state, run = run_graph(jobs, tmp_path, devices=2, backend="inline")
    assert summary.exit_code == 0, summary.failures
    pp = merged(run, "pp")
    assert len(pp) == 8 and set(pp[0]) == {"id", "prompt", "chosen", "rejected", "chosen_reward", "rejected_reward",
                                           "p_chosen", "chosen_finish", "rejected_finish"}
    assert {r["chosen_finish"] for r in pp} | {r["rejected_finish"] for r in pp} <= {"eos", "length"}
    assert merged(run, "pr")[0]["answer"] is not None and merged(run, "pr")[0]["task"] == "math"
    vr = merged(run, "vr")
    assert {r["cut"] for r in vr} >= {0} and all(r["kind"] == "sampled" for r in vr)
    assert len(vr) == sum(2 * len({r["cut"] for r in vr if r["id"] == i}) for i in {r["id"] for r in vr})
    vg = merged(run, "vg")
    kinds = {}
    for r in vg:
        kinds.setdefault((r["id"], r["cut"]), []).append(r["kind"])
    assert all(sorted(k) == ["greedy", "sampled"] for k in kinds.values())
    se = merged(run, "se")
    assert all(r["correct"] is None and isinstance(r["reward"], float) for r in se)
    assert len({round(r["reward"], 3) for r in se}) > 1


def test_bad_requests_name_their_keys(tiny):
    problems = check_request(request(tiny, "preference_pairs", n=1, sampling={"max_new_tokens": 0, "temperature": -1,
                                                                            "top_p": 0, "top_k": -1, "batch_size": 0}))
    text = "\n".join(problems)
    for key in ("samples_per_prompt=1 must be >= 2", "max_new_tokens=0", "temperature=-1", "top_p=0", "top_k=-1",
                "data_collection.batch_size=0"):
        assert key in text, key
    with pytest.raises(ConfigError, match="data_collection.recipe='nope' is not known"):
        ParallelDataGenerator([1]).plan(request(tiny, "nope"), "x", 4)
    with pytest.raises(ConfigError, match="no examples"):
        ParallelDataGenerator([1]).plan(request(tiny), "x", 0)
