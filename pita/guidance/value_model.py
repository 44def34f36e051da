"""The guidance (value) model: a small causal-LM backbone plus a head that scores candidate
next tokens of the reference model.

    vm = ValueModel.create(backbone_path, loss="bce")            # or "mse", "mle", "bradley_terry"
    out = vm.scores(h, candidates)    # h: [B, H] backbone states, candidates: [B, k] token ids -> [B, k, n_out]

The head reads the backbone's state at s and the embedding of the candidate token a, plus the
backbone's own language-model log-probability of a (the *LM prior*):

    out = W_o gelu(W_h h_s + W_e E[a] + (U_h h_s) * (U_e E[a])) + w_lm * log p_LM(a | s)

so scoring k candidates, or the whole vocabulary, costs one small matmul per step and no
vocabulary-by-atoms weight matrix. ``w_lm`` starts at ``lm_prior`` (bce / mse: the logit starts
as log p_LM(a|s) plus a learned state term; mle: ``lm_prior * linspace(-1, 1)`` over the atoms,
so a likelier token starts with more mass on high returns). Starting it at 0 instead leaves the
head unable to tell a right next token from a wrong one: on the tiny family's arith task the
weight then stays near 0.07 after training, the head's scores are flat over the candidates,
and guidance changes nothing (docs/decisions/value-head-lm-prior.md). The Bradley-Terry
proxy reward model does not use the prior (its score is read at the last token). n_out is 1 for
bce / mse / bradley_terry (a logit) and ``num_atoms`` for mle (logits over atoms spanning
[v_min, v_max]). The backbone shares the reference's tokenizer (checked at plan time).

Training positions: for a sequence prompt + prefix + continuation, the state before each
continuation token y_t is scored with candidate y_t (loss masked to continuation tokens). A
Bradley-Terry proxy reward model is the same class with loss="bradley_terry": the reward of a
full sequence is the head's output at its last token (the same function at training and scoring).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from pita.core.errors import ConfigError
from pita.models.lm import cache_of, with_cache

HEAD_FILE, META_FILE = "value_head.pt", "value_head.json"


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


class ValueModel(nn.Module):
    def __init__(self, backbone, spec: HeadSpec):
        super().__init__()
        spec.check()
        self.backbone = backbone
        self.spec = spec
        H = backbone.config.hidden_size
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

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, backbone_path: str, loss: str = "bce", num_atoms: int = 11, v_min: float = 0.0,
               v_max: float = 1.0, head_dim: int = 128, dtype=torch.float32, lm_prior: float = 1.0) -> "ValueModel":
        from transformers import AutoModelForCausalLM

        bb = AutoModelForCausalLM.from_pretrained(backbone_path, dtype=dtype)
        spec = HeadSpec(loss, num_atoms, float(v_min), float(v_max), head_dim, bb.config.vocab_size,
                        bb.config.hidden_size, float(lm_prior))
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
        return HeadSpec(**json.loads(meta.read_text()))

    @classmethod
    def load(cls, path: str | Path, expect: HeadSpec | None = None, device: str = "cpu",
             dtype=torch.float32) -> "ValueModel":
        """Load a checkpoint; with ``expect``, refuse a head that does not match (warm starts)."""
        from transformers import AutoModelForCausalLM

        spec = cls.read_spec(path)
        if expect is not None:
            diff = [f"{k}: checkpoint {getattr(spec, k)!r} vs config {getattr(expect, k)!r}"
                    for k in ("loss", "num_atoms", "v_min", "v_max", "head_dim")
                    if (k != "num_atoms" or spec.loss == "mle" or expect.loss == "mle")
                    and getattr(spec, k) != getattr(expect, k)]
            if diff:
                raise ConfigError(f"the guidance checkpoint {path} has an incompatible head ({'; '.join(diff)}); "
                                  f"warm-start only from a round trained with the same loss and atoms")
        bb = AutoModelForCausalLM.from_pretrained(Path(path) / "backbone", dtype=dtype)
        vm = cls(bb, spec)
        # weights_only: a checkpoint holds tensors; never unpickle code from a file (older torch did by default)
        vm.load_state_dict(torch.load(Path(path) / HEAD_FILE, map_location="cpu", weights_only=True), strict=False)
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
        """``h`` [..., H], ``candidates`` [..., k] -> head outputs [..., k, n_out]; ``lm_logp``: the
        states' :meth:`lm_logprobs` when the caller already has them (scoring in chunks)."""
        emb = self.backbone.get_input_embeddings()(candidates)
        z = self.w_h(h).unsqueeze(-2) + self.w_e(emb) + self.u_h(h).unsqueeze(-2) * self.u_e(emb)
        lm_lp = (self.lm_logprobs(h) if lm_logp is None else lm_logp).gather(-1, candidates)
        return self.w_o(torch.nn.functional.gelu(z)) + lm_lp.unsqueeze(-1).to(z.dtype) * self.w_lm

    def token_scores(self, input_ids, attention_mask) -> torch.Tensor:
        """Head output for each actual next token: position t scores token t+1 -> [B, T-1, n_out]."""
        h, _ = self.hidden(input_ids, attention_mask)
        return self.scores(h[:, :-1], input_ids[:, 1:].unsqueeze(-1)).squeeze(-2)

    def sequence_reward(self, input_ids, attention_mask) -> torch.Tensor:
        """Bradley-Terry proxy reward of right-padded sequences: the head at each one's last token
        (the state before it scoring it), read from that one position: no [B x T x vocabulary]
        tensor."""
        h, _ = self.hidden(input_ids, attention_mask)
        last = (attention_mask.sum(-1) - 2).clamp(min=0)  # the state before the last real token
        rows = torch.arange(h.shape[0], device=h.device)
        tok = input_ids[rows, last + 1].unsqueeze(-1)
        return self.scores(h[rows, last], tok)[..., 0, 0]

    def sequence_value(self, input_ids, attention_mask) -> torch.Tensor:
        """The value a value model predicts for right-padded whole sequences: the head at each
        one's last token, as :meth:`sequence_reward` reads it, in the head's own units (bce: the
        logit of success; mse: the value; mle: the mean over the atoms). Larger is better in
        every case: what a best-of-n control scored by the value model ranks by."""
        if self.spec.n_out == 1:
            return self.sequence_reward(input_ids, attention_mask).float()
        from pita.losses.value import atoms

        h, _ = self.hidden(input_ids, attention_mask)
        last = (attention_mask.sum(-1) - 2).clamp(min=0)
        rows = torch.arange(h.shape[0], device=h.device)
        out = self.scores(h[rows, last], input_ids[rows, last + 1].unsqueeze(-1))[..., 0, :].float()
        z = atoms(self.spec.v_min, self.spec.v_max, self.spec.num_atoms).to(out.device, out.dtype)
        return (torch.softmax(out, -1) * z).sum(-1)
