"""Training the guidance (value) model and the Bradley-Terry proxy reward model.

    examples = value_examples(records, targets)        # token ids + per-sequence target
    curve = train(vm, examples, TrainSettings(...), log)

AdamW on fp32 master weights (bf16/fp16 autocast on CUDA), gradient clipping, token-budget
batches re-formed and reshuffled every epoch, optional gradient checkpointing. The loss is
masked to continuation tokens: the state before each continuation token y_t is scored with
y_t as the candidate, against the sequence's target (a probability for bce/mse, a return for
mle). Pairs (bradley_terry) compare the head at the last token of chosen vs rejected.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass

import torch

from pita.core.errors import ConfigError, JobError
from pita.models.lm import pad_right
from pita.losses.value import bce_loss, bradley_terry_loss, mle_loss, mse_loss

log = logging.getLogger(__name__)


LOSS_WEIGHTINGS = ("token", "sequence")


@dataclass
class TrainSettings:
    epochs: int = 2
    lr: float = 5e-4
    weight_decay: float = 0.0
    token_budget: int = 8192  # tokens per batch (padded length x rows)
    batch_size: int = 32  # sequences per batch at most
    head_lr_scale: float = 10.0  # the new head learns this much faster than the pre-trained backbone
    # how a batch's per-position losses are averaged: token (over every scored position: a long
    # continuation weighs more) | sequence (each sequence's mean, then the mean over sequences, as
    # both reference implementations do: one roll-out, one vote)
    loss_weighting: str = "token"
    grad_clip: float = 1.0
    gradient_checkpointing: bool = False
    micro_batch_size: int = 0  # rows per forward/backward (gradient accumulation); 0 = the whole batch
    clear_cache_interval: int = 0  # CUDA: empty the allocator cache every N optimizer steps; 0 = never
    seed: int = 0
    max_len: int = 512  # longer sequences are cut from the left of the prompt, with a warning
    # rows of one prompt (its roll-in cuts and continuations) batched together, and the prefix
    # they share run once per batch: the same loss and gradients per batch, fewer tokens
    share_prefixes: bool = False
    # a file to keep the training state in (weights, optimizer, position, random state): written
    # every checkpoint_s seconds at most (longer when a save costs more than 5% of that time), read
    # back by a re-attempt, which then continues where it stopped (a lost node, a killed worker)
    # with the same batches and the same result; removed when training ends. "" : none
    checkpoint: str = ""
    checkpoint_s: float = 300.0

    def check(self, where: str) -> None:
        p = []
        if self.epochs < 1:
            p.append(f"{where}.epochs={self.epochs} must be >= 1")
        if not self.lr > 0:
            p.append(f"{where}.lr={self.lr} must be > 0")
        if self.loss_weighting not in LOSS_WEIGHTINGS:
            from pita.core.names import unknown_name

            p.append(unknown_name(f"{where}.loss_weighting", self.loss_weighting, LOSS_WEIGHTINGS))
        if self.token_budget < 16:
            p.append(f"{where}.token_budget={self.token_budget} must be >= 16")
        if p:
            raise ConfigError(p)


@dataclass
class SeqExample:
    ids: list[int]
    start: int  # index of the first continuation token
    target: float
    group: object = None  # rows with one group (a prompt of one round) may share a prefix


@dataclass
class PairExample:
    chosen: list[int]
    rejected: list[int]


def value_examples(records: list[dict], target_key: str) -> list[SeqExample]:
    out = []
    for r in records:
        cont = list(r["continuation_ids"])
        if not cont:
            continue
        ids = list(r["prompt_ids"]) + list(r["prefix_ids"]) + cont
        out.append(SeqExample(ids, len(ids) - len(cont), float(r[target_key]), prompt_group(r)))
    return out


def prompt_group(r: dict):
    """The group a rollout record's row shares its prompt (and roll-in) with."""
    return (r.get("id"), r.get("_round", 0))


def _grouped_batches(examples: list, lengths: list[int], budget: int, rng: random.Random,
                     max_rows: int = 1 << 30) -> list[list[int]]:
    """Batches that keep each group's rows together (sorted by their ids, so rows cut at the same
    point sit side by side), groups in a new random order every epoch, cut under the token budget
    and the row cap as :func:`_batches` cuts; the batches shuffled."""
    groups: dict = {}
    for i, e in enumerate(examples):
        groups.setdefault(e.group if e.group is not None else ("row", i), []).append(i)
    order = list(groups.values())
    rng.shuffle(order)
    return _cut([i for g in order for i in sorted(g, key=lambda i: examples[i].ids)], lengths, budget, rng, max_rows)


def _common(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a[:limit], b[:limit]):
        if x != y:
            break
        n += 1
    return n


SHARE_MIN_TOKENS = 8  # a shared prefix shorter than this is not worth its own forward


def shared_prefix_groups(seqs: list[list[int]], starts: list[int], rows: list[int]) -> list[tuple[int, list[int]]]:
    """``rows`` (indices into ``seqs``) split into (shared length, rows): consecutive rows join a
    group while sharing does not shrink (G rows x L shared tokens), every row keeping its last
    token before the continuation (its first scored state) outside the shared part."""
    out: list[tuple[int, list[int]]] = []
    for i in rows:
        cap = starts[i] - 1
        if out:
            L, g = out[-1]
            lcp = _common(seqs[g[0]], seqs[i], min(L if len(g) > 1 else starts[g[0]] - 1, cap))
            if lcp >= SHARE_MIN_TOKENS and (len(g) + 1) * lcp >= len(g) * (L if len(g) > 1 else 0):
                out[-1] = (lcp, g + [i])
                continue
        out.append((cap, [i]))
    return [(L if len(g) > 1 else 0, g) for L, g in out]


def _batches(lengths: list[int], budget: int, rng: random.Random, max_rows: int = 1 << 30) -> list[list[int]]:
    """Shuffle, sort locally by length (less padding), cut into batches under the token budget
    and the row cap, shuffle the batches: a different grouping every epoch."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    chunked = []
    for s in range(0, len(order), 256):
        chunked += sorted(order[s:s + 256], key=lambda i: lengths[i])
    return _cut(chunked, lengths, budget, rng, max_rows)


def _cut(order: list[int], lengths: list[int], budget: int, rng: random.Random, max_rows: int) -> list[list[int]]:
    """Rows in ``order`` cut into consecutive batches under the token budget (padded length x
    rows) and the row cap; the batches shuffled."""
    batches, cur, longest = [], [], 0
    for i in order:
        L = max(longest, lengths[i])
        if cur and (L * (len(cur) + 1) > budget or len(cur) >= max_rows):
            batches.append(cur)
            cur, L = [], lengths[i]
        cur.append(i)
        longest = L
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def _clip(ids: list[int], start: int, max_len: int) -> tuple[list[int], int]:
    if len(ids) <= max_len:
        return ids, start
    cut = len(ids) - max_len
    if cut >= start:
        cut = start - 1  # keep at least one token of context before the continuation
    return ids[cut:], start - cut


@torch.no_grad()
def calibrate(vm, examples: list[SeqExample], pad_id: int = 0, device: str = "cpu", sample: int = 256,
              max_len: int = 512, seed: int = 0) -> dict:
    """Set the head's output bias so that, before training, its mean prediction over the training
    positions matches the targets: bce / mse ``logit(mean target) - mean(w_lm * log p_LM)``;
    mle ``log(mean two-hot histogram) - w_lm * mean log p_LM`` per atom (w_lm = 0 for the
    reference head, which has no LM prior).

    The LM prior makes the initial logit log p_LM(a|s), which is calibrated for nothing in
    particular (PITA's targets centre on 0.5, Q#'s on the success rate); the head's small
    learning rate would take many epochs to move the bias there, and until it does the loss is
    worse than a constant guess. Only a new head is calibrated, not a warm start.
    """
    from pita.losses.value import two_hot

    spec = vm.spec
    rng = random.Random(seed)
    picked = examples if len(examples) <= sample else rng.sample(examples, sample)
    w = vm.lm_weight
    lps, tg = [], []
    vm.to(device).eval()
    for k in range(0, len(picked), 32):
        batch = [_clip(e.ids, e.start, max_len) + (e.target,) for e in picked[k:k + 32]]
        if bool(w.any()):
            ids, mask = pad_right([b[0] for b in batch], pad_id, device)
            h, _ = vm.hidden(ids, mask)
            lp = torch.log_softmax(vm.backbone.lm_head(h[:, :-1]).float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1))[..., 0]
        for row, (seq, start, target) in enumerate(batch):
            if bool(w.any()):
                lps.append(lp[row, start - 1:len(seq) - 1])
            tg.append(torch.full((len(seq) - start,), float(target)))
    lp_mean = float(torch.cat(lps).mean()) if lps else 0.0
    targets = torch.cat(tg)
    if spec.loss == "mle":
        hist = two_hot(targets, spec.v_min, spec.v_max, spec.num_atoms).mean(0)
        bias = torch.log(hist.clamp_min(1e-3)) - w * lp_mean
    else:
        m = float(targets.mean().clamp(1e-3, 1 - 1e-3))
        bias = torch.full((1,), math.log(m / (1 - m))) - w * lp_mean
    out = vm.out_layer
    with torch.no_grad():
        out.bias.copy_(bias.to(out.bias))
    return {"mean_lm_logprob": lp_mean if lps else None, "bias": [round(float(b), 4) for b in bias]}


def train(vm, examples: list, s: TrainSettings, logger: logging.Logger = log, pad_id: int = 0,
          device: str = "cpu", tracker=None) -> list[dict]:
    """Train in place; returns the loss curve [{"epoch", "step", "loss"}]. With ``tracker``
    (``pita.tracking.TrackerSettings``) every step's loss also goes to that tracker."""
    if not examples:
        raise JobError("no training examples: the data collection produced nothing usable")
    from pita.tracking import open_tracker

    with open_tracker(tracker) as t:
        return _train(vm, examples, s, logger, pad_id, device, t)


def optimizer_kwargs(device) -> dict:
    """AdamW's implementation: fused on CUDA, as TRL's trainers use it (transformers' default
    ``adamw_torch_fused``). torch's default there, foreach, holds a copy of every parameter's
    second moment while it steps (``_foreach_sqrt``): measured on an H100 (1B Llama, fp32 weights,
    bench/gpu_check.py), the step peaks at 17.1 GB allocated against 13.7 GB fused, above the
    plan's estimate. On the CPU, torch's default (a loop over the parameters) is kept."""
    return {"fused": True} if str(device).startswith("cuda") else {}


def _train(vm, examples: list, s: TrainSettings, logger: logging.Logger, pad_id: int, device: str,
           tracker) -> list[dict]:
    torch.manual_seed(s.seed)
    rng = random.Random(s.seed)
    vm.to(device).train()
    if s.gradient_checkpointing:  # transformers 5.x name first; the old one warns on every call
        enable = getattr(vm.backbone, "activation_checkpointing_enable", None) or vm.backbone.gradient_checkpointing_enable
        enable()
    head = [p for n, p in vm.named_parameters() if not n.startswith("backbone.") and p.requires_grad]
    body = [p for n, p in vm.named_parameters() if n.startswith("backbone.") and p.requires_grad]
    cuda = str(device).startswith("cuda")
    opt = torch.optim.AdamW([{"params": body, "lr": s.lr}, {"params": head, "lr": s.lr * s.head_lr_scale}],
                            weight_decay=s.weight_decay, **optimizer_kwargs(device))
    amp = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    pairs = isinstance(examples[0], PairExample)
    if pairs:
        lengths = [max(len(e.chosen), len(e.rejected)) * 2 for e in examples]
    else:
        clipped = [_clip(e.ids, e.start, s.max_len) for e in examples]
        lengths = [len(c[0]) for c in clipped]
    curve, step = [], 0
    ckpt = _Checkpoint(s.checkpoint, s.checkpoint_s)
    first_epoch, skip, total, count = 0, 0, 0.0, 0
    saved = ckpt.load()
    if saved is not None:
        vm.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        first_epoch, skip, step, curve = saved["epoch"], saved["batch"], saved["step"], saved["curve"]
        total, count = saved["total"], saved["count"]
        rng.setstate(saved["rng_epoch"])
        torch.set_rng_state(saved["torch_rng"])
        if cuda and saved.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(saved["cuda_rng"])
        logger.info("continuing from the checkpoint at epoch %d, step %d (%s)", first_epoch, step, s.checkpoint)
    for epoch in range(first_epoch, s.epochs):
        if epoch > first_epoch:
            total, count, skip = 0.0, 0, 0
        rng_epoch = rng.getstate()  # the epoch's batches are drawn from here (a resume draws them again)
        batching = (lambda: _grouped_batches(examples, lengths, s.token_budget, rng, s.batch_size)) \
            if s.share_prefixes and not pairs else (lambda: _batches(lengths, s.token_budget, rng, s.batch_size))
        for k, batch in enumerate(batching()):
            if k < skip:
                continue
            # micro-batches: gradients accumulate, each part weighted by its share of the batch's
            # loss units (masked tokens, or pairs), so the step equals the whole batch's
            micro = s.micro_batch_size if s.micro_batch_size > 0 else len(batch)
            parts = [batch[k:k + micro] for k in range(0, len(batch), micro)]
            by_row = pairs or s.loss_weighting == "sequence"
            units = [len(part) if by_row else sum(len(clipped[i][0]) - clipped[i][1] for i in part) for part in parts]
            opt.zero_grad(set_to_none=True)
            lv = 0.0
            for part, u in zip(parts, units):
                with torch.autocast("cuda", dtype=amp, enabled=cuda):
                    loss = _loss(vm, examples, clipped if not pairs else None, part, pairs, pad_id, device,
                                 share=s.share_prefixes, per_sequence=s.loss_weighting == "sequence")
                (loss * (u / sum(units))).backward()
                lv += float(loss.detach()) * u / sum(units)
            torch.nn.utils.clip_grad_norm_(vm.parameters(), s.grad_clip)
            opt.step()
            if cuda and s.clear_cache_interval > 0 and (step + 1) % s.clear_cache_interval == 0:
                torch.cuda.empty_cache()
            step += 1
            if not math.isfinite(lv):
                raise JobError(f"the training loss became {lv} at epoch {epoch} step {step}; lower the learning rate")
            total += lv * len(batch)
            count += len(batch)
            curve.append({"epoch": epoch, "step": step, "loss": lv})
            tracker.log({"train/loss": lv, "train/epoch": epoch}, step)
            if ckpt.due():
                ckpt.save(lambda: {"model": vm.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
                                   "batch": k + 1, "step": step, "curve": curve, "total": total, "count": count,
                                   "rng_epoch": rng_epoch, "torch_rng": torch.get_rng_state(),
                                   "cuda_rng": torch.cuda.get_rng_state() if cuda else None}, logger)
        logger.info("epoch %d: mean loss %.4f over %d examples", epoch, total / max(count, 1), count)
    vm.eval()
    ckpt.remove()
    return curve


class _Checkpoint:
    """The training state in one file, replaced atomically: written when ``interval_s`` has passed
    since the last write, and at least 20 times the last write's cost (so saving stays under 5%
    of the time)."""

    def __init__(self, path: str, interval_s: float):
        self.path = path
        self.interval_s = interval_s
        self.last = time.monotonic()
        self.cost = 0.0

    def load(self) -> dict | None:
        if not self.path or not os.path.exists(self.path):
            return None
        try:
            return torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception as e:  # a torn file cannot be: it is replaced atomically; another version's
            log.warning("ignoring the training checkpoint %s (%s): training starts over", self.path, e)
            return None

    def due(self) -> bool:
        return bool(self.path) and self.interval_s > 0 and \
            time.monotonic() - self.last >= max(self.interval_s, 20 * self.cost)

    def save(self, state, logger) -> None:
        t = time.monotonic()
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = f"{self.path}.tmp"
        torch.save(state(), tmp)
        os.replace(tmp, self.path)
        self.last = time.monotonic()
        self.cost = self.last - t
        logger.debug("training checkpoint written in %.1fs", self.cost)

    def remove(self) -> None:
        if self.path:
            for p in (self.path, f"{self.path}.tmp"):
                try:
                    os.remove(p)
                except FileNotFoundError:
                    pass


def _checkpointing(model) -> bool:
    """Activation checkpointing on (transformers 5.x name first; then no KV cache is returned in
    training, so shared prefixes fall back to whole rows)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if name in type(model).__dict__ or any(name in vars(c) for c in type(model).__mro__):
            return bool(getattr(model, name))
    return False


def _shared_scores(vm, examples, clipped, batch: list[int], pad_id: int, device, per_sequence: bool = False):
    """The head's scores at every scored position of ``batch``, flattened to [1, N, n_out] with
    their targets and an all-ones mask: rows that share a prefix run it once (one row, its KV
    cache repeated over the group) and only their own suffixes; the rest as one padded batch.
    The masked mean over the same positions is the loss :func:`_loss` computes unshared (and with
    ``per_sequence`` each position weighs 1 / its row's positions, as there)."""
    seqs = [clipped[i][0] for i in batch]
    starts = [clipped[i][1] for i in batch]
    groups = shared_prefix_groups(seqs, starts, list(range(len(batch))))
    outs, tgts, wts = [], [], []
    singles = [g[0] for L, g in groups if L == 0]
    for L, g in groups:
        if L == 0:
            continue
        pre = torch.tensor([seqs[g[0]][:L]], device=device)
        _, cache = vm.hidden(pre, torch.ones_like(pre), use_cache=True)
        cache.batch_repeat_interleave(len(g))
        suf, suf_mask = pad_right([seqs[r][L:] for r in g], pad_id, device)
        mask = torch.cat([torch.ones(len(g), L, dtype=suf_mask.dtype, device=device), suf_mask], 1)
        pos = (torch.arange(suf.shape[1], device=device) + L).unsqueeze(0).expand(len(g), -1)
        h, _ = vm.hidden(suf, mask, position_ids=pos, past_key_values=cache, use_cache=True)
        sc = vm.next_token_scores(h, suf).float()  # [G, S-1, n_out]
        for row, r in enumerate(g):
            a, b = starts[r] - 1 - L, len(seqs[r]) - 1 - L
            outs.append(sc[row, a:b])
            tgts.append(torch.full((b - a,), float(examples[batch[r]].target), device=device))
            wts.append(torch.full((b - a,), 1.0 / max(b - a, 1) if per_sequence else 1.0, device=device))
    if singles:
        ids, mask = pad_right([seqs[r] for r in singles], pad_id, device)
        sc = vm.token_scores(ids, mask).float()
        for row, r in enumerate(singles):
            a, b = starts[r] - 1, len(seqs[r]) - 1
            outs.append(sc[row, a:b])
            tgts.append(torch.full((b - a,), float(examples[batch[r]].target), device=device))
            wts.append(torch.full((b - a,), 1.0 / max(b - a, 1) if per_sequence else 1.0, device=device))
    out = torch.cat(outs, 0).unsqueeze(0)
    tgt = torch.cat(tgts, 0).unsqueeze(0)
    return out, tgt, torch.ones(tgt.shape, device=device), torch.cat(wts, 0).unsqueeze(0)


def _loss(vm, examples, clipped, batch: list[int], pairs: bool, pad_id: int, device,
          share: bool = False, per_sequence: bool = False) -> torch.Tensor:
    spec = vm.spec
    if pairs:
        ids, mask = pad_right([examples[i].chosen for i in batch] + [examples[i].rejected for i in batch],
                              pad_id, device)
        r = vm.sequence_reward(ids, mask).float()
        n = len(batch)
        return bradley_terry_loss(r[:n], r[n:])
    if share and not _checkpointing(vm.backbone):
        out, tgt, pos_mask, w = _shared_scores(vm, examples, clipped, batch, pad_id, device, per_sequence)
    else:
        seqs = [clipped[i][0] for i in batch]
        ids, mask = pad_right(seqs, pad_id, device)
        out = vm.token_scores(ids, mask).float()  # [B, T-1, n_out]
        pos_mask = torch.zeros(out.shape[:2], device=device)
        for row, i in enumerate(batch):
            start, n_tok = clipped[i][1], len(clipped[i][0])
            pos_mask[row, start - 1:n_tok - 1] = 1
        w = pos_mask / pos_mask.sum(1, keepdim=True).clamp_min(1)  # each row's positions weigh 1 together
        tgt = torch.tensor([examples[i].target for i in batch], device=device).unsqueeze(-1)
        tgt = tgt.expand(out.shape[:2])
    w = w if per_sequence else None  # token: the plain masked mean
    if spec.loss == "bce":
        return bce_loss(out[..., 0], tgt, pos_mask, w)
    if spec.loss == "mse":
        return mse_loss(out[..., 0], tgt, pos_mask, w)
    if spec.loss == "mle":
        return mle_loss(out, tgt, pos_mask, spec.v_min, spec.v_max, w)
    raise JobError(f"loss {spec.loss} trains on pairs, but the examples are sequences")
