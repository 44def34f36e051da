"""pita.core.memory: estimates checked against numbers worked out by hand.

The small shape used throughout (``SHAPE``): 1000 parameters, 2 layers, hidden 8, 2 KV heads of
dimension 4, vocabulary 16. Totals are multiplied by 1.10 (workspace) and truncated to int, so
comparisons allow 1 byte for float rounding.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pita.core.memory import (
    CUDA_CONTEXT_BYTES,
    ModelShape,
    bytes_per_param,
    inference_bytes,
    kv_cache_bytes,
    largest_batch,
    split_proportionally,
    training_bytes,
    weights_bytes,
)

SHAPE = ModelShape(n_params=1000, n_layers=2, hidden=8, n_kv_heads=2, head_dim=4, vocab=16)


def near(x):
    return pytest.approx(x, abs=1)


# ---------------------------------------------------------------- dtypes and pieces
@pytest.mark.parametrize("dtype,expected", [
    ("float32", 4), ("fp32", 4), ("torch.float32", 4), ("bfloat16", 2), ("torch.bfloat16", 2),
    ("BF16", 2), ("float16", 2), ("half", 2), ("int8", 1), ("fp8", 1), ("int4", 0.5),
])
def test_bytes_per_param(dtype, expected):
    assert bytes_per_param(dtype) == expected


def test_bytes_per_param_unknown_dtype_lists_choices():
    with pytest.raises(ValueError) as ei:
        bytes_per_param("float64")
    assert "float64" in str(ei.value) and "bfloat16" in str(ei.value)


def test_weights_bytes():
    assert weights_bytes(SHAPE, "bf16") == 2000
    assert weights_bytes(SHAPE, "int4") == 500


def test_kv_cache_bytes_by_hand():
    """2 (K and V) * 2 layers * 3 sequences * 5 tokens * 2 KV heads * 4 dims * 2 bytes = 960."""
    assert kv_cache_bytes(SHAPE, "bf16", batch=3, seq_len=5) == 960
    assert kv_cache_bytes(SHAPE, "fp32", batch=3, seq_len=5) == 1920
    assert kv_cache_bytes(SHAPE, "bf16", batch=6, seq_len=5) == 1920  # linear in batch


def test_inference_bytes_by_hand():
    """bf16, batch 2, seq 4: weights 2000 + KV 2*2*2*4*2*4*2 = 512 + logits 2*16*4 = 128
    -> 2640 * 1.10 = 2904; with CUDA the context is added."""
    assert inference_bytes(SHAPE, "bf16", 2, 4, cuda=False) == near(2904)
    assert inference_bytes(SHAPE, "bf16", 2, 4, cuda=True) == near(2904 + CUDA_CONTEXT_BYTES)
    assert CUDA_CONTEXT_BYTES == int(0.6 * 1024**3)


def test_training_bytes_by_hand():
    """bf16, batch 1, seq 4 (4 tokens), AdamW, fp32 master, no checkpointing:
        weights 1000*2 = 2000, grads 2000, AdamW 1000*8 = 8000, master 1000*4 = 4000,
        activations 4 tokens * 2 layers * (6*8 + 2*8 + 2*8 + 4*32 = 208 elements) * 2 bytes = 3328,
        logits 4 tokens * 16 * (2 * 2 bytes in bf16 and its gradient + 3 * 4 fp32) = 1024
        -> 20352 * 1.10 = 22387.2 -> 22387."""
    assert training_bytes(SHAPE, "bf16", 1, 4, cuda=False) == near(22387)
    assert training_bytes(SHAPE, "bf16", 1, 4, cuda=True) == near(22387 + CUDA_CONTEXT_BYTES)


def test_training_needs_more_than_inference_and_grows_with_batch():
    for dtype in ("bf16", "fp32"):
        assert training_bytes(SHAPE, dtype, 4, 64) > inference_bytes(SHAPE, dtype, 4, 64)
    sizes = [training_bytes(SHAPE, "bf16", b, 16) for b in (1, 2, 4, 8)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    # batch 2 by hand: activations 8*2*208*2 = 6656, logits 8*16*16 = 2048
    # -> 16000 + 6656 + 2048 = 24704 * 1.1 = 27174.4
    assert training_bytes(SHAPE, "bf16", 2, 4, cuda=False) == near(27174)


def test_gradient_checkpointing_lowers_training_bytes():
    """Checkpointing: each layer's input, 4 tokens * 2 layers * 8 = 64 elements, plus one layer's
    full set 4 * 208 = 832 -> 896 * 2 bytes = 1792 instead of 3328 -> 18816 * 1.10 = 20697.6."""
    assert training_bytes(SHAPE, "bf16", 1, 4, gradient_checkpointing=True, cuda=False) == near(20697)
    deep = ModelShape(n_params=10**6, n_layers=24, hidden=256, n_kv_heads=4, head_dim=64, vocab=1000)
    assert (training_bytes(deep, "bf16", 8, 512, gradient_checkpointing=True)
            < training_bytes(deep, "bf16", 8, 512, gradient_checkpointing=False))


def test_fp32_master_copy_adds_4_bytes_per_param_only_for_16_bit():
    with_m = training_bytes(SHAPE, "bf16", 1, 4, master_fp32=True, cuda=False)
    without = training_bytes(SHAPE, "bf16", 1, 4, master_fp32=False, cuda=False)
    assert with_m - without == near(4 * 1000 * 1.10)  # 17987.2 -> 17987 without the master copy
    assert without == near(17987)
    f_with = training_bytes(SHAPE, "fp32", 1, 4, master_fp32=True, cuda=False)
    f_without = training_bytes(SHAPE, "fp32", 1, 4, master_fp32=False, cuda=False)
    assert f_with == f_without
    # fp32 by hand: 4000 + 4000 + 8000 + 0 + activations 1664 * 4 = 6656 + logits 4*16*(8+12) = 1280
    # -> 23936 * 1.10 = 26329.6
    assert f_with == near(26329)


def test_optimizer_states():
    """SGD keeps no state: 20352 - 8000 = 12352 * 1.10 = 13587.2."""
    assert training_bytes(SHAPE, "bf16", 1, 4, optimizer="sgd", cuda=False) == near(13587)
    assert (training_bytes(SHAPE, "bf16", 1, 4, optimizer="adafactor", cuda=False)
            == training_bytes(SHAPE, "bf16", 1, 4, optimizer="sgd_momentum", cuda=False))
    with pytest.raises(ValueError, match="lion"):
        training_bytes(SHAPE, "bf16", 1, 4, optimizer="lion")


def test_model_shape_from_hf_config_by_hand():
    """hidden 8, 2 heads of 4, 2 layers, vocab 16, intermediate 32, untied embeddings:
    per layer 8*8*2 (q, o) + 8*8*2 (k, v) + 3*8*32 = 128 + 128 + 768 = 1024;
    total 2 * 1024 + 16 * 8 * 2 = 2304. With 1 KV head, k/v are 8*4*2 = 64 -> 2*960 + 256 = 2176."""
    cfg = SimpleNamespace(hidden_size=8, num_attention_heads=2, num_hidden_layers=2, vocab_size=16,
                          intermediate_size=32, tie_word_embeddings=False)
    s = ModelShape.from_hf_config(cfg)
    assert s == ModelShape(n_params=2304, n_layers=2, hidden=8, n_kv_heads=2, head_dim=4, vocab=16, n_heads=2,
                           intermediate=32)
    gqa = SimpleNamespace(**{**vars(cfg), "num_key_value_heads": 1})
    assert ModelShape.from_hf_config(gqa).n_params == 2176
    assert ModelShape.from_hf_config(gqa).n_kv_heads == 1
    assert ModelShape.from_hf_config(cfg, n_params=7).n_params == 7


# ---------------------------------------------------------------- largest_batch
def brute_force(estimate, free, margin, limit):
    budget = free * (1 - margin)
    return max((b for b in range(1, limit + 1) if estimate(b) <= budget), default=0)


@pytest.mark.parametrize("estimate", [
    lambda b: 100 + 7 * b,
    lambda b: 50 + 3 * b + 0.25 * b * b,
    lambda b: 10 * ((b + 7) // 8),  # steps: flat runs of equal estimates
    lambda b: training_bytes(SHAPE, "bf16", b, 16, cuda=False),
])
@pytest.mark.parametrize("free,margin,limit", [
    (1000, 0.1, 4096), (1000, 0.0, 100), (250_000, 0.2, 4096), (5000, 0.1, 37), (10**6, 0.5, 1000),
])
def test_largest_batch_matches_brute_force(estimate, free, margin, limit):
    assert largest_batch(estimate, free, margin, limit) == brute_force(estimate, free, margin, limit)


def test_largest_batch_by_hand():
    """budget 1000 * 0.9 = 900; 100 + 7b <= 900 -> b <= 114.3 -> 114."""
    assert largest_batch(lambda b: 100 + 7 * b, 1000, 0.1) == 114
    assert largest_batch(lambda b: 100 + 7 * b, 1000, 0.0) == 128  # 100 + 7*128 = 996 <= 1000


def test_largest_batch_zero_when_nothing_fits():
    assert largest_batch(lambda b: 901 * b, 1000, 0.1) == 0
    assert largest_batch(lambda b: 900 * b, 1000, 0.1) == 1  # exactly the budget fits


def test_largest_batch_capped_at_limit():
    assert largest_batch(lambda b: 1, 1e12, 0.1) == 4096
    assert largest_batch(lambda b: 1, 1e12, 0.1, limit=37) == 37
    assert largest_batch(lambda b: b, 1000, 0.0, limit=1000) == 1000
    assert largest_batch(lambda b: b, 999, 0.0, limit=1000) == 999


# ---------------------------------------------------------------- split_proportionally
def test_split_proportionally_by_hand():
    """10 over [80, 40, 40]: exact 5, 2.5, 2.5 -> floors 5, 2, 2, one left; the .5 remainders tie
    and the earlier worker (index 1) gets it -> [5, 3, 2]."""
    assert split_proportionally(10, [80, 40, 40]) == [5, 3, 2]
    assert split_proportionally(10, [80e9, 40e9, 40e9]) == [5, 3, 2]


@pytest.mark.parametrize("n,caps,expected", [
    (7, [1, 1, 1], [3, 2, 2]),          # ties go to the earlier workers
    (8, [1, 1, 1], [3, 3, 2]),
    (0, [5, 3], [0, 0]),
    (9, [1, 2], [3, 6]),
    (5, [0, 0], [3, 2]),                # no capacity anywhere: split evenly
    (4, [0, 1, 0], [0, 4, 0]),
    (3, [10, 10, 10, 10], [1, 1, 1, 0]),
])
def test_split_proportionally_cases(n, caps, expected):
    assert split_proportionally(n, caps) == expected


def test_split_proportionally_sums_and_is_deterministic():
    caps = [80e9, 40e9, 24e9, 24e9, 16e9]
    for n in range(0, 60):
        got = split_proportionally(n, caps)
        assert sum(got) == n
        assert got == split_proportionally(n, list(caps))
        # each worker is within one item of its exact share
        assert all(abs(g - n * c / sum(caps)) < 1 for g, c in zip(got, caps))


@pytest.mark.parametrize("n,caps", [(-1, [1.0]), (3, []), (3, [1.0, -0.5])])
def test_split_proportionally_rejects_bad_input(n, caps):
    with pytest.raises(ValueError):
        split_proportionally(n, caps)


def test_split_proportionally_exact_ties_go_to_the_earlier_worker():
    """24 over [80, 5, 5]: exact 21.33, 1.33, 1.33 -> floors 21, 1, 1, one left; all three remainders
    are exactly 1/3, so worker 0 gets it -> [22, 1, 1]. (Float gives 21.333333333333332 for worker 0
    and 1.3333333333333333 for worker 1, so the result is [21, 2, 1].)"""
    assert split_proportionally(24, [80, 5, 5]) == [22, 1, 1]


def test_layer_activations_count_each_width():
    """6h + 2q + 2kv + 4I: hidden 8, 2 heads of 4 (q 8), 2 KV heads (kv 8), intermediate 32."""
    from pita.core.memory import layer_activation_elements

    s = ModelShape(n_params=1000, n_layers=2, hidden=8, n_kv_heads=2, head_dim=4, vocab=16, n_heads=2,
                   intermediate=32)
    assert layer_activation_elements(s) == 6 * 8 + 2 * 8 + 2 * 8 + 4 * 32


def test_padded_attention_keeps_the_mask_bias_and_repeated_keys_by_hand():
    """8 query heads over 2 KV heads of 4, 3 rows of 10 tokens in bf16: SDPA with a padding mask
    keeps the keys and values repeated to the 6 missing heads (2 x 3 x 10 x 6 x 4 x 2 bytes) and the
    [3 x 10 x 10] bias; eager keeps the attention weights twice instead of the bias; FlashAttention
    (unpadded) and grouped queries without repetition keep nothing more. Per layer, and one layer's
    worth under gradient checkpointing."""
    from pita.core.memory import attention_layer_bytes

    s = ModelShape(n_params=1000, n_layers=2, hidden=32, n_kv_heads=2, head_dim=4, vocab=16, n_heads=8,
                   intermediate=64)
    repeated = 2 * 3 * 10 * 6 * 4 * 2
    assert attention_layer_bytes(s, 3, 10, 2, "sdpa") == repeated + 3 * 10 * 10 * 2
    assert attention_layer_bytes(s, 3, 10, 2, "eager") == repeated + 2 * 3 * 8 * 10 * 10 * 2
    assert attention_layer_bytes(s, 3, 10, 2, "flash_attention_2") == attention_layer_bytes(s, 3, 10, 2, None) == 0
    mha = ModelShape(n_params=1000, n_layers=2, hidden=32, n_kv_heads=8, head_dim=4, vocab=16, n_heads=8)
    assert attention_layer_bytes(mha, 3, 10, 2, "sdpa") == 3 * 10 * 10 * 2
    plain = training_bytes(s, "bf16", 3, 10, cuda=False)
    for gc, layers in ((False, 2), (True, 1)):
        base = training_bytes(s, "bf16", 3, 10, cuda=False, gradient_checkpointing=gc)
        sdpa = training_bytes(s, "bf16", 3, 10, cuda=False, gradient_checkpointing=gc, attn_impl="sdpa")
        assert sdpa - base == near(int(layers * (repeated + 600) * 1.10))
    assert training_bytes(s, "bf16", 3, 10, cuda=False, attn_impl="flash_attention_2") == plain


def test_generation_bytes_take_the_larger_of_prefill_and_the_last_decode_step():
    """A long completion: the full-length cache is the peak, and the prefill is not added on top."""
    from pita.core.memory import generation_bytes, kv_cache_bytes, layer_transient_bytes

    s = ModelShape(n_params=10**6, n_layers=4, hidden=64, n_kv_heads=2, head_dim=32, vocab=1000, n_heads=2,
                   intermediate=128)
    got = generation_bytes(s, "bf16", 8, 100, 10_000, cuda=False)
    want = (10**6 * 2 + kv_cache_bytes(s, "bf16", 8, 10_100) + layer_transient_bytes(s, 8, 2)
            + 8 * 1000 * (2 + 4 * 6)) * 1.10
    assert got == near(int(want))
    assert generation_bytes(s, "bf16", 8, 100, 1, cuda=False) < got


def test_lora_trains_only_its_adapters():
    from pita.core.memory import lora_params

    s = ModelShape(n_params=10**6, n_layers=2, hidden=8, n_kv_heads=2, head_dim=4, vocab=16, n_heads=2,
                   intermediate=32)
    n = lora_params(s, 4, ["q_proj", "v_proj"])
    assert n == 2 * (4 * (8 + 8) + 4 * (8 + 8)) and lora_params(s, 0, ["q_proj"]) == 0
    full = training_bytes(s, "fp32", 1, 4, cuda=False)
    lora = training_bytes(s, "fp32", 1, 4, cuda=False, trainable_params=n)
    # frozen base: no gradient or AdamW state for it; the adapters add weights, gradients, states
    assert abs((full - lora) - ((10**6 - n) * (4 + 8) - n * 4) * 1.10) < 2


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3"])
def test_a_layers_kept_activations_per_token_match_the_formula_under_autocast(kind):
    """What one decoder layer keeps for its backward per token, measured on a small model built
    here (the saved tensors' bytes, under autocast to bf16 over fp32 weights as value training
    runs; the difference between 4 and 2 layers and between 128 and 64 tokens removes the weights'
    casts, the embeddings and the shared mask), against ``layer_activation_elements(autocast=True)``
    plus the padded attention's own: within 10% for Llama (SwiGLU, GQA), Qwen3 (per-head q/k norms)
    and Gemma 3 (q/k norms, a norm before and after each block)."""
    import transformers as tf

    from pita.core.memory import ModelShape, attention_layer_bytes, layer_activation_elements

    def build(layers):
        common = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512)
        torch.manual_seed(0)
        if kind == "llama":
            cfg = tf.LlamaConfig(**common)
            return tf.LlamaForCausalLM(cfg).train(), cfg
        if kind == "qwen3":
            cfg = tf.Qwen3Config(**common)
            return tf.Qwen3ForCausalLM(cfg).train(), cfg
        cfg = tf.Gemma3TextConfig(**common, sliding_window=1024, layer_types=["full_attention"] * layers)
        return tf.Gemma3ForCausalLM(cfg).train(), cfg

    def kept(model, B, T):
        seen = {}

        def pack(t):
            st = t.untyped_storage()
            seen.setdefault(st._cdata, st.nbytes())
            return t

        ids = torch.randint(3, 300, (B, T), generator=torch.Generator().manual_seed(1))
        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, :3] = 0  # padded rows, as value training's batches are
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.model(input_ids=ids, attention_mask=mask)
        return sum(v for k, v in seen.items() if k not in params)

    (m2, cfg), (m4, _) = build(2), build(4)
    B, T1, T2 = 2, 64, 128
    per = ((kept(m4, B, T2) - kept(m4, B, T1)) - (kept(m2, B, T2) - kept(m2, B, T1))) / 2 / (B * (T2 - T1)) / 2
    shape = ModelShape.from_hf_config(cfg)
    assert shape.qk_norm == (kind != "llama") and shape.norms == (4 if kind == "gemma3" else 2)
    attention = (attention_layer_bytes(shape, B, T2, 2, "sdpa") - attention_layer_bytes(shape, B, T1, 2, "sdpa")) \
        / (B * (T2 - T1)) / 2
    want = layer_activation_elements(shape, autocast=True) + attention
    assert abs(per - want) <= 0.10 * per, (kind, per, want)
