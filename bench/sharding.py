"""One DPO training job three ways on the tiny family: one process, 2 data-parallel ranks, 2 FSDP ranks.

    python -m bench.sharding [--json] [--cache .cache/pita] [--pairs 64] [--batch 8]

Each is round 0's planned DPO job run through its own job function (``pita.algos.dpo.dpo_train``),
on the same preference pairs, with the same effective batch. Prints per variant: wall seconds,
the parameters each rank holds (FSDP: its shards), the loss at every step, and the largest loss
difference from the one-process run. On CPU the ranks use gloo; the FSDP variant runs accelerate's
FSDP2 path there (pita.training.sharding.job_trainer). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def _pairs(folder: Path, n: int) -> Path:
    from datasets import Dataset

    rows = [{"id": f"p{i}", "prompt": f"What is {i} + {i}?", "chosen": f"The answer is {2 * i}.",
             "rejected": f"It is {2 * i + 1}, I think.", "chosen_reward": 1.0, "rejected_reward": 0.0,
             "p_chosen": 0.7} for i in range(n)]
    path = folder / "pairs"
    Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _params(cache: str, batch: int, *overrides: str) -> dict:
    from hydra import compose, initialize_config_dir

    from pita.cli import CONF_DIR
    from pita.plans import build_plan

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[
            "experiment.workload=experiment", "experiment.datasets=[arith]", "experiment.algos=[DPO]",
            "experiment.rounds=1", f"system.cache_dir={cache}", f"algos.DPO.batch_size={batch}",
            "algos.DPO.epochs=1", "algos.DPO.lr=2e-4", f"training.micro_batch_size={batch // 2}",
            "training.save_steps=0", *overrides])
    jobs = build_plan(cfg, [int(8e9)] * 2)
    return next(j for j in jobs if j.id == "DPO.tiny.arith.r0.train").params


def run(cache: str, pairs: int, batch: int) -> dict:
    from pita.algos import dpo
    from pita.core.paths import JobPaths
    from pita.models.tiny import build_tiny_family

    build_tiny_family(cache, 0)
    root = Path(tempfile.mkdtemp(prefix="pita-bench-sharding-"))
    data = _pairs(root, pairs)
    variants = {"one process": (), "2 ranks, data-parallel": ("algos.DPO.devices=2",),
                "2 ranks, FSDP": ("algos.DPO.devices=2", "algos.DPO.sharding=fsdp")}
    out = {}
    for name, overrides in variants.items():
        params = _params(cache, batch, *overrides)
        job = root / name.replace(" ", "_").replace(",", "")
        ctx = SimpleNamespace(params=params, dep_result=lambda j: {"path": str(data)}, paths=JobPaths(job),
                              log=logging.getLogger("bench.sharding"))
        job.mkdir(parents=True)
        t0 = time.perf_counter()
        res = dpo.dpo_train(ctx)
        wall = time.perf_counter() - t0
        rows = [json.loads(x) for x in ctx.paths.metrics.read_text().splitlines()]
        out[name] = {"wall_s": round(wall, 2), "steps": res["steps"], "rank_params": res["rank_params"],
                     "losses": [r["loss"] for r in rows if "loss" in r]}
    base = out["one process"]["losses"]
    for v in out.values():
        v["max_abs_loss_diff_vs_one_process"] = max(abs(a - b) for a, b in zip(v["losses"], base))
        v["losses"] = [round(x, 5) for x in v["losses"]]
    return {"pairs": pairs, "effective_batch": batch, "threads": os.environ.get("OMP_NUM_THREADS"), "variants": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--cache", default=os.environ.get("PITA_TEST_CACHE", ".cache/pita"))
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")  # one thread per rank on two cores
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if not args.json:
        logging.basicConfig(level=logging.WARNING)
    result = run(args.cache, args.pairs, args.batch)
    if args.json:
        print(json.dumps(result))
    else:
        for name, v in result["variants"].items():
            print(f"{name:<24} {v['wall_s']:>7.2f} s  {v['steps']} steps  params per rank {v['rank_params']}  "
                  f"max |loss - one process| {v['max_abs_loss_diff_vs_one_process']:.2e}")
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
