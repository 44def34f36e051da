"""Memory estimates for jobs, from a model's shape and dtype.

These are planning numbers, not measurements: the scheduler reserves them on a device before a
job starts, and the OOM retry (batch halved) covers the cases where they are too small.

    inference  ~ weights + KV cache(batch, seq) + logits of one step + workspace
    training   ~ weights + gradients + optimizer states (+ fp32 master copy) + activations + logits

Activation sizes follow the usual transformer accounting (Korthikanti et al., 2022): about
``34 * hidden`` bytes per token per layer in 16-bit without recomputation, and only each layer's
input (``2 * hidden`` bytes per token per layer) plus one layer's full set with gradient
checkpointing. Attention scores are not materialised (SDPA / FlashAttention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

GiB = 1024**3
GB = 1e9

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "int8": 1, "fp8": 1, "float8": 1, "int4": 0.5,
}

# Per-process overhead that is there before the first tensor: CUDA context, cuBLAS workspace.
CUDA_CONTEXT_BYTES = int(0.6 * GiB)


def bytes_per_param(dtype: str) -> float:
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not known; choose one of: {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelShape:
    """What memory estimates need to know about a model."""

    n_params: int
    n_layers: int
    hidden: int
    n_kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_hf_config(cls, cfg, n_params: int | None = None) -> "ModelShape":
        """Build from a transformers config (``n_params`` estimated from the shape when not given)."""
        hidden = cfg.hidden_size
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        layers = cfg.num_hidden_layers
        vocab = cfg.vocab_size
        if n_params is None:
            inter = getattr(cfg, "intermediate_size", 4 * hidden)
            per_layer = hidden * (heads * head_dim) * 2 + hidden * (kv * head_dim) * 2 + 3 * hidden * inter
            n_params = layers * per_layer + vocab * hidden * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
        return cls(int(n_params), layers, hidden, kv, head_dim, vocab)


def weights_bytes(shape: ModelShape, dtype: str) -> float:
    return shape.n_params * bytes_per_param(dtype)


def kv_cache_bytes(shape: ModelShape, dtype: str, batch: int, seq_len: int) -> float:
    """Keys and values of every layer for ``batch`` sequences of ``seq_len`` tokens."""
    return 2 * shape.n_layers * batch * seq_len * shape.n_kv_heads * shape.head_dim * bytes_per_param(dtype)


def inference_bytes(shape: ModelShape, dtype: str, batch: int, seq_len: int, cuda: bool = True) -> int:
    """Weights + KV cache + one step of fp32 logits + a 10% workspace (+ CUDA context)."""
    w = weights_bytes(shape, dtype)
    kv = kv_cache_bytes(shape, dtype, batch, seq_len)
    logits = batch * shape.vocab * 4
    total = (w + kv + logits) * 1.10
    return int(total + (CUDA_CONTEXT_BYTES if cuda else 0))


def training_bytes(
    shape: ModelShape,
    dtype: str,
    batch: int,
    seq_len: int,
    optimizer: str = "adamw",
    master_fp32: bool = True,
    gradient_checkpointing: bool = False,
    cuda: bool = True,
) -> int:
    """Weights + gradients + optimizer states (+ fp32 master) + activations + logits (+ context).

    ``batch`` is the micro-batch that is resident at once (gradient accumulation does not add).
    """
    b = bytes_per_param(dtype)
    n = shape.n_params
    weights = n * b
    grads = n * b
    opt_states = {"adamw": 8, "adam": 8, "sgd": 0, "sgd_momentum": 4, "adafactor": 4}.get(optimizer)
    if opt_states is None:
        raise ValueError(f"optimizer={optimizer!r} is not known; choose adamw, adam, sgd, sgd_momentum, adafactor")
    optim = n * opt_states
    master = n * 4 if (master_fp32 and b < 4) else 0
    tokens = batch * seq_len
    act = tokens * shape.n_layers * 34 * shape.hidden
    if gradient_checkpointing:  # layer inputs kept, one layer's activations live during recompute
        act = min(act, tokens * shape.n_layers * 2 * shape.hidden + tokens * 34 * shape.hidden)
    act *= b / 2  # the 34*h figure is for 16-bit activations
    logits = tokens * shape.vocab * 4 * 2  # fp32 logits and their gradient
    total = (weights + grads + optim + master + act + logits) * 1.10
    return int(total + (CUDA_CONTEXT_BYTES if cuda else 0))


def largest_batch(estimate: Callable[[int], float], free_bytes: float, margin: float = 0.1, limit: int = 4096) -> int:
    """The largest batch b (1..limit) with ``estimate(b) <= free_bytes * (1 - margin)``; 0 if none fits.

    ``estimate`` must grow with b; binary search keeps this cheap for large limits.
    """
    budget = free_bytes * (1.0 - margin)
    if estimate(1) > budget:
        return 0
    lo, hi = 1, 1
    while hi < limit and estimate(min(hi * 2, limit)) <= budget:
        hi = min(hi * 2, limit)
        lo = hi
    if hi >= limit:
        return limit
    hi = min(hi * 2, limit)
    while lo + 1 < hi:  # estimate(lo) fits, estimate(hi) does not
        mid = (lo + hi) // 2
        if estimate(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def split_proportionally(n_items: int, capacities: list[float]) -> list[int]:
    """Split ``n_items`` across workers proportionally to capacity (largest-remainder rounding).

    Deterministic: ties go to the earlier worker. Every worker with capacity gets its share; the
    counts always add up to ``n_items``.
    """
    if n_items < 0:
        raise ValueError(f"n_items={n_items} must be >= 0")
    if not capacities:
        raise ValueError("no workers to split the items across")
    if any(c < 0 for c in capacities):
        raise ValueError(f"capacities={capacities} must all be >= 0")
    from fractions import Fraction

    caps = [Fraction(c) for c in capacities]  # exact: ties must be real ties, not rounding noise
    total = sum(caps)
    if total <= 0:
        caps = [Fraction(1)] * len(caps)
        total = Fraction(len(caps))
    exact = [n_items * c / total for c in caps]
    counts = [int(x) for x in exact]
    rest = n_items - sum(counts)
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:rest]:
        counts[i] += 1
    return counts
