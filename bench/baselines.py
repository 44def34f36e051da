"""DPO / GRPO / GRPO-HF on the embedded default: reference vs trained policy, over seeds.

    python -m bench.baselines [--json] [--seeds 0 1 2] [--rounds 2] [--cache .cache/pita]
    python -m bench.baselines --runs outputs/bench-bl-s0/<time> outputs/bench-bl-s1/<time> ...

The same driver as ``bench.value_guided`` (one ``run_parallel.py`` run per seed, then the
aggregate of their ``results/final_results.json``) with the TRL baselines as the default
algorithms. A trained policy is evaluated once per round (its rows carry eta 0); the KL column is
KL(policy || original reference) from the same evaluation jobs as the value-guided algorithms.
Nothing is asserted about the numbers.
"""

from __future__ import annotations

from bench.value_guided import main as _main


def main(argv=None) -> int:
    return _main(argv, algos=("DPO", "GRPO", "GRPO-HF"), name="bench-bl", prog="python -m bench.baselines",
                 doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
