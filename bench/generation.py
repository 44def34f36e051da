"""Generation benchmark on the tiny family (on a GPU when there is one, else the CPU).

    python -m bench.generation [--json] [--cache .cache/pita] [--device cuda|cpu]

Prints:
    batched_tokens_per_s / loop_tokens_per_s / batched_vs_loop   KV-cache generation of 64
        prompts x 32 new tokens in batches of 64, against one prompt at a time
    reward_pairs_per_s_b32 / _b2 / reward_b32_vs_b2              the sentiment reward model
    pdg_wall_s_1_worker / _2_workers                             ParallelDataGenerator, the same
        request (arith, 96 prompts x 2 samples) through the local backend on 1 and 2 devices
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def _tokens(out) -> int:
    return sum(len(s.token_ids) for o in out for s in o)


def run(cache: str, device: str = "cpu") -> dict:
    from pita.datasets.config import dataset_config
    from pita.datasets.loading import load_examples
    from pita.datasets.toy import sentiment_labelled
    from pita.models.lm import LM
    from pita.models.tiny import build_tiny_family
    from pita.rewards.reward_model import RewardModelScorer

    paths = build_tiny_family(cache, 0)
    lm = LM.load(paths["reference"], device=device)
    ex = load_examples(dataset_config("arith", toy_test_size=64), "test")
    prompts, keys = [e.prompt for e in ex], [e.id for e in ex]
    # budgets are per sample: force the full 32 tokens so both sides generate the same amount
    lm.generate(prompts[:4], max_new_tokens=8, keys=keys[:4])  # warm-up
    saved = lm.eos_ids
    lm.eos_ids = [-1]
    try:
        t = time.perf_counter()
        out = lm.generate(prompts, n=1, max_new_tokens=32, keys=keys, batch_size=64)
        batched = _tokens(out) / (time.perf_counter() - t)
        t = time.perf_counter()
        n_tok = 0
        for p, k in zip(prompts[:16], keys[:16]):
            n_tok += _tokens(lm.generate([p], n=1, max_new_tokens=32, keys=[k], batch_size=1))
        loop = n_tok / (time.perf_counter() - t)
    finally:
        lm.eos_ids = saved

    rm = RewardModelScorer(paths["reward_sentiment"], device=device, batch_size=32)
    data = sentiment_labelled(256, seed=5)
    ps = ["Continue this review positively: " + " ".join(x.split()[:3]) for x, _ in data]
    cs = [" ".join(x.split()[3:]) for x, _ in data]
    rm.score(ps[:8], cs[:8])
    rates = {}
    for bs in (32, 2):
        rm.batch_size = bs
        t = time.perf_counter()
        rm.score(ps, cs)
        rates[bs] = len(ps) / (time.perf_counter() - t)

    pdg = {}
    for workers in (1, 2):
        pdg[workers] = _pdg_wall(paths, workers)
    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    return {"benchmark": "generation", "device": name, "cpu_count": os.cpu_count(),
            "batched_tokens_per_s": round(batched, 1), "loop_tokens_per_s": round(loop, 1),
            "batched_vs_loop": round(batched / loop, 2),
            "reward_pairs_per_s_b32": round(rates[32], 1), "reward_pairs_per_s_b2": round(rates[2], 1),
            "reward_b32_vs_b2": round(rates[32] / rates[2], 2),
            "pdg_wall_s_1_worker": round(pdg[1], 2), "pdg_wall_s_2_workers": round(pdg[2], 2)}


def _pdg_wall(paths: dict, workers: int) -> float:
    from omegaconf import OmegaConf

    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths
    from pita.datasets.config import dataset_config
    from pita.generation.parallel import ParallelDataGenerator

    ds = dataset_config("arith", toy_train_size=96)
    req = {"recipe": "samples", "dataset": OmegaConf.to_container(OmegaConf.structured(ds)), "split": "train",
           "policy": {"model": paths["reference"], "dtype": "float32", "guidance": None}, "n": 2, "chunk_size": 16,
           "seed": 0, "attn_impl": "sdpa",
           "sampling": {"max_new_tokens": 32, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "batch_size": 32},
           "scoring": {"reward_model": None, "reward_batch_size": 32, "correctness_bonus": 1.0},
           "preferences": {"beta": 1.0, "sampling": True}, "rollouts": {"cut_points": 2, "continuations": 2,
                                                                        "mode": "sampled"}}
    jobs = ParallelDataGenerator([1] * workers).plan(req, "g", 96)
    gpus = GPUManager.from_inventory(workers, 8e9, kind="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        run = RunPaths.create(tmp, "bench")
        setup_logging(run.run_log, console=False)
        s = ExecutorSettings(progress="off", max_jobs_per_device=1,
                             threads_per_job=max(1, (os.cpu_count() or 1) // workers))
        t = time.perf_counter()
        summary = Executor(JobGraph(jobs).validate(), gpus, make_backend("local"), run, s).run()
        wall = time.perf_counter() - t
        if summary.exit_code:
            raise RuntimeError(f"generation failed: {summary.failures}")
    return wall


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cache", default=".cache/pita")
    ap.add_argument("--device", default=None, help="where the model and reward model run (default: cuda when "
                    "there is one); ParallelDataGenerator's rows always run on CPU devices")
    args = ap.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    out = run(args.cache, args.device)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:>26}: {v}")


if __name__ == "__main__":
    main()
