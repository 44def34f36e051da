"""Run an experiment on every device of this machine: ``python run_parallel.py experiment.name=NAME``.

The documented entry point; ``pita run ...`` and ``python -m pita run ...`` are the same command
(pita.cli.run_main: our --help, the override checks, then Hydra with pita/conf/config.yaml ->
pita.cli.run_experiment). With ``-m`` (multirun) each sweep point is its own run; the exit code
is the worst of them.
"""

import sys

from pita.entry import run_parallel

if __name__ == "__main__":
    sys.exit(run_parallel())
