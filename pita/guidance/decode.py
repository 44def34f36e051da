"""Guided decoding: π(a|s) ∝ π_ref(a|s) · E[e^{ηZ} | s, a], one step at a time.

    guide = GuidedDecoder(value_model, mode="bernoulli", eta=2.0, top_k=20)
    lm.generate(prompts, guide=guide, temperature=1.0, top_p=1.0)

Each step, given the reference's log-probs ``ref_lp`` (already divided by the temperature and,
with ``top_k``, restricted to the top-k candidates), ``adjust`` returns

    ref_lp[a] + offset(mode, η, head(s, a))   for the candidates a,   -inf elsewhere

where the candidates are the top-k of the reference (``top_k=-1``: the whole vocabulary) and the
offset is ``bernoulli`` log(1 − p + p·e^η), ``expectation`` η·c, or ``mle`` log Σ_i p_i e^{η z_i}.
Where temperature and top-p apply: the temperature divides the reference logits before the
offset (temperature 1 gives exactly π_ref·E[e^{ηZ}]); top-p is applied after the offset, to
the guided distribution. η = 0 leaves the reference (restricted to its candidates) unchanged.

The value model keeps its own KV cache, fed the same tokens as the reference: the prompt once
(``begin``), then each new token (``advance``); the prefix is never re-encoded, and the cache
object is updated in place (sliding-window and hybrid caches included), never copied.
A failure here fails the job: there is no fallback to unguided sampling.
"""

from __future__ import annotations

import torch

from pita.core.errors import ConfigError
from pita.guidance.offsets import check_eta, check_mode, offset


class GuidedDecoder:
    def __init__(self, value_model, mode: str, eta: float, top_k: int = 20):
        check_mode(mode)
        eta = check_eta(eta)
        vocab = value_model.spec.vocab_size
        if top_k == 0 or (top_k > vocab and vocab) or top_k < -1:
            raise ConfigError(f"guidance.top_k={top_k} must be -1 (all tokens) or in 1..{vocab}")
        if mode == "mle" and value_model.spec.loss != "mle":
            raise ConfigError(f"guidance.mode=mle needs a value model trained with loss=mle "
                              f"(this one was trained with {value_model.spec.loss})")
        if mode != "mle" and value_model.spec.loss == "mle":
            raise ConfigError(f"a value model trained with loss=mle needs guidance.mode=mle, not {mode}")
        self.vm, self.mode, self.eta, self.top_k = value_model, mode, float(eta), top_k
        self.atoms = None
        if value_model.spec.loss == "mle":
            from pita.losses.value import atoms

            s = value_model.spec
            self.atoms = atoms(s.v_min, s.v_max, s.num_atoms)
        self.past = None
        self.h = None

    @torch.no_grad()
    def begin(self, ids, mask, pos) -> None:
        h, self.past = self.vm.hidden(ids, mask, pos, use_cache=True)
        self.h = h[:, -1]

    @torch.no_grad()
    def advance(self, feed, mask, pos) -> None:
        h, self.past = self.vm.hidden(feed, mask, pos, past_key_values=self.past, use_cache=True)
        self.h = h[:, -1]

    @torch.no_grad()
    def adjust(self, ref_lp: torch.Tensor) -> torch.Tensor:
        V = ref_lp.shape[-1]
        if self.top_k == -1 or self.top_k >= V:
            cands = torch.arange(V, device=ref_lp.device).expand(ref_lp.shape[0], V)
        else:
            cands = torch.topk(ref_lp, self.top_k, dim=-1).indices
        if self.eta == 0:
            off = torch.zeros(cands.shape, dtype=ref_lp.dtype, device=ref_lp.device)
        else:
            out = self.vm.scores(self.h.to(next(self.vm.parameters()).dtype), cands).float()
            atoms = self.atoms.to(out.device) if self.atoms is not None else None
            off = offset(self.mode, self.eta, out, atoms)
        final = torch.full_like(ref_lp, float("-inf"))
        final.scatter_(-1, cands, ref_lp.gather(-1, cands) + off)
        return final
