"""Guided decoding: π(a|s) ∝ π_ref(a|s) · E[e^{ηZ} | s, a], one step at a time.

    guide = GuidedDecoder(value_model, mode="bernoulli", eta=2.0, top_k=20)
    lm.generate(prompts, guide=guide, temperature=1.0, top_p=1.0)

Each step, given the reference's log-probs ``ref_lp`` (already divided by the temperature),
``adjust`` returns the guided logits

    ref_lp[a] + δ(a),   δ(a) = offset(mode, η, head(s, a)) for the k scored candidates, 0 elsewhere

where the scored candidates are the reference's top ``top_k`` tokens (``top_k=-1``: the whole
vocabulary) and the offset is ``bernoulli`` log(1 − p + p·e^η), ``expectation`` η·c, or ``mle``
log Σ_i p_i e^{η z_i}. As in the Q# reference code, ``top_k`` chooses which tokens the value model
scores, not which tokens exist: every other token keeps its reference log-prob and stays
sampleable, so the guided policy shares its support with π_ref.

The target distribution. One step samples from π(a|s) = π_ref(a|s) e^{δ_s(a)} / Z_s with
Z_s = Σ_a π_ref(a|s) e^{δ_s(a)}, so a whole sequence y has

    log π(y) = log π_ref(y) + Σ_t δ_t(y_t) − Σ_t log Z_t

(with top_k = -1 and an exact value function this is the KL-optimal π_ref·e^{ηr}/Z; with a
smaller top_k the tilt is applied to the scored tokens only). At η = 0 every δ is 0 and the
guided policy is π_ref itself. Where temperature and top-p apply: the temperature divides the
reference logits before the offset (temperature 1 gives exactly π_ref·E[e^{ηZ}]); top-p is
applied after the offset, to the guided distribution.

The value model keeps its own KV cache, fed the same tokens as the reference: the prompt once
(``begin``), then each new token (``advance``); the prefix is never re-encoded, and the cache
object is updated in place (sliding-window and hybrid caches included), never copied. With the
reference head (pita/guidance/value_model.py) each step's candidates run through the value
model's backbone in one batched pass over that cache (``ValueModel.candidate_scores``), which
leaves the cache as it was. When the sampler drops finished rows from its batch (``select``),
the value model's cache drops the same rows.
A failure here fails the job: there is no fallback to unguided sampling.
"""

from __future__ import annotations

import torch

from pita.core.errors import ConfigError
from pita.guidance.offsets import check_eta, check_mode, offset


# candidates scored at once by the value head (top_k=-1 scores the whole vocabulary in chunks)
CANDIDATE_CHUNK = 1024
# the reference head's candidate pass: its 4-D mask is rows x chunk x (prefix + chunk), so the
# whole vocabulary goes through the backbone this many candidates at a time
REFERENCE_CHUNK = 256


OFFSET_SHIFTS = ("min", "none")
OFFSET_TEMPERATURES = ("before", "after")


class GuidedDecoder:
    """``offset_shift="min"`` (mle): each state's candidate offsets shifted so the lowest is 0 (a
    constant per state when every token is a candidate, so it changes nothing then; with top_k
    below the vocabulary, the other tokens count as the worst candidate instead of as an outcome
    of 0). ``offset_temperature="before"``: δ enters the logits before the temperature, so the
    tempered log-probs get δ/T (``temperature`` is set by the sampler)."""

    def __init__(self, value_model, mode: str, eta: float, top_k: int = 20, offset_shift: str = "none",
                 offset_temperature: str = "after"):
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
        if offset_shift not in OFFSET_SHIFTS or offset_temperature not in OFFSET_TEMPERATURES:
            raise ConfigError(f"offset_shift={offset_shift!r} must be one of {OFFSET_SHIFTS} and offset_temperature="
                              f"{offset_temperature!r} one of {OFFSET_TEMPERATURES}")
        self.vm, self.mode, self.eta, self.top_k = value_model, mode, float(eta), top_k
        self.offset_shift, self.offset_temperature = offset_shift, offset_temperature
        self.temperature = 1.0  # the sampler's (LM.generate_ids sets it)
        self.atoms = None
        if value_model.spec.loss == "mle":
            from pita.losses.value import atoms

            s = value_model.spec
            self.atoms = atoms(s.v_min, s.v_max, s.num_atoms)
        self.reference_head = getattr(value_model.spec, "head", "embedding") == "reference"
        self.past = None
        self.h = None
        self.mask = None  # the 2-D attention mask of the tokens in the cache
        self.next_pos = None  # the position a candidate takes: one past the last token fed

    @torch.no_grad()
    def begin(self, ids, mask, pos) -> None:
        h, self.past = self.vm.hidden(ids, mask, pos, use_cache=True)
        self.h = h[:, -1]
        self.mask, self.next_pos = mask, pos[:, -1] + 1

    @torch.no_grad()
    def advance(self, feed, mask, pos) -> None:
        h, self.past = self.vm.hidden(feed, mask, pos, past_key_values=self.past, use_cache=True)
        self.h = h[:, -1]
        self.mask, self.next_pos = mask, pos[:, -1] + 1

    def end(self) -> None:
        """Drop the state of the batch just sampled (the value model's KV cache, its last hidden
        state): the sampler calls it when a batch ends, so what follows (the reward model scoring
        the samples, the reference's KL pass) does not run beside a cache nothing reads."""
        self.past = self.h = self.mask = self.next_pos = None

    def selectable(self) -> bool:
        from pita.models.lm import selectable

        return selectable(self.past)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only these batch rows (the sampler drops finished rows): the value model's cache
        shrinks with the reference's, in place."""
        self.past.batch_select_indices(keep)
        self.h = self.h[keep]
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]

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
            h = self.h.to(next(self.vm.parameters()).dtype)
            atoms = self.atoms.to(h.device) if self.atoms is not None else None
            if self.reference_head:
                # each candidate through the backbone; the whole vocabulary REFERENCE_CHUNK at a time
                off = torch.cat([offset(self.mode, self.eta, self.vm.candidate_scores(
                    self.past, self.mask, self.next_pos, cands[:, a:a + REFERENCE_CHUNK]).float(), atoms)
                    for a in range(0, cands.shape[-1], REFERENCE_CHUNK)], dim=-1)
            # the head's tensors are [rows x candidates x head_dim]: the whole vocabulary (top_k=-1)
            # is scored CANDIDATE_CHUNK candidates at a time, the backbone's log-probs computed once
            elif cands.shape[-1] <= CANDIDATE_CHUNK:
                off = offset(self.mode, self.eta, self.vm.scores(h, cands).float(), atoms)
            else:
                lm_logp = self.vm.lm_logprobs(h) if self.vm.spec.head == "embedding" else None
                off = torch.cat([offset(self.mode, self.eta, self.vm.scores(h, cands[:, a:a + CANDIDATE_CHUNK],
                                                                             lm_logp).float(), atoms)
                                 for a in range(0, cands.shape[-1], CANDIDATE_CHUNK)], dim=-1)
        if self.mode == "mle" and self.offset_shift == "min":
            off = off - off.min(dim=-1, keepdim=True).values
        if self.offset_temperature == "before" and self.temperature and self.temperature != 1.0:
            off = off / self.temperature  # (logits + δ) / T = logits / T + δ / T
        # the offset on the scored candidates only; every other token keeps its reference log-prob
        return ref_lp.scatter(-1, cands, ref_lp.gather(-1, cands) + off.to(ref_lp.dtype))
