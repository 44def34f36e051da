"""Q# (QSharp): the value model learns the return of each sampled continuation.

Targets: 0/1 correctness on math, the reward model's score on reward tasks, min-max normalised to
[0, 1] over each round's training data (``normalize_targets``, the bounds stored with the model),
as the PITA reference code does: bce loss and bernoulli guidance, so that eta means the same tilt
for Q# and PITA. With ``normalize_targets=none`` (raw rewards) reward tasks default to mle over
atoms spanning the data, with mle guidance.
"""

from __future__ import annotations

from dataclasses import dataclass

from pita.algos.base import register_algorithm
from pita.algos.value_guided import ValueGuidedAlgorithm, ValueGuidedConfig, returns_examples


@dataclass
class QSharpConfig(ValueGuidedConfig):
    pass


@register_algorithm
class QSharp(ValueGuidedAlgorithm):
    name = "QSharp"
    Config = QSharpConfig

    def default_loss(self, task: str) -> str:
        return "mle" if task == "reward" and self.normalization() == "none" else "bce"

    @classmethod
    def value_examples(cls, ctx, records: list[dict], device: str) -> list:
        return returns_examples(records, task=ctx.params["task"])
