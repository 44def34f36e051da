"""Value training with and without shared prefixes: tokens and wall time per epoch.

    python -m bench.value_prefix [--json] [--cache .cache/pita] [--epochs 1] [--run outputs/demo/<time>]

Two data sets of value-model rows (token ids, the first continuation position, a target), each
trained for ``--epochs`` epochs on the tiny family's reference backbone (bce loss, one thread),
once as today (rows batched by length, every row run whole) and once with
``share_prefixes`` (a prompt's rows batched together, the prefix they share run once):

    demo     arith-shaped, as experiment=smoke collects it: 40-token prompts, 2 roll-in cuts x
             4 continuations of 24 tokens (9 rows per prompt), 96 prompts
    tldr     TL;DR-shaped: 320-token posts, 4 cuts x 4 continuations of 48 tokens along a
             64-token roll-in (17 rows per prompt, ~80% of their tokens shared), 24 prompts
    run      with ``--run``: the value rows a finished run collected (every
             ``data.*value_rollouts*.merge`` of the folder, Q#'s targets), e.g. the demo's

Prints per set and mode: real tokens run through the model (prefixes once where shared),
padded tokens (what the batches' shapes hold), wall seconds per epoch, and the final loss of
each mode. Nothing is asserted; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch


def _rows(prompts: int, prompt_len: int, cuts: list[int], conts: int, cont_len: int, rollin: int, seed: int):
    from pita.guidance.train import SeqExample

    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [rng.randrange(3, 250) for _ in range(prompt_len)]
        roll = [rng.randrange(3, 250) for _ in range(rollin)]
        for cut in cuts:
            for _ in range(conts if cut else 1):
                cont = [rng.randrange(3, 250) for _ in range(rng.randrange(cont_len // 2, cont_len + 1))]
                ids = prompt + roll[:cut] + cont
                out.append(SeqExample(ids, len(ids) - len(cont), float(rng.random() < 0.5), (p, 0)))
    return out


def _run_rows(run: str):
    """The value rows of a finished run's value-rollout collections (returns as Q# trains them)."""
    from pathlib import Path

    from datasets import load_from_disk

    from pita.algos.value_guided import returns_examples

    out = []
    for merge in sorted(Path(run, "jobs").glob("data.*value_rollouts*.merge")):
        recs = load_from_disk(str(merge / "artifacts" / "data")).to_list()
        rnd = int(merge.name.split(".r", 1)[1].split(".", 1)[0]) if ".r" in merge.name else 0
        for r in recs:
            r["_round"] = rnd
        task = "math" if ".arith." in merge.name else "reward"
        targets = None
        if task == "reward":  # rewards min-max normalised to [0, 1], as the bce head is trained on them
            kept = [float(r["reward"]) for r in recs if r["continuation_ids"]]
            lo, hi = min(kept), max(kept)
            targets = [(x - lo) / (hi - lo) if hi > lo else 0.5 for x in kept]
        out += returns_examples(recs, targets=targets, task=task)
    if not out:
        raise SystemExit(f"--run {run}: no value-rollout collections there (jobs/data.*value_rollouts*.merge)")
    return out


def _tokens(examples, s, share: bool) -> tuple[int, int]:
    """Real and padded tokens of one epoch's batches, as train() forms them."""
    from pita.guidance.train import _batches, _clip, _grouped_batches, shared_prefix_groups

    rng = random.Random(s.seed)
    clipped = [_clip(e.ids, e.start, s.max_len) for e in examples]
    lengths = [len(c[0]) for c in clipped]
    batches = (_grouped_batches(examples, lengths, s.token_budget, rng, s.batch_size) if share
               else _batches(lengths, s.token_budget, rng, s.batch_size))
    real = padded = 0
    for b in batches:
        seqs, starts = [clipped[i][0] for i in b], [clipped[i][1] for i in b]
        if not share:
            real += sum(map(len, seqs))
            padded += len(b) * max(map(len, seqs))
            continue
        singles = []
        for L, g in shared_prefix_groups(seqs, starts, list(range(len(b)))):
            if L == 0:
                singles += g
                continue
            real += L + sum(len(seqs[r]) - L for r in g)
            padded += L + len(g) * max(len(seqs[r]) - L for r in g)
        if singles:
            real += sum(len(seqs[r]) for r in singles)
            padded += len(singles) * max(len(seqs[r]) for r in singles)
    return real, padded


def run(cache: str, epochs: int = 1, run_dir: str | None = None) -> dict:
    import logging

    from pita.guidance.train import TrainSettings, train
    from pita.guidance.value_model import ValueModel
    from pita.models.tiny import build_tiny_family

    torch.set_num_threads(1)
    paths = build_tiny_family(cache, 0)
    sets = {"demo": _rows(96, 40, [0, 6, 12], 4, 24, 12, 0), "tldr": _rows(24, 320, [0, 16, 32, 48, 64], 4, 48, 64, 1)}
    if run_dir:
        sets["run"] = _run_rows(run_dir)
    out = {"benchmark": "value_prefix", "threads": 1, "epochs": epochs}
    quiet = logging.getLogger("bench.value_prefix")
    quiet.setLevel(logging.WARNING)
    for name, ex in sets.items():
        row = {"rows": len(ex), "rows_per_prompt": len(ex) // len({e.group for e in ex})}
        for share in (False, True):
            s = TrainSettings(epochs=epochs, lr=5e-4, token_budget=8192, batch_size=64, seed=0, share_prefixes=share)
            torch.manual_seed(0)
            vm = ValueModel.create(paths["reference"], loss="bce")
            t = time.perf_counter()
            curve = train(vm, ex, s, quiet)
            wall = (time.perf_counter() - t) / epochs
            real, padded = _tokens(ex, s, share)
            key = "shared" if share else "whole"
            row[f"{key}_tokens_per_epoch"] = real
            row[f"{key}_padded_tokens_per_epoch"] = padded
            row[f"{key}_s_per_epoch"] = round(wall, 2)
            row[f"{key}_final_loss"] = round(curve[-1]["loss"], 4)
        row["tokens_ratio"] = round(row["shared_tokens_per_epoch"] / row["whole_tokens_per_epoch"], 3)
        row["time_ratio"] = round(row["shared_s_per_epoch"] / row["whole_s_per_epoch"], 3)
        out[name] = row
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cache", default=".cache/pita")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--run", default=None, help="a finished run whose value rows to train on too")
    a = ap.parse_args(argv)
    out = run(a.cache, a.epochs, a.run)
    print(json.dumps(out, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
