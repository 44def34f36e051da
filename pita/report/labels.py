"""How informative a run's preference labels were, per preference collection.

    label_quality(run)   # [{collection, recipe, used_by, pairs, ties, near_ties, informative, ...}]

A label is a Bradley-Terry draw, P(a chosen) = σ(β (r_a − r_b)) (pita/rewards/preferences.py): its
noise is set by β (``data_collection.bt_beta``), and a pair whose reward gap is small against it
is a coin flip whatever the method does with it. Per collection (each merge of
``preference_pairs`` or ``value_rollouts`` records, the pairs exactly as the training jobs form
them):

- ``ties``: share of pairs with equal rewards (dropped, or kept as coin flips, by every trainer alike: ``data_collection.ties``);
- ``near_ties``: share of the other pairs whose gap is below the label noise, P(the higher reward
  is chosen) < ``NEAR_TIE_P`` (0.55): β |Δr| < 0.2;
- ``informative``: the rest;
- ``agreement``: the expected share of labels that pick the higher reward, mean σ(β |Δr|) (ties
  count 1/2): 0.5 is labels carrying no information, 1 labels that always follow the reward;
- ``against_reward``: share of the drawn labels that chose the lower reward;
- ``median_gap``: the median |Δr| of the pairs.

The proxies' held-out pair accuracy (Q#-HF, GRPO-HF) comes from their training jobs' results
(``heldout_accuracy``: labels of held-out prompts the proxy predicts; ``heldout_reward_agreement``:
held-out pairs where the proxy orders the two completions as the true reward does).
"""

from __future__ import annotations

import json
import logging
import math
import statistics

from pita.core.paths import RunPaths
from pita.report.config import run_config

log = logging.getLogger(__name__)

NEAR_TIE_P = 0.55


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def gap_quality(gaps: list[float], against: list[bool] | None, beta: float) -> dict:
    """The figures of one collection from its pairs' reward gaps (chosen − rejected, or a − b)."""
    n = len(gaps)
    if n == 0:
        return {"pairs": 0}
    ties = sum(g == 0 for g in gaps)
    near = sum(g != 0 and _sigmoid(beta * abs(g)) < NEAR_TIE_P for g in gaps)
    out = {"pairs": n, "ties": ties / n, "near_ties": near / n, "informative": (n - ties - near) / n,
           "agreement": math.fsum(_sigmoid(beta * abs(g)) for g in gaps) / n,
           "median_gap": statistics.median(abs(g) for g in gaps), "beta": beta}
    if against is not None:
        out["against_reward"] = sum(against) / n
    return out


def _records(run: RunPaths, job_id: str) -> list[dict] | None:
    try:
        from datasets import load_from_disk

        return load_from_disk(str(run.job(job_id).artifacts / "data")).to_list()
    except Exception as e:  # noqa: BLE001 - a missing collection only loses its line
        log.warning("label quality: the records of %s are unreadable (%s: %s)", job_id, type(e).__name__, e)
        return None


def _labels(run: RunPaths) -> dict:
    try:
        dc = run_config(run)
        return {"beta": float(dc.data_collection.bt_beta), "sampling": bool(dc.data_collection.bradley_terry_sampling),
                "seed": int(dc.system.seed), "per_prompt": int(dc.data_collection.pairs_per_prompt)}
    except Exception:  # noqa: BLE001 - the defaults of a run without a readable config
        return {"beta": 1.0, "sampling": True, "seed": 0, "per_prompt": 4}


def label_quality(run: RunPaths, preference: frozenset | None = None) -> list[dict]:
    """One entry per preference collection of the run (see the module); never raises.
    ``preference``: the algorithms that learn from labelled pairs (the roster's); a roll-out
    collection none of them reads (Q#'s own, labelled by nobody) is left out. None: every one."""
    try:
        return _label_quality(run, preference)
    except Exception as e:  # noqa: BLE001 - the results are written without it
        log.warning("label quality could not be computed (%s: %s)", type(e).__name__, e)
        return []


def _label_quality(run: RunPaths, preference: frozenset | None) -> list[dict]:
    from pita.guidance.rollouts import continuation_pairs

    state = json.loads(run.state.read_text())
    jobs = state.get("jobs", {})
    lab = _labels(run)
    out = []
    for jid, j in sorted(jobs.items()):
        if j.get("kind") != "generation.merge" or j.get("state") != "COMPLETED":
            continue
        res = run.job(jid).read_result()
        recipe = res.get("recipe")
        if recipe not in ("preference_pairs", "value_rollouts"):
            continue
        users = sorted({u.split(".")[0] for u, e in jobs.items() if jid in (e.get("deps") or [])
                        and not u.startswith("data.")})
        if preference is not None:
            users = [u for u in users if u in preference]
            if not users:
                continue
        recs = _records(run, jid)
        if recs is None:
            continue
        if recipe == "preference_pairs":
            gaps = [float(r["chosen_reward"]) - float(r["rejected_reward"]) for r in recs]
            q = gap_quality([abs(g) for g in gaps], [g < 0 for g in gaps], lab["beta"])
        else:
            pairs = continuation_pairs(recs, lab["seed"], lab["beta"], lab["sampling"], lab["per_prompt"])
            q = gap_quality([0.0 if tie else abs(float(c["reward"]) - float(r["reward"])) for c, r, tie in pairs],
                            [not tie and float(c["reward"]) < float(r["reward"]) for c, r, tie in pairs], lab["beta"])
        out.append({"collection": jid, "recipe": recipe, "used_by": users, **q})
    for jid, j in sorted(jobs.items()):
        if j.get("kind") == "algo.proxy_train" and j.get("state") == "COMPLETED":
            res = run.job(jid).read_result()
            out.append({"collection": jid, "recipe": "proxy", "used_by": [jid.split(".")[0]],
                        "pairs": res.get("pairs"), "heldout_pairs": res.get("heldout_pairs"),
                        "train_accuracy": res.get("pair_accuracy"), "heldout_accuracy": res.get("heldout_accuracy"),
                        "heldout_reward_agreement": res.get("heldout_reward_agreement")})
    return out


def label_table(entries: list[dict]) -> list[str]:
    """Markdown lines: one table of the collections, one of the proxies."""
    if not entries:
        return []
    pct = lambda v: "" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    cols = [e for e in entries if e["recipe"] != "proxy" and e.get("pairs")]
    proxies = [e for e in entries if e["recipe"] == "proxy"]
    lines = []
    if cols:
        beta = cols[0].get("beta", 1.0)
        lines += [f"Per preference collection, the pairs as the trainers form them (Bradley-Terry labels, β {beta:g}; "
                  f"a near tie: P(the higher reward is chosen) < {NEAR_TIE_P}, |Δr| < {_near_gap(beta):.3g}):", "",
                  "| collection | labels for | pairs | ties | near ties | informative | label agrees with reward (expected) "
                  "| drawn against reward | median abs(Δr) |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| `{e['collection']}` | {', '.join(e['used_by'])} | {e['pairs']} | {pct(e['ties'])} | "
                  f"{pct(e['near_ties'])} | {pct(e['informative'])} | {pct(e['agreement'])} | "
                  f"{pct(e.get('against_reward'))} | {e['median_gap']:.3g} |" for e in cols]
        lines.append("")
    if proxies:
        lines += ["Proxy reward models: pair accuracy on the labels they trained on, and on the pairs of held-out "
                  "prompts (against the drawn labels, and against the true reward's order):", "",
                  "| proxy | pairs trained | train accuracy | held-out pairs | held-out label accuracy "
                  "| held-out reward agreement |", "|---|---|---|---|---|---|"]
        lines += [f"| `{e['collection']}` | {e.get('pairs')} | {pct(e.get('train_accuracy'))} | "
                  f"{e.get('heldout_pairs') if e.get('heldout_pairs') is not None else ''} | "
                  f"{pct(e.get('heldout_accuracy'))} | {pct(e.get('heldout_reward_agreement'))} |" for e in proxies]
        lines.append("")
    return lines


def _near_gap(beta: float) -> float:
    """The |Δr| below which a pair is a near tie."""
    return math.log(NEAR_TIE_P / (1 - NEAR_TIE_P)) / beta if beta > 0 else math.inf


def reward_description(run: RunPaths, dataset: str) -> str:
    """What made a preference label on ``dataset``, from the run's config: the verifier alone
    (``bonus x correct``), a reward model plus the verifier (the PITA reference's math reward), or a
    reward model alone (a reward task)."""
    try:
        from omegaconf import OmegaConf

        from pita.datasets.config import task_of

        cfg = run_config(run)
        rm = (OmegaConf.select(cfg, "model.reward_models") or {}).get(dataset)
        task = task_of(OmegaConf.select(cfg, f"datasets.{dataset}"))
        bonus = float(OmegaConf.select(cfg, "data_collection.correctness_bonus") or 1.0)
    except Exception:  # noqa: BLE001 - a run without a readable config: unknown
        return "unknown"
    if task == "reward":
        return f"reward model {rm}" if rm else "reward function"
    if rm:
        return f"reward model {rm} + {bonus:g} x verifier"
    return f"{bonus:g} x verifier (no reward model configured)"


def supervision_records(run: RunPaths, state: dict) -> list[dict]:
    """``final_results.json``'s ``supervision``: one record per preference learner's training job
    (PITA's value model, DPO, the Q#-HF and GRPO-HF proxies): its algorithm, training dataset and
    round, the pairs it was given, the ties among them and the decisive rest, the tie rule, and
    what made the label (``reward``). Never raises."""
    out = []
    try:
        for jid, j in sorted((state.get("jobs") or {}).items()):
            if j.get("state") != "COMPLETED" or j.get("kind") not in ("algo.value_train", "algo.dpo_train",
                                                                      "algo.proxy_train"):
                continue
            sup = run.job(jid).read_result().get("supervision")
            if not sup:
                continue
            parts = jid.split(".")
            rnd = next((int(x[1:]) for x in parts[3:] if x[:1] == "r" and x[1:].isdigit()), None)
            out.append({"algorithm": parts[0], "family": parts[1], "train_dataset": parts[2], "round": rnd,
                        "job": jid, "learner": "proxy" if j.get("kind") == "algo.proxy_train" else "trainer",
                        **sup, "reward": reward_description(run, parts[2])})
    except Exception as e:  # noqa: BLE001 - the results are written without it
        log.warning("supervision records could not be read (%s: %s)", type(e).__name__, e)
    return out


def supervision_table(records: list[dict]) -> list[str]:
    """Markdown lines: the share of pairs that tied, per preference learner."""
    if not records:
        return []
    lines = ["What labelled each preference learner's pairs (one tie rule for all: `data_collection.ties`):", "",
             "| job | pairs | ties | decisive | tie rule | pairs trained | label from |", "|---|---|---|---|---|---|---|"]
    for r in records:
        share = f" ({100 * r['ties'] / r['pairs']:.0f}%)" if r.get("pairs") else ""
        lines.append(f"| `{r['job']}` | {r['pairs']} | {r['ties']}{share} | {r['decisive']} | {r['tie_rule']} | "
                     f"{r.get('trained_pairs', '')} | {r['reward']} |")
    return lines + [""]


def returns_records(run: RunPaths, state: dict) -> list[dict]:
    """``final_results.json``'s ``returns_filter``: one record per value-training job that left out
    prompts whose roll-outs all scored the same return (Q#, Q#-HF: ``drop_no_variation``): its
    algorithm, training dataset and round, the prompts it saw and how many it left out. Never raises."""
    out = []
    try:
        for jid, j in sorted((state.get("jobs") or {}).items()):
            if j.get("state") != "COMPLETED" or j.get("kind") != "algo.value_train":
                continue
            rf = run.job(jid).read_result().get("returns_filter")
            if not rf:
                continue
            parts = jid.split(".")
            rnd = next((int(x[1:]) for x in parts[3:] if x[:1] == "r" and x[1:].isdigit()), None)
            out.append({"algorithm": parts[0], "family": parts[1], "train_dataset": parts[2], "round": rnd,
                        "job": jid, **rf})
    except Exception as e:  # noqa: BLE001 - the results are written without it
        log.warning("returns-filter records could not be read (%s: %s)", type(e).__name__, e)
    return out


def returns_table(records: list[dict]) -> list[str]:
    """Markdown lines: the prompts each return learner left out (all its roll-outs one return)."""
    if not records:
        return []
    lines = ["Prompts each return learner left out because every roll-out of them scored the same return "
             "(`algos.<A>.drop_no_variation`, as the Q# reference trains; rounds 0..r together):", "",
             "| job | prompts | left out | roll-outs left out |", "|---|---|---|---|"]
    for r in records:
        share = f" ({100 * r['prompts_dropped'] / r['prompts']:.0f}%)" if r.get("prompts") else ""
        lines.append(f"| `{r['job']}` | {r['prompts']} | {r['prompts_dropped']}{share} | {r['rollouts_dropped']} |")
    return lines + [""]
