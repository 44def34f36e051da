"""A synthetic experiment grid: the shape of a real run with no model or dataset.

For every (algorithm, family, dataset) and round r:

    gen[r].shard_0..S-1 -> gen[r].merge -> train[r] -> eval[r].shard_0..E-1 -> eval[r].merge
                                              |
                                              +-> gen[r+1].shard_*   (round r+1 uses round r's model)

plus one base-model evaluation (E shards + merge) per (family, dataset). Merges hold no device.

It serves two users with one builder: the demo (``experiment.workload=synthetic``: each job
sleeps a moment and writes a small artifact) and the scheduler benchmark, which uses
:func:`benchmark_grid`, a fixed, documented workload with heterogeneous durations and memory.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pita.core.job import Job, Resources

ALGOS = ["PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"]
VALUE_GUIDED = {"PITA", "QSharp", "QSharp-HF"}


@dataclass(frozen=True)
class StageCost:
    """Duration (any unit; seconds in the demo, minutes in the benchmark) and memory in GB."""

    seconds: float
    memory_gb: float


def build_grid(algos, families, datasets, rounds, gen_shards, eval_shards, cost, kind="synthetic.work",
               merge_kind="synthetic.merge", params=None) -> list[Job]:
    """Build the grid. ``cost(stage, algo, family, dataset, round, shard) -> StageCost``.

    ``stage`` is one of gen, train, eval (device jobs) or merge (host jobs).
    """
    params = dict(params or {})
    jobs: list[Job] = []

    def add(jid, stage, deps, algo, fam, ds, r, shard, group):
        c = cost(stage, algo, fam, ds, r, shard)
        is_merge = stage == "merge"
        jobs.append(Job(
            id=jid, kind=merge_kind if is_merge else kind, deps=list(deps), group=group,
            params={**params, "seconds": c.seconds, "stage": stage, **({} if is_merge else {"batch_size": 8})},
            resources=Resources(devices=0 if is_merge else 1, memory_gb=0.0 if is_merge else c.memory_gb),
            duration_hint=c.seconds))
        return jid

    def eval_block(prefix, deps, algo, fam, ds, r, group):
        shards = [add(f"{prefix}.eval.s{i}", "eval", deps, algo, fam, ds, r, i, group) for i in range(eval_shards)]
        return add(f"{prefix}.eval.merge", "merge", shards, algo, fam, ds, r, None, group)

    for fam in families:
        for ds in datasets:
            eval_block(f"base.{fam}.{ds}", [], "base", fam, ds, 0, "base")
            for algo in algos:
                prev_train = None
                for r in range(rounds):
                    p = f"{algo}.{fam}.{ds}.r{r}"
                    g = f"round {r}"
                    gdeps = [prev_train] if prev_train else []
                    shards = [add(f"{p}.gen.s{i}", "gen", gdeps, algo, fam, ds, r, i, g) for i in range(gen_shards)]
                    merge = add(f"{p}.gen.merge", "merge", shards, algo, fam, ds, r, None, g)
                    prev_train = add(f"{p}.train", "train", [merge], algo, fam, ds, r, None, g)
                    eval_block(p, [prev_train], algo, fam, ds, r, g)
    return jobs


def demo_grid(algos, families, datasets, rounds, gen_shards, eval_shards, job_seconds, memory_gb,
              fail=(), peak_gb=None) -> list[Job]:
    """The demo workload: uniform short jobs; ids in ``fail`` raise (to show failure handling);
    ``peak_gb``: the peak every device job reports (memory learning sees it)."""
    jobs = build_grid(algos, families, datasets, rounds, gen_shards, eval_shards,
                      lambda stage, *a: StageCost(job_seconds if stage != "merge" else job_seconds / 4, memory_gb))
    if peak_gb is not None:
        for j in jobs:
            if j.resources.devices:
                j.params["peak_gb"] = float(peak_gb)
    ids = {j.id for j in jobs}
    unknown = [f for f in fail if f not in ids]
    if unknown:  # a typo would otherwise fail nothing, silently
        from pita.core.errors import ConfigError
        from pita.core.names import suggest

        raise ConfigError([f"synthetic.fail lists {f!r}, which is not a job of this plan{suggest(f, ids)}; "
                           f"job ids look like {jobs[-1].id} (python -m pita status RUN --all lists them)"
                           for f in unknown])
    for j in jobs:
        if j.id in set(fail):
            j.params["fail"] = True
    return jobs


# ---------------------------------------------------------------- the benchmark workload
# Durations in minutes and memory in GB on an 80 GB device (76 GB usable after the 5% margin:
# quarter, half and whole usable devices), for two model families:
#   large: 8B reference, 1.7B guidance;  small: 1.7B reference, 0.6B guidance.
# Value-guided algorithms train the guidance model; DPO / GRPO train the reference model.
BENCH_FAMILIES = {
    #          gen       vg-train   dpo-train  grpo-train  eval
    "large": {"gen": (20, 38), "train_vg": (30, 38), "train_dpo": (60, 76), "train_grpo": (90, 76), "eval": (10, 38)},
    "small": {"gen": (8, 19), "train_vg": (12, 19), "train_dpo": (25, 38), "train_grpo": (35, 38), "eval": (4, 19)},
}
# Relative dataset sizes (duration multipliers).
BENCH_DATASETS = {"gsm8k": 1.0, "math500": 0.6, "aime": 0.2, "imdb": 0.8, "tldr": 0.9}
BENCH_MERGE_MINUTES = 1.0
BENCH_JITTER = 0.3  # every duration is multiplied by U(1 - 0.3, 1 + 0.3), seeded


def benchmark_grid(seed: int = 0, rounds: int = 3, gen_shards: int = 4, eval_shards: int = 4) -> list[Job]:
    """6 algorithms x 5 datasets x 2 families x ``rounds`` rounds, heterogeneous and seeded."""
    rng = random.Random(seed)

    def cost(stage, algo, fam, ds, r, shard):
        if stage == "merge":
            return StageCost(BENCH_MERGE_MINUTES, 0.0)
        table = BENCH_FAMILIES[fam]
        if stage == "train":
            key = "train_vg" if algo in VALUE_GUIDED else ("train_dpo" if algo == "DPO" else "train_grpo")
        else:
            key = stage
        minutes, mem = table[key]
        if stage in ("gen", "eval"):
            minutes = minutes / (gen_shards if stage == "gen" else eval_shards) * 4
        jitter = rng.uniform(1 - BENCH_JITTER, 1 + BENCH_JITTER)
        return StageCost(minutes * BENCH_DATASETS[ds] * jitter, float(mem))

    return build_grid(ALGOS, list(BENCH_FAMILIES), list(BENCH_DATASETS), rounds, gen_shards, eval_shards, cost)
