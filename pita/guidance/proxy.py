"""The proxy reward model of Q#-HF and GRPO-HF: a Bradley-Terry head on the guidance backbone,
trained on preference pairs, then used as the reward (job kind ``algo.proxy_train``).

    job = proxy_job("QSharp-HF.tiny.arith.r0.proxy", data=[merges...], backbone=..., ...)
    scores = score_sequences(ValueModel.load(ckpt), [token ids, ...], "cpu")

Pairs come from either kind of collected data: value roll-outs (Q#-HF: two continuations of a cut,
labelled by a Bradley-Terry draw on their rewards) or ``preference_pairs`` records (GRPO-HF: a
chosen and a rejected text, tokenized here with the policy's chat template). Pairs with equal
rewards state no preference and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from pita.core.errors import JobError
from pita.core.job import TRAINING_RETRY, Job, Resources, RetryPolicy, add_kind_module, job_kind

add_kind_module("pita.guidance.proxy")


@dataclass
class ProxyKeys:
    """The keys of an algorithm that trains a proxy reward model (mixed into its config)."""

    proxy_epochs: int = 2  # proxy reward model: passes over the pairs per round
    proxy_lr: float = 5e-4  # learning rate of the proxy reward model
    proxy_weight_decay: float = 0.0  # AdamW's weight decay of the proxy (the PITA reference: 0.01)
    proxy_head_lr_scale: float = 10.0  # its head's learning rate as a multiple of proxy_lr (the reference: 1)
    # share of the training prompts whose pairs are held out of the proxy's training to measure
    # its pair accuracy on (results/report.md, "Label quality"); 0 trains on every pair
    proxy_heldout: float = 0.1


def check_proxy_keys(k: str, c) -> list[str]:
    p = []
    if c.proxy_epochs < 1:
        p.append(f"{k}.proxy_epochs={c.proxy_epochs} must be >= 1")
    if not c.proxy_lr > 0:
        p.append(f"{k}.proxy_lr={c.proxy_lr} must be > 0")
    if not c.proxy_weight_decay >= 0:
        p.append(f"{k}.proxy_weight_decay={c.proxy_weight_decay} must be >= 0 (the PITA reference: 0.01)")
    if not c.proxy_head_lr_scale > 0:
        p.append(f"{k}.proxy_head_lr_scale={c.proxy_head_lr_scale} must be > 0 (1: the head learns at proxy_lr)")
    h = c.proxy_heldout
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 0.5:
        p.append(f"{k}.proxy_heldout={h!r} must be a share of the prompts in [0, 0.5) (0: no held-out pairs; "
                 f"e.g. {k}.proxy_heldout=0.1)")
    return p


def proxy_job(job_id: str, data: list[str], backbone: str, epochs: int, lr: float, labels: dict, seed: int,
              batch_size: int, token_budget: int, head_dim: int, memory_gb: float, group: str,
              tokenizer: str | None = None, training: dict | None = None, heldout: float = 0.0,
              head: str = "reference", weight_decay: float = 0.0, head_lr_scale: float = 10.0) -> Job:
    """The job training a proxy on the pairs of the merge jobs ``data`` (rounds 0..r); ``labels``:
    how roll-out pairs are labelled (``preference_labels`` of pita/algos/base.py); ``heldout``:
    the share of prompts whose pairs only measure it."""
    params = {"data": list(data), "backbone": backbone, "epochs": epochs, "lr": lr, **labels, "seed": seed,
              "batch_size": batch_size, "token_budget": token_budget, "head_dim": head_dim, "heldout": float(heldout),
              "head": head, "weight_decay": float(weight_decay), "head_lr_scale": float(head_lr_scale)}
    if tokenizer:
        params["tokenizer"] = tokenizer
    params.update(training or {})
    return Job(id=job_id, kind="algo.proxy_train", deps=list(data), group=group, params=params,
               resources=Resources(1, memory_gb), retry=TRAINING_RETRY if "micro_batch_size" in params else
               RetryPolicy(), duration_hint=2.0)


def text_ids(tok, prompt: str, completion: str, finished: bool = True) -> list[int]:
    """The chat-formatted prompt, the completion and, when it ``finished`` (not cut off by the
    length limit), EOS, as token ids: how the proxy reward model sees a text pair at training and
    a GRPO-HF completion at scoring."""
    chat = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True) \
        if getattr(tok, "chat_template", None) else prompt
    return (tok(chat, add_special_tokens=False)["input_ids"] + tok(completion, add_special_tokens=False)["input_ids"]
            + ([tok.eos_token_id] if finished else []))


def score_sequences(vm, seqs: list[list[int]], dev, batch: int = 64, value: bool = False) -> list[float]:
    """Proxy rewards of full sequences, batched (sorted by length; the same head as in training);
    ``value``: a value model's predicted value instead (``ValueModel.sequence_value``)."""
    import torch

    from pita.models.lm import pad_right

    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = [0.0] * len(seqs)
    with torch.no_grad():
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            ids, mask = pad_right([seqs[i] for i in idx], 0, dev)
            got = vm.sequence_value(ids, mask) if value else vm.sequence_reward(ids, mask)
            for i, v in zip(idx, got.float().tolist()):
                out[i] = v
    return out


def pair_accuracy(vm, examples, dev, batch: int = 64) -> float:
    """Share of pairs whose chosen sequence the proxy scores higher."""
    scores = score_sequences(vm, [e.chosen for e in examples] + [e.rejected for e in examples], dev, batch)
    n = len(examples)
    return sum(scores[i] > scores[n + i] for i in range(n)) / n


def held_out(prompt_id, share: float, seed: int) -> bool:
    """Whether a prompt's pairs are held out of the proxy's training: a fixed draw per prompt
    (every round and every pair of a prompt on the same side)."""
    from pita.rewards.preferences import uniform

    return share > 0 and uniform(seed, f"proxy-heldout/{prompt_id}") < share


def optimizer_settings(p: dict) -> dict:
    """AdamW's weight decay and the head's learning-rate multiple a training job's params carry
    (absent, a plan written before the keys: 0 and 10, what it trained with)."""
    return {"weight_decay": float(p.get("weight_decay", 0.0)), "head_lr_scale": float(p.get("head_lr_scale", 10.0)),
            "loss_weighting": str(p.get("loss_weighting", "token"))}


def shared_settings(p: dict) -> dict:
    """The ``training.*`` settings a training job's params carry (absent: off)."""
    return {"gradient_checkpointing": bool(p.get("gradient_checkpointing", False)),
            "micro_batch_size": int(p.get("micro_batch_size", 0)),
            "clear_cache_interval": int(p.get("clear_cache_interval", 0))}


@job_kind("algo.proxy_train")
def proxy_train(ctx):
    import torch

    from pita.guidance.rollouts import continuation_pairs, read_rounds, sequence_ids
    from pita.guidance.train import PairExample, TrainSettings, train
    from pita.tracking import tracker_settings
    from pita.guidance.value_model import ValueModel
    from pita.models.lm import default_device

    p = ctx.params
    ties = p.get("ties", "drop")  # data_collection.ties, every preference learner's rule
    records = read_rounds(ctx, p["data"])
    split = lambda pid: held_out(pid, float(p.get("heldout", 0.0)), int(p["label_seed"]))  # noqa: E731
    # (prompt id, labelled pair, the pair ordered by the true reward) for every pair with a preference
    if records and "chosen" in records[0]:  # preference_pairs records (GRPO-HF): text, tokenized here
        from pita.models.chat import load_tokenizer

        tok = load_tokenizer(p.get("tokenizer") or p["backbone"], p.get("chat_template_kwargs"))
        ids = lambda r, side: text_ids(tok, r["prompt"], r[side], r.get(f"{side}_finish", "eos") == "eos")  # noqa: E731
        labelled = []
        n_pairs, n_ties = len(records), sum(r["chosen_reward"] == r["rejected_reward"] for r in records)
        for r in records:
            if r["chosen_reward"] != r["rejected_reward"] or ties == "draw":
                c, rj = ids(r, "chosen"), ids(r, "rejected")
                labelled.append((r["id"], PairExample(c, rj), PairExample(c, rj) if r["chosen_reward"] >
                                 r["rejected_reward"] else PairExample(rj, c)))
    else:
        formed = continuation_pairs(records, p["label_seed"], p["beta"], p["bt_sampling"], p["pairs_per_prompt"],
                                    ties=ties)
        n_pairs, n_ties = len(formed), sum(tie for _c, _r, tie in formed)
        labelled = [(c["id"], PairExample(sequence_ids(c), sequence_ids(r)),
                     PairExample(sequence_ids(c), sequence_ids(r)) if c["reward"] > r["reward"] else
                     PairExample(sequence_ids(r), sequence_ids(c)))
                    for c, r, tie in formed if not tie or ties == "draw"]
    examples = [e for pid, e, _ in labelled if not split(pid)]
    heldout = [(e, truth) for pid, e, truth in labelled if split(pid)]
    if not examples:
        raise JobError(f"no preference pairs with different rewards among {len(records)} records to train the "
                       f"proxy reward model on; collect more data (a larger train split, more samples per prompt)")
    torch.manual_seed(p["seed"])  # the new head's initial weights: same seed, same model
    # the reference head scores a sequence from its last token's hidden state, as the reference
    # code's Bradley-Terry reward model does; a plan written before the key existed: the embedding head
    vm = ValueModel.create(p["backbone"], loss="bradley_terry", head_dim=p["head_dim"], head=p.get("head", "embedding"))
    dev = default_device()
    curve = train(vm, examples, TrainSettings(epochs=p["epochs"], lr=p["lr"], token_budget=p["token_budget"],
                                              batch_size=p["batch_size"], seed=p["seed"], **shared_settings(p),
                                              **optimizer_settings(p),
                                              checkpoint=str(ctx.paths.checkpoints / "train-state.pt")),
                  ctx.log, pad_id=0, device=dev, tracker=tracker_settings(ctx))
    out = ctx.paths.artifacts / "model"
    vm.save(out)
    ctx.paths.write_metrics(curve)
    batch = max(1, int(p.get("micro_batch_size") or 64))
    acc = pair_accuracy(vm, examples, dev, batch=batch)
    tokens = sum(len(e.chosen) + len(e.rejected) for e in examples) * int(p["epochs"])
    trainable = sum(w.numel() for w in vm.parameters() if w.requires_grad)
    from pita.rewards.preferences import supervision

    res = {"checkpoint": str(out), "pairs": len(examples), "pair_accuracy": acc, "heldout_pairs": len(heldout),
           "supervision": supervision(n_pairs, n_ties, ties),
           "steps": len(curve), "train_tokens": tokens, "train_flops": 6.0 * trainable * tokens,
           "loss_first": curve[0]["loss"], "loss_last": curve[-1]["loss"]}
    if heldout:
        res["heldout_accuracy"] = pair_accuracy(vm, [e for e, _ in heldout], dev, batch=batch)
        res["heldout_reward_agreement"] = pair_accuracy(vm, [t for _, t in heldout], dev, batch=batch)
    ctx.log.info("proxy reward model: %d pairs, training pair accuracy %.3f; %d held-out pairs: label accuracy %s, "
                 "agreement with the true reward %s", len(examples), acc, len(heldout),
                 *(f"{res[k]:.3f}" if k in res else "-" for k in ("heldout_accuracy", "heldout_reward_agreement")))
    return res
