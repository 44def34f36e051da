"""The guidance (value) model: a causal-LM backbone plus a head that scores candidate next
tokens of the reference model. Two heads (``HeadSpec.head``):

``reference`` (the default; what the PITA and Q# reference implementations build): the backbone's
last hidden state *after* the candidate, into one linear layer,

    out(s, a) = W h(s + a) + b

so scoring a candidate runs it through the backbone. At each guided step the k candidates run in
one batched pass over the prefix's KV cache (:meth:`ValueModel.candidate_scores`): every
candidate sits at position = prefix length and a 4-D mask lets it see the prefix and itself
only; the pass writes into a shallow view of the cache, so the prefix cache is left as it was
(no crop, and no copy of a sliding-window cache). Training reads the same state: position t's
hidden state scores token t (:meth:`next_token_scores`).

``q`` (Q#'s ``--classifier_type Q``): one vocabulary-wide linear head on the state *before* the
candidate,

    out(s, a) = W[a] h(s) + b            W: [vocabulary x n_out x H]

so every candidate's score comes from the prefix's state alone, like the embedding head's, and
costs no backbone pass; no LM prior. Its rows are gathered for the candidates scored (never a
[positions x vocabulary] tensor); the table holds vocabulary x hidden x n_out parameters (the
plan reserves them and their AdamW state).

``embedding`` (pita's own variant): the head reads the state *before* the candidate and the
candidate's input embedding, plus the backbone's own language-model log-probability of a (the
*LM prior*):

    out = W_o gelu(W_h h_s + W_e E[a] + (U_h h_s) * (U_e E[a])) + w_lm * log p_LM(a | s)

so scoring k candidates, or the whole vocabulary, costs one small matmul per step. ``w_lm``
starts at ``lm_prior`` (bce / mse: the logit starts as log p_LM(a|s) plus a learned state term;
mle: ``lm_prior * linspace(-1, 1)`` over the atoms). Without the prior this head cannot tell a
right next token from a wrong one (the candidate never passes through the backbone;
docs/decisions/value-head-lm-prior.md), so part of what it adds is sampling sharper.

n_out is 1 for bce / mse / bradley_terry (a logit) and ``num_atoms`` for mle (logits over atoms
spanning [v_min, v_max]). The backbone shares the reference's tokenizer (checked at plan time).

Training positions: for a sequence prompt + prefix + continuation, each continuation token y_t is
scored as a candidate after its prefix (loss masked to continuation tokens). A Bradley-Terry
proxy reward model is the same class with loss="bradley_terry": the reward of a full sequence is
the head's score of its last token (the same function at training and scoring).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from pita.core.errors import ConfigError
from pita.models.lm import cache_of, with_cache

HEAD_FILE, META_FILE = "value_head.pt", "value_head.json"
HEADS = ("reference", "embedding", "q")


@dataclass
class HeadSpec:
    loss: str = "bce"
    num_atoms: int = 11
    v_min: float = 0.0
    v_max: float = 1.0
    head_dim: int = 128
    vocab_size: int = 0
    hidden_size: int = 0
    lm_prior: float = 1.0  # initial weight of the backbone's LM log-prob of the candidate
    # the reward range its targets were min-max normalised from (None: raw targets); the head's
    # values, and the guidance eta, are in units of this range
    target_min: float | None = None
    target_max: float | None = None
    # reference | embedding (see the module's docstring)
    head: str = "reference"

    @property
    def n_out(self) -> int:
        return self.num_atoms if self.loss == "mle" else 1

    def check(self) -> None:
        from pita.losses.value import LOSSES

        if self.loss not in LOSSES:
            raise ConfigError(f"loss={self.loss!r} is not known; choose one of {', '.join(LOSSES)}")
        if self.loss == "mle":
            if self.num_atoms < 2:
                raise ConfigError(f"num_atoms={self.num_atoms} must be >= 2 for the mle loss")
            if self.v_min >= self.v_max:
                raise ConfigError(f"v_min={self.v_min} must be < v_max={self.v_max}")
        if not self.lm_prior >= 0:
            raise ConfigError(f"lm_prior={self.lm_prior} must be >= 0 (0 starts the head without the LM prior)")
        if self.head not in HEADS:
            raise ConfigError(f"head={self.head!r} is not known; choose one of {', '.join(HEADS)}")


class ValueModel(nn.Module):
    def __init__(self, backbone, spec: HeadSpec):
        super().__init__()
        spec.check()
        self.backbone = backbone
        self.spec = spec
        H = backbone.config.get_text_config().hidden_size
        if spec.head == "reference":
            self.score = nn.Linear(H, spec.n_out)
            nn.init.normal_(self.score.weight, std=0.01)
            nn.init.zeros_(self.score.bias)  # start near neutral: p ~ 0.5, near-uniform atoms
            return
        if spec.head == "q":
            self.q = QHead(backbone.config.get_text_config().vocab_size, H, spec.n_out)
            return
        E = backbone.get_input_embeddings().embedding_dim
        self.w_h = nn.Linear(H, spec.head_dim)
        self.w_e = nn.Linear(E, spec.head_dim, bias=False)
        self.u_h = nn.Linear(H, spec.head_dim, bias=False)
        self.u_e = nn.Linear(E, spec.head_dim, bias=False)
        self.w_o = nn.Linear(spec.head_dim, spec.n_out)
        nn.init.normal_(self.w_o.weight, std=0.01)
        nn.init.zeros_(self.w_o.bias)  # start near neutral: p ~ 0.5, near-uniform atoms
        if spec.loss == "bradley_terry":
            w_lm = torch.zeros(1)
        elif spec.loss == "mle":
            w_lm = spec.lm_prior * torch.linspace(-1.0, 1.0, spec.n_out)
        else:
            w_lm = torch.full((1,), float(spec.lm_prior))
        self.w_lm = nn.Parameter(w_lm)

    @property
    def out_layer(self) -> nn.Linear:
        """The head's last linear layer (its bias is what :func:`pita.guidance.train.calibrate` sets)."""
        return self.score if self.spec.head == "reference" else self.q if self.spec.head == "q" else self.w_o

    @property
    def lm_weight(self) -> torch.Tensor:
        """The LM prior's weight per output (0 for the reference and q heads, which have none)."""
        if self.spec.head in ("reference", "q"):
            return torch.zeros(self.spec.n_out)
        return self.w_lm.detach().float().cpu()

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, backbone_path: str, loss: str = "bce", num_atoms: int = 11, v_min: float = 0.0,
               v_max: float = 1.0, head_dim: int = 128, dtype=torch.float32, lm_prior: float = 1.0,
               head: str = "reference") -> "ValueModel":
        from transformers import AutoModelForCausalLM

        bb = AutoModelForCausalLM.from_pretrained(backbone_path, dtype=dtype)
        tc = bb.config.get_text_config()
        spec = HeadSpec(loss, num_atoms, float(v_min), float(v_max), head_dim, tc.vocab_size,
                        tc.hidden_size, float(lm_prior), head=head)
        return cls(bb, spec)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.backbone.save_pretrained(path / "backbone")
        head = {k: v for k, v in self.state_dict().items() if not k.startswith("backbone.")}
        torch.save(head, path / HEAD_FILE)
        (path / META_FILE).write_text(json.dumps(asdict(self.spec), indent=2))

    @staticmethod
    def read_spec(path: str | Path) -> HeadSpec:
        meta = Path(path) / META_FILE
        if not meta.exists():
            raise ConfigError(f"{path} is not a guidance checkpoint ({META_FILE} missing)")
        # a checkpoint written before the field existed holds the embedding head
        return HeadSpec(**{"head": "embedding", **json.loads(meta.read_text())})

    @classmethod
    def load(cls, path: str | Path, expect: HeadSpec | None = None, device: str = "cpu",
             dtype=torch.float32) -> "ValueModel":
        """Load a checkpoint; with ``expect``, refuse a head that does not match (warm starts)."""
        from transformers import AutoModelForCausalLM

        spec = cls.read_spec(path)
        if expect is not None:
            diff = [f"{k}: checkpoint {getattr(spec, k)!r} vs config {getattr(expect, k)!r}"
                    for k in ("loss", "num_atoms", "v_min", "v_max", "head_dim", "head")
                    if (k != "num_atoms" or spec.loss == "mle" or expect.loss == "mle")
                    and (k != "head_dim" or spec.head == expect.head == "embedding")
                    and getattr(spec, k) != getattr(expect, k)]
            if diff:
                raise ConfigError(f"the guidance checkpoint {path} has an incompatible head ({'; '.join(diff)}); "
                                  f"warm-start only from a round trained with the same loss, atoms and head")
        bb = AutoModelForCausalLM.from_pretrained(Path(path) / "backbone", dtype=dtype)
        vm = cls(bb, spec)
        # weights_only: a checkpoint holds tensors; never unpickle code from a file (older torch did by default)
        missing, unexpected = vm.load_state_dict(torch.load(Path(path) / HEAD_FILE, map_location="cpu",
                                                            weights_only=True), strict=False)
        missing = [k for k in missing if not k.startswith("backbone.")]
        if missing or unexpected:
            raise ConfigError(f"the guidance checkpoint {path} does not hold a {spec.head} head "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]}); it was written by another version")
        return vm.to(device)

    # ------------------------------------------------------------------ scoring
    def hidden(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        body = self.backbone.model
        out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=use_cache, **with_cache(body, past_key_values))
        return out.last_hidden_state, cache_of(out)

    def lm_logprobs(self, h: torch.Tensor) -> torch.Tensor:
        """The backbone's next-token log-probabilities [..., V] (fp32) of states ``h`` [..., H]."""
        return torch.log_softmax(self.backbone.lm_head(h).float(), -1)

    def scores(self, h: torch.Tensor, candidates: torch.Tensor, lm_logp: torch.Tensor | None = None) -> torch.Tensor:
        """Embedding head: ``h`` [..., H] (the states before the candidates), ``candidates`` [..., k]
        -> head outputs [..., k, n_out]; ``lm_logp``: the states' :meth:`lm_logprobs` when the caller
        already has them (scoring in chunks)."""
        if self.spec.head == "reference":
            raise TypeError("the reference head scores a candidate from the state after it: use next_token_scores "
                            "or candidate_scores")
        if self.spec.head == "q":
            return self.q(h, candidates)
        emb = self.backbone.get_input_embeddings()(candidates)
        z = self.w_h(h).unsqueeze(-2) + self.w_e(emb) + self.u_h(h).unsqueeze(-2) * self.u_e(emb)
        lm_lp = (self.lm_logprobs(h) if lm_logp is None else lm_logp).gather(-1, candidates)
        return self.w_o(torch.nn.functional.gelu(z)) + lm_lp.unsqueeze(-1).to(z.dtype) * self.w_lm

    def next_token_scores(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The head's score of each token of ``ids`` [B, T] as the candidate after the tokens before
        it, from the backbone's states ``h`` [B, T, H] of ``ids``: index t scores token t + 1 ->
        [B, T-1, n_out]. The reference head reads the state at token t + 1 itself, the embedding
        head the state at t and token t + 1's embedding, the q head the state at t and token t + 1's
        row of its table."""
        if self.spec.head == "reference":
            return self.score(h[:, 1:])
        return self.scores(h[:, :-1], ids[:, 1:].unsqueeze(-1)).squeeze(-2)

    def token_scores(self, input_ids, attention_mask) -> torch.Tensor:
        """Head output for each actual next token: position t scores token t+1 -> [B, T-1, n_out]."""
        h, _ = self.hidden(input_ids, attention_mask)
        return self.next_token_scores(h, input_ids)

    def _last_token_scores(self, input_ids, attention_mask) -> torch.Tensor:
        """Right-padded sequences: the head's score of each one's last real token -> [B, n_out]."""
        h, _ = self.hidden(input_ids, attention_mask)
        last = (attention_mask.sum(-1) - 1).clamp(min=1)  # the last real token (scored after the ones before it)
        rows = torch.arange(h.shape[0], device=h.device)
        if self.spec.head == "reference":
            return self.score(h[rows, last])
        return self.scores(h[rows, last - 1], input_ids[rows, last].unsqueeze(-1))[..., 0, :]

    def sequence_reward(self, input_ids, attention_mask) -> torch.Tensor:
        """Bradley-Terry proxy reward of right-padded sequences: the head's score of each one's
        last token, read from that one position: no [B x T x vocabulary] tensor."""
        return self._last_token_scores(input_ids, attention_mask)[..., 0]

    def sequence_value(self, input_ids, attention_mask) -> torch.Tensor:
        """The value a value model predicts for right-padded whole sequences: the head's score of
        each one's last token, as :meth:`sequence_reward` reads it, in the head's own units (bce:
        the logit of success; mse: the value; mle: the mean over the atoms). Larger is better in
        every case: what a best-of-n control scored by the value model ranks by."""
        out = self._last_token_scores(input_ids, attention_mask).float()
        if self.spec.n_out == 1:
            return out[..., 0]
        from pita.losses.value import atoms

        z = atoms(self.spec.v_min, self.spec.v_max, self.spec.num_atoms).to(out.device, out.dtype)
        return (torch.softmax(out, -1) * z).sum(-1)

    # ------------------------------------------------------------------ the candidate pass
    @torch.no_grad()
    def candidate_scores(self, past, mask: torch.Tensor, position: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Reference head at a guided step: the scores [B, k, n_out] of ``candidates`` [B, k] after
        the prefix held in ``past`` (the value model's KV cache of the tokens fed so far, ``mask``
        [B, L] their 2-D attention mask), each candidate at ``position`` [B] (the next position).
        One forward of B x k tokens: candidate j sees the prefix and itself, never another
        candidate. The cache is read, not changed (the pass reads a shallow view of it, each
        layer's concatenation dropped after its attention)."""
        B, k = candidates.shape
        view = cache_view(past)
        if view is None:  # a cache with state updated in place (static, linear attention): a copy
            import copy

            view = copy.deepcopy(past)
        dtype = next(self.backbone.parameters()).dtype
        attn = _candidate_masks(self.backbone.config.get_text_config(), past, mask, k, dtype)
        pos = position.view(B, 1).expand(B, k)
        body = self.backbone.model
        with packed_attention(self.backbone):
            out = body(input_ids=candidates, attention_mask=attn, position_ids=pos, use_cache=True,
                       **with_cache(body, view))
        return self.score(out.last_hidden_state)


class QHead(nn.Module):
    """Q#'s ``Q`` classifier: a [vocabulary x n_out x H] table and a bias [n_out] shared by every
    token (what :func:`pita.guidance.train.calibrate` sets). ``forward(h [..., H], candidates
    [..., k]) -> [..., k, n_out]`` gathers the candidates' rows: the same numbers as the
    reference's ``Linear(H, vocabulary x n_out)(h)`` indexed by the candidates."""

    def __init__(self, vocab: int, hidden: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, n_out, hidden))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, std=0.01)

    def forward(self, h: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        w = self.weight[candidates].to(h.dtype)  # [..., k, n_out, H]
        return torch.einsum("...h,...koh->...ko", h, w) + self.bias.to(h.dtype)


def cache_view(past):
    """A cache object sharing ``past``'s key and value tensors whose updates (concatenations)
    land on the view alone, or None when ``past`` has layers that update in place. The dynamic
    layers (full and sliding-window) rebind their tensors on every update, never write into them."""
    import copy

    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(past, "layers", None)
    if type(past) is not DynamicCache or not layers or not all(
            type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers):
        return None
    view = copy.copy(past)
    view.layers = [_transient(copy.copy(layer)) for layer in layers]
    return view


def _transient(layer):
    """``layer`` (a view's copy) whose update returns the concatenated keys and values for its
    attention and then forgets them: the pass holds one layer's concatenation at a time, not a
    copy of the whole cache (at 1,024 tokens a Qwen3-sized value model's fp32 cache is 19 GB at
    71 rows, which the guided shard's peak held until the pass ended)."""
    import weakref

    cls = type(layer)
    # the function reaches its layer through a weak reference: a strong one (layer -> update ->
    # layer) is a cycle, which only the cyclic collector frees, and the view's layers kept the
    # prefix's keys and values (a whole cache) alive after the pass, one copy per guided step
    ref = weakref.ref(layer)

    def update(*args, **kwargs):
        lay = ref()
        before = dict(lay.__dict__)
        try:
            return cls.update(lay, *args, **kwargs)
        finally:
            lay.__dict__.clear()
            lay.__dict__.update(before)

    layer.update = update
    return layer


def _candidate_masks(config, past, mask: torch.Tensor, k: int, dtype):
    """The additive 4-D masks [B, 1, k, S + k] of the candidate pass: row j sees the S cached
    positions the 2-D ``mask`` allows and candidate j. Models with several attention kinds
    (``config.layer_types``: full and sliding-window) get one mask per kind, each as wide as
    that kind's cache holds (a sliding-window layer keeps only its last window - 1 positions)."""
    B = mask.shape[0]
    eye = torch.eye(k, dtype=torch.bool, device=mask.device).expand(B, k, k)

    def additive(cached: int) -> torch.Tensor:
        seen = mask[:, mask.shape[1] - cached:].bool().unsqueeze(1).expand(B, k, cached)
        allowed = torch.cat([seen, eye], dim=-1).unsqueeze(1)
        return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill(~allowed, torch.finfo(dtype).min)

    kinds = getattr(config, "layer_types", None)
    if not kinds:
        return additive(mask.shape[1])
    out = {}
    for i, kind in enumerate(kinds):
        if kind not in out:
            layer = past.layers[i]
            cached = layer.keys.shape[-2] if getattr(layer, "is_initialized", True) and layer.keys is not None else 0
            out[kind] = additive(min(int(cached), mask.shape[1]))
    return out


PACKED_ATTENTION = "pita_packed_gqa_sdpa"


def packed_gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """SDPA for several query positions over a grouped-query cache without repeating its keys and
    values per query head: the ``n_rep`` query heads that share a KV head attend as ``n_rep`` x q
    query rows of that head, each row with its own position's mask (the mask is the same for every
    head). transformers' own SDPA path repeats K/V per head whenever a mask is given and more than
    one position is queried: at a guided step's candidate pass (top_k positions, a 4-D mask) that
    wrote and read the value model's whole cache n_rep times over (``bench.decode_bytes``). One
    position, no mask, a per-head mask or bias, soft-capping or attention sinks: transformers'
    SDPA as it is."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = int(getattr(module, "num_key_value_groups", 1) or 1)
    B, H, q, D = query.shape
    if (n_rep == 1 or q == 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or getattr(module, "sinks", None) is not None or (module.training and dropout)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    L = key.shape[-2]
    mask = attention_mask[:, :, :, :L].expand(B, 1, q, L).repeat(1, 1, n_rep, 1)  # row r x q + i: position i's
    out = torch.nn.functional.scaled_dot_product_attention(query.reshape(B, H // n_rep, n_rep * q, D), key, value,
                                                           attn_mask=mask, dropout_p=0.0, scale=scaling)
    return out.reshape(B, H, q, D).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def packed_attention(model):
    """While it runs, ``model``'s SDPA attention is :func:`packed_gqa_sdpa` (other kinds as they are)."""
    configs = [c for c in {id(x): x for x in (model.config, model.config.get_text_config())}.values()
               if getattr(c, "_attn_implementation", None) == "sdpa"]
    for c in configs:
        c._attn_implementation = PACKED_ATTENTION
    try:
        yield
    finally:
        for c in configs:
            c._attn_implementation = "sdpa"


def _register_packed_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(PACKED_ATTENTION, packed_gqa_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, sdpa_mask)


_register_packed_attention()
