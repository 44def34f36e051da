"""The two value heads side by side on the demo: PITA, Q# and Q#-HF, k seeds each, pooled.

    python -m bench.value_heads [--seeds 3] [--cache .cache/pita] [--out outputs/heads] [--json]

For each head (``reference``: the candidates through the backbone, as the references build it;
``embedding``: pita's variant with the LM prior) ``pita seeds K experiment=demo
experiment.algos=[PITA,QSharp,QSharp-HF] algos.<A>.head=<head>``, then prints per head the
pooled KL-matched cells (method gain over the base at each budget, seed-level interval), each
run's wall time, and PITA's pairs and ties (``supervision``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("PITA", "QSharp", "QSharp-HF")


def run_head(head: str, args) -> dict:
    name = f"heads-{head}"
    t = time.monotonic()
    cmd = [sys.executable, "-m", "pita", "seeds", str(args.seeds), "experiment=demo",
           f"experiment.algos=[{','.join(ALGOS)}]", f"experiment.name={name}", f"system.cache_dir={args.cache}",
           f"system.output_dir={args.out}", "executor.progress=off", *[f"algos.{a}.head={head}" for a in ALGOS]]
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode not in (0, 1):
        sys.stderr.write(r.stdout[-4000:])
        raise SystemExit(f"head={head}: pita seeds failed (exit {r.returncode})")
    pooled = json.loads((Path(args.out) / name / f"seeds-{args.seeds}.json").read_text())
    runs = sorted(p for p in (Path(args.out)).glob(f"{name}-seed*/*") if (p / "results").is_dir())
    sup = []
    for run in runs:
        fr = json.loads((run / "results" / "final_results.json").read_text())
        sup += [s for s in fr.get("supervision") or [] if s["algorithm"] == "PITA"]
    return {"head": head, "wall_s": round(time.monotonic() - t, 1), "pooled": pooled, "runs": [str(r) for r in runs],
            "pita_supervision": sup}


def cells(pooled: dict) -> list[str]:
    out = []
    for c in pooled.get("cells") or pooled.get("kl_matched", {}).get("cells") or []:
        if c.get("algorithm") not in ALGOS:
            continue
        g = c.get("gain")
        out.append(f"  {c.get('dataset', c.get('eval_dataset'))} {c['algorithm']:<10} KL {c.get('budget')}: "
                   f"{c.get('kind')} value {c.get('value')} gain {g} [{c.get('gain_ci_lo')}, {c.get('gain_ci_hi')}]")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cache", default=".cache/pita")
    ap.add_argument("--out", default="outputs/heads")
    ap.add_argument("--heads", nargs="+", default=["reference", "embedding"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = [run_head(h, args) for h in args.heads]
    if args.json:
        print(json.dumps(res, indent=2))
        return
    for r in res:
        print(f"head {r['head']}: {r['wall_s']} s for {args.seeds} seeds")
        print("\n".join(cells(r["pooled"])))
        for s in r["pita_supervision"]:
            print(f"  PITA {s['job']}: {s['pairs']} pairs, {s['ties']} ties, {s['decisive']} decisive ({s['tie_rule']}); "
                  f"label from {s['reward']}")


if __name__ == "__main__":
    main()
