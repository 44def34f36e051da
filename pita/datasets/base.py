"""The record every dataset adapter produces, and the adapter registry.

    Example(id="gsm8k-train-00017", prompt="Natalia sold clips to ...", answer="72",
            task="math", meta={"source": "openai/gsm8k"})

``prompt`` is the task text before any chat template (the model wrapper applies the
tokenizer's template). ``answer`` is the gold final answer for verifiable (math) tasks and None
for reward tasks, which are scored by a reward model instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pita.core.names import Registry


@dataclass
class Example:
    id: str
    prompt: str
    answer: str | None = None
    task: str = "math"  # "math" (verifiable answer) or "reward" (scored by a reward model)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Example":
        return cls(**d)


# name -> adapter class (see pita/datasets/adapters.py); filled by @DATASETS.register("name")
DATASETS: Registry[type] = Registry("dataset")
