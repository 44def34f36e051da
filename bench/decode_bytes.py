"""What one decode step of the job's own sampler moves, counted op by op (on this machine's CPU).

    python -m bench.decode_bytes [--json] [--cache .cache/pita] [--rows 8] [--prompt 256]

For each paper family's attention shape (hidden size, query heads, KV heads, head dim; two
decoder layers and random weights: what a step moves per layer does not depend on the depth),
``pita.models.lm.LM.generate_ids`` samples one token and then two; the second run's extra ops are
one decode step. Every aten op's tensor inputs (reads) and outputs (writes) are counted once per
storage and sorted by what they are:

    weights         the model's parameters
    cache           the KV cache: [rows, KV heads, positions, head dim] tensors (attention's reads,
                    the cache's growth by concatenation: a read of the old cache and a write of
                    the new one)
    kv_repeated     keys and values repeated per query head ([rows, heads, positions, head dim],
                    heads > KV heads), which SDPA's grouped-query path would not need
    mask            attention masks (a row's 0/1 or additive mask over the positions)
    other           activations, logits and the sampler's own tensors

Prints per family the bytes per step of each kind, the cache's bytes at the step's length, and
``cache_passes`` = cache bytes moved / cache size: what ``pita.plans.durations.HF_CACHE_PASSES``
assumes. Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json

import torch

# (hidden, query heads, KV heads, head dim, intermediate) of the paper families' policies
FAMILIES = {
    "qwen3": ("Qwen3ForCausalLM", 4096, 32, 8, 128, 12288),  # Qwen3-8B
    "llama": ("LlamaForCausalLM", 2048, 32, 8, 64, 8192),  # Llama-3.2-1B
    "llama-old": ("LlamaForCausalLM", 4096, 32, 8, 128, 14336),  # Llama-3.1-8B
    "phi": ("Phi3ForCausalLM", 3072, 24, 8, 128, 8192),  # Phi-4-mini
}
VOCAB = 4096  # the logits and the sampler's tensors are "other"; a small vocabulary keeps the run short


_NO_MOVE = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}


class _Counter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self, params: set[int], shape: tuple[int, int, int], positions: int):
        super().__init__()
        self.params, (self.kv_heads, self.heads, self.head_dim) = params, shape
        self.positions = positions  # a K/V tensor spans at least the prompt (queries span a few positions)
        self.bytes = {"weights": 0, "cache": 0, "kv_repeated": 0, "mask": 0, "other": 0}

    def _kind(self, t: torch.Tensor) -> str:
        if t.untyped_storage().data_ptr() in self.params:
            return "weights"
        s = tuple(t.shape)
        if len(s) == 4 and s[-1] == self.head_dim and s[1] == self.kv_heads and s[2] >= self.positions:
            return "cache"
        if (len(s) == 4 and s[-1] == self.head_dim and s[1] == self.heads and self.heads != self.kv_heads
                and s[2] >= self.positions):
            return "kv_repeated"
        if t.dtype == torch.bool or (len(s) == 4 and s[1] == 1 and s[-1] > 1 and t.is_floating_point()):
            return "mask"
        return "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "is_view", False) or func in _NO_MOVE:  # a view or a shape: nothing moved
            return out
        seen = set()
        flat = list(torch.utils._pytree.tree_leaves((args, kwargs or {}))) + list(torch.utils._pytree.tree_leaves(out))
        for t in flat:
            if isinstance(t, torch.Tensor) and t.numel():
                key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
                if key in seen:
                    continue
                seen.add(key)
                self.bytes[self._kind(t)] += t.numel() * t.element_size()
        return out


def _model(family: str, dtype=torch.bfloat16):
    import transformers

    arch, hidden, heads, kv, head_dim, inter = FAMILIES[family]
    cfg_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cfg = cfg_cls(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=4096,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return getattr(transformers, arch)(cfg).to(dtype).eval(), (kv, heads, head_dim)


def _value_model(model, head: str):
    """A value model with the policy's own backbone shape (its own weights) and ``head``."""
    import copy

    from pita.guidance.value_model import HeadSpec, ValueModel

    bb = copy.deepcopy(model)
    tc = bb.config
    vm = ValueModel(bb, HeadSpec("bce", vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, head=head)).to(
        torch.bfloat16).eval()
    return vm


def run(cache: str, family: str, rows: int = 8, prompt: int = 256, guided: str | None = None) -> dict:
    from pita.models.lm import LM
    from pita.models.tiny import build_tiny_family
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_family(cache, 0)["reference"])
    model, shape = _model(family)
    lm = LM(model, tok)
    lm.eos_ids = [-1]  # never stop early
    ids = [[5 + (i + j) % 200 for j in range(prompt)] for i in range(rows)]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    vm = None
    if guided:
        vm = _value_model(model, guided)
        params |= {p.untyped_storage().data_ptr() for p in vm.parameters()}
    counts = []
    for n in (1, 2):
        guide = None
        if vm is not None:
            from pita.guidance.decode import GuidedDecoder

            guide = GuidedDecoder(vm, "bernoulli", 1.0, top_k=20)
        with torch.no_grad(), _Counter(params, shape, prompt) as c:
            lm.generate_ids(ids, n, seeds=list(range(rows)), temperature=1.0, guide=guide)
        counts.append(c.bytes)
    step = {k: counts[1][k] - counts[0][k] for k in counts[0]}
    kv, heads, head_dim = shape
    length = prompt + 1  # the cache the decode step attends over
    cache_size = 2 * model.config.num_hidden_layers * rows * kv * length * head_dim * 2  # bf16
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if vm is not None:  # the value model's weights and cache are as large again
        weights += sum(p.numel() * p.element_size() for p in vm.parameters())
        cache_size *= 2
    return {"benchmark": "decode_bytes", "family": family, "guided": guided, "rows": rows, "prompt": prompt,
            "layers": model.config.num_hidden_layers, "step_bytes": step, "weights_bytes": weights,
            "cache_bytes": cache_size, "cache_passes": round(step["cache"] / cache_size, 3),
            "kv_repeated_passes": round(step["kv_repeated"] / cache_size, 3),
            "weight_passes": round(step["weights"] / weights, 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cache", default=".cache/pita")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--family", default="all", choices=["all", *FAMILIES])
    ap.add_argument("--guided", default="none", choices=["none", "reference", "embedding", "q", "all"],
                    help="also a guided step, the value model the policy's size with this head")
    args = ap.parse_args(argv)
    fams = list(FAMILIES) if args.family == "all" else [args.family]
    heads = {"none": [None], "all": [None, "reference", "embedding", "q"]}.get(args.guided, [None, args.guided])
    out = [run(args.cache, f, args.rows, args.prompt, h) for f in fams for h in heads]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for r in out:
        print(f"{r['family']}{' guided (' + r['guided'] + ' head)' if r['guided'] else ''}: per decode step, {r['rows']} rows at {r['prompt'] + 1} positions, "
              f"{r['layers']} layers: cache moved {r['cache_passes']}x its size, K/V repeated {r['kv_repeated_passes']}x, "
              f"weights {r['weight_passes']}x; bytes {r['step_bytes']}")


if __name__ == "__main__":
    main()
