"""Memory estimates for jobs, from a model's shape and dtype.

These are planning numbers, not measurements: the scheduler reserves them on a device before a
job starts, and the OOM retry (batch halved) covers the cases where they are too small.

    inference  ~ weights + KV cache(batch, seq) + logits of one step + workspace
    training   ~ weights + gradients + optimizer states (+ fp32 master copy) + activations + logits

Activation sizes follow the transformer accounting of Korthikanti et al. (2022), per layer and
token, from the model's own widths (:func:`layer_activation_elements`: wide MLPs and grouped
queries count as they are), and only each layer's input plus one layer's full set with gradient
checkpointing. Attention scores are not materialised (SDPA / FlashAttention). The formulas are
checked against fake-tensor measurements of the jobs' own code: ``python -m bench.memory_truth``.
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
# What NCCL allocates on each rank of a multi-device job, outside torch's allocator (torch's
# counters never see it): its channels' buffers and, on NVSwitch nodes, NVLS's. Measured by others
# on A100 / H100 nodes: 0.54-0.69 GB per communicator over 2-4 NVLink GPUs (NVIDIA/nccl#964), 1.6 GB
# for one communicator that ran an all-reduce (NVIDIA/nccl#864); NVLS adds enough that NVIDIA's
# own launchers turn it off to save memory (NeMo-Framework-Launcher#127). A sharded or
# data-parallel job holds one communicator per rank (FSDP2's all-gathers and reduce-scatters share
# it), so 2 GiB per rank covers the measured 1.6 GB with room for NVLS.
NCCL_RANK_BYTES = int(2 * GiB)


def bytes_per_param(dtype: str) -> float:
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not known; choose one of: {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


# model types (config.model_type) whose attention normalises each head's queries and keys, and
# those with a norm before and after each attention and MLP block
QK_NORM_TYPES = ("qwen3", "gemma3", "olmo2", "olmo3")
SANDWICH_NORM_TYPES = ("gemma2", "gemma3")


@dataclass(frozen=True)
class ModelShape:
    """What memory estimates need to know about a model (its language model's sizes)."""

    n_params: int
    n_layers: int
    hidden: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    n_heads: int = 0  # 0: unknown (hidden // head_dim is used)
    intermediate: int = 0  # the MLP's width; 0: unknown (4 x hidden is used)
    qk_norm: bool = False  # an RMSNorm on each head's queries and keys (Qwen3, Gemma 3, OLMo 2)
    norms: int = 2  # norms per decoder layer (4: Gemma 2 and 3 norm each block's input and output)

    @property
    def heads(self) -> int:
        return self.n_heads or max(1, self.hidden // max(1, self.head_dim))

    @property
    def mlp(self) -> int:
        return self.intermediate or 4 * self.hidden

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention and MLP projections)."""
        h, d = self.hidden, self.head_dim
        return h * self.heads * d * 2 + h * self.n_kv_heads * d * 2 + 3 * h * self.mlp

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder layers (embeddings, output head, final norm)."""
        return max(0, self.n_params - self.n_layers * self.layer_params)

    @classmethod
    def from_hf_config(cls, cfg, n_params: int | None = None) -> "ModelShape":
        """Build from a transformers (text) config (``n_params`` estimated from the shape when not given)."""
        hidden = cfg.hidden_size
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        layers = cfg.num_hidden_layers
        vocab = cfg.vocab_size
        inter = getattr(cfg, "intermediate_size", None) or getattr(cfg, "hidden_dim", None) or 4 * hidden
        if n_params is None:
            per_layer = hidden * (heads * head_dim) * 2 + hidden * (kv * head_dim) * 2 + 3 * hidden * inter
            n_params = layers * per_layer + vocab * hidden * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
        kind = str(getattr(cfg, "model_type", "") or "")
        qk_norm = kind.startswith(QK_NORM_TYPES)
        norms = 4 if kind.startswith(SANDWICH_NORM_TYPES) else 2
        return cls(int(n_params), layers, hidden, kv, head_dim, vocab, heads, inter, qk_norm, norms)


def fsdp_gather_bytes(shape: ModelShape) -> float:
    """What FSDP2 holds unsharded at once besides the shards, in fp32: the root unit (embeddings,
    output head) for the whole step, the layer running, the next one prefetched, and one layer's
    full gradient before its reduce-scatter."""
    return (shape.root_params + 3 * shape.layer_params) * 4


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


# fp32 [rows x vocabulary] tensors the sampler holds at once at one step: the tempered
# log-probs, the guided or nucleus-masked copy, the sampled distribution, the reference's under
# its own processing, the softmax and its cumulative sum
SAMPLER_COPIES = 6


def layer_transient_bytes(shape: ModelShape, tokens: int, act_bytes: float) -> float:
    """The widest moment of one layer's forward over ``tokens`` tokens without autograd: the
    residual stream and its normed copy next to the MLP's gate, up and gated product (or the
    attention's queries, keys, values and output, whichever is wider)."""
    mlp = 2 * shape.hidden + 3 * shape.mlp
    attn = 3 * shape.hidden + (2 * shape.heads + 2 * shape.n_kv_heads) * shape.head_dim
    return tokens * max(mlp, attn) * act_bytes


def generation_bytes(shape: ModelShape, dtype: str, batch: int, prompt_len: int, new_tokens: int,
                     cuda: bool = True) -> int:
    """Sampling ``batch`` completions of up to ``new_tokens`` after prompts of ``prompt_len``:
    weights + the larger of the prefill (the prompts' KV cache and the widest layer over every
    prompt token) and the last decode step (the KV cache at full length), + the last position's
    logits and the sampler's fp32 copies (+ 10% workspace and the context). Prefill keeps only
    the last position's logits (``LM.generate_ids``)."""
    b = bytes_per_param(dtype)
    w = weights_bytes(shape, dtype)
    prefill = (kv_cache_bytes(shape, dtype, batch, prompt_len)
               + layer_transient_bytes(shape, batch * prompt_len, b) + batch * prompt_len * shape.hidden * b)
    decode = kv_cache_bytes(shape, dtype, batch, prompt_len + new_tokens) + layer_transient_bytes(shape, batch, b)
    logits = batch * shape.vocab * (b + 4 * SAMPLER_COPIES)
    return int((w + max(prefill, decode) + logits) * 1.10 + (CUDA_CONTEXT_BYTES if cuda else 0))


# completion positions whose fp32 log-probabilities over the vocabulary exist at once when
# ``LM.sequence_logprobs`` scores a batch (chunked over positions)
SCORE_CHUNK_TOKENS = 1024


def scoring_bytes(shape: ModelShape, dtype: str, batch: int, seq_len: int, cuda: bool = True,
                  weights: bool = True, logits: bool = True) -> int:
    """Scoring ``batch`` sequences of ``seq_len`` tokens in one forward without a KV cache: weights
    (unless ``weights=False``: a second use of a model already counted) + the widest layer over
    every token + the final hidden states + one chunk of completion positions' logits in fp32
    (logits, log-softmax, nucleus mask) (+ 10% workspace and the context)."""
    b = bytes_per_param(dtype)
    tokens = batch * seq_len
    w = weights_bytes(shape, dtype) if weights else 0
    act = layer_transient_bytes(shape, tokens, b) + tokens * shape.hidden * b
    lg = min(tokens, SCORE_CHUNK_TOKENS) * shape.vocab * (b + 4 * 3) if logits else 0  # a classifier: none
    return int((w + act + lg) * 1.10 + (CUDA_CONTEXT_BYTES if cuda else 0))


# the linear layers LoRA may adapt: (input width, output width) in a layer of ``shape``
def _linear_widths(shape: ModelShape) -> dict[str, tuple[int, int]]:
    q, kv, h, i = shape.heads * shape.head_dim, shape.n_kv_heads * shape.head_dim, shape.hidden, shape.mlp
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
            "qkv_proj": (h, q + 2 * kv), "gate_up_proj": (h, 2 * i)}


def lora_params(shape: ModelShape, r: int, targets) -> int:
    """Parameters of rank-``r`` LoRA adapters on the named linear layers of every layer (a name
    this table does not know counts as the widest, hidden x MLP)."""
    if r <= 0:
        return 0
    widths = _linear_widths(shape)
    widest = shape.hidden + shape.mlp
    return shape.n_layers * sum(r * (sum(widths[t]) if t in widths else widest) for t in targets)


def layer_activation_elements(shape: ModelShape, autocast: bool = False) -> int:
    """Elements one layer keeps per token for its backward (SwiGLU MLP, SDPA attention), in the
    activations' dtype: the two norms' inputs and fp32 statistics (6h), queries and attention
    output (2q), keys and values (2kv), and the MLP's gate, up, activation and product (4 x
    intermediate). A model that norms each head's queries and keys keeps their fp32 inputs and
    normed outputs (3q + 3kv); each norm beyond two keeps its fp32 input and output (4h).
    ``autocast``: 16-bit activations over fp32 weights (value and proxy training): every projection
    casts its input and keeps the copy (q, k, v, gate, up: 5h) and the residual stream and the
    norms' outputs stay fp32 (2.5h more). Per-token slopes measured on fake tensors
    (bench/memory_truth.py) for SmolLM2, Llama 3.2, Qwen3 and Gemma 3 agree with these within 3%."""
    q = shape.heads * shape.head_dim
    kv = shape.n_kv_heads * shape.head_dim
    out = 6 * shape.hidden + 2 * q + 2 * kv + 4 * shape.mlp
    if shape.qk_norm:
        out += 3 * q + 3 * kv
    out += 4 * shape.hidden * max(0, shape.norms - 2)
    if autocast:
        out += (15 * shape.hidden) // 2
    return out


def attention_layer_bytes(shape: ModelShape, rows: int, seq_len: int, act_bytes: float, attn_impl: str | None) -> float:
    """What one layer's attention keeps for its backward beyond :func:`layer_activation_elements`
    when a batch of ``rows`` padded sequences of ``seq_len`` tokens trains through ``attn_impl``
    (transformers' integrations as they run with a padding mask, which a batch of prompts and
    completions of different lengths has):

    - ``sdpa``: the keys and values repeated to every query head (``repeat_kv``: SDPA's grouped-query
      path is taken only without a mask) and the boolean mask turned into a bias in the activations'
      dtype, [rows x seq x seq], which the memory-efficient kernel keeps for its backward;
    - ``eager``: the repeated keys and values, and the attention weights before and after the
      softmax, [rows x heads x seq x seq] each;
    - ``flash_attention_2`` (unpadded sequences, grouped queries in the kernel) or ``None``: nothing.
    """
    if attn_impl not in ("sdpa", "eager"):
        return 0.0
    repeated = 2 * rows * seq_len * (shape.heads - shape.n_kv_heads) * shape.head_dim * act_bytes
    if attn_impl == "sdpa":
        return repeated + rows * seq_len * seq_len * act_bytes
    return repeated + 2 * rows * shape.heads * seq_len * seq_len * act_bytes


def training_bytes(
    shape: ModelShape,
    dtype: str,
    batch: int,
    seq_len: int,
    optimizer: str = "adamw",
    master_fp32: bool = True,
    gradient_checkpointing: bool = False,
    cuda: bool = True,
    act_dtype: str | None = None,
    trainable_params: int | None = None,
    frozen_dtype: str | None = None,
    extra_bytes: float = 0.0,
    logits: bool = True,
    shards: int = 1,
    attn_impl: str | None = None,
    autocast_copies: bool = False,
) -> int:
    """Weights + gradients + optimizer states (+ fp32 master) + activations + logits (+ context).

    ``batch`` is the micro-batch that is resident at once (gradient accumulation does not add).
    ``act_dtype``: the activations' dtype (autocast's, e.g. bfloat16 over fp32 weights; default
    ``dtype``). ``trainable_params``: gradients and optimizer states for this many parameters
    only (LoRA adapters, which are then added to the weights); default every parameter.
    ``frozen_dtype``: the dtype the frozen weights are held in when ``trainable_params`` is set
    (LoRA's base on CUDA: the model's dtype; default ``dtype``). ``extra_bytes``: other resident memory (a frozen reference model). ``logits=False``: the loss
    never takes the whole vocabulary at every position (TRL's fused head: ``fused_head_bytes``). ``shards``: FSDP over this many devices
    (weights, gradients, optimizer states and master weights split; :func:`fsdp_gather_bytes`
    added; activations and logits per device as before). ``attn_impl``: what the attention keeps
    beyond the layer's own activations for ``batch`` padded rows (:func:`attention_layer_bytes`;
    ``None``: nothing, as for unpadded or packed rows). ``autocast_copies``: a loop of its own
    under ``torch.autocast`` over fp32 weights (value and proxy training): what autocast's casts
    keep (:func:`layer_activation_elements`' ``autocast``, and a 16-bit copy of each layer's
    weights); the policy trainers' figures were measured through their own trainer without it.
    """
    b = bytes_per_param(dtype)
    ab = bytes_per_param(act_dtype or dtype)
    n = shape.n_params
    t = n if trainable_params is None else int(trainable_params)
    weights = (n * bytes_per_param(frozen_dtype or dtype) + t * b) if trainable_params is not None else n * b
    grads = t * b
    opt_states = {"adamw": 8, "adam": 8, "sgd": 0, "sgd_momentum": 4, "adafactor": 4}.get(optimizer)
    if opt_states is None:
        raise ValueError(f"optimizer={optimizer!r} is not known; choose adamw, adam, sgd, sgd_momentum, adafactor")
    optim = t * opt_states
    master = t * 4 if (master_fp32 and b < 4) else 0
    tokens = batch * seq_len
    autocast = autocast_copies and ab < b  # 16-bit activations over wider weights
    per_layer = layer_activation_elements(shape, autocast)
    act = tokens * shape.n_layers * per_layer
    if gradient_checkpointing:  # layer inputs kept, one layer's activations live during recompute
        act = min(act, tokens * shape.n_layers * shape.hidden + tokens * per_layer)
    act *= ab
    attention = attention_layer_bytes(shape, batch, seq_len, ab, attn_impl)
    act += attention * (1 if gradient_checkpointing else shape.n_layers)
    # the logits in the activations' dtype, their fp32 log-softmax and its gradient, and the
    # gradient back in the activations' dtype (a loss that takes the whole vocabulary at every
    # position; TRL's trainers do not: logits=False and pita.core.memory.fused_head_bytes)
    lg = batch * seq_len * shape.vocab * (2 * ab + 4 * 3) if logits else 0
    state = weights + grads + optim + master
    if autocast:  # autocast's 16-bit copy of each decoder layer's weights, kept for the backward
        # (recomputed per layer under gradient checkpointing: one layer's)
        state += (1 if gradient_checkpointing else shape.n_layers) * shape.layer_params * ab
    if shards > 1:
        state = state / shards + fsdp_gather_bytes(shape)
    total = (state + act + lg + extra_bytes) * 1.10
    return int(total + (CUDA_CONTEXT_BYTES if cuda else 0))


# TRL's fused log-prob head (trl/kernels/chunked_logprob.py, TRL 1.16), what DPO and GRPO train
# through: it projects this many positions x this many vocabulary entries at a time into one
# buffer, never the [rows x length x vocabulary] logits
FUSED_TOKEN_CHUNK = 4096
FUSED_VOCAB_CHUNK = 32768


def fused_head_bytes(shape: ModelShape, tokens: int, act_dtype: str, head_trains: bool) -> float:
    """What TRL's fused head holds beyond the activations while it runs over ``tokens`` positions:
    the projection buffer and a vocabulary chunk of the head in the compute dtype; the positions'
    hidden states gathered and cast, their fp32 gradient and a few fp32 statistics each; and, when
    the head trains (full fine-tuning), its whole gradient accumulated in fp32 and cast back."""
    a = bytes_per_param(act_dtype)
    v = min(shape.vocab, FUSED_VOCAB_CHUNK)
    buffers = min(tokens, FUSED_TOKEN_CHUNK) * v * a + v * shape.hidden * a
    per_token = tokens * (shape.hidden * (2 * a + 4) + 4 * 8)
    head = shape.vocab * shape.hidden * (4 + a) if head_trains else 0.0
    return buffers + per_token + head


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


def generate_rows(per_device: int, sampling_bytes: Callable[[int], float] | None, budget: float | None) -> int:
    """Rows per ``generate`` call when GRPO samples a generation batch of ``per_device`` rows on one
    device with transformers: what the sampling phase holds at r rows (``sampling_bytes(r)``: the
    resident weights and optimizer state, the gathered policy, the KV cache, the step's logits;
    no gradients or activations then) decides, not the training micro-batch. The fewest calls
    whose rows fit ``budget``, the rows spread evenly over them (16 rows that fit 12 at a time are
    two calls of 8, not 12 + 4); one call of all the rows without a budget or a measure; 1 row a
    call when even one does not fit. The job's trainer samples with the number the plan computed
    here (its params' ``rows_per_generate``), and the plan prices that many calls."""
    per_device = max(1, int(per_device))
    if sampling_bytes is None or budget is None:
        return per_device
    most = largest_batch(sampling_bytes, budget, margin=0.0, limit=per_device) or 1
    return -(-per_device // generate_calls(per_device, most))


def generate_calls(per_device: int, rows: int) -> int:
    """``generate`` calls one device makes per generation batch of ``per_device`` rows."""
    return -(-max(1, int(per_device)) // max(1, int(rows)))


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
