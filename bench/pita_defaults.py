"""PITA's ``epochs`` and ``lm_prior`` chosen on validation prompts, over both toy tasks.

    python -m bench.pita_defaults [--epochs 2 10] [--lm-prior 0 1] [--seed 0] [--rounds 1]
                                  [--cache .cache/pita] [--out outputs] [--json]
    python -m bench.pita_defaults --runs RUN ...      (score runs that already finished)

One ``run_parallel.py`` run per (epochs, lm_prior), PITA alone on arith and sentiment. Each
configuration is scored on the validation prompts only (``results/validation.json``: prompts set
aside from the training data; the test rows are never read): per dataset, the last round's
validation metric at its best η (the η the run itself would choose). Datasets are combined by
rank (1 = best on that dataset; ties share the mean rank); the configuration with the lowest mean
rank wins, ties broken by the smaller epochs, then the smaller lm_prior. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_config(epochs: int, prior: float, args) -> Path:
    name = f"{args.name}-e{epochs}-p{prior:g}"
    cmd = [sys.executable, str(ROOT / "run_parallel.py"), f"experiment.name={name}", "experiment.workload=experiment",
           "experiment.datasets=[arith,sentiment]", "experiment.algos=[PITA]", f"experiment.rounds={args.rounds}",
           f"system.seed={args.seed}", f"system.cache_dir={args.cache}", f"system.output_dir={args.out}",
           f"algos.PITA.epochs={epochs}", f"algos.PITA.lm_prior={prior}", "executor.progress=off", "eval.n=4",
           "eval.validation_prompts=128",
           *[f"datasets.{d}.toy_{split}_size={size}" for d in ("arith", "sentiment")
             for split, size in (("train", args.train_size), ("test", 16))]]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:])
        raise SystemExit(f"epochs={epochs} lm_prior={prior}: the run failed (exit {r.returncode})")
    return sorted((Path(args.out) / name).iterdir())[-1]


def validation_scores(run: Path) -> dict:
    """{dataset: best validation metric over η at the last round} and the run's settings."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    val = json.loads((run / "results" / "validation.json").read_text())
    last = max(int(v["round"]) for v in val)
    best: dict[str, tuple[float, float]] = {}
    for v in val:
        if int(v["round"]) != last:
            continue
        m = "pass@1" if v.get("pass@1") is not None else "mean_reward"
        ds = v.get("eval_dataset") or v["train_dataset"]
        if ds not in best or v[m] > best[ds][0]:
            best[ds] = (float(v[m]), float(v["eta"]))
    return {"run": str(run), "epochs": cfg["algos"]["PITA"]["epochs"], "lm_prior": cfg["algos"]["PITA"]["lm_prior"],
            "validation": {d: {"metric": s, "eta": e} for d, (s, e) in sorted(best.items())}}


def choose(scored: list[dict]) -> dict:
    datasets = sorted({d for s in scored for d in s["validation"]})
    for d in datasets:
        vals = sorted((s["validation"][d]["metric"] for s in scored), reverse=True)
        for s in scored:
            v = s["validation"][d]["metric"]
            hits = [i + 1 for i, x in enumerate(vals) if x == v]
            s.setdefault("rank", {})[d] = sum(hits) / len(hits)
    for s in scored:
        s["mean_rank"] = sum(s["rank"].values()) / len(datasets)
    return min(scored, key=lambda s: (s["mean_rank"], s["epochs"], s["lm_prior"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pita_defaults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, nargs="+", default=[2, 10])
    ap.add_argument("--lm-prior", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--train-size", type=int, default=1000)
    ap.add_argument("--cache", default=".cache/pita")
    ap.add_argument("--out", default="outputs")
    ap.add_argument("--name", default="bench-pita-defaults")
    ap.add_argument("--runs", nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    walls = {}
    if args.runs:
        runs = [Path(r) for r in args.runs]
    else:
        runs = []
        for e, p in itertools.product(args.epochs, args.lm_prior):
            t = time.perf_counter()
            runs.append(run_config(e, p, args))
            walls[f"e{e}-p{p:g}"] = round(time.perf_counter() - t, 1)
            print(f"epochs {e}, lm_prior {p:g}: {runs[-1]} in {walls[f'e{e}-p{p:g}']:.0f}s", file=sys.stderr, flush=True)
    scored = [validation_scores(r) for r in runs]
    best = choose(scored)
    if args.json:
        print(json.dumps({"configs": scored, "chosen": {k: best[k] for k in ("epochs", "lm_prior")}, "wall_s": walls},
                         indent=2))
        return 0
    for s in sorted(scored, key=lambda s: (s["epochs"], s["lm_prior"])):
        cells = "  ".join(f"{d} {v['metric']:.3f} (η {v['eta']:g}, rank {s['rank'][d]:g})"
                          for d, v in s["validation"].items())
        print(f"epochs {s['epochs']:>2}  lm_prior {s['lm_prior']:g}:  {cells}  mean rank {s['mean_rank']:.2f}")
    print(f"chosen on validation: epochs {best['epochs']}, lm_prior {best['lm_prior']:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
