"""pita: run PITA, Q#, Q#-HF, DPO, GRPO and GRPO-HF experiments across every GPU of a node.

The entry points are ``run_parallel.py`` (Hydra main) and ``python -m pita``. The package is
layered: ``pita.core`` orchestrates jobs on devices and knows nothing of algorithms.
"""

__version__ = "0.1.0"
