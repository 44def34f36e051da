"""Plans: turn a configuration into the whole job graph before anything runs."""

from __future__ import annotations

from pita.core.job import Job

WORKLOADS = ("synthetic", "generate", "experiment")


def build_plan(cfg, device_totals: list[int] | None = None, cuda: bool = False) -> list[Job]:
    """All jobs of the experiment described by ``cfg`` (validated by the caller)."""
    if cfg.experiment.workload == "synthetic":
        from pita.plans.synthetic import demo_grid

        s = cfg.synthetic
        return demo_grid(list(s.algos), list(s.families), list(s.datasets), s.rounds, s.gen_shards,
                         s.eval_shards, s.job_seconds, s.memory_gb, fail=list(s.fail))
    if cfg.experiment.workload == "generate":
        from pita.plans.generation import generation_plan

        return generation_plan(cfg, list(device_totals or [1]), cuda)
    if cfg.experiment.workload == "experiment":
        from pita.plans.experiment import experiment_plan

        return experiment_plan(cfg, list(device_totals or [1]), cuda)
    raise AssertionError(f"unvalidated workload {cfg.experiment.workload!r}")
