"""The causal-LM wrapper every job uses: load, chat-format, batched sampling, sequence log-probs.

    lm = LM.load(path, device="cuda", dtype="bfloat16", attn_impl="sdpa")
    out = lm.generate(["What is 2 + 3?"], n=4, max_new_tokens=64, seed=0, keys=["ex-1"])
    out[0][2].text, out[0][2].token_ids, out[0][2].finish   # prompt 0, sample 2

Generation is our own loop over the KV cache rather than ``model.generate`` because:
- every sample has its own token budget (a list of budgets is honoured per sample, never the
  minimum over a batch), and stops at its own EOS;
- sampling is reproducible per example: sample j of the prompt with key k draws its uniforms from
  a generator seeded by (seed, k, j), so the same example gives the same text whatever batch or
  shard it lands in;
- guided decoding (value-guided algorithms) plugs into the same loop through ``guide``.
Masks come from lengths, never from comparing ids with the pad id, so a pad token equal to EOS
(common in real tokenizers: SmolLM2's pad is its end-of-turn ``<|im_end|>``) cannot corrupt
them. Prompts are left-padded.

EOS: a sample stops at any id of the generation config's ``eos_token_id`` (real instruction
models list several) or the tokenizer's. ``eos_ids[0]`` is the tokenizer's own EOS, the id a
chat template writes at the end of a turn and the one TRL and ``text_ids`` append; the id a
sample actually stopped on is kept (``Sample.meta["eos_id"]``) so its log-prob under the
reference is taken on that token, not on a stand-in.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from pita.core.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
from pita.models.families import ATTN_IMPLS  # noqa: E402  (re-exported)


@dataclass
class Sample:
    text: str
    token_ids: list[int]
    finish: str  # "eos" or "length"
    meta: dict = field(default_factory=dict)


def default_device() -> str:
    """The process's device: ``cuda:LOCAL_RANK`` when a GPU is visible (a one-device job sees
    only its own GPU, as cuda:0; rank r of a k-device job sees the job's k GPUs and uses the
    r-th), else the CPU. Every model a job builds outside the trainer (reward models, proxies)
    goes here, where accelerate puts that rank's inputs."""
    from pita.core.devinfo import process_device

    return process_device()


# completion positions whose log-probabilities over the vocabulary are computed at once by
# ``LM.sequence_logprobs`` (the planning estimate, pita.core.memory.SCORE_CHUNK_TOKENS, assumes it)
SCORE_CHUNK = 1024


def keep_last_logits(model) -> dict:
    """``logits_to_keep=1`` where the model's forward takes it: prefill then makes one position's
    logits per row instead of every prompt position's."""
    params = _forward_params(model)
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def _forward_params(model) -> frozenset:
    import inspect

    fwd = type(model).forward
    cached = getattr(fwd, "_pita_params", None)
    if cached is None:
        cached = frozenset(inspect.signature(fwd).parameters)
        try:
            fwd._pita_params = cached
        except AttributeError:
            pass
    return cached


def selectable(cache) -> bool:
    """Whether rows can be dropped from this KV cache in place: a dynamic cache whose layers hold
    keys and values only. Caches with other per-row state (linear-attention or recurrent layers,
    static buffers) keep every row to the end of the batch, as before."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    return (type(cache) is DynamicCache and bool(layers)
            and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers))


def _cache_param(forward) -> str:
    """The name a model's ``forward`` takes its KV cache under: ``cache`` in transformers 5.x
    (where ``past_key_values`` is deprecated and warns on every call), ``past_key_values`` before."""
    import inspect

    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


_CACHE_PARAM: dict[type, str] = {}


def with_cache(model, past) -> dict:
    """``{<the model's cache keyword>: past}``, to pass to ``model(...)`` whatever the transformers version."""
    cls = type(model)
    if cls not in _CACHE_PARAM:
        _CACHE_PARAM[cls] = _cache_param(cls.forward)
    return {_CACHE_PARAM[cls]: past}


def cache_of(output):
    """The KV cache a forward pass returned, under either version's field name."""
    if "cache" in getattr(type(output), "__dataclass_fields__", {}):
        return output.cache
    return getattr(output, "past_key_values", None)


def pad_right(seqs: list[list[int]], pad_id: int, device="cpu"):
    """Right-padded ids and the attention mask (from lengths, never from the pad id)."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return ids.to(device), mask.to(device)


def row_seed(seed: int, key: str, j: int) -> int:
    h = hashlib.sha256(f"{seed}/{key}/{j}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def resolve_attn_impl(requested: str) -> str:
    if requested not in ATTN_IMPLS:
        raise ConfigError(f"system.attn_impl={requested!r} is not known; choose one of {', '.join(ATTN_IMPLS)}")
    if requested == "flash_attention_2":
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            log.warning("system.attn_impl=flash_attention_2 but flash-attn is not installed; using sdpa "
                        "(pip install flash-attn, or set system.attn_impl=sdpa to silence this)")
            return "sdpa"
        if not torch.cuda.is_available():
            log.warning("flash_attention_2 needs CUDA; using sdpa on CPU")
            return "sdpa"
    return requested


def nucleus(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask of the smallest set of tokens whose probability reaches ``top_p`` (always >= 1 token)."""
    if top_p >= 1.0:
        return torch.isfinite(logp)
    probs = torch.softmax(logp, -1)
    sp, si = torch.sort(probs, dim=-1, descending=True)
    keep = (sp.cumsum(-1) - sp) < top_p
    return torch.zeros_like(keep).scatter(-1, si, keep) & torch.isfinite(logp)


def step_kl_of(logq: torch.Tensor, logr: torch.Tensor) -> torch.Tensor:
    """KL(q || r) of each row's next-token distributions from normalised log-probs, summed in
    float64: sum over tokens of q (log q - log r), a token q cannot draw adding nothing (also where
    r cannot either); a token q can draw and r cannot makes it +inf. Rounding below 0 is clamped."""
    logq, logr = logq.float(), logr.float()
    terms = torch.where(torch.isfinite(logq), logq.exp() * (logq - logr), torch.zeros_like(logq))
    return terms.sum(-1, dtype=torch.float64).clamp(min=0.0)


def _tempered(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """Normalised log-probs of ``logits`` at ``temperature``, restricted to their top ``top_k``."""
    lp = torch.log_softmax(logits.float() / temperature, -1)
    if top_k and 0 < top_k < lp.shape[-1]:
        kth = torch.topk(lp, top_k, dim=-1).values[..., -1:]
        lp = lp.masked_fill(lp < kth, float("-inf"))
    return lp


def sample_from(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Inverse-CDF sampling with one uniform per row (``u``: [B]); temperature 0 means greedy.

    Order: temperature scaling, then top-k, then top-p (nucleus) on the tempered distribution.
    """
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k and top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sp, si = torch.sort(probs, dim=-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p  # always keeps the most likely token
        sp = sp * keep
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    cdf = probs.cumsum(-1)
    cdf[..., -1] = 1.0 + 1e-6  # guard against round-off in the last bucket
    # right=True: the first bucket whose cdf exceeds u, so a zero-probability token is never drawn
    idx = torch.searchsorted(cdf, u.to(cdf.dtype).reshape(-1, 1).contiguous(), right=True).squeeze(-1)
    return idx.clamp_(max=logits.shape[-1] - 1)


class LM:
    def __init__(self, model, tokenizer, device: str = "cpu"):
        self.model = model
        self.tok = tokenizer
        self.device = torch.device(device)
        self.eos_ids = self._eos_ids()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str, device: str = "cpu", dtype: str = "float32", attn_impl: str = "sdpa",
             tf32: bool = True, compile: bool = False, gguf_file: str | None = None,
             chat_template_kwargs: dict | None = None) -> "LM":
        """``chat_template_kwargs``: the family's chat-template variables (pita/models/chat.py)."""
        from transformers import AutoModelForCausalLM

        from pita.models.chat import load_tokenizer

        if dtype not in DTYPES:
            raise ConfigError(f"dtype={dtype!r} is not known; choose one of {', '.join(DTYPES)}")
        if str(device).startswith("cuda") and tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        kw = {"gguf_file": gguf_file} if gguf_file else {}
        try:
            tok = load_tokenizer(path, chat_template_kwargs, **kw)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype],
                                                         attn_implementation=resolve_attn_impl(attn_impl), **kw)
        except OSError as e:
            raise ConfigError(f"cannot load the model {path!r} ({str(e).splitlines()[0]}); give a local path, or "
                              f"make sure the hub is reachable (HF_HUB_OFFLINE is {'set' if _offline() else 'unset'})") from e
        model.to(device).eval()
        log.info("loaded %s on %s in %s, attention %s", path, device, dtype, model.config._attn_implementation)
        if compile:
            model.forward = torch.compile(model.forward, dynamic=True)
        return cls(model, tok, device)

    def _eos_ids(self) -> list[int]:
        """Every id a sample stops on; the tokenizer's EOS first (see the module docstring)."""
        ids = []
        gen_cfg = getattr(self.model, "generation_config", None)
        e = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        for x in [self.tok.eos_token_id] + ([e] if isinstance(e, int) else list(e or [])):
            if x is not None and x not in ids:
                ids.append(int(x))
        if not ids:
            raise ConfigError("the tokenizer has no eos token; set one (tokenizer.eos_token) before generating")
        return ids

    # ------------------------------------------------------------------ text
    def chat_prompt(self, prompt: str) -> str:
        """The prompt as the model's chat template renders a user turn ready for the answer."""
        if getattr(self.tok, "chat_template", None):
            return self.tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                add_generation_prompt=True)
        return prompt

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.tok(t, add_special_tokens=False)["input_ids"] for t in texts]

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], max_new_tokens: int | Sequence[int], seeds: Sequence[int],
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                     guide=None, return_stop: bool = False, kl_out: list | None = None,
                     reference_temperature: float | None = None) -> list[tuple]:
        """One completion per row: ([token ids without EOS], "eos" | "length", logp, logp_ref), and
        with ``return_stop`` a fifth item: the EOS id the row stopped on (None at the length limit).
        ``kl_out``, a list, receives one number per row: the exact KL of the distribution each step
        was drawn from (the policy's, after the nucleus, renormalised) to the reference's at every
        sampled step, summed along the row's path; it is 0 when the two are the same distribution
        (no guide, ``top_p`` = 1, the reference's own temperature).

        The policy is what is sampled: the reference's logits at ``temperature`` (and ``top_k``),
        reshaped by ``guide``, restricted to the nucleus (``top_p``) and renormalised. ``logp`` is
        the sample's log-probability under it; ``logp_ref`` under the reference: its logits at
        ``reference_temperature`` (default ``temperature``) and ``top_k``, no nucleus and never the
        guide's candidate set, so a token outside the reference's nucleus still has a finite
        ``logp_ref``. With ``top_p`` < 1 the policy differs from the reference even without a guide,
        and both the log-ratio and ``kl_out`` say by how much. ``reference_temperature`` lets the
        reference sampled at a lower temperature be measured against itself at the evaluation's.
        Greedy rows (temperature 0) report 0 for both.

        ``guide`` (see pita/guidance/decode.py) reshapes each step: it sees the same tokens as the
        reference (``begin`` with the prompt, ``advance`` with each fed token) and ``adjust``
        turns the reference's tempered log-probs into the guided ones.
        """
        B = len(prompt_ids)
        if B == 0:
            return []
        budgets = [int(max_new_tokens)] * B if isinstance(max_new_tokens, int) else [int(b) for b in max_new_tokens]
        if len(budgets) != B or any(b < 0 for b in budgets):
            raise ValueError(f"max_new_tokens must be >= 0 per row (got {budgets[:4]}... for {B} rows)")
        T = max(budgets)
        other_temp = (None if reference_temperature is None or float(reference_temperature) == float(temperature or 1.0)
                      else float(reference_temperature))
        lens = [len(p) for p in prompt_ids]
        L = max(lens)
        dev = self.device
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            if p:
                ids[i, L - len(p):] = torch.tensor(p)
                mask[i, L - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        U = torch.stack([torch.rand(max(T, 1), generator=torch.Generator().manual_seed(s)) for s in seeds]).to(dev)
        out = [[] for _ in range(B)]
        finish = ["length"] * B
        stop: list[int | None] = [None] * B
        logp = torch.zeros(B, dtype=torch.float64, device=dev)
        logp_ref = torch.zeros(B, dtype=torch.float64, device=dev)
        kl_path = torch.zeros(B, dtype=torch.float64, device=dev)
        active = torch.tensor([b > 0 for b in budgets], device=dev)
        budget_t = torch.tensor(budgets, device=dev)
        eos_t = torch.tensor(self.eos_ids, device=dev)
        # rows[i]: the caller's row that batch row i holds. Finished rows leave the batch once at
        # least half of it has finished (their KV caches too), so a batch whose completions end
        # at different lengths does not keep computing the finished ones up to the longest
        rows = torch.arange(B, device=dev)
        row_list = list(range(B))
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        res = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **keep_last_logits(self.model))
        past, logits = cache_of(res), res.logits[:, -1, :]
        if guide is not None:
            guide.temperature = temperature  # offsets that enter before the temperature are scaled by it
            guide.begin(ids, mask, pos)
        compact = selectable(past) and (guide is None or bool(getattr(guide, "selectable", lambda: False)()))
        next_pos = pos[:, -1] + 1
        for step in range(T):
            if not bool(active.any()):
                break
            if temperature == 0 and guide is None:
                tok = logits.argmax(-1)
            else:
                ref_lp = _tempered(logits, temperature or 1.0, top_k)
                final = guide.adjust(ref_lp) if guide is not None else ref_lp
                if temperature == 0:
                    tok = final.argmax(-1)
                else:
                    truncated = top_p < 1.0
                    if truncated:  # the nucleus is part of the policy: what is drawn from
                        q = torch.log_softmax(final.masked_fill(~nucleus(final, top_p), float("-inf")), -1)
                    else:
                        q = torch.log_softmax(final, -1)
                    tok = sample_from(q, U[:, step], 1.0, 1.0, 0)
                    r_lp = ref_lp if other_temp is None else _tempered(logits, other_temp, top_k)
                    step_q = q.gather(-1, tok.unsqueeze(-1)).squeeze(-1).double()
                    step_r = torch.log_softmax(r_lp, -1).gather(-1, tok.unsqueeze(-1)).squeeze(-1).double()
                    logp.index_add_(0, rows, torch.where(active, step_q, torch.zeros_like(step_q)))
                    logp_ref.index_add_(0, rows, torch.where(active, step_r, torch.zeros_like(step_r)))
                    if kl_out is not None and (guide is not None or truncated or other_temp is not None):
                        step_kl = step_kl_of(q, torch.log_softmax(r_lp, -1))
                        kl_path.index_add_(0, rows, torch.where(active, step_kl, torch.zeros_like(step_kl)))
            is_eos = torch.isin(tok, eos_t)
            tok_list, eos_list, act_list = tok.tolist(), is_eos.tolist(), active.tolist()
            for i, row in enumerate(row_list):
                if not act_list[i]:
                    continue
                if eos_list[i]:
                    finish[row] = "eos"
                    stop[row] = tok_list[i]
                else:
                    out[row].append(tok_list[i])
            done_now = is_eos | (budget_t <= step + 1)
            active = active & ~done_now
            n_active = int(active.sum())
            if n_active == 0 or step == T - 1:
                break
            if compact and 2 * n_active <= len(row_list):
                keep = active.nonzero().squeeze(-1)
                past.batch_select_indices(keep)
                if guide is not None:
                    guide.select(keep)
                rows, mask, tok, next_pos = rows[keep], mask[keep], tok[keep], next_pos[keep]
                U, budget_t, active = U[keep], budget_t[keep], active[keep]
                row_list = rows.tolist()
            feed = torch.where(active, tok, torch.full_like(tok, self.pad_id)).unsqueeze(-1)
            mask = torch.cat([mask, active.long().unsqueeze(-1)], dim=-1)
            res = self.model(input_ids=feed, attention_mask=mask, position_ids=next_pos.unsqueeze(-1),
                             use_cache=True, **with_cache(self.model, past), **keep_last_logits(self.model))
            past, logits = cache_of(res), res.logits[:, -1, :]
            if guide is not None:
                guide.advance(feed, mask, next_pos.unsqueeze(-1))
            next_pos = next_pos + 1
        del past, logits, res
        if guide is not None and hasattr(guide, "end"):
            guide.end()  # its cache, like the reference's, is not held past the batch
        lp, lr = logp.tolist(), logp_ref.tolist()
        if kl_out is not None:
            kl_out.extend(kl_path.tolist())
        # compute accounting: tokens sampled by this model (EOS included), read by the generation job
        self.tokens_generated = getattr(self, "tokens_generated", 0) + sum(
            len(o) + (f == "eos") for o, f in zip(out, finish))
        self.sequences_generated = getattr(self, "sequences_generated", 0) + B
        if return_stop:
            return [(out[i], finish[i], lp[i], lr[i], stop[i]) for i in range(B)]
        return [(out[i], finish[i], lp[i], lr[i]) for i in range(B)]

    def generate(self, prompts: Sequence[str], n: int = 1, max_new_tokens: int | Sequence[int] = 64,
                 seed: int = 0, keys: Sequence[str] | None = None, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, batch_size: int = 16, chat: bool = True, guide=None,
                 reference_temperature: float | None = None) -> list[list[Sample]]:
        """``n`` samples for each prompt; ``keys`` (default: the prompt index) make sampling reproducible
        per example whatever the batching. ``max_new_tokens`` may be one budget per prompt."""
        if n < 1 or batch_size < 1:
            raise ValueError(f"n={n} and batch_size={batch_size} must be >= 1")
        keys = list(keys) if keys is not None else [str(i) for i in range(len(prompts))]
        budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        texts = [self.chat_prompt(p) if chat else p for p in prompts]
        enc = self.encode(texts)
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        results: list[list[Sample]] = [[None] * n for _ in prompts]  # type: ignore[list-item]
        for s in range(0, len(rows), batch_size):
            chunk = rows[s:s + batch_size]
            kls: list[float] = []
            got = self.generate_ids([enc[i] for i, _ in chunk], [budgets[i] for i, _ in chunk],
                                    [row_seed(seed, keys[i], j) for i, j in chunk], temperature, top_p, top_k,
                                    guide=guide, return_stop=True, kl_out=kls,
                                    reference_temperature=reference_temperature)
            for (i, j), (tok_ids, fin, lp, lr, eos_id), kl in zip(chunk, got, kls):
                results[i][j] = Sample(self.tok.decode(tok_ids, skip_special_tokens=True), tok_ids, fin,
                                       {"logp": lp, "logp_ref": lr, "eos_id": eos_id, "kl_path": kl})
        return results

    # ------------------------------------------------------------------ scoring
    def hidden_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The final (normed) hidden states [B, L, H] of right-padded ``ids``: the model body alone,
        no KV cache and no logits."""
        body = getattr(self.model, self.model.base_model_prefix, None) or self.model.get_decoder()
        return body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state

    def logits_of(self, h: torch.Tensor) -> torch.Tensor:
        """Next-token logits of hidden states ``h`` [N, H], as the model's own head makes them."""
        logits = self.model.get_output_embeddings()(h)
        cap = getattr(self.model.config.get_text_config(), "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def sequence_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                          batch_size: int = 16, add_eos: bool | Sequence[bool] = False, temperature: float = 1.0,
                          top_p: float = 1.0, eos_ids: Sequence[int | None] | None = None) -> list[float]:
        """log π(completion | prompt) summed over completion tokens (plus EOS when ``add_eos``, one flag
        or one per row), with the logits divided by ``temperature`` and restricted to the top-``top_p``
        nucleus as the sampler does (a token outside the nucleus gives -inf). ``eos_ids`` (one per
        row, None for none) names the EOS each row ended on, where a model has several; without
        it ``add_eos`` appends ``eos_ids[0]``, the tokenizer's."""
        outs: list[float] = []
        eos_flags = [bool(add_eos)] * len(prompt_ids) if isinstance(add_eos, bool) else [bool(x) for x in add_eos]
        ends = ([self.eos_ids[0] if e else None for e in eos_flags] if eos_ids is None
                else [None if x is None else int(x) for x in eos_ids])
        for ids, mask, r_t, p_t in self._scored_batches(prompt_ids, completion_ids, ends, batch_size):
            # the final hidden states (no KV cache, no logits), then the completion positions only,
            # SCORE_CHUNK positions at a time: never a [rows x length x vocabulary] tensor
            h = self.hidden_states(ids, mask)
            sums = torch.zeros(ids.shape[0], dtype=torch.float64, device=self.device)
            if r_t.numel():
                tgt = ids[r_t, p_t + 1]
                for a in range(0, r_t.numel(), SCORE_CHUNK):
                    sl = slice(a, a + SCORE_CHUNK)
                    logp = torch.log_softmax(self.logits_of(h[r_t[sl], p_t[sl]]).float() / (temperature or 1.0), -1)
                    if top_p < 1.0:
                        logp = torch.log_softmax(logp.masked_fill(~nucleus(logp, top_p), float("-inf")), -1)
                    sums.index_add_(0, r_t[sl], logp.gather(-1, tgt[sl].unsqueeze(-1)).squeeze(-1).double())
                    del logp
            del h
            outs += [float(x) for x in sums.tolist()]
        return outs

    def _scored_batches(self, prompt_ids, completion_ids, ends, batch_size: int):
        """Right-padded ``prompt + completion (+ end token)`` batches on the device, with the
        (row, position) of every position whose next token is a completion token."""
        for s in range(0, len(prompt_ids), batch_size):
            P, C = prompt_ids[s:s + batch_size], completion_ids[s:s + batch_size]
            C = [list(c) + ([e] if e is not None else []) for c, e in zip(C, ends[s:s + batch_size])]
            seqs = [list(p) + list(c) for p, c in zip(P, C)]
            L = max(len(x) for x in seqs)
            ids = torch.full((len(seqs), L), self.pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, x in enumerate(seqs):
                ids[i, :len(x)] = torch.tensor(x)
                mask[i, :len(x)] = 1
            rows_i, pos_i = [], []
            for i, (p, c) in enumerate(zip(P, C)):
                rows_i += [i] * len(c)
                pos_i += range(len(p) - 1, len(p) - 1 + len(c))
            yield (ids.to(self.device), mask.to(self.device), torch.tensor(rows_i, dtype=torch.long, device=self.device),
                   torch.tensor(pos_i, dtype=torch.long, device=self.device))

    @torch.no_grad()
    def path_kl(self, ref: "LM", prompt_ids: list[list[int]], completion_ids: list[list[int]],
                eos_ids: Sequence[int | None], temperature: float = 1.0, batch_size: int = 16,
                logp_ref_out: list | None = None, top_p: float = 1.0) -> list[float]:
        """Per row, the exact KL of this model's next-token distribution to ``ref``'s at every step
        of the given path (the completion, then its EOS where ``eos_ids`` names one), summed: the
        KL of a sampled sequence without the noise of a single log-ratio. Both models see the same
        token ids and divide their logits by ``temperature``; this model's distribution is
        restricted to its nucleus when ``top_p`` < 1 (what it was sampled from, as in
        ``generate_ids``), the reference's never is. A path drawn from this model makes the mean over rows an unbiased, never
        negative, estimate of KL(this model || ref) over sequences. ``logp_ref_out``, when given,
        receives each row's log ref(path) from the same forward pass of ``ref`` (what
        ``ref.sequence_logprobs(..., eos_ids=eos_ids, temperature=temperature)`` returns), so an
        evaluation runs the reference once, not twice."""
        outs: list[float] = []
        ends = [None if x is None else int(x) for x in eos_ids]
        t = temperature or 1.0
        for ids, mask, r_t, p_t in self._scored_batches(prompt_ids, completion_ids, ends, batch_size):
            h = self.hidden_states(ids, mask)
            h_ref = ref.hidden_states(ids.to(ref.device), mask.to(ref.device))
            sums = torch.zeros(ids.shape[0], dtype=torch.float64, device=self.device)
            lref = torch.zeros_like(sums)
            tgt = ids[r_t, p_t + 1]
            for a in range(0, r_t.numel(), SCORE_CHUNK):
                sl = slice(a, a + SCORE_CHUNK)
                q = torch.log_softmax(self.logits_of(h[r_t[sl], p_t[sl]]).float() / t, -1)
                if top_p < 1.0:
                    q = torch.log_softmax(q.masked_fill(~nucleus(q, top_p), float("-inf")), -1)
                r = torch.log_softmax(ref.logits_of(h_ref[r_t[sl].to(ref.device), p_t[sl].to(ref.device)]).float() / t, -1)
                r = r.to(q.device)
                sums.index_add_(0, r_t[sl], step_kl_of(q, r))
                if logp_ref_out is not None:
                    lref.index_add_(0, r_t[sl], r.gather(-1, tgt[sl].unsqueeze(-1)).squeeze(-1).double())
                del q, r
            del h, h_ref
            outs += [float(x) for x in sums.tolist()]
            if logp_ref_out is not None:
                logp_ref_out += [float(x) for x in lref.tolist()]
        return outs


def _offline() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
