"""The plan's seconds follow what each job executes (pita/plans/durations.py): rows and tokens as
the job counts them, the KV cache a decoding step reads and copies, the value model's own forward
in guided decoding, training's efficiency at its micro-batch, loading and saving, and vLLM as it
runs (every device decodes every token step; the weights synced each step)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pita.core.memory import ModelShape
from pita.plans import durations as D

# Qwen3-1.7B-like policy and value model (28 layers, 8 KV heads of 128)
POLICY = ModelShape(n_params=1_700_000_000, n_layers=28, hidden=2048, n_kv_heads=8, head_dim=128, vocab=151936,
                    n_heads=16, intermediate=6144)
VALUE = ModelShape(n_params=600_000_000, n_layers=28, hidden=1024, n_kv_heads=8, head_dim=128, vocab=151936,
                   n_heads=16, intermediate=3072)
RM = ModelShape(n_params=2_500_000_000, n_layers=18, hidden=2048, n_kv_heads=1, head_dim=256, vocab=256000)


def _shape(part):
    return {"reference": POLICY, "guidance": VALUE}.get(part, RM)


def _job(jid, kind, params, deps=(), devices=1):
    return SimpleNamespace(id=jid, kind=kind, params=params, deps=list(deps),
                           resources=SimpleNamespace(devices=devices))


def _request(recipe="samples", n=4, new=512, dataset="gsm8k", guided=False, rm=None, **extra):
    return {"recipe": recipe, "n": n, "chunk_size": 64, "dataset": {"name": dataset},
            "policy": {"guidance": {"from_job": "v"} if guided else None},
            "sampling": {"max_new_tokens": new, "batch_size": 64},
            "scoring": {"reward_model": rm, "reward_batch_size": 32}, **extra}


def _shard(jid, req, examples=64):
    return _job(jid, "generation.shard", {"request": req, "chunks": [0, 1], "n_examples": examples})


def _seconds(*jobs, target=None):
    d = D.Durations(list(jobs), _shape, "bfloat16", 256)
    return d.seconds(target or jobs[-1])


def test_pitas_greedy_vs_sampled_collection_samples_two_continuations_per_cut_not_continuations():
    pita = {"recipe": "value_rollouts", "rollouts": {"cut_points": 4, "continuations": 4, "mode": "greedy_vs_sampled"}}
    qsharp = {"recipe": "value_rollouts", "rollouts": {"cut_points": 4, "continuations": 4, "mode": "sampled"}}
    assert D.rows_per_example(pita) == 1 + 4 * 2
    assert D.rows_per_example(qsharp) == 1 + 4 * 4


def test_a_decoding_step_reads_its_kv_cache_and_transformers_copies_it():
    short = D.decode_seconds(POLICY.n_params, POLICY.n_params * 2, 64, 64, 100, 512, 28,
                             kv_bytes_per_token=D.Durations([], _shape, "bfloat16", 256).kv_per_token(POLICY))
    no_cache = D.decode_seconds(POLICY.n_params, POLICY.n_params * 2, 64, 64, 100, 512, 28)
    assert short > 1.2 * no_cache  # 64 rows x ~356 positions x 112 KiB: as much as the weights a step
    hf = D.decode_seconds(POLICY.n_params, POLICY.n_params * 2, 64, 64, 100, 512, 28, overhead=False,
                          kv_bytes_per_token=1e5)
    paged = D.decode_seconds(POLICY.n_params, POLICY.n_params * 2, 64, 64, 100, 512, 28, overhead=False,
                             kv_bytes_per_token=1e5, cache_passes=D.VLLM_CACHE_PASSES)
    assert hf > paged


def test_guided_decoding_counts_the_value_models_layers_and_the_datasets_prompt():
    plain = _seconds(_shard("s", _request("eval", n=1, new=256)))
    guided = _seconds(_shard("g", _request("eval", n=1, new=256, guided=True)))
    # a guided step runs a second forward of 28 layers: at least the launches of those layers
    steps = 256  # one batch of 64 rows
    assert guided - plain > steps * D.step_overhead(VALUE.n_layers)
    imdb = _seconds(_shard("i", _request("eval", n=1, new=256, dataset="imdb")))
    tldr = _seconds(_shard("t", _request("eval", n=1, new=256, dataset="tldr")))
    assert tldr > imdb  # 420 prompt tokens against 45


def test_a_reward_models_scoring_is_counted():
    plain = _seconds(_shard("s", _request(n=4, new=128, dataset="tldr")))
    scored = _seconds(_shard("r", _request(n=4, new=128, dataset="tldr", rm="some/rm")))
    assert scored - plain > D.LOAD_BASE_S  # its loading, and a forward over 256 completions


def test_value_training_reads_rows_as_long_as_the_collection_samples():
    def value_seconds(new):
        shard = _shard("d.s0", _request("value_rollouts", new=new,
                                        rollouts={"cut_points": 2, "continuations": 2, "mode": "sampled"}), 64)
        merge = _job("d.merge", "generation.merge", {"shards": ["d.s0"]}, devices=0)
        train = _job("v", "algo.value_train", {"data": ["d.merge"], "epochs": 10, "batch_size": 32,
                                               "micro_batch_size": 8})
        return _seconds(shard, merge, train)

    short, long = value_seconds(128), value_seconds(512)
    rows = 64 * (1 + 2 * 2) * 10  # examples x rows each x epochs
    # 150 + 512 tokens a row against 150 + 128: at least the extra tokens' FLOPs at the best MFU
    assert long - short >= 6 * VALUE.n_params * rows * (512 - 128) / (D.PEAK_FLOPS * D.MFU_MAX)


def test_training_efficiency_falls_with_small_micro_batches_of_short_sequences():
    d = D.Durations([], _shape, "bfloat16", 256)
    tokens = 1e8
    small = d.train(POLICY, tokens, 1, 256, 8, rows=tokens / 256, batch_rows=64)
    large = d.train(POLICY, tokens, 8, 1024, 8, rows=tokens / 1024, batch_rows=64)
    assert small > 1.5 * large
    assert D.training_mfu(256) < 0.25 < D.training_mfu(8 * 1024) <= D.MFU_MAX


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_vllm_decodes_every_token_step_on_each_device_and_syncs_weights_each_step(mode):
    def grpo(devices, use_vllm=True):
        p = {"devices": devices, "sharding": "fsdp" if devices > 1 else "none", "batch_size": 64,
             "num_generations": 8, "max_steps": 100, "micro_batch_size": 2, "max_completion_length": 512,
             "lora_r": 0, "use_vllm": use_vllm, "vllm_mode": mode, "dataset": {"name": "gsm8k"}}
        return _seconds(_job("g", "algo.grpo_train", p, devices=devices))

    one, eight = grpo(1), grpo(8)
    # training splits over 8 devices; each device still decodes every token step of its rows
    # (colocated), or the server decodes all of them: far from 8x faster
    assert eight > one / 4
    # the weight sync each step is counted
    assert grpo(1) > 100 * (D.VLLM_SYNC_BASE_S + POLICY.n_params * 2 / D.VLLM_SYNC_BYTES_S)


def test_dpo_is_priced_for_the_pairs_it_trains_on():
    """With ties dropped, DPO trains on the decisive pairs: where a verifier alone labels them
    about a quarter (VERIFIER_DECISIVE), where a reward model scores them all of them; with
    ties=draw every pair. The training part of the seconds follows."""
    def dpo(rm=None, ties="drop"):
        shard = _job("g.s0", "generation.shard", {"request": _request("preference_pairs", n=8, rm=rm),
                                                  "chunks": [0, 1000], "n_examples": 64_000})
        merge = _job("g.merge", "generation.merge", {"shards": ["g.s0"]})
        p = {"devices": 1, "sharding": "none", "batch_size": 64, "micro_batch_size": 4, "epochs": 2, "lora_r": 0,
             "max_length": 1024, "ties": ties, "dataset": {"name": "gsm8k"}}
        return _seconds(shard, merge, _job("t", "algo.dpo_train", p, deps=["g.merge"]))

    verifier, drawn, rm = dpo(), dpo(ties="draw"), dpo(rm="RM-Gemma-2B")
    assert rm == drawn and verifier < 0.5 * drawn
    assert D.decisive_share({"scoring": {"reward_model": None}}) == D.VERIFIER_DECISIVE
    assert D.decisive_share({"scoring": {"reward_model": None}}, "draw") == 1.0


@pytest.mark.parametrize("rows", [64, 32, 8])
def test_grpo_without_vllm_decodes_its_generate_calls_one_after_another(rows):
    """Each generate call runs to the longest completion: 64 rows a device in calls of 32 cost
    about twice one call of 64 (decoding is latency-bound), calls of 8 about eight times."""
    def grpo(r):
        p = {"devices": 1, "sharding": "none", "batch_size": 64, "num_generations": 8, "max_steps": 10,
             "micro_batch_size": 2, "max_completion_length": 512, "lora_r": 0, "use_vllm": False,
             "dataset": {"name": "gsm8k"}, "rows_per_generate": r}
        return _seconds(_job("g", "algo.grpo_train", p))

    assert grpo(rows) >= grpo(64) and (rows == 64 or grpo(rows) > grpo(2 * rows))


def test_a_cards_measurements_are_kept_apart_and_the_plan_says_which_kinds_they_correct(tmp_path, capsys):
    """A run on H100s teaches H100 plans only (the store's scope names the card); the plan's
    ``seconds from`` says, per kind, roofline or measured on that card; CPU runs calibrate CPU plans."""
    import json

    from pita.cli.plan import plan_main

    h100 = D.DurationLearner.load(tmp_path, "smollm2", cuda=True, card="H100-SXM")
    h100.observe("algo.dpo_train", 100.0, 250.0)
    h100.save()
    assert D.DurationLearner.load(tmp_path, "smollm2", cuda=True, card="A100-80GB").factor("algo.dpo_train") is None
    assert D.DurationLearner.load(tmp_path, "smollm2", cuda=True, card="H100-SXM").factor("algo.dpo_train") == 2.5
    base = ["--json", "experiment=paper_math", "model=smollm2", f"system.cache_dir={tmp_path}", "experiment.algos=[DPO]"]
    for inventory, expected in (("4xH100", "measured on H100-SXM"), ("4xA100-80GB", "roofline")):
        assert plan_main([*base, f"system.inventory={inventory}"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan["duration_sources"]["algo.dpo_train"] == expected
        assert plan["duration_sources"]["eval.shard (reference)"] == "roofline"
