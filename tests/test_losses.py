"""Value losses (pita/losses/value.py) and guidance offsets (pita/guidance/offsets.py).

Run: .venv/bin/python -m pytest -q tests/test_losses.py

Every expected number is worked out by hand in the test's docstring; the property tests draw
from a seeded generator so a failure reproduces.
"""

from __future__ import annotations

import math

import pytest
import torch

from pita.core.errors import ConfigError
from pita.guidance.offsets import (
    MODES,
    bernoulli_offset,
    check_eta,
    expectation_offset,
    mle_offset,
    offset,
)
from pita.losses.value import (
    LOSSES,
    atoms,
    bce_loss,
    bradley_terry_loss,
    check_loss,
    mle_loss,
    mse_loss,
    two_hot,
)

LN2, LN3, LN5 = math.log(2), math.log(3), math.log(5)


def close(actual, expected, tol=1e-6):
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=0), (actual, expected)


# --------------------------------------------------------------------------- BCE / MSE


def test_bce_by_hand():
    """logit 0, target 1: −log σ(0) = log 2.
    logit ln 3 (σ = 3/4), target 1/2: −(½ log ¾ + ½ log ¼) = ½ log(16/3).
    Mean of the two: (log 2 + ½ log(16/3)) / 2."""
    logits = torch.tensor([0.0, LN3])
    close(bce_loss(logits[:1], torch.tensor([1.0]), torch.tensor([1])), LN2)
    close(bce_loss(logits[1:], [0.5], [1]), 0.5 * math.log(16 / 3))
    close(bce_loss(logits, [1.0, 0.5], [1, 1]), (LN2 + 0.5 * math.log(16 / 3)) / 2)


def test_mse_by_hand():
    """logit 0, target 1: (½ − 1)² = 0.25. logit ln 3, target 0: (¾)² = 0.5625.
    Mean of both = 0.40625; with the second masked out, 0.25."""
    logits = torch.tensor([0.0, LN3])
    close(mse_loss(logits, [1.0, 0.0], [1, 1]), 0.40625)
    close(mse_loss(logits, [1.0, 0.0], torch.tensor([True, False])), 0.25)


# --------------------------------------------------------------------------- atoms / two-hot


def test_atoms_include_both_ends():
    """atoms(−1, 1, 5) = [−1, −½, 0, ½, 1]."""
    close(atoms(-1, 1, 5), [-1.0, -0.5, 0.0, 0.5, 1.0])
    assert atoms(0, 1, 3, dtype=torch.float64).dtype == torch.float64


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.25, [0.5, 0.5, 0.0]),  # halfway between atoms 0 and ½
        (0.9, [0.0, 0.2, 0.8]),   # (0.9 − 0.5)/0.5 = 0.8 on atom 1
        (0.5, [0.0, 1.0, 0.0]),   # exactly on an atom: all mass there
        (0.0, [1.0, 0.0, 0.0]),   # lower end
        (1.0, [0.0, 0.0, 1.0]),   # upper end
        (-3.0, [1.0, 0.0, 0.0]),  # clamped up to 0
        (7.0, [0.0, 0.0, 1.0]),   # clamped down to 1
    ],
)
def test_two_hot_by_hand(value, expected):
    """Atoms [0, ½, 1]; the mass on the upper neighbour is (v − z_lo)/(z_hi − z_lo)."""
    close(two_hot(torch.tensor(value), 0.0, 1.0, 3), expected)


def test_two_hot_exact_atom_hits_put_all_mass_on_that_atom():
    """Every atom of atoms(−2, 3, 11) (spacing ½) encodes as a one-hot row, exactly."""
    z = atoms(-2, 3, 11)
    assert torch.equal(two_hot(z, -2, 3, 11), torch.eye(11))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_two_hot_mean_is_the_clamped_value(dtype, tol):
    """Property over 1000 values drawn from [−4, 5] (beyond both ends of [−2, 3], so both clamps
    are exercised) plus the ends themselves: rows are ≥ 0, sum to 1, use at most two adjacent
    atoms, and Σ_i t_i z_i = clamp(v, −2, 3)."""
    g = torch.Generator().manual_seed(0)
    values = torch.rand(1000, generator=g, dtype=dtype) * 9 - 4
    values = torch.cat([values, torch.tensor([-2.0, 3.0, -100.0, 100.0], dtype=dtype)])
    assert (values < -2).any() and (values > 3).any()
    t = two_hot(values, -2.0, 3.0, 11)
    assert t.shape == (1004, 11) and t.dtype == dtype
    assert (t >= 0).all()
    close(t.sum(-1), torch.ones(1004), tol)
    idx = torch.arange(11)
    nonzero = t > 0
    highest = torch.where(nonzero, idx, -1).max(-1).values
    lowest = torch.where(nonzero, idx, 99).min(-1).values
    assert (highest - lowest <= 1).all()  # one atom, or two neighbours
    z = atoms(-2, 3, 11, dtype=dtype)
    close((t * z).sum(-1), values.clamp(-2, 3), tol)


def test_two_hot_keeps_leading_shape():
    """[2, 3] values → [2, 3, 5] targets; integers become float32."""
    t = two_hot(torch.zeros(2, 3, dtype=torch.int64), 0, 1, 5)
    assert t.shape == (2, 3, 5) and t.dtype == torch.float32


# --------------------------------------------------------------------------- MLE


def test_mle_loss_by_hand():
    """logits [0, ln 2, ln 3] → softmax [1/6, 2/6, 3/6]; value ¼ on atoms [0, ½, 1] → target
    [½, ½, 0]. CE = −(½ log(1/6) + ½ log(1/3)) = ½ log 18."""
    logits = torch.tensor([[0.0, LN2, LN3]])
    close(mle_loss(logits, [0.25], [1], 0.0, 1.0), 0.5 * math.log(18))


def test_mle_loss_is_minimised_by_the_two_hot_target():
    """With logits = log t the CE equals the entropy of t, the smallest it can be: for t = [½, ½, 0]
    that is log 2, and any other logits give more."""
    t = torch.tensor([[0.5, 0.5, 0.0]])
    best = mle_loss(torch.log(t.clamp_min(1e-30)), [0.25], [1], 0.0, 1.0)
    close(best, LN2)
    assert mle_loss(torch.zeros(1, 3), [0.25], [1], 0.0, 1.0) > best + 0.05


# --------------------------------------------------------------------------- Bradley–Terry


def test_bradley_terry_by_hand():
    """r_c − r_r = 0: −log σ(0) = log 2. r_c − r_r = 2: −log σ(2) = log(1 + e^{−2}).
    Mean of both = (log 2 + log(1 + e^{−2}))/2; masking the second leaves log 2."""
    r_c, r_r = torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0])
    close(bradley_terry_loss(r_c[:1], r_r[:1]), LN2)
    close(bradley_terry_loss(r_c[1:], r_r[1:]), math.log1p(math.exp(-2)))
    close(bradley_terry_loss(r_c, r_r), (LN2 + math.log1p(math.exp(-2))) / 2)
    close(bradley_terry_loss(r_c, r_r, mask=[1, 0]), LN2)


def test_bradley_terry_is_stable_for_large_margins():
    """−log σ(−1000) = 1000 + log(1 + e^{−1000}) = 1000 (not inf); −log σ(1000) = 0."""
    close(bradley_terry_loss(torch.tensor([-1000.0]), torch.tensor([0.0])), 1000.0)
    close(bradley_terry_loss(torch.tensor([1000.0]), torch.tensor([0.0])), 0.0)


# --------------------------------------------------------------------------- masks


def _case(name):
    """(loss on [2, 3] positions, inputs with grad, targets, mask). Position [0, 2] and the whole of
    row 1 but [1, 0] are masked out."""
    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    if name == "mle":
        x = torch.randn(2, 3, 5, generator=g)
        y = torch.rand(2, 3, generator=g)
        return (lambda x, y, m: mle_loss(x, y, m, 0.0, 1.0)), x, y, mask
    x = torch.randn(2, 3, generator=g)
    if name == "bradley_terry":
        y = torch.randn(2, 3, generator=g)
        return (lambda x, y, m: bradley_terry_loss(x, y, m)), x, y, mask
    fn = {"bce": bce_loss, "mse": mse_loss}[name]
    return fn, x, torch.rand(2, 3, generator=g), mask


@pytest.mark.parametrize("name", LOSSES)
def test_masked_positions_change_nothing_and_get_zero_grad(name):
    """Garbage at masked positions (NaN targets, ±1e4 logits) leaves the loss unchanged, equal to
    the loss over the kept positions alone, and their gradient is exactly 0 (kept ones: nonzero)."""
    fn, x, y, mask = _case(name)
    keep = mask.bool()
    x1 = x.clone().requires_grad_(True)
    clean = fn(x1, y, mask)
    clean.backward()

    x_bad, y_bad = x.clone(), y.clone()
    x_bad[~keep] = 1e4
    y_bad[~keep] = float("nan")
    x2 = x_bad.clone().requires_grad_(True)
    dirty = fn(x2, y_bad, mask)
    dirty.backward()

    assert torch.isfinite(dirty)
    assert dirty.item() == pytest.approx(clean.item(), abs=1e-6)
    assert (x2.grad[~keep] == 0).all()
    kept_grad = x2.grad[keep].reshape(int(keep.sum()), -1)  # [K, A] for mle, [K, 1] otherwise
    assert (kept_grad != 0).any(dim=-1).all()

    # The same loss over only the kept positions (a single flat batch, all kept).
    alone = fn(x[keep], y[keep], torch.ones(int(keep.sum())))
    close(dirty.detach(), alone)


@pytest.mark.parametrize("name", LOSSES)
def test_all_zero_mask_gives_zero_loss_with_grad(name):
    """No kept position: the loss is 0, still differentiable, and every gradient is 0."""
    fn, x, y, mask = _case(name)
    x = x.clone().requires_grad_(True)
    loss = fn(x, y, torch.zeros_like(mask))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_mask_shape_must_match():
    """A [2] mask for [2, 3] logits would silently broadcast and miscount: refused."""
    with pytest.raises(ValueError, match="mask has shape"):
        bce_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2))


# --------------------------------------------------------------------------- offsets


def test_bernoulli_offset_by_hand():
    """p = ½, η = ln 3: log(½ + ½·3) = log 2. p = 0 → log 1 = 0; p = 1 → log e^η = η, exactly;
    p outside [0, 1] is clamped (−0.1 → 0, 1.2 → η)."""
    close(bernoulli_offset(0.5, LN3), LN2)
    out = bernoulli_offset(torch.tensor([0.0, 1.0, -0.1, 1.2]), 2.5)
    assert out.tolist() == [0.0, 2.5, 0.0, 2.5]


def test_expectation_offset_by_hand():
    """η·c: 2·¼ = ½."""
    close(expectation_offset(0.25, 2.0), 0.5)


def test_mle_offset_point_mass_is_eta_z():
    """probs one-hot on z = ½ (atoms [−1, ½, 2]), η = 3: log(1·e^{3·½}) = 1.5; zero-probability
    atoms contribute nothing."""
    close(mle_offset(torch.tensor([0.0, 1.0, 0.0]), torch.tensor([-1.0, 0.5, 2.0]), 3.0), 1.5)


def test_mle_offset_two_atoms_by_hand():
    """atoms [0, 1], probs [¾, ¼], η = ln 5: log(¾·1 + ¼·5) = log 2."""
    close(mle_offset(torch.tensor([0.75, 0.25]), torch.tensor([0.0, 1.0]), LN5), LN2)


def test_mle_offset_matches_bernoulli_on_zero_one_atoms():
    """Z ∈ {0, 1}: Σ p_i e^{η z_i} = (1 − p) + p e^η, the Bernoulli form, for 200 random p and η
    (plus p = 0 and p = 1)."""
    g = torch.Generator().manual_seed(2)
    p = torch.cat([torch.rand(200, generator=g), torch.tensor([0.0, 1.0])])
    for eta in (0.1, 1.0, 3.7, 10.0):
        probs = torch.stack([1 - p, p], dim=-1)
        close(mle_offset(probs, torch.tensor([0.0, 1.0]), eta), bernoulli_offset(p, eta), 1e-6)


def test_mle_offset_lies_between_eta_mean_and_eta_max():
    """Jensen: η E[Z] ≤ log E[e^{ηZ}] ≤ η max{z : p(z) > 0}, for random histograms."""
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(100, 7, generator=g, dtype=torch.float64) * 2, -1)
    z = atoms(-1, 2, 7, dtype=torch.float64)
    off = mle_offset(probs, z, 1.5)
    assert (off >= 1.5 * (probs * z).sum(-1) - 1e-12).all()
    assert (off <= 1.5 * 2.0 + 1e-12).all()


def test_offset_dispatch_by_hand():
    """bernoulli: logit ln 3 → p = ¾; η = ln 5: log(¼ + ¾·5) = log 4.
    expectation: logit 0 → c = ½; η = 2: 1.
    mle: logits [0, ln 3] → probs [¼, ¾] on atoms [0, 1]; η = ln 5: log(¼ + ¾·5) = log 4.
    Shapes: [2, 3, 1] heads give [2, 3] offsets; [2, 3, A] heads too."""
    close(offset("bernoulli", LN5, torch.tensor([[LN3]])), [math.log(4)])
    close(offset("expectation", 2.0, torch.tensor([[0.0]])), [1.0])
    close(offset("mle", LN5, torch.tensor([[0.0, LN3]]), atom_values=torch.tensor([0.0, 1.0])), [math.log(4)])
    assert offset("bernoulli", 1.0, torch.zeros(2, 3, 1)).shape == (2, 3)
    assert offset("mle", 1.0, torch.zeros(2, 3, 4), atoms(0, 1, 4)).shape == (2, 3)


def test_offset_bernoulli_agrees_with_sigmoid_form_and_survives_saturation():
    """For moderate logits offset('bernoulli') = bernoulli_offset(σ(x)).
    x = −110, η = 110: p = σ(−110) ≈ e^{−110} underflows to 0 in float32 (the smallest subnormal is
    ≈ e^{−103}), yet the offset is log(1 − p + p·e^{110}) ≈ log(1 + e^{−110}·e^{110}) = log 2;
    going through σ would give 0. x = 40, η = 2: σ rounds to 1, offset ≈ η = 2."""
    x = torch.linspace(-6, 6, 25)
    close(offset("bernoulli", 2.0, x.unsqueeze(-1)), bernoulli_offset(torch.sigmoid(x), 2.0), 1e-5)
    assert torch.sigmoid(torch.tensor(-110.0)).item() == 0.0
    close(offset("bernoulli", 110.0, torch.tensor([[-110.0]])), [LN2])
    close(offset("bernoulli", 2.0, torch.tensor([[40.0]])), [2.0])


@pytest.mark.parametrize("mode", MODES)
def test_eta_zero_gives_exactly_zero(mode):
    """η = 0: E[e^{0·Z}] = 1, so the offset is log 1 = 0 exactly, whatever the head says."""
    g = torch.Generator().manual_seed(4)
    out = torch.randn(4, 5, generator=g) * 10
    got = offset(mode, 0.0, out, atom_values=atoms(0, 1, 5))
    assert torch.equal(got, torch.zeros(4))
    p = torch.rand(7, generator=g)
    assert torch.equal(bernoulli_offset(p, 0), torch.zeros(7))
    assert torch.equal(expectation_offset(p, 0), torch.zeros(7))
    assert torch.equal(mle_offset(torch.softmax(out, -1), atoms(0, 1, 5), 0), torch.zeros(4))


# --------------------------------------------------------------------------- errors


def test_atoms_errors_name_the_field():
    """num_atoms = 1 cannot span [v_min, v_max]; v_min ≥ v_max is an empty support."""
    with pytest.raises(ConfigError, match="num_atoms=1 must be an integer >= 2"):
        atoms(0, 1, 1)
    with pytest.raises(ConfigError, match=r"v_min=1\.0, v_max=1\.0: v_min must be .* below v_max"):
        atoms(1.0, 1.0, 3)
    with pytest.raises(ConfigError, match="v_min=2, v_max=1"):
        two_hot(torch.tensor(0.5), 2, 1, 3)
    with pytest.raises(ConfigError, match="num_atoms=1"):
        mle_loss(torch.zeros(1, 1), [0.5], [1], 0.0, 1.0)


@pytest.mark.parametrize("eta", [-1.0, -1e-9, float("nan"), float("inf"), True, "big"])
def test_eta_must_be_a_finite_nonnegative_number(eta):
    """Negative η would steer *away* from success; NaN/inf/non-numbers break sampling."""
    with pytest.raises(ConfigError, match=r"eta=.* must be >= 0"):
        check_eta(eta)
    with pytest.raises(ConfigError, match="eta="):
        offset("bernoulli", eta, torch.zeros(1, 1))
    with pytest.raises(ConfigError, match="eta="):
        bernoulli_offset(0.5, eta)


def test_negative_eta_message_names_the_value():
    with pytest.raises(ConfigError) as e:
        mle_offset(torch.tensor([1.0]), torch.tensor([0.0]), -2)
    assert "eta=-2 must be >= 0" in str(e.value)


def test_unknown_mode_lists_choices_and_suggests():
    with pytest.raises(ConfigError) as e:
        offset("bernouli", 1.0, torch.zeros(1, 1))
    msg = str(e.value)
    assert "guidance.mode='bernouli'" in msg and "did you mean 'bernoulli'" in msg
    assert "bernoulli, expectation, mle" in msg


def test_unknown_loss_lists_choices_and_suggests():
    with pytest.raises(ConfigError) as e:
        check_loss("bradley-terry", field="algos.pita.loss")
    msg = str(e.value)
    assert "algos.pita.loss='bradley-terry'" in msg and "did you mean 'bradley_terry'" in msg
    assert "bce, bradley_terry, mle, mse" in msg
    assert check_loss("mle", field="algos.pita.loss") == "mle"


def test_mle_offset_atom_count_must_match():
    with pytest.raises(ValueError, match="atom_values has shape"):
        mle_offset(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.5, 1.0]), 1.0)
    with pytest.raises(ValueError, match="needs atom_values"):
        offset("mle", 1.0, torch.zeros(1, 3))


def test_per_sequence_weights_average_each_rows_mean_then_the_rows():
    """Row A scores one position with loss 0.25 ((sigmoid 0 - 1)^2), row B three with loss 0
    (target 0.5). Over tokens: 0.25 / 4 = 0.0625; each row's mean, then the rows' (both
    reference implementations): (0.25 + 0) / 2 = 0.125. Weights are 1 / a row's kept positions."""
    import torch

    from pita.losses.value import bce_loss, mse_loss

    logits = torch.zeros(2, 3)
    targets = torch.tensor([[1.0, 9.0, 9.0], [0.5, 0.5, 0.5]])  # 9: padding, never read
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    w = mask / mask.sum(1, keepdim=True)
    assert float(mse_loss(logits, targets, mask)) == pytest.approx(0.0625)
    assert float(mse_loss(logits, targets, mask, w)) == pytest.approx(0.125)
    # all-equal lengths: the two averages agree
    full = torch.ones(2, 3)
    t = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert float(bce_loss(logits, t, full, full / 3)) == pytest.approx(float(bce_loss(logits, t, full)))
