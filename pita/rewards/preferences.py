"""Bradley–Terry preference labels from scalar rewards: which of two completions is "chosen".

    P(a ≻ b) = σ(β (r_a − r_b))

    >>> sample_preference([1.0, 0.0], seed=0, key="gsm8k-17", beta=1.0)
    (0, 1, 0.7310585786300049)      # or (1, 0, 0.2689...) with probability 0.269

For a group of candidates the pair is fixed first: with two, that pair; with more, the highest-
and the lowest-reward candidates (ties go to the lower index; the widest reward gap is the most
informative pair and the one DPO-style data collection conventionally keeps). Then either the
label is sampled from the Bradley–Terry probability (``sampling=True``, simulating a noisy
annotator whose noise level is 1/β; β = 0 is a coin flip, β → ∞ the argmax) or the
higher-reward candidate is taken (``sampling=False``).

The draw uses one uniform number derived by SHA-256 from (seed, key), not from a shared RNG or
Python's salted ``hash()``, so a prompt's label is the same in every run, on every worker and in
any processing order.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable

from pita.core.errors import ConfigError


def check_beta(beta: float) -> None:
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or math.isnan(beta) or beta < 0:
        raise ConfigError(
            f"data_collection.bt_beta={beta!r} must be a number >= 0 (0: labels are coin flips; "
            "larger: labels follow the reward more closely); set e.g. data_collection.bt_beta=1.0"
        )


def _sigmoid(x: float) -> float:
    # Numerically stable for large |x| (math.exp(-x) overflows for x < -709).
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def bt_probability(r_a: float, r_b: float, beta: float = 1.0) -> float:
    """P(a ≻ b) = σ(β (r_a − r_b)) under the Bradley–Terry model."""
    check_beta(beta)
    if beta == 0:
        return 0.5  # also when the gap is infinite (0 * inf would be nan)
    return _sigmoid(beta * (float(r_a) - float(r_b)))


def uniform(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by (seed, key): the first 8 bytes of SHA-256 over both."""
    digest = hashlib.sha256(f"{seed}\x1f{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def preference_pair(rewards: list[float]) -> tuple[int, int] | None:
    """The (higher, lower) reward candidates compared; ties go to the lower index.

    Two candidates: that pair. More: the highest and the lowest reward. All equal: 0 and 1.
    """
    if len(rewards) < 2:
        return None
    hi = min(range(len(rewards)), key=lambda i: (-rewards[i], i))
    lo = min((i for i in range(len(rewards)) if i != hi), key=lambda i: (rewards[i], i))
    return hi, lo


def sample_preference(
    rewards: list[float], seed: int, key: str, beta: float = 1.0, sampling: bool = True
) -> tuple[int, int, float] | None:
    """(chosen index, rejected index, p) for one group of candidates, or None if fewer than 2.

    ``p`` is the Bradley–Terry probability that the returned chosen beats the returned rejected,
    σ(β (r_chosen − r_rejected)); it is below 0.5 when the sample went against the rewards.
    """
    check_beta(beta)
    rewards = [float(r) for r in rewards]
    bad = [i for i, r in enumerate(rewards) if math.isnan(r)]
    if bad:
        raise ValueError(f"sample_preference(key={key!r}): reward at index {bad[0]} is NaN")
    pair = preference_pair(rewards)
    if pair is None:
        return None
    a, b = pair
    p_a = bt_probability(rewards[a], rewards[b], beta)
    if sampling and uniform(seed, key) >= p_a:
        return b, a, 1.0 - p_a
    return a, b, p_a


def make_pairs(
    groups: Iterable[dict], seed: int, beta: float = 1.0, sampling: bool = True, per_group: int | None = None,
    round: int | None = None,
) -> list[dict]:
    """Preference records for many prompts; groups with fewer than 2 completions are skipped.

    Each group: ``{"id", "prompt", "completions", "rewards"}`` and optionally ``"finishes"`` (each
    completion's ``eos`` | ``length``). Each record: ``{"id", "prompt", "chosen", "rejected",
    "chosen_reward", "rejected_reward", "p_chosen"}``, with ``chosen_finish`` / ``rejected_finish``
    when the group has finishes (a completion cut off by the length limit must not be trained as
    one that ended). The group's id is
    the sampling key, so a prompt's label does not depend on the other groups.

    ``per_group=None``: one pair per group, its highest- and lowest-reward completions.
    ``per_group=P``: P disjoint pairs of the group's completions in order (1-2, 3-4, ...), each
    labelled once by its own draw (key ``<id>/<k>``): the same budget rule as value roll-outs.
    ``round``: the round the completions were sampled in, part of every draw's key (``r<round>/``),
    so a prompt's pairs of later rounds get draws of their own rather than round 0's again.
    """
    check_beta(beta)
    out = []
    salt = "" if round is None else f"r{int(round)}/"
    for g in groups:
        comps, rewards = list(g["completions"]), list(g["rewards"])
        if len(comps) != len(rewards):
            raise ValueError(
                f"make_pairs: group {g['id']!r} has {len(comps)} completions but {len(rewards)} rewards"
            )
        if per_group is None:
            drawn = [(None, sample_preference(rewards, seed, f"{salt}{g['id']}", beta, sampling))]
        else:
            drawn = []
            for k in range(min(per_group, len(comps) // 2)):
                a, b = 2 * k, 2 * k + 1
                res = sample_preference([rewards[a], rewards[b]], seed, f"{salt}{g['id']}/{k}", beta, sampling)
                drawn.append((k, None if res is None else ((a, b)[res[0]], (a, b)[res[1]], res[2])))
        for k, res in drawn:
            if res is None:
                continue
            c, r, p = res
            out.append(
                {
                    "id": g["id"],
                    "prompt": g["prompt"],
                    "chosen": comps[c],
                    "rejected": comps[r],
                    "chosen_reward": float(rewards[c]),
                    "rejected_reward": float(rewards[r]),
                    "p_chosen": p,
                    **({} if k is None else {"pair": k}),
                    **({} if "finishes" not in g else {"chosen_finish": g["finishes"][c],
                                                      "rejected_finish": g["finishes"][r]}),
                }
            )
    return out


TIE_RULES = ("drop", "draw")


def supervision(pairs: int, ties: int, rule: str) -> dict:
    """What a preference learner's labels were (its training job's ``supervision`` result):
    ``pairs`` labelled, ``ties`` among them (equal rewards), ``decisive`` the rest, and the
    ``tie_rule`` that kept or dropped the ties."""
    return {"pairs": int(pairs), "ties": int(ties), "decisive": int(pairs) - int(ties), "tie_rule": rule,
            "trained_pairs": int(pairs) if rule == "draw" else int(pairs) - int(ties)}
