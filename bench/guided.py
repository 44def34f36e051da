"""Guided decoding benchmark on the tiny family (on a GPU when there is one, else the CPU).

    python -m bench.guided [--json] [--cache .cache/pita] [--device cuda|cpu] [--head reference|embedding|q|all]

Prints:
    unguided_tokens_per_s / guided_tokens_per_s / guided_time_ratio
        64 prompts x 32 new tokens (EOS disabled, so both sides generate the same tokens count),
        guided with a value model whose backbone is the same size as the reference (the
        reference checkpoint itself), top_k 20, eta 1; per head (``--head all``, the default;
        ``both``: the first two): the reference head runs the 20 candidates through the backbone
        each step, the embedding head scores them from the prefix's state, the q head gathers
        their rows of its vocabulary-wide table
    ms_per_token_prefix_long / _short / prefix_ratio
        time per generated token with a prompt of ``--long`` tokens vs 32 tokens, guided: the
        incremental caches (reference and value model) must keep it nearly flat
    unguided_prefix_ratio
        the same ratio for the reference alone: what attention over a longer context costs
        anyway (on the tiny model, attention is a large share of a step's work)
    ms_per_token_reencode_long
        the value model's cost per token if it re-encoded the long prefix at every step (one full
        forward per row per step): what the incremental cache saves
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def _timed(lm, ids, n_new, guide_factory) -> float:
    t = time.perf_counter()
    lm.generate_ids(ids, n_new, seeds=list(range(len(ids))), temperature=1.0,
                    guide=guide_factory() if guide_factory else None)
    return time.perf_counter() - t


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(cache: str, long: int = 480, batch: int = 64, n_new: int = 32, device: str = "cpu",
        head: str = "reference") -> dict:
    from pita.guidance.decode import GuidedDecoder
    from pita.guidance.value_model import ValueModel
    from pita.models.lm import LM
    from pita.models.tiny import build_tiny_family

    torch.manual_seed(0)
    paths = build_tiny_family(cache, 0)
    lm = LM.load(paths["reference"], device=device)
    vm = ValueModel.create(paths["reference"], loss="bce", head=head).to(device).eval()  # same size as the reference
    guide = lambda: GuidedDecoder(vm, "bernoulli", 1.0, top_k=20)  # noqa: E731
    lm.eos_ids = [-1]  # never stop early: equal work on both sides
    prompt = lm.encode([lm.chat_prompt("Tom has 5 cups. Tom gets 7 more. How many cups does Tom have?")])[0]
    ids = [prompt] * batch
    _timed(lm, ids[:4], 4, guide)  # warm-up
    plain = _timed(lm, ids, n_new, None)
    guided = _timed(lm, ids, n_new, guide)
    filler = lm.encode([" The film was great and I loved it." * 200])[0]
    long_ids = [(filler + prompt)[-long:]] * 8
    short_ids = [(filler + prompt)[-32:]] * 8
    t_long = _timed(lm, long_ids, n_new, guide) / (8 * n_new)
    t_short = _timed(lm, short_ids, n_new, guide) / (8 * n_new)
    u_long = _timed(lm, long_ids, n_new, None) / (8 * n_new)
    u_short = _timed(lm, short_ids, n_new, None) / (8 * n_new)
    # what re-encoding the prefix every step would cost the value model: one full forward per token
    with torch.no_grad():
        x = torch.tensor(long_ids, device=device)
        vm.hidden(x)
        _sync(device)
        t = time.perf_counter()
        for _ in range(4):
            vm.hidden(x)
        _sync(device)
        reencode_long = (time.perf_counter() - t) / (4 * 8)
    return {"benchmark": "guided", "head": head, "device": _device_name(device), "batch": batch, "new_tokens": n_new,
            "unguided_tokens_per_s": round(batch * n_new / plain, 1),
            "guided_tokens_per_s": round(batch * n_new / guided, 1),
            "guided_time_ratio": round(guided / plain, 3),
            "prefix_long": long, "prefix_short": 32,
            "ms_per_token_prefix_long": round(1000 * t_long, 3), "ms_per_token_prefix_short": round(1000 * t_short, 3),
            "prefix_ratio": round(t_long / t_short, 3),
            "unguided_prefix_ratio": round(u_long / u_short, 3),
            "ms_per_token_reencode_long": round(1000 * reencode_long, 3)}


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cache", default=".cache/pita")
    ap.add_argument("--long", type=int, default=480)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--head", default="all", choices=["all", "both", "reference", "embedding", "q"])
    args = ap.parse_args(argv)
    heads = {"all": ["reference", "embedding", "q"], "both": ["reference", "embedding"]}.get(args.head, [args.head])
    outs = [run(args.cache, args.long, device=args.device, head=h) for h in heads]
    if args.json:
        print(json.dumps(outs if len(outs) > 1 else outs[0], indent=2))
    else:
        print("\n\n".join("\n".join(f"{k:>28}: {v}" for k, v in out.items()) for out in outs))


if __name__ == "__main__":
    main()
