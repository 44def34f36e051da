"""All six algorithms on the embedded default: the reference vs each method, over seeds.

    python -m bench.value_guided [--json] [--seeds 0 1 2] [--rounds 2] [--cache .cache/pita]
                                 [--train-size 1000] [--test-size 200] [--n 4]
    python -m bench.value_guided --runs outputs/bench-vg-s0/<time> outputs/bench-vg-s1/<time> ...

Runs ``run_parallel.py experiment.workload=experiment`` once per seed (``system.seed``, which also
seeds the tiny family: each seed is its own reference model, data and value models), then
aggregates the runs' ``results/final_results.json``. With ``--runs`` it only aggregates runs
that already finished. Extra Hydra overrides go after ``--``.

Prints one row per (algorithm, dataset, round, eta): the metric (arith: pass@1 over n samples
per test prompt; sentiment: mean reward-model score) and KL(policy || reference), both as the
mean over seeds, with the gain over the same seed's reference (``base``) and its spread, and
for each (algorithm, dataset) the last round at the eta chosen on each seed's validation prompts
(the run's ``selected`` rows; never the best eta on the test split), with its KL. Nothing is
asserted about the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pita.report.report import metric_of
from pita.report.results import read_results

ROOT = Path(__file__).resolve().parents[1]


def _latest(out: Path, name: str) -> Path:
    runs = sorted((out / name).iterdir())
    return runs[-1]


def run_seed(seed: int, args, extra: list[str]) -> tuple[Path, float]:
    name = f"{args.name}-s{seed}"
    cmd = [sys.executable, str(ROOT / "run_parallel.py"), f"experiment.name={name}",
           "experiment.workload=experiment", f"experiment.datasets=[{','.join(args.datasets)}]",
           f"experiment.algos=[{','.join(args.algos)}]", f"experiment.rounds={args.rounds}",
           f"system.seed={seed}", f"system.cache_dir={args.cache}", f"system.output_dir={args.out}",
           f"eval.n={args.n}", "executor.progress=off",
           *[f"datasets.{d}.toy_{split}_size={size}" for d in args.datasets if d in ("arith", "sentiment")
             for split, size in (("train", args.train_size), ("test", args.test_size))], *extra]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:])
        raise SystemExit(f"seed {seed}: the run failed (exit {r.returncode}); see the output above")
    return _latest(Path(args.out), name), wall


def aggregate(runs: list[Path]) -> dict:
    """{rows: [...], best: [...]} over the runs (one per seed)."""
    cells: dict[tuple, list[tuple[float, float, float]]] = {}
    selected: dict[tuple, list] = {}
    last_round: dict[tuple, int] = {}
    for run in runs:
        rows = read_results(Path(run) / "results" / "final_results.json")[0]
        base = {r["eval_dataset"]: r for r in rows if r["algorithm"] == "base"}
        for r in rows:
            if r["algorithm"] != "base":
                k = (r["algorithm"], r["eval_dataset"])
                last_round[k] = max(last_round.get(k, 0), int(r["round"]))
        for r in rows:
            m = metric_of(r)
            b = base.get(r["eval_dataset"])
            gain = r[m] - b[m] if b is not None else float("nan")
            key = (r["algorithm"], r["eval_dataset"], r["round"] if r["algorithm"] != "base" else "-",
                   float(r["eta"]), m)
            cells.setdefault(key, []).append((r[m], r.get("kl") or 0.0, gain))
            k = (r["algorithm"], r["eval_dataset"])
            if r["algorithm"] != "base" and r.get("selected") and int(r["round"]) == last_round[k]:
                selected.setdefault(k, []).append((r[m], r.get("kl") or 0.0, gain, float(r["eta"]), m))
    out = []
    for (algo, ds, rnd, eta, m), vals in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0]))):
        v, kl, g = zip(*vals)
        out.append({"algorithm": algo, "dataset": ds, "round": rnd, "eta": eta, "metric": m, "seeds": len(vals),
                    "value": statistics.mean(v), "value_sd": statistics.stdev(v) if len(v) > 1 else 0.0,
                    "kl": statistics.mean(kl), "gain": statistics.mean(g),
                    "gain_sd": statistics.stdev(g) if len(g) > 1 else 0.0})
    chosen = []
    for (algo, ds), vals in sorted(selected.items()):
        v, kl, g, etas, m = zip(*vals)
        chosen.append({"algorithm": algo, "dataset": ds, "round": last_round[(algo, ds)], "metric": m[0],
                       "etas": list(etas), "seeds": len(vals), "value": statistics.mean(v),
                       "gain": statistics.mean(g), "gain_sd": statistics.stdev(g) if len(g) > 1 else 0.0,
                       "kl": statistics.mean(kl), "kl_sd": statistics.stdev(kl) if len(kl) > 1 else 0.0})
    return {"runs": [str(r) for r in runs], "rows": out, "chosen": chosen, **matched(runs)}


ORDER = ("PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF", "control: temperature", "control: best-of-n")


def matched(runs: list[Path]) -> dict:
    """The KL-matched comparison pooled over the runs (pita/report/matched.py: each seed's frontier
    read at the budgets, the mean over seeds, intervals resampling seeds and test prompts), and
    each run's label quality."""
    from pita.core.paths import RunPaths
    from pita.report.intervals import RecordStore
    from pita.report.matched import differences, matched_cells, public
    from pita.report.results import kl_budgets, read_validation

    paths = [RunPaths.open_existing(str(r)) for r in runs]
    budgets = kl_budgets(paths[0])
    # each seed's frontier chosen on its validation rows, read on its test rows
    cells = matched_cells([(read_results(p.results / "final_results.json")[0], read_validation(p), RecordStore(p))
                           for p in paths], budgets, keep_draws=True)
    quality = [read_results(p.results / "final_results.json")[1].get("label_quality") or [] for p in paths]
    return {"kl_budgets": budgets, "kl_matched": public(cells), "differences": differences(cells, ORDER),
            "label_quality": quality}


def render(res: dict) -> str:
    lines = [f"{'algorithm':<10} {'dataset':<10} {'round':>5} {'eta':>5} {'metric':>11} {'value':>7} {'sd':>6} "
             f"{'gain':>7} {'sd':>6} {'KL':>7}"]
    for r in res["rows"]:
        lines.append(f"{r['algorithm']:<10} {r['dataset']:<10} {r['round']!s:>5} {r['eta']:>5.2f} {r['metric']:>11} "
                     f"{r['value']:>7.3f} {r['value_sd']:>6.3f} {r['gain']:>+7.3f} {r['gain_sd']:>6.3f} {r['kl']:>7.3f}")
    lines.append("")
    lines.append("last round, eta chosen on each seed's validation prompts (mean over seeds):")
    for b in res["chosen"]:
        etas = "" if all(e == 0.0 for e in b["etas"]) else f" eta {'/'.join(f'{e:g}' for e in b['etas'])}"
        lines.append(f"  {b['algorithm']:<10} {b['dataset']:<10} round {b['round']}{etas}: {b['metric']} "
                     f"{b['value']:.3f}, gain {b['gain']:+.3f} (sd {b['gain_sd']:.3f}), KL {b['kl']:.3f} "
                     f"(sd {b['kl_sd']:.3f})")
    if res.get("kl_matched"):
        from pita.report.matched import matched_tables

        lines += ["", "at equal KL (nats per sequence), mean over seeds [95% interval resampling seeds and prompts]:", ""]
        lines += matched_tables(res["kl_matched"], ORDER, res.get("differences"))
    for i, q in enumerate(res.get("label_quality") or []):
        from pita.report.labels import label_table

        lines += [f"label quality, seed run {i}:", ""] + label_table(q)
    return "\n".join(lines)


def main(argv=None, algos=("PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"), name="bench-vg", prog="python -m bench.value_guided",
         doc=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog=prog, description=(doc or __doc__).split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--algos", nargs="+", default=list(algos))
    ap.add_argument("--datasets", nargs="+", default=["arith", "sentiment"])
    ap.add_argument("--n", type=int, default=4, help="samples per test prompt (eval.n)")
    ap.add_argument("--train-size", type=int, default=1000, help="toy tasks: training prompts")
    ap.add_argument("--test-size", type=int, default=200, help="toy tasks: test prompts")
    ap.add_argument("--cache", default=".cache/pita")
    ap.add_argument("--out", default="outputs")
    ap.add_argument("--runs", nargs="+", help="aggregate these finished runs instead of running")
    ap.add_argument("--name", default=name, help="run names are NAME-s<seed>")
    args = ap.parse_args(argv)
    walls = {}
    if args.runs:
        runs = [Path(r) for r in args.runs]
    else:
        runs = []
        for s in args.seeds:
            run, wall = run_seed(s, args, extra)
            runs.append(run)
            walls[s] = round(wall, 1)
            print(f"seed {s}: {run} in {wall:.0f}s", file=sys.stderr, flush=True)
    res = aggregate(runs)
    res["wall_s"] = walls
    print(json.dumps(res, indent=2) if args.json else render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
