"""The algorithms, one module each, registered by name (pita/algos/base.py says how to add one).

    value-guided (pita/algos/value_guided.py):  PITA (pita.py), QSharp (qsharp.py), QSharp-HF (qsharp_hf.py)
    post-training (pita/algos/post_training.py): DPO (dpo.py), GRPO (grpo.py), GRPO-HF (grpo_hf.py)

Importing this package registers the built-in algorithms; none of their modules imports torch
or transformers until a job runs.
"""

from pita.algos.base import (ALGORITHMS, AlgoConfig, Algorithm, PlanContext, algorithm, default_configs,
                             on_register, register_algorithm, unregister_algorithm)
from pita.algos import pita, qsharp, qsharp_hf, dpo, grpo, grpo_hf  # noqa: E402,F401  (registration order = default order)

__all__ = ["ALGORITHMS", "AlgoConfig", "Algorithm", "PlanContext", "algorithm", "default_configs", "on_register",
           "register_algorithm", "unregister_algorithm"]
