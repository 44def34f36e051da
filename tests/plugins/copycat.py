"""A small algorithm defined outside the package, to show that adding one is one file.

``Copycat`` "trains" by handing on the reference model unchanged, then every round is evaluated
like any trained policy. Its rows must therefore equal the base model's (same prompts, same
sample seeds) with KL 0: a check of the shared evaluation path as much as of the registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from pita.algos import AlgoConfig, Algorithm, register_algorithm
from pita.core.job import Job, Resources, job_kind


@dataclass
class CopycatConfig(AlgoConfig):
    note: str = "unchanged"  # written into each round's result


@register_algorithm
class Copycat(Algorithm):
    name = "Copycat"
    Config = CopycatConfig

    def check(self, cfg, n_devices: int) -> list[str]:
        p = super().check(cfg, n_devices)
        if not self.c.note:
            p.append(f"{self.key}.note must not be empty")
        return p

    def plan(self, p) -> list[Job]:
        jobs, prev = [], None
        for r in range(p.cfg.experiment.rounds):
            train = Job(id=f"{p.prefix(self.name)}.r{r}.train", kind="copycat.train", deps=[prev] if prev else [],
                        group=f"round {r}", params={"reference": p.paths["reference"], "note": self.c.note},
                        resources=Resources(0, 0.0))
            jobs.append(train)
            jobs += p.evaluations(self.name, r, train.id, policy={"model_from_job": train.id,
                                                                   "reference": p.paths["reference"]})
            prev = train.id
        return jobs


@job_kind("copycat.train")
def copycat_train(ctx):
    return {"checkpoint": ctx.params["reference"], "note": ctx.params["note"]}
