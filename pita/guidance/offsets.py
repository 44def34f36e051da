"""Guidance offsets: the per-token log-weights that turn π_ref into the guided policy.

Value-guided decoding samples from

    π(a | s) ∝ π_ref(a | s) · E[e^{ηZ} | s, a]

where Z is the (random) outcome of finishing the text after token a and η ≥ 0 trades the
reference policy (η = 0) against the value model (η → ∞). In log space the guided logits are the
reference log-probs plus an offset, log E[e^{ηZ} | s, a], which the value head estimates:

    bernoulli    Z ∈ {0, 1} with P(Z = 1) = p:      log(1 − p + p·e^η)
    expectation  first-order form η·E[Z] = η·c       (Q#-style: π ∝ π_ref · e^{η Q})
    mle          Z on atoms z_i with probs p_i:     log Σ_i p_i e^{η z_i}

``offset(mode, eta, out, atom_values)`` maps the value head's raw output ``out`` to the offset:

    bernoulli    out[..., 0] is a logit, p = sigmoid(out[..., 0])
    expectation  out[..., 0] is a logit, c = sigmoid(out[..., 0]) is the expected outcome in
                 [0, 1] (the head trained with the bce or mse loss)
    mle          out is [..., A] logits over the atoms ``atom_values``, p = softmax(out)

All of them give exactly 0 at η = 0 (sampling from π_ref unchanged), and the bernoulli and mle
forms agree on a two-atom {0, 1} histogram. The offsets only reweight, so adding a constant
per state does not change the policy; ``offset`` never needs to normalise.

Run the tests: .venv/bin/python -m pytest -q tests/test_losses.py
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pita.core.errors import ConfigError
from pita.core.names import unknown_name

MODES = ("bernoulli", "expectation", "mle")


def check_mode(mode: str, field: str = "guidance.mode") -> str:
    """Return ``mode`` if it is one of MODES; otherwise raise ConfigError naming ``field``."""
    if mode not in MODES:
        raise ConfigError(unknown_name(field, mode, MODES))
    return mode


def check_eta(eta, field: str = "eta") -> float:
    """``eta`` as a float; ConfigError unless it is a finite number >= 0."""
    bad = isinstance(eta, bool)
    try:
        value = float(eta)
    except (TypeError, ValueError, RuntimeError):
        bad, value = True, math.nan
    if bad or not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"{field}={eta!r} must be >= 0 (a finite number: 0 samples from the reference policy, "
            f"larger values trust the value model more); set e.g. {field}=1.0"
        )
    return value


def _float(x, like: torch.Tensor | None = None) -> torch.Tensor:
    if like is not None:
        return torch.as_tensor(x, dtype=like.dtype, device=like.device)
    x = torch.as_tensor(x)
    return x if x.is_floating_point() else x.to(torch.float32)


def bernoulli_offset(p, eta: float) -> torch.Tensor:
    """log(1 − p + p·e^η) for P(Z = 1) = p, computed as logaddexp(log(1 − p), log p + η).

    p is clamped into [0, 1]; p = 0 gives exactly 0 and p = 1 exactly η.
    """
    eta = check_eta(eta)
    p = _float(p).clamp(0, 1)
    if eta == 0:
        return torch.zeros_like(p)
    general = torch.logaddexp(torch.log1p(-p), torch.log(p) + eta)
    out = torch.where(p == 0, torch.zeros_like(p), general)
    return torch.where(p == 1, torch.full_like(p, eta), out)


def expectation_offset(c, eta: float) -> torch.Tensor:
    """η·c, the first-order offset for an expected outcome c."""
    eta = check_eta(eta)
    c = _float(c)
    return torch.zeros_like(c) if eta == 0 else eta * c


def _mle_from_log_probs(log_probs: torch.Tensor, atom_values, eta: float) -> torch.Tensor:
    z = _float(atom_values, like=log_probs)
    if z.dim() != 1 or z.shape[0] != log_probs.shape[-1]:
        raise ValueError(
            f"atom_values has shape {tuple(z.shape)} but the distribution has {log_probs.shape[-1]} "
            "atoms on its last axis; pass one value per atom (see pita.losses.value.atoms)"
        )
    if eta == 0:
        return torch.zeros(log_probs.shape[:-1], dtype=log_probs.dtype, device=log_probs.device)
    return torch.logsumexp(log_probs + eta * z, dim=-1)


def mle_offset(probs, atom_values, eta: float) -> torch.Tensor:
    """log Σ_i p_i e^{η z_i} for probs [..., A] over atoms z [A]; atoms with p_i = 0 add nothing."""
    eta = check_eta(eta)
    probs = _float(probs)
    # log 0 = −inf, and logsumexp ignores −inf terms: zero-probability atoms contribute nothing.
    return _mle_from_log_probs(torch.log(probs.clamp_min(0)), atom_values, eta)


def offset(mode: str, eta: float, out: torch.Tensor, atom_values=None) -> torch.Tensor:
    """The offset [...] for the value head's raw output ``out`` (see the module docstring).

    bernoulli uses logsigmoid(±x) for log p and log(1 − p) rather than sigmoid then log, so a
    saturated logit does not round p to exactly 0 or 1.
    """
    check_mode(mode)
    eta = check_eta(eta)
    out = _float(out)
    if mode == "mle":
        if atom_values is None:
            raise ValueError("offset(mode='mle') needs atom_values, one value per atom of the head")
        return _mle_from_log_probs(F.log_softmax(out, dim=-1), atom_values, eta)
    x = out[..., 0]
    if eta == 0:
        return torch.zeros_like(x)
    if mode == "bernoulli":
        return torch.logaddexp(F.logsigmoid(-x), F.logsigmoid(x) + eta)
    return eta * torch.sigmoid(x)
