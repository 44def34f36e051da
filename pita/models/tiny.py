"""The ``tiny`` model family, built locally with no download, deterministically from a seed.

    paths = build_tiny_family(cache_dir=".cache/pita", seed=0)
    paths["reference"], paths["guidance"], paths["reward_sentiment"]   # local checkpoint folders

- tokenizer: byte-level BPE trained with ``tokenizers`` on the toy tasks' text, wrapped as a
  ``PreTrainedTokenizerFast`` with bos / eos / pad (pad != eos) and a chat template;
- reference: a Llama-architecture causal LM (Llama, not Qwen2: Qwen2's tokenizer class
  re-tokenizes differently), pre-trained briefly on toy-task text so that it is imperfect but
  clearly better than random on ``arith``;
- guidance: a smaller Llama with the same tokenizer, pre-trained on the same text (the backbone
  of the value model);
- reward_sentiment: a Llama sequence classifier (one logit: positive minus negative) trained on
  labelled toy reviews, loaded later through the same code path as real reward models.

The result is cached under ``<cache_dir>/tiny-<version>-seed<seed>/``. The tokenizer and every
part's config are written first (:func:`prepare_tiny_family`, seconds, at plan time); then each
part is trained on its own (:func:`build_part`: a run's ``model.build_tiny`` job, in parallel
with the other parts), under a lock per part, with a ``.built`` marker per part and
``.complete`` once all three exist.

The same seed gives the same weights on a machine however the family is built and however
loaded the machine is: every part trains with exactly one intra-op thread (torch's CPU kernels
split their sums by thread, so the thread count is part of the arithmetic), and a pretraining
step's micro-batches may be computed by one process in turn or by two processes at once whose
gradients are summed (:func:`_pretrain`: a sum of two float tensors is the same in either
order, so both give the same bits). A run's reference build on two CPU devices uses two such
processes; the load changes how long a build takes, never what it builds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from pathlib import Path

import torch

from pita.models.lm import pad_right

log = logging.getLogger(__name__)

# bump when the corpus, sizes or training change (v4: length-sorted micro-batches; v5: one thread,
# micro-batches cut to equal padded sizes)
VERSION = "v5"
SPECIALS = {"bos": "<|bos|>", "eos": "<|eos|>", "pad": "<|pad|>", "user": "<|user|>", "assistant": "<|assistant|>"}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}<|eos|>"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SIZES = {
    "reference": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2),
    "guidance": dict(hidden_size=96, intermediate_size=288, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2),
    "reward": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2),
}
# The guidance model is smaller but trained as long: a value model can only tell a right next
# token from a wrong one if its backbone can do the task at all.
TRAIN = {"reference": dict(steps=600, lr=3e-3), "guidance": dict(steps=600, lr=3e-3), "reward": dict(steps=150, lr=2e-3)}


def build_tokenizer(texts: list[str], vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=SPECIALS["bos"], eos_token=SPECIALS["eos"],
                                  pad_token=SPECIALS["pad"], padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 512
    return tok


def _llama_config(tok, size: str, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True,
                       rms_norm_eps=1e-5, **SIZES[size], **extra)


def _chat(tok, prompt: str, response: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
                                   tokenize=True, return_dict=False)


def _cuts(lengths: list[int], parts: int) -> list[int]:
    """Where to cut a length-sorted batch into ``parts`` micro-batches of about equal padded size
    (rows x the longest row): the bounds [0, c1, ..., n] that minimise the largest micro-batch, the
    earliest cuts on ties. Two micro-batches computed at once then take about as long each."""
    n = len(lengths)
    parts = max(1, min(parts, n))
    best: dict[tuple[int, int], tuple[int, list[int]]] = {}

    def solve(start: int, k: int) -> tuple[int, list[int]]:  # rows start.. in k parts
        if k == 1:
            return (n - start) * lengths[-1], [n]
        if (start, k) not in best:
            best[(start, k)] = min(((max((end - start) * lengths[end - 1], solve(end, k - 1)[0]), [end, *solve(end, k - 1)[1]])
                                    for end in range(start + 1, n - k + 2)), key=lambda c: c[0])
        return best[(start, k)]

    return [0, *solve(0, parts)[1]]


def _pretrain(model, seqs: list[list[int]], steps: int, lr: float, seed: int, pad_id: int, batch: int = 32,
              progress=None, parts: int = 2):
    """Next-token training, each step on ``batch`` sequences drawn at random. The batch's loss is
    the mean over all its target tokens, computed in ``parts`` length-sorted micro-batches (each
    padded only to its own longest sequence, cut to about equal padded sizes) whose token-loss sums
    are divided by the batch's token count: the same gradient as one padded batch, with about 30%
    of the padding's compute gone.

    In an initialised process group of w ranks (w <= ``parts``), rank r computes micro-batches r,
    r + w, ... and the ranks all-reduce the gradient (and the loss) before the optimizer step,
    which every rank takes alike. With two micro-batches on two ranks the sum is the one a single
    process accumulates (float addition of two terms commutes), so the weights are the same bits."""
    import torch.distributed as dist

    grouped = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    if world > 1 and (world, parts) != (2, 2):
        raise ValueError(f"pretraining on {world} processes in {parts} micro-batches: only two micro-batches on two "
                         f"processes sum their gradients as one process does (other counts add in another order)")
    g = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30) * max(0.05, 1 - s / steps))
    params = list(model.parameters())
    model.train()
    losses = []
    for step in range(steps):
        rows = sorted((seqs[g.randrange(len(seqs))] for _ in range(batch)), key=len)
        n_targets = sum(len(r) - 1 for r in rows)
        cuts = _cuts([len(r) for r in rows], parts)
        opt.zero_grad()
        total = 0.0
        for k in range(rank, len(cuts) - 1, world):
            ids, mask = pad_right(rows[cuts[k]:cuts[k + 1]], pad_id)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                                     ignore_index=-100, reduction="sum") / n_targets
            loss.backward()
            total += loss.item()
        if world > 1:
            total = _all_reduce(params, total)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(total)
        if progress is not None and rank == 0 and ((step + 1) % 100 == 0 or step + 1 == steps):
            progress(step + 1, steps, losses[-1])
    model.eval()
    return losses


def _all_reduce(params: list, loss: float) -> float:
    """Sum every rank's gradients (one flat buffer, one collective) and losses; returns the loss."""
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    at = 0
    for p in params:
        p.grad.copy_(flat[at:at + p.numel()].view_as(p))
        at += p.numel()
    total = torch.tensor([loss], dtype=torch.float64)  # the loss as a single process adds it
    dist.all_reduce(total)
    return float(total)


def _train_reward(model, tok, seed: int, steps: int, lr: float, batch: int = 32):
    from pita.datasets.toy import sentiment_labelled

    data = []
    for text, label in sentiment_labelled(2000, seed):
        words = text.split()
        prompt = "Continue this review positively: " + " ".join(words[:3])
        data.append((_chat(tok, prompt, " ".join(words[3:])), label))
    g = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        rows = [data[g.randrange(len(data))] for _ in range(batch)]
        # right padding: the score is read at the last real token
        ids, mask = pad_right([r for r, _ in rows], tok.pad_token_id)
        y = torch.tensor([float(lab) for _, lab in rows])
        logit = model(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


PARTS = ("reference", "guidance", "reward_sentiment")


def family_dir(cache_dir: str | Path, seed: int) -> Path:
    return Path(cache_dir) / f"tiny-{VERSION}-seed{seed}"


def family_paths(cache_dir: str | Path, seed: int) -> dict[str, str]:
    root = family_dir(cache_dir, seed)
    return {k: str(root / k) for k in ("tokenizer", *PARTS)}


def part_built(cache_dir: str | Path, seed: int, part: str) -> bool:
    root = family_dir(cache_dir, seed)
    return (root / ".complete").exists() or (root / part / ".built").exists()


def prepare_tiny_family(cache_dir: str | Path, seed: int) -> dict[str, str]:
    """The family's tokenizer, and each part's folder with the tokenizer and the model's config
    (no weights yet): seconds, so a plan can read every part's config and tokenizer before the
    parts themselves are trained (by :func:`build_part`, one job each)."""
    from filelock import FileLock

    root = family_dir(cache_dir, seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = family_paths(cache_dir, seed)
    with FileLock(str(root) + ".lock", timeout=1800):
        if (root / ".prepared").exists() or (root / ".complete").exists():
            return paths
        from pita.datasets.adapters import ARITH_TEMPLATE
        from pita.datasets.toy import corpus, sentiment_labelled

        pairs = corpus(seed, template=ARITH_TEMPLATE)
        tok = build_tokenizer([p + " " + r for p, r in pairs] + [t for t, _ in sentiment_labelled(500, seed)])
        tok.save_pretrained(root / "tokenizer")
        for part in PARTS:
            tok.save_pretrained(root / part)
            _part_config(tok, part).save_pretrained(root / part)
        (root / ".prepared").write_text(json.dumps({"seed": seed, "version": VERSION}))
    return paths


def _part_config(tok, part: str):
    if part == "reward_sentiment":
        return _llama_config(tok, "reward", num_labels=1)
    return _llama_config(tok, part)


PRETRAINED = ("reference", "guidance")  # the parts whose training may be shared by two processes


@contextlib.contextmanager
def one_thread():
    """torch at one intra-op thread for the block (the family's arithmetic), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_part(cache_dir: str | Path, seed: int, part: str, progress=None, steps: int | None = None) -> dict:
    """Train one part at one thread and save it into its folder (rank 0 saves when a process group
    shares a pretrained part's steps). Returns its report. Called by :func:`build_part`, under the
    part's lock, or by each rank of a run's build job while the job holds that lock. ``steps``:
    fewer training steps than the family's (checks of the build's arithmetic; a run never sets it)."""
    import torch.distributed as dist
    from transformers import AutoTokenizer, LlamaForCausalLM, LlamaForSequenceClassification

    root = family_dir(cache_dir, seed)
    tok = AutoTokenizer.from_pretrained(root / "tokenizer")
    with one_thread():
        if part == "reward_sentiment":
            torch.manual_seed(seed + 2)
            model = LlamaForSequenceClassification(_part_config(tok, part))
            report = {"final_loss": round(_train_reward(model, tok, seed, **{**TRAIN["reward"], **_steps(steps)}), 4)}
        else:
            from pita.datasets.adapters import ARITH_TEMPLATE
            from pita.datasets.toy import corpus

            seqs = [_chat(tok, p, r) for p, r in corpus(seed, template=ARITH_TEMPLATE)]
            torch.manual_seed(seed + (0 if part == "reference" else 1))
            model = LlamaForCausalLM(_part_config(tok, part))
            losses = _pretrain(model, seqs, **{**TRAIN[part], **_steps(steps)}, seed=seed, pad_id=tok.pad_token_id,
                               progress=progress)
            model.generation_config.eos_token_id = tok.eos_token_id
            model.generation_config.pad_token_id = tok.pad_token_id
            report = {"params": sum(p.numel() for p in model.parameters()), "final_loss": round(losses[-1], 4)}
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        model.save_pretrained(root / part)
        tok.save_pretrained(root / part)
    return report


def _steps(steps: int | None) -> dict:
    return {} if steps is None else {"steps": int(steps)}


def build_part(cache_dir: str | Path, seed: int, part: str, progress=None, train=None, steps: int | None = None) -> dict:
    """Train and save one part of the family (``reference``, ``guidance`` or ``reward_sentiment``)
    unless it is already built; under a lock per part, so concurrent runs build it once. Each part
    seeds itself, so the parts may be built in any order or in parallel. ``progress(step, steps,
    loss)`` is called every 100 steps. ``train()``, if given, trains and saves the part in place of
    :func:`train_part` (a run's build job: on two processes) and returns its report; ``steps`` as
    in :func:`train_part`. Returns what was built (``cached``: nothing was)."""
    from filelock import FileLock

    if part not in PARTS:
        raise ValueError(f"the tiny family has no part {part!r}; its parts are {', '.join(PARTS)}")
    prepare_tiny_family(cache_dir, seed)
    root = family_dir(cache_dir, seed)
    with FileLock(str(root / part) + ".lock", timeout=3600):
        if part_built(cache_dir, seed, part):
            return {"part": part, "cached": True}
        t0 = time.time()
        report = train() if train is not None else train_part(cache_dir, seed, part, progress=progress, steps=steps)
        report["built_s"] = round(time.time() - t0, 1)
        (root / part / ".built").write_text(json.dumps(report))
        _mark_complete(root)
    log.info("built the tiny family's %s in %s (%.1fs)", part, root / part, time.time() - t0)
    return {"part": part, "cached": False, **report}


def _mark_complete(root: Path) -> None:
    reports = {}
    for part in PARTS:
        marker = root / part / ".built"
        if not marker.exists():
            return
        reports[part] = json.loads(marker.read_text())
    (root / "build.json").write_text(json.dumps(reports, indent=2))
    (root / ".complete").write_text(json.dumps({"seed": root.name.rsplit("seed", 1)[-1], "version": VERSION,
                                                "built_s": round(sum(r["built_s"] for r in reports.values()), 1)}))


def build_tiny_family(cache_dir: str | Path = ".cache/pita", seed: int = 0, force: bool = False) -> dict[str, str]:
    """Build (or reuse) the whole tiny family in this process, one part after the other; returns
    {"tokenizer", "reference", "guidance", "reward_sentiment"}. (A run builds the parts as jobs.)"""
    root = family_dir(cache_dir, seed)
    if force:
        for marker in [root / ".complete", root / ".prepared", *(root / part / ".built" for part in PARTS)]:
            marker.unlink(missing_ok=True)
    for part in PARTS:
        build_part(cache_dir, seed, part)
    return family_paths(cache_dir, seed)
