"""Run an experiment on every device of this machine: ``python run_parallel.py experiment.name=NAME``.

Hydra main (pita/conf/config.yaml; keys documented in pita/config/schema.py) -> pita.cli.run_experiment.
With ``-m`` (multirun) each sweep point is its own run; the exit code is the worst of them.
"""

import sys

import hydra
from omegaconf import DictConfig

from pita.cli import check_cli_overrides, normalize_argv, run_experiment

_exit_codes: list[int] = []


@hydra.main(config_path="pita/conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    _exit_codes.append(run_experiment(cfg))


if __name__ == "__main__":
    sys.argv[1:] = normalize_argv(sys.argv[1:])  # --multirun / -m anywhere, as the README writes it
    check_cli_overrides()  # a bad override exits 2 with the fix, before Hydra's generic error
    main()
    sys.exit(max(_exit_codes, default=0))
