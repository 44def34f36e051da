"""ParallelDataGenerator: one generation request -> shard jobs on every device -> one merged dataset.

    gen = ParallelDataGenerator(capacities=[80e9] * 8)
    jobs = gen.plan(request, prefix="PITA.tiny.arith.r0.gen", deps=[...], memory_gb=4.0)

The request's examples are cut into fixed chunks of ``chunk_size`` (by example index, the same
whatever the number of devices); shard i takes a contiguous run of chunks, the runs sized in
proportion to device capacity. Each shard loads its models once and writes one checkpoint file
per chunk (``jobs/<shard>/checkpoints/chunk-00007.jsonl``, atomically), so a killed shard resumes
after its last finished chunk. Because sampling is keyed by example and chunks never change,
the merged result is identical for 1 and N workers with the same seed. The merge job reads the
chunks in order and writes a ``datasets`` Arrow folder (``artifacts/data``, ``save_to_disk``)
plus ``artifacts/preview.csv``.

Request (plain data, travels in job params):
    recipe        samples | preference_pairs | prompts | value_rollouts (see recipes.py)
    dataset       a DatasetConfig as a dict; split: train | test | held_out
    policy        {"model": path, "dtype": "float32", "guidance": None}
    n             samples per prompt
    sampling      {"max_new_tokens", "temperature", "top_p", "top_k", "batch_size"}
    scoring       {"reward_model": path | None, "reward_batch_size": 32, "correctness_bonus": 1.0}
    preferences   {"beta": 1.0, "sampling": True}
    rollouts      {"cut_points": 2, "continuations": 2, "mode": "sampled" | "greedy_vs_sampled"}
    chunk_size, seed, attn_impl
"""

from __future__ import annotations

import math
from typing import Sequence

from pita.core.errors import ConfigError
from pita.core.job import Job, Resources, add_kind_module
from pita.core.memory import split_proportionally
from pita.core.names import unknown_name
from pita.generation.recipes import RECIPES

add_kind_module("pita.generation.jobs")


def check_request(req: dict) -> list[str]:
    """Every problem with a request, each naming its key."""
    p = []
    if req.get("recipe") not in RECIPES:
        p.append(unknown_name("data_collection.recipe", req.get("recipe"), RECIPES))
    for key, v in (("data_collection.samples_per_prompt", req.get("n")), ("data_collection.chunk_size", req.get("chunk_size")),
                   ("data_collection.max_new_tokens", req["sampling"].get("max_new_tokens")),
                   ("data_collection.batch_size", req["sampling"].get("batch_size")),
                   ("data_collection.reward_batch_size", req["scoring"].get("reward_batch_size"))):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            p.append(f"{key}={v!r} must be a positive integer")
    s = req["sampling"]
    if not (isinstance(s.get("temperature"), (int, float)) and s["temperature"] >= 0):
        p.append(f"data_collection.temperature={s.get('temperature')!r} must be >= 0 (0 = greedy)")
    if not (isinstance(s.get("top_p"), (int, float)) and 0 < s["top_p"] <= 1):
        p.append(f"data_collection.top_p={s.get('top_p')!r} must be in (0, 1]")
    if not (isinstance(s.get("top_k"), int) and s["top_k"] >= 0):
        p.append(f"data_collection.top_k={s.get('top_k')!r} must be an integer >= 0 (0 = off)")
    if req.get("recipe") == "preference_pairs" and isinstance(req.get("n"), int) and req["n"] < 2:
        p.append(f"data_collection.samples_per_prompt={req['n']} must be >= 2 to form preference pairs")
    pr = req.get("preferences", {})
    if not (isinstance(pr.get("beta", 1.0), (int, float)) and pr.get("beta", 1.0) >= 0):
        p.append(f"data_collection.bt_beta={pr.get('beta')!r} must be >= 0")
    ro = req.get("rollouts", {})
    if req.get("recipe") == "value_rollouts":
        if ro.get("mode") not in ("sampled", "greedy_vs_sampled"):
            p.append(unknown_name("data_collection.continuation_mode", ro.get("mode"), ["sampled", "greedy_vs_sampled"]))
        for key in ("cut_points", "continuations"):
            v = ro.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                p.append(f"data_collection.{key}={v!r} must be a positive integer")
    return p


class ParallelDataGenerator:
    def __init__(self, capacities: Sequence[float]):
        if not capacities:
            raise ValueError("no devices to generate on")
        self.capacities = list(capacities)

    def shard_chunks(self, n_examples: int, chunk_size: int) -> list[tuple[int, int]]:
        """[(first chunk, end chunk)] per shard; shards that would get no chunk are dropped."""
        n_chunks = math.ceil(n_examples / chunk_size)
        counts = split_proportionally(n_chunks, self.capacities)
        out, start = [], 0
        for c in counts:
            if c:
                out.append((start, start + c))
            start += c
        return out

    def plan(self, request: dict, prefix: str, n_examples: int, deps: Sequence[str] = (), memory_gb: float = 0.0,
             group: str = "", duration_hint: float = 1.0) -> list[Job]:
        problems = check_request(request)
        if n_examples < 1:
            problems.append(f"the generation request {prefix!r} has no examples (check the dataset's caps)")
        if problems:
            raise ConfigError(problems)
        ranges = self.shard_chunks(n_examples, request["chunk_size"])
        shards = []
        for i, (a, b) in enumerate(ranges):
            shards.append(Job(id=f"{prefix}.s{i}", kind="generation.shard", deps=list(deps), group=group,
                              params={"request": request, "chunks": [a, b], "n_examples": n_examples,
                                      "batch_size": request["sampling"]["batch_size"]},
                              resources=Resources(1, memory_gb), duration_hint=duration_hint * (b - a)))
        merge = Job(id=f"{prefix}.merge", kind="generation.merge", deps=[j.id for j in shards], group=group,
                    params={"shards": [j.id for j in shards], "recipe": request["recipe"]},
                    resources=Resources(0, 0.0), duration_hint=0.1)
        return shards + [merge]
