"""Q# (QSharp): the value model learns the return of each sampled continuation.

Targets: 0/1 correctness on math (bce loss, bernoulli guidance), the reward model's score on
reward tasks (mle over atoms spanning the data, mle guidance).
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
        return "mle" if task == "reward" else "bce"

    @classmethod
    def value_examples(cls, ctx, records: list[dict], device: str) -> list:
        return returns_examples(records, task=ctx.params["task"])
