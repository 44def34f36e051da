"""pita's value-guided methods beside the PITA reference code, on the same models and data.

    PITA_REFERENCE=<a checkout of flash-36/PITA> python -m bench.reference_check --run <demo run folder>
        [--tasks arith,sentiment] [--methods PITA,QSharp] [--etas 2,8] [--n 8] [--json]

From a finished run of the embedded default (``make demo``; its tiny family, its round-0 data), for
each task and method, the round-0 value model four ways, each on the examples the run's own
training job built (``value_guided.training_examples``: PITA's labelled pairs; Q#'s roll-outs, the
prompts whose returns do not vary left out, targets min-max normalised):

    pita (run)         the run's own model (pita's code at the run's settings)
    pita (ref. set.)   pita's code at the reference's settings: lr 2e-5, weight decay 0.01, one
                       learning rate for head and backbone, each roll-out's mean loss then the mean
                       over roll-outs, atoms on [0, 1]
    ref. (ref. set.)   the reference's ValueClassifier and trainer (bench/reference_side.py, in a
                       process of its own) at its settings: lr 2e-5, weight decay 0.01, batch 32
    ref. (run lr)      the same at the run's learning rate

The run's epochs for all four. Each is then read the same way: its loss on its training examples
(pita's token mean, one definition for all four), how well it orders one prompt's completions on
the run's validation pool (the best-of-n pool: pairs whose outcomes differ, the share ordered as
their outcomes are, with its standard error over prompts; 0.5 is chance), and the run's test
prompts decoded at each eta (``--n`` samples a prompt, the same seeds for all four), with the
task's metric and the exact per-step KL. The reference's weights are loaded into pita's reference
head (the same two parts: ``backbone``, ``score``) and decoded by pita's guided decoder, which
samples the reference's logits processor's distribution (log-probabilities within 4e-6 on the same
weights, measured before); so the four differ only in how they were trained. Each decoded row's
difference from pita (run) is paired over the test prompts (its standard error beside it).

Needs ``loguru`` (``pip install loguru``; the reference's trainers log with it). The project holds
none of the reference's code; the checkout lives outside it. Prints a table (``--json``: JSON);
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_SETTINGS = {"lr": 2e-5, "weight_decay": 0.01, "head_lr_scale": 1.0, "loss_weighting": "sequence"}
log = logging.getLogger("bench.reference_check")


def _ctx(run, job_id: str):
    """A stand-in for a job's context: its params, its dependencies' results, the run's paths."""
    from pita.core.paths import RunPaths

    rp = RunPaths(run)
    launch = json.loads((rp.job(job_id).dir / "launch.json").read_text())
    return SimpleNamespace(params=launch["job"]["params"], run=rp, log=log,
                           dep_result=lambda j: rp.job(j).read_result(), paths=rp.job(job_id))


def examples_of(run, job_id: str):
    """(examples, the job's params, min-max bounds or None) as the run's training job built them."""
    from pita.algos.value_guided import minmax_targets, training_examples

    ctx = _ctx(run, job_id)
    examples, _ = training_examples(ctx, "cpu")
    bounds = None
    if ctx.params.get("normalize_targets", "none") == "minmax":
        examples, bounds = minmax_targets(examples)
    return examples, ctx.params, bounds


def reference_items(method: str, examples) -> list[dict]:
    """The examples as the reference's trainers read them: PITA's pairs (pita keeps each pair's
    chosen row, target 1, then its rejected one, target 0, one cut: one prefix), Q#'s rows."""
    if method == "PITA":
        out = []
        for c, r in zip(examples[0::2], examples[1::2]):
            assert c.target == 1.0 and r.target == 0.0 and c.ids[:c.start] == r.ids[:r.start], "a pair out of order"
            out.append({"input_ids": c.ids[:c.start], "chosen_target_ids": c.ids[c.start:],
                        "rejected_target_ids": r.ids[r.start:]})
        return out
    return [{"input_ids": e.ids[:e.start], "target_ids": e.ids[e.start:], "rewards": float(e.target),
             "loss_weights": 1.0} for e in examples]


def train_reference(checkout: str, method: str, p: dict, examples, lr: float, out: Path) -> dict:
    spec = {"checkout": checkout, "method": method, "backbone": p["backbone"], "loss": p["loss"],
            "num_atoms": p["num_atoms"], "v_min": 0.0, "v_max": 1.0, "lr": lr, "weight_decay": 0.01,
            "epochs": p["epochs"], "batch_size": 32, "seed": p["seed"], "items": reference_items(method, examples),
            "out": str(out)}
    f = out.with_suffix(".spec.json")
    f.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t = time.time()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "reference_side.py"), str(f)], cwd=tempfile.gettempdir(),
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the reference's training failed:\n{r.stderr[-4000:]}")
    return {**json.loads(Path(str(out) + ".json").read_text()), "wall_s": round(time.time() - t, 1)}


def load_reference(p: dict, state: Path, bounds):
    """The reference's weights in pita's reference head (atoms on [0, 1] as its own)."""
    import torch

    from pita.guidance.value_model import ValueModel

    vm = ValueModel.create(p["backbone"], loss=p["loss"], num_atoms=p["num_atoms"], v_min=0.0, v_max=1.0,
                           head="reference")
    missing, unexpected = vm.load_state_dict(torch.load(state, map_location="cpu"), strict=False)
    if unexpected or [k for k in missing if not k.startswith("backbone.lm_head")]:
        raise SystemExit(f"the reference's weights do not fit pita's reference head: missing {missing}, "
                         f"unexpected {unexpected}")
    if bounds:
        vm.spec.target_min, vm.spec.target_max = bounds
    return vm.eval()


def train_pita(run, job_id: str, out: Path, settings: dict) -> dict:
    """The run's training job's own function on a copy of its params changed by ``settings``."""
    from pita.algos.value_guided import value_train
    from pita.core.paths import JobPaths

    ctx = _ctx(run, job_id)
    ctx.params = {**ctx.params, **settings, **({"v_min": 0.0, "v_max": 1.0} if ctx.params["loss"] == "mle" else {})}
    ctx.paths = JobPaths(out)
    ctx.paths.dir.mkdir(parents=True, exist_ok=True)
    t = time.time()
    res = value_train(ctx)
    return {**res, "wall_s": round(time.time() - t, 1)}


def train_loss(vm, examples) -> float:
    """pita's token-mean loss of ``vm`` on ``examples`` (one definition for every model)."""
    import torch

    from pita.guidance.train import _batches, _clip, _loss

    clipped = [_clip(e.ids, e.start, 512) for e in examples]
    total = units = 0.0
    import random

    with torch.no_grad():
        for batch in _batches([len(c[0]) for c in clipped], 8192, random.Random(0), 32):
            u = sum(len(clipped[i][0]) - clipped[i][1] for i in batch)
            total += float(_loss(vm, examples, clipped, batch, False, 0, "cpu")) * u
            units += u
    return total / units


def pool_of(run, task: str) -> list[list[dict]]:
    """The run's validation pool (the best-of-n control's samples of the validation prompts), by prompt."""
    from pita.core.paths import RunPaths
    from pita.generation.jobs import gather

    rp = RunPaths(run)
    merge = next(rp.root.glob(f"jobs/control.best_of_n.*.{task}.valpool.logprob"), None) or \
        next(rp.root.glob(f"jobs/control.best_of_n.*.{task}.valpool.merge"))
    params = json.loads((merge / "launch.json").read_text())["job"]["params"]
    ctx = SimpleNamespace(params=params, run=rp, dep_result=lambda j: rp.job(j).read_result())
    by: dict = {}
    for r in gather(ctx):
        by.setdefault(r["id"], []).append(r)
    return [sorted(g, key=lambda x: x["sample"]) for _, g in sorted(by.items())]


def within_prompt(vm, groups, reference: str, math_task: bool) -> dict:
    from transformers import AutoTokenizer

    from pita.eval.controls import ranking_agreement
    from pita.guidance.proxy import score_sequences, text_ids

    tok = AutoTokenizer.from_pretrained(reference)
    flat = [s for g in groups for s in g]
    got = score_sequences(vm, [text_ids(tok, s["prompt"], s["completion"], s.get("finish") == "eos") for s in flat],
                          "cpu", value=True)
    scores, k = [], 0
    for g in groups:
        scores.append(got[k:k + len(g)])
        k += len(g)
    outcomes = [[float(bool(s["correct"])) if math_task else float(s["reward"]) for s in g] for g in groups]
    return ranking_agreement(scores, outcomes)


def decode(run, method: str, task: str, vm, etas: list[float], n: int, tmp: Path) -> dict:
    """The run's test prompts decoded with ``vm`` at ``etas`` as the run's evaluation shard does."""
    from pita.datasets.config import DatasetConfig
    from pita.datasets.loading import load_examples
    from pita.generation.jobs import prepare
    from pita.generation.recipes import RUNNERS

    shard = _ctx(run, f"{method}.tiny.{task}.r0.eval.s0")
    req = json.loads(json.dumps(shard.params["request"]))
    req.update(etas=[float(e) for e in etas], n=n)
    folder = tmp / f"vm-{id(vm)}"
    vm.save(folder)
    ds = DatasetConfig(**req["dataset"])
    examples = load_examples(ds, req["split"])
    ctx = SimpleNamespace(log=log, dep_result=lambda j: {"checkpoint": str(folder)})
    lm, scorer = prepare(ctx, req, examples, ds)
    recs = RUNNERS["eval"](lm, examples, req, scorer)
    return {"records": recs, "task": examples[0].task}


def summary(recs: list[dict], eta: float, math_task: bool) -> dict:
    key = "correct" if math_task else "reward"
    by: dict = {}
    for r in recs:
        if abs(r["eta"] - eta) < 1e-9:
            by.setdefault(r["id"], []).append(r)
    per = {i: statistics.fmean(float(x[key]) for x in g) for i, g in by.items()}
    kl = statistics.fmean(float(x["kl_path"]) for g in by.values() for x in g)
    return {"metric": statistics.fmean(per.values()), "per_prompt": per, "kl": kl}


def paired(a: dict, b: dict) -> tuple[float, float]:
    d = [a["per_prompt"][i] - b["per_prompt"][i] for i in a["per_prompt"]]
    return statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))


def check(run: str, checkout: str, tasks: list[str], methods: list[str], etas: list[float], n: int) -> dict:
    import torch

    from pita.guidance.value_model import ValueModel

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    out = {"run": run, "reference": checkout, "etas": etas, "n": n, "cases": []}
    with tempfile.TemporaryDirectory(prefix="pita-reference-check-") as tmp:
        tmp = Path(tmp)
        for task in tasks:
            groups = pool_of(run, task)
            for method in methods:
                job = f"{method}.tiny.{task}.r0.train"
                examples, p, bounds = examples_of(run, job)
                math_task = p["task"] == "math"
                reference = json.loads((Path(run) / "jobs" / f"{method}.tiny.{task}.r0.eval.s0" / "launch.json")
                                       .read_text())["job"]["params"]["request"]["policy"]["model"]
                models, trained = {}, {}
                models["pita (run)"] = ValueModel.load(_ctx(run, job).dep_result(job)["checkpoint"], device="cpu").eval()
                res = train_pita(run, job, tmp / f"{task}-{method}-pita-ref", REFERENCE_SETTINGS)
                trained["pita (ref. set.)"] = res
                models["pita (ref. set.)"] = ValueModel.load(res["checkpoint"], device="cpu").eval()
                for name, lr in (("ref. (ref. set.)", 2e-5), ("ref. (run lr)", float(p["lr"]))):
                    state = tmp / f"{task}-{method}-{lr:g}.pt"
                    trained[name] = train_reference(checkout, method, p, examples, lr, state)
                    models[name] = load_reference(p, state, bounds)
                rows = {}
                for name, vm in models.items():
                    row = {"train_loss": train_loss(vm, examples), "within_prompt": within_prompt(vm, groups, reference,
                                                                                                 math_task)}
                    dec = decode(run, method, task, vm, etas, n, tmp)["records"]
                    row["decoded"] = {f"{e:g}": summary(dec, e, math_task) for e in etas}
                    rows[name] = row
                for name, row in rows.items():
                    for e in etas:
                        d = row["decoded"][f"{e:g}"]
                        d["vs_pita_run"] = paired(d, rows["pita (run)"]["decoded"][f"{e:g}"])
                for row in rows.values():
                    for d in row["decoded"].values():
                        d.pop("per_prompt")
                out["cases"].append({"task": task, "method": method, "examples": len(examples),
                                     "trained": {k: {x: v[x] for x in ("loss", "steps", "wall_s", "loss_last")
                                                     if x in v} for k, v in trained.items()},
                                     "models": rows})
    return out


def table(out: dict) -> str:
    lines = []
    for c in out["cases"]:
        lines += [f"{c['task']} / {c['method']} ({c['examples']} training examples; test prompts x {out['n']} samples)",
                  f"  {'model':18} {'train loss':>10} {'within-prompt':>16} "
                  + " ".join(f"{'η=' + f'{e:g}' + ' metric (vs pita run)':>30} {'KL':>6}" for e in out["etas"])]
        for name, r in c["models"].items():
            w = r["within_prompt"]
            wp = "-" if w["agreement"] is None else f"{w['agreement']:.3f} ± {w['agreement_se']:.3f}"
            cells = []
            for e in out["etas"]:
                d = r["decoded"][f"{e:g}"]
                diff, se = d["vs_pita_run"]
                cells.append(f"{d['metric']:>9.3f} ({diff:+.3f} ± {se:.3f})".rjust(30) + f" {d['kl']:>6.3f}")
            lines.append(f"  {name:18} {r['train_loss']:>10.4f} {wp:>16} " + " ".join(cells))
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a finished run of the embedded default (make demo)")
    ap.add_argument("--tasks", default="arith,sentiment")
    ap.add_argument("--methods", default="PITA,QSharp")
    ap.add_argument("--etas", default="2,8")
    ap.add_argument("--n", type=int, default=8, help="samples per test prompt")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    checkout = os.environ.get("PITA_REFERENCE")
    if not checkout or not (Path(checkout) / "pita" / "models" / "value_classifier.py").exists():
        print("set PITA_REFERENCE to a checkout of flash-36/PITA (its pita/models/value_classifier.py)", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading and writing the models again and again
    out = check(a.run, checkout, a.tasks.split(","), a.methods.split(","), [float(e) for e in a.etas.split(",")], a.n)
    print(json.dumps(out, indent=1) if a.json else table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
