"""Collect every ``eval.merge`` result of a run into results/final_results.json and results.csv,
one ``results/cells/<algorithm>.<family>.<train dataset>.r<round>.<eval dataset>.eta<eta>.json``
per row, and render the table printed at the end of a run.

Rows of a value-guided algorithm sweep eta; the eta each (algorithm, family, training dataset,
round) reports is chosen on validation prompts carved from the training data (rows labelled
``split: validation``, kept in results/validation.csv), never on the test split: the test row
at that eta has ``selected`` true. Every eta's test row stays in the CSV (the frontier plot).

Each test row carries ``eval_job`` (the ``eval.merge`` that produced it) and its 95% confidence
intervals and gain over the base model (pita/report/intervals.py), computed here once so that the
report and the plots read the same numbers.
"""

from __future__ import annotations

import csv
import json
import math
import re
import logging
from pathlib import Path

from pita.core.paths import RunPaths, atomic_write_json
from pita.report.config import run_config
from pita.report.intervals import CI_COLUMNS, add_intervals, metric_of as _metric
from pita.report.roster import Roster
from pita.tracking import open_tracker, settings_for

log = logging.getLogger(__name__)

COLUMNS = ["algorithm", "family", "train_dataset", "round", "eval_dataset", "eta", "variant", "selected", "pass@1", "pass@1_stderr",
           "maj@n", "first_sample_acc", "mean_reward", "mean_reward_stderr", "kl", "kl_stderr", "kl_per_token",
           "kl_logratio", "kl_logratio_stderr", "kl_estimator", "kl_bound", "kl_pool_mass", "scored_by", "n", "prompts",
           "train_device_s", "eval_device_s", "tokens", *CI_COLUMNS, "eval_job", "reused_from"]


EVAL_KINDS = ("eval.merge", "control.best_of_n", "eval.eta_search")  # the jobs whose results are rows of the table


def collect(run: RunPaths) -> tuple[list[dict], list[dict]]:
    """(test rows, validation rows) of every completed ``eval.merge``; test rows carry ``selected``."""
    state = json.loads(run.state.read_text())
    rows = []
    stopped: dict[tuple, dict] = {}
    for jid, e in sorted(state["jobs"].items()):
        if e.get("kind") in EVAL_KINDS and e.get("state") == "COMPLETED":
            res = run.job(jid).read_result()
            rows += [{**r, "eval_job": jid} for r in res.get("results", [])]
            if e.get("kind") == "eval.eta_search" and res.get("stopped"):
                lab = res.get("labels") or {}
                stopped[tuple(lab.get(k) for k in ("algorithm", "family", "train_dataset", "round"))] = res["stopped"]
    for r in rows:  # which limit stopped the eta search short of a budget, on the method's rows
        got = stopped.get(tuple(r.get(k) for k in ("algorithm", "family", "train_dataset", "round")))
        if got:
            r["eta_search_stopped"] = got
    val = [r for r in rows if r.get("split") == "validation"]
    rows = [r for r in rows if r.get("split") != "validation"]
    add_compute(rows, state, lambda jid: run.job(jid).read_result())
    select_eta(rows, val)
    add_intervals(rows, run)
    return rows, val


def select_eta(rows: list[dict], val: list[dict]) -> None:
    """Mark the test row of each (algorithm, family, training dataset, round, eval dataset) at the
    eta, and the arm of a grid (``variant``: a learning rate, a control's setting), that scored
    best on the validation prompts (ties: the smaller eta, closer to the reference, then the
    first arm). A cell with one row is its own choice; a sweep without validation rows has no
    choice (``selected`` false everywhere, the report says so)."""
    best: dict[tuple, tuple] = {}
    for v in val:
        key = (v["algorithm"], v["family"], v["train_dataset"], v["round"])
        score = (v[_metric(v)], -float(v["eta"]))
        if key not in best or score > best[key][0]:
            best[key] = (score, (v.get("variant") or "", float(v["eta"])))
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["algorithm"], r["family"], r["train_dataset"], r["round"], r["eval_dataset"]), []).append(r)
    for key, cell in cells.items():
        chosen = best.get(key[:4])
        for r in cell:
            r["selected"] = len(cell) == 1 or (chosen is not None and (r.get("variant") or "", float(r["eta"])) == chosen[1])


def _device_s(e: dict) -> float:
    return sum(float(a.get("duration_s") or 0.0) * max(1, len(a.get("devices") or [])) for a in e.get("attempts", []))


def add_compute(rows: list[dict], state: dict, result_of) -> None:
    """Compute behind each row (a job without devices counts as one device): ``train_device_s``
    (device-seconds of the data collection and training jobs of its algorithm, family and
    training dataset, rounds 0..round), ``tokens`` (sampled by those data-collection jobs),
    ``eval_device_s`` (its evaluation jobs' device-seconds, shared equally among the etas they
    evaluated)."""
    jobs = state.get("jobs", {})
    etas: dict[tuple, int] = {}
    for r in rows:
        key = (r["algorithm"], r["family"], r["train_dataset"], r["round"], r["eval_dataset"])
        etas[key] = etas.get(key, 0) + 1
    for r in rows:
        a, fam, tr, rnd, ev = r["algorithm"], r["family"], r["train_dataset"], r["round"], r["eval_dataset"]
        if a == "base":
            eval_prefix, train_ids = f"base.{fam}.{ev}.eval.", []
        else:
            # the method's (or its arm's: <algo>.<family>.<dataset>.<arm>) job-id prefix, read off its evaluation
            own = str(r.get("eval_job") or "").split(f".r{rnd}.eval", 1)[0] or f"{a}.{fam}.{tr}"
            eval_prefix = f"{own}.r{rnd}.eval{'' if ev == tr else '-' + ev}."
            train_ids = [j for pre in dict.fromkeys([own, f"{a}.{fam}.{tr}"]) for j in jobs  # an arm's, and shared ones
                         if j.startswith(f"{pre}.r") and ".eval" not in j and ".val" not in j and ".eta_search" not in j
                         and j[len(f"{pre}.r"):].split(".", 1)[0].isdigit()
                         and int(j[len(f"{pre}.r"):].split(".", 1)[0]) <= int(rnd)]
            train_ids += shared_data(train_ids, jobs, f"data.{fam}.{tr}.")
        r["train_device_s"] = round(sum(_device_s(jobs[j]) for j in train_ids), 1)
        r["tokens"] = sum(int((result_of(j) or {}).get("tokens") or 0) for j in train_ids
                          if jobs[j].get("kind") == "generation.shard" and jobs[j].get("state") == "COMPLETED")
        ev_s = sum(_device_s(e) for j, e in jobs.items() if j.startswith(eval_prefix))
        r["eval_device_s"] = round(ev_s / etas[(a, fam, tr, rnd, ev)], 1)


TRAIN_KINDS = ("algo.value_train", "algo.proxy_train", "algo.dpo_train", "algo.grpo_train")


def method_budgets(state: dict, result_of) -> list[dict]:
    """What each (algorithm, family, training dataset) received, over all its rounds: one entry
    each, so that a reader sees whether the methods were compared on equal terms.

        sequences       completions sampled to make training data (data collection, roll-ins
                        included, and GRPO's online samples)
        tokens          tokens of those samples
        labels          completions scored by the task's reward (verifier or reward model):
                        what the method paid its labeller
        examples        labelled completions its training jobs trained on, one unit for every
                        method: a value model's returns, both completions of each pair PITA,
                        DPO or a proxy kept, GRPO's online completions
        optimizer_steps optimizer steps of every training job (value, proxy and policy models)
        train_tokens    tokens through the trained models, summed over epochs
        train_flops     training FLOPs: 6 x trainable parameters x tokens (transformers' own
                        estimate for DPO / GRPO); null where a job did not record it
        device_s        device-seconds of those jobs

    Counted from the jobs' results (the attempts that finished; shared data collections count
    for every method that used them). Evaluation is not part of a method's budget."""
    jobs = state.get("jobs", {})
    out: dict[tuple, dict] = {}
    for jid, e in sorted(jobs.items()):
        if ".eval" in jid or ".val" in jid or ".eta_search" in jid or e.get("state") != "COMPLETED":
            continue
        parts = jid.split(".")
        at = next((i for i in (3, 4) if len(parts) > i and parts[i][:1] == "r" and parts[i][1:].isdigit()), None)
        if at is None or parts[0] in ("data", "control", "model", "base"):
            continue  # not a method's job (shared data collections count for the methods that used them)
        key = tuple(parts[:3])  # every arm of a grid counts towards its method
        own = [jid] + shared_data([jid], jobs, f"data.{key[1]}.{key[2]}.")
        b = out.setdefault(key, {"algorithm": key[0], "family": key[1], "train_dataset": key[2], "rounds": 0,
                                 "sequences": 0, "tokens": 0, "labels": 0, "examples": 0, "optimizer_steps": 0,
                                 "train_tokens": 0,
                                 "train_flops": 0.0, "device_s": 0.0, "_seen": set()})
        b["rounds"] = max(b["rounds"], int(parts[at][1:]) + 1)
        for j in own:
            if j in b["_seen"] or jobs.get(j, {}).get("state") != "COMPLETED":
                continue
            b["_seen"].add(j)
            res, kind = result_of(j) or {}, jobs[j].get("kind")
            b["device_s"] += _device_s(jobs[j])
            if kind == "generation.shard" or kind in TRAIN_KINDS:
                b["sequences"] += int(res.get("sequences") or 0)
                b["tokens"] += int(res.get("tokens") or 0)
                b["labels"] += int(res.get("scored") or 0)
            if kind in TRAIN_KINDS:
                b["optimizer_steps"] += int(res.get("steps") or 0)
                b["examples"] += int(res.get("examples") or 2 * int(res.get("pairs") or 0) or
                                     (res.get("sequences") if kind == "algo.grpo_train" else 0) or 0)
                b["train_tokens"] = None if b["train_tokens"] is None or res.get("train_tokens") is None else \
                    b["train_tokens"] + int(res["train_tokens"])
                b["train_flops"] = None if b["train_flops"] is None or res.get("train_flops") is None else \
                    b["train_flops"] + float(res["train_flops"])
    for b in out.values():
        b.pop("_seen")
        b["device_s"] = round(b["device_s"], 1)
    return list(out.values())


def shared_data(ids: list[str], jobs: dict, prefix: str) -> list[str]:
    """The shared data-collection jobs (``data.<family>.<dataset>.*``) that ``ids`` depend on,
    directly or through their merges: their compute counts towards every row that used them."""
    out, todo = [], [d for j in ids for d in jobs.get(j, {}).get("deps", [])]
    while todo:
        d = todo.pop()
        if d.startswith(prefix) and d not in out:
            out.append(d)
            todo += jobs.get(d, {}).get("deps", [])
    return out


def cell_name(r: dict) -> str:
    algo = r["algorithm"].replace(": ", "-").replace(" ", "_")  # control: best-of-n -> control-best-of-n
    variant = re.sub(r"[^A-Za-z0-9=+-]+", "_", str(r.get("variant") or "")).strip("_")  # an arm, a snapshot
    return (f"{algo}.{r['family']}.{r['train_dataset']}.r{r['round']}.{r['eval_dataset']}"
            f".eta{float(r['eta']):g}" + (f".{variant}" if variant else ""))


def read_results(path) -> tuple[list[dict], dict]:
    """(rows, extras) of a ``final_results.json``: extras holds ``kl_matched`` and the other
    run-level tables; a file written before they existed (a bare list of rows) has none."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, list):
        return data, {}
    return list(data.get("rows") or []), {k: v for k, v in data.items() if k != "rows"}


def wide_ratio(run: RunPaths) -> float:
    """``eval.wide_ratio`` of the run's config (the default for a run made before the key)."""
    from pita.report.matched import WIDE_RATIO

    try:
        from omegaconf import OmegaConf

        got = OmegaConf.select(run_config(run), "eval.wide_ratio")
    except Exception:  # noqa: BLE001 - an unreadable config falls back to the default
        got = None
    return float(got) if got else WIDE_RATIO


def kl_budgets(run: RunPaths) -> list[float]:
    """``eval.kl_budgets`` of the run's config (the defaults for a run made before the key)."""
    from pita.report.matched import BUDGETS

    try:
        from omegaconf import OmegaConf

        got = OmegaConf.select(run_config(run), "eval.kl_budgets")
    except Exception:  # noqa: BLE001 - an unreadable config falls back to the defaults
        got = None
    return [float(b) for b in got] if got else list(BUDGETS)


def kl_matched(run: RunPaths, rows: list[dict], budgets: list[float] | None = None,
               val: list[dict] | None = None, order=()) -> dict:
    """The KL-matched comparison of one run (pita/report/matched.py), as saved: the cells and the
    paired differences of two methods. ``val``: the validation rows each frontier is chosen on
    (default: the run's results/validation.json); ``budgets`` (from ``pita report --kl-budgets``)
    replace the run's ``eval.kl_budgets``, a reading of the same rows."""
    from pita.report.intervals import RecordStore
    from pita.report.matched import differences, matched_cells, public

    source = "eval.kl_budgets" if budgets is None else "pita report --kl-budgets"
    budgets = kl_budgets(run) if budgets is None else [float(b) for b in budgets]
    val = read_validation(run) if val is None else val
    cells = matched_cells([(rows, val, RecordStore(run))], budgets, keep_draws=True, wide_ratio=wide_ratio(run))
    return {"budgets": budgets, "budgets_from": source, "unit": "nats per sequence",
            "estimator": sorted({r.get("kl_estimator") or "log-ratio" for r in rows if r["algorithm"] != "base"}),
            "cells": public(cells), "differences": differences(cells, order)}


def validation_choices(val: list[dict], store=None) -> list[dict]:
    """How sure each validation choice was: per (algorithm, family, training dataset, round) with
    two or more validation rows, the chosen row (as ``select_eta`` chooses), the runner-up, the
    margin between their validation metrics and its standard error: paired over the validation
    prompts where both rows' per-sample records are in ``store`` (a RecordStore), else from the
    two rows' own standard errors as if independent (``se_kind`` says which)."""
    from pita.report.intervals import columns_of

    groups: dict[tuple, list[dict]] = {}
    for v in val:
        groups.setdefault((v["algorithm"], v["family"], v["train_dataset"], v["round"]), []).append(v)
    out = []
    for key, rows in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if len(rows) < 2:
            continue
        m = _metric(rows[0])
        ranked = sorted(rows, key=lambda v: (v[m], -float(v["eta"])), reverse=True)
        a, b = ranked[0], ranked[1]
        margin = float(a[m]) - float(b[m])
        se, kind = None, "unpaired"
        if store is not None:
            ca, cb = (columns_of(r, store) or {} for r in (a, b))  # a reused row reads its source's samples
            pa, pb = ca.get(m), cb.get(m)
            if pa and pb and set(pa) == set(pb) and len(pa) > 1:
                d = [pa[i][0] / pa[i][1] - pb[i][0] / pb[i][1] for i in sorted(pa)]
                mean = math.fsum(d) / len(d)
                se = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
                kind = "paired over prompts"
        if se is None:
            sa, sb = a.get(f"{m}_stderr"), b.get(f"{m}_stderr")
            se = math.sqrt(float(sa) ** 2 + float(sb) ** 2) if sa is not None and sb is not None else None
        name = lambda r: r.get("variant") or f"η={float(r['eta']):g}"  # noqa: E731
        out.append({"algorithm": key[0], "family": key[1], "train_dataset": key[2], "round": key[3], "metric": m,
                    "chosen": name(a), "chosen_value": float(a[m]), "runner_up": name(b), "runner_up_value": float(b[m]),
                    "margin": margin, "margin_se": se, "se_kind": kind, "rows": len(rows),
                    "prompts": a.get("prompts")})
    return out


def read_validation(run: RunPaths) -> list[dict]:
    """The validation rows a run's results were chosen on (results/validation.json; none before it)."""
    path = run.results / "validation.json"
    return json.loads(path.read_text()) if path.exists() else []


def write(run: RunPaths, roster: Roster | None = None, budgets: list[float] | None = None) -> list[dict]:
    rows, val = collect(run)
    if not rows:
        return rows
    if val:
        atomic_write_json(run.results / "validation.json", val)
        with open(run.results / "validation.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[c for c in COLUMNS if c not in ("selected", "train_device_s", "eval_device_s",
                                                                               "tokens", *CI_COLUMNS)],
                               extrasaction="ignore")
            w.writeheader()
            for r in val:
                w.writerow(r)
    extras = {"kl_matched": kl_matched(run, rows, budgets, val,
                                       roster.order({r["algorithm"] for r in rows}) if roster else ())}
    from pita.report.labels import label_quality

    extras["label_quality"] = label_quality(run, roster.preference_pairs if roster and roster.preference_pairs else None)
    state = json.loads(run.state.read_text())
    extras["budgets"] = method_budgets(state, lambda jid: run.job(jid).read_result())
    from pita.report.labels import returns_records, supervision_records

    extras["supervision"] = supervision_records(run, state)
    extras["returns_filter"] = returns_records(run, state)
    extras["scorers"] = [run.job(jid).read_result().get("scorer") for jid, e in sorted(state["jobs"].items())
                         if e.get("kind") == "eval.scorer_quality" and e.get("state") == "COMPLETED"]
    extras["scorers"] = [x for x in extras["scorers"] if x]
    from pita.report.intervals import RecordStore

    extras["validation_choices"] = validation_choices(val, RecordStore(run))
    atomic_write_json(run.results / "final_results.json", {"rows": rows, **extras})
    for r in rows:
        atomic_write_json(run.results / "cells" / f"{cell_name(r)}.json", r)
    with open(run.results / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    send_results(run, rows, roster)  # logging.tracker: the final table (does nothing without one)
    return rows


def table(rows: list[dict]) -> str:
    def fmt(r, k):
        v = r.get(k)
        return "" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    metric = lambda r: "pass@1" if "pass@1" in r else "mean_reward"  # noqa: E731

    shared = [len([x for x in rows if _same_cell(x, r)]) > 1 for r in rows]  # a cell with a choice to star
    # the row's eta, or its arm of a grid (lr=1e-05) or a control's setting (T=0.5)
    settings = [(r.get("variant") or f"{r['eta']:.2f}") + ("*" if r.get("selected") and many else " ")
                for r, many in zip(rows, shared)]
    width = max(6, *map(len, settings))
    aw = max(10, *(len(r["algorithm"]) for r in rows))
    lines = [f"{'algorithm':<{aw}} {'dataset':<10} {'round':>5} {'eta':>{width}} {'metric':>11} {'value':>7} {'+-':>6} "
             f"{'KL':>7} {'+-':>6}"]
    for r, setting in zip(rows, settings):
        m = metric(r)
        rnd = "-" if r["algorithm"] == "base" else r["round"]  # the reference has no round
        lines.append(f"{r['algorithm']:<{aw}} {r['eval_dataset']:<10} {rnd:>5} {setting:>{width}} {m:>11} "
                     f"{fmt(r, m):>7} {fmt(r, m + '_stderr'):>6} {fmt(r, 'kl'):>7} {fmt(r, 'kl_stderr'):>6}")
    if any(shared):
        lines.append("* the eta (or arm, or setting) chosen on the validation prompts (results/validation.csv), "
                     "never on the test split")
    return "\n".join(lines)


def _same_cell(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("algorithm", "family", "train_dataset", "round", "eval_dataset"))


def send_results(run: RunPaths, rows: list[dict], roster: Roster | None = None) -> None:
    """The final results to the run's tracker: the table as text, and each reported value
    (base, and every algorithm at its chosen eta) as a scalar per round. Never raises."""
    try:
        cfg = run_config(run) if run.config.exists() else None
        s = settings_for(cfg, run, "results")
        if s.kind == "none" or not rows:
            return
        from pita.report.intervals import metric_of
        from pita.report.plots import swept_algorithms
        from pita.report.report import full_table, headline_table

        swept = swept_algorithms(rows)
        roster = roster if roster is not None else Roster.of_run(run)
        with open_tracker(s) as t:
            t.text("results/headline", headline_table(rows, swept, roster))
            t.text("results/all_rows", full_table(rows, swept, roster))
            for r in rows:
                if r["algorithm"] == "base" or r.get("selected"):
                    m = metric_of(r)
                    tag = f"{r['eval_dataset']}/{r['algorithm']}"
                    t.log({f"{tag}/{m}": r[m], f"{tag}/kl": r.get("kl"), f"{tag}/gain": r.get("gain")},
                          step=int(r["round"]))
    except Exception as e:  # noqa: BLE001 - results are on disk already
        log.warning("the results could not be sent to the tracker (%s: %s)", type(e).__name__, e)
