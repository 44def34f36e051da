"""Value-model losses as pure functions: BCE, MSE, histogram MLE (two-hot), Bradley–Terry.

    loss = bce_loss(logits, targets, mask)          # logits, targets, mask: [B, T]
    loss = mle_loss(logits, values, mask, 0.0, 1.0)  # logits: [B, T, A]; values, mask: [B, T]
    loss = bradley_terry_loss(r_chosen, r_rejected)  # [B] each

Every loss averages over the positions where ``mask`` is nonzero (0/1 or bool, one entry per
position: the logits' shape, less the atom axis for ``mle_loss``), or, given ``weights`` of the
same shape, takes their weighted mean there (1 / a row's kept positions: each row's mean, then
the mean over rows, as both reference implementations average). Masked positions are replaced
by harmless values *before* the loss is computed, so padding that holds garbage (NaN targets,
huge logits) changes neither the loss nor the gradient, which is exactly 0 there. An all-zero
mask gives a loss of 0 that is still attached to the graph (``backward()`` works and gives zero
gradients); the average divides by ``max(count, 1)`` so no host sync is needed to find that case.

Histogram MLE predicts a distribution over ``num_atoms`` evenly spaced atoms on [v_min, v_max];
its target is the "two-hot" encoding of the scalar value: the value is clamped into the support
and its mass split between the two neighbouring atoms so that the target's mean is the value.

Run the tests: .venv/bin/python -m pytest -q tests/test_losses.py
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pita.core.errors import ConfigError
from pita.core.names import unknown_name

LOSSES = ("bce", "mse", "mle", "bradley_terry")


def check_loss(name: str, field: str = "loss") -> str:
    """Return ``name`` if it is one of LOSSES; otherwise raise ConfigError naming ``field``.

    ``field`` is where the name came from in the config, e.g. ``"algos.pita.loss"``.
    """
    if name not in LOSSES:
        raise ConfigError(unknown_name(field, name, LOSSES))
    return name


# --------------------------------------------------------------------------- masking


def _keep(mask, shape: torch.Size, device: torch.device, what: str) -> torch.Tensor:
    """``mask`` as a bool tensor of exactly ``shape`` (nonzero = keep)."""
    mask = torch.as_tensor(mask, device=device)
    if mask.shape != shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but {what} has shape {tuple(shape)}; "
            "pass one 0/1 entry per position"
        )
    return mask != 0


def _masked_mean(per_position: torch.Tensor, keep: torch.Tensor, weights=None) -> torch.Tensor:
    # Division by max(count, 1): an all-zero mask gives 0 (still in the graph), no host sync.
    if weights is not None:  # a weighted mean over the kept positions (e.g. 1 / each row's length)
        w = torch.where(keep, _like(weights, per_position), torch.zeros_like(per_position))
        total = (torch.where(keep, per_position, torch.zeros_like(per_position)) * w).sum()
        return total / w.sum().clamp_min(torch.finfo(per_position.dtype).tiny)
    total = torch.where(keep, per_position, torch.zeros_like(per_position)).sum()
    return total / keep.sum().clamp_min(1).to(per_position.dtype)


def _like(x, ref: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x, dtype=ref.dtype, device=ref.device)


def _check_same_shape(a: torch.Tensor, b: torch.Tensor, a_name: str, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{a_name} has shape {tuple(a.shape)} but {b_name} has shape {tuple(b.shape)}; they must match")


# --------------------------------------------------------------------------- scalar heads


def bce_loss(logits: torch.Tensor, targets, mask, weights=None) -> torch.Tensor:
    """Masked mean of binary cross-entropy with logits; targets are probabilities in [0, 1]
    (probability of success, or of being preferred). ``weights`` (the mask's shape): a weighted
    mean instead, e.g. 1 / each row's kept positions for the mean over rows of each row's mean."""
    targets = _like(targets, logits)
    _check_same_shape(targets, logits, "targets", "logits")
    keep = _keep(mask, logits.shape, logits.device, "logits")
    logits = torch.where(keep, logits, torch.zeros_like(logits))
    targets = torch.where(keep, targets, torch.zeros_like(targets))
    per = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return _masked_mean(per, keep, weights)


def mse_loss(logits: torch.Tensor, targets, mask, weights=None) -> torch.Tensor:
    """Masked mean of (sigmoid(logits) − targets)², targets in [0, 1] (``weights``: as bce_loss)."""
    targets = _like(targets, logits)
    _check_same_shape(targets, logits, "targets", "logits")
    keep = _keep(mask, logits.shape, logits.device, "logits")
    logits = torch.where(keep, logits, torch.zeros_like(logits))
    targets = torch.where(keep, targets, torch.zeros_like(targets))
    per = (torch.sigmoid(logits) - targets) ** 2
    return _masked_mean(per, keep, weights)


# --------------------------------------------------------------------------- histogram MLE


def _check_support(v_min: float, v_max: float, num_atoms: int) -> None:
    problems = []
    if isinstance(num_atoms, bool) or not isinstance(num_atoms, int) or num_atoms < 2:
        problems.append(
            f"num_atoms={num_atoms!r} must be an integer >= 2 (the histogram needs both ends of "
            "[v_min, v_max]); set e.g. num_atoms=11"
        )
    try:
        ordered = float(v_min) < float(v_max) and math.isfinite(v_min) and math.isfinite(v_max)
    except (TypeError, ValueError):
        ordered = False
    if not ordered:
        problems.append(
            f"v_min={v_min!r}, v_max={v_max!r}: v_min must be a finite number below v_max; "
            "set e.g. v_min=0.0 v_max=1.0"
        )
    if problems:
        raise ConfigError(problems)


def atoms(v_min: float, v_max: float, num_atoms: int, device=None,
          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``num_atoms`` support points of the histogram: linspace(v_min, v_max), both ends included."""
    _check_support(v_min, v_max, num_atoms)
    return torch.linspace(float(v_min), float(v_max), num_atoms, device=device, dtype=dtype)


def two_hot(values, v_min: float, v_max: float, num_atoms: int) -> torch.Tensor:
    """Target distributions [..., num_atoms] whose mean over the atoms is clamp(values).

    Each value is clamped into [v_min, v_max] and its mass split between the atoms z_lo ≤ v ≤ z_hi
    by linear interpolation: p_hi = (v − z_lo) / (z_hi − z_lo), p_lo = 1 − p_hi. The neighbours are
    found against the very atoms ``atoms()`` returns, so a value equal to an atom puts all its
    mass there. Float inputs keep their dtype; others become float32.
    """
    _check_support(v_min, v_max, num_atoms)
    values = torch.as_tensor(values)
    if not values.is_floating_point():
        values = values.to(torch.float32)
    z = atoms(v_min, v_max, num_atoms, device=values.device, dtype=values.dtype)
    x = values.clamp(z[0], z[-1]).reshape(-1)
    lo = (torch.searchsorted(z, x, right=True) - 1).clamp(0, num_atoms - 2)
    z_lo, z_hi = z[lo], z[lo + 1]
    p_hi = ((x - z_lo) / (z_hi - z_lo)).clamp(0, 1)
    out = torch.zeros(x.shape[0], num_atoms, dtype=values.dtype, device=values.device)
    out.scatter_(1, lo.unsqueeze(1), (1 - p_hi).unsqueeze(1))
    out.scatter_add_(1, (lo + 1).unsqueeze(1), p_hi.unsqueeze(1))
    return out.reshape(*values.shape, num_atoms)


def mle_loss(logits: torch.Tensor, values, mask, v_min: float, v_max: float, weights=None) -> torch.Tensor:
    """Masked mean of the cross-entropy −Σ_i t_i log softmax(logits)_i with t = two_hot(values).

    ``logits`` is [..., A] (A = number of atoms); ``values``, ``mask`` (and ``weights``, as
    bce_loss) are [...].
    """
    values = _like(values, logits)
    if values.shape != logits.shape[:-1]:
        raise ValueError(
            f"values has shape {tuple(values.shape)} but logits has shape {tuple(logits.shape)}; "
            "values must be logits' shape without the last (atom) axis"
        )
    keep = _keep(mask, values.shape, logits.device, "values")
    logits = torch.where(keep.unsqueeze(-1), logits, torch.zeros_like(logits))
    values = torch.where(keep, values, torch.full_like(values, float(v_min)))
    target = two_hot(values.detach(), v_min, v_max, logits.shape[-1])
    per = -(target * F.log_softmax(logits, dim=-1)).sum(-1)
    return _masked_mean(per, keep, weights)


# --------------------------------------------------------------------------- preferences


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, mask=None) -> torch.Tensor:
    """Mean of −log σ(r_chosen − r_rejected) over the pairs (masked mean when ``mask`` is given)."""
    r_rejected = _like(r_rejected, r_chosen)
    _check_same_shape(r_rejected, r_chosen, "r_rejected", "r_chosen")
    if mask is None:
        return -F.logsigmoid(r_chosen - r_rejected).mean()
    keep = _keep(mask, r_chosen.shape, r_chosen.device, "r_chosen")
    diff = torch.where(keep, r_chosen - r_rejected, torch.zeros_like(r_chosen))
    return _masked_mean(-F.logsigmoid(diff), keep)
