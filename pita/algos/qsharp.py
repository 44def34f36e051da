"""Q# (QSharp): the value model learns the return of each sampled continuation.

Targets: 0/1 correctness on math, the reward model's score on reward tasks, min-max normalised to
[0, 1] over each round's training data (``normalize_targets``, the bounds stored with the model),
as the PITA reference code does. The loss per task kind follows the PITA reference's Q#: bce with
bernoulli guidance on math (0/1 targets), mle over atoms spanning the data with mle guidance on
reward tasks. Roll-ins are sampled from the round's policy and every cut is continued by the
frozen reference (``continue_from=reference``): the targets are the reference's returns, the
quantity Q# estimates; ``algos.QSharp.rollin`` / ``continue_from`` switch either. Prompts whose
roll-outs all score the same are left out of training (``drop_no_variation``, on as in the Q#
reference).
"""

from __future__ import annotations

from dataclasses import dataclass

from pita.algos.base import register_algorithm
from pita.algos.value_guided import ReturnsFilterKey, ValueGuidedAlgorithm, ValueGuidedConfig, returns_examples


@dataclass
class QSharpConfig(ReturnsFilterKey, ValueGuidedConfig):
    pass


@register_algorithm
class QSharp(ValueGuidedAlgorithm):
    name = "QSharp"
    Config = QSharpConfig

    def default_loss(self, task: str) -> str:
        return "mle" if task == "reward" else "bce"

    @classmethod
    def value_examples(cls, ctx, records: list[dict], device: str) -> list:
        return returns_examples(records, task=ctx.params["task"])
