"""``results/report.md``, from what a run saved (results, state, config, training metrics).

    python -m pita report outputs/NAME/<time>      re-render from the saved files

The report opens with a headline table: per evaluation dataset and algorithm, the last round's
row at the eta chosen on validation, its metric and KL with 95% intervals (bootstrap over
prompts, pita/report/intervals.py) and the paired gain over the base model. Every row follows,
base first, then algorithms in registry order; eta appears only for algorithms that sweep it.
Then the plots (pita/report/plots.py), compute per phase (jobs, wall time summed over jobs,
device-seconds = wall x devices held, tokens sampled, peak resident memory), failures, and a
link to the run's ``config.yaml``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pita.core.paths import RunPaths
from pita.report.config import run_config
from pita.report.intervals import add_intervals, metric_of
from pita.report.roster import Roster
from pita.report.plots import (plot_frontier, plot_rounds, plot_timeline, plot_training,
                               swept_algorithms, training_curves)


def phase_of(job_id: str, kind: str) -> str:
    if kind == "generation.shard":
        return "evaluation" if ".eval." in job_id or ".val." in job_id else "generation"
    if kind.endswith("merge"):
        return "merge"
    if kind.startswith("model."):
        return "model build"
    if "train" in kind or kind.startswith("algo."):
        return "training"
    return kind.split(".")[0]


def compute_table(state: dict, results_of) -> list[dict]:
    """One row per phase: jobs, wall_s, device_s, tokens, peak_rss_gb."""
    acc: dict[str, dict] = {}
    for jid, j in state.get("jobs", {}).items():
        ph = phase_of(jid, j.get("kind", ""))
        a = acc.setdefault(ph, {"phase": ph, "jobs": 0, "wall_s": 0.0, "device_s": 0.0, "tokens": 0,
                                "peak_rss_gb": 0.0})
        a["jobs"] += 1
        for at in j.get("attempts", []):
            d = float(at.get("duration_s") or 0.0)
            a["wall_s"] += d
            a["device_s"] += d * max(1, len(at.get("devices") or []))
            a["peak_rss_gb"] = max(a["peak_rss_gb"], (at.get("peak_rss_bytes") or 0) / 2**30)
        if j.get("state") == "COMPLETED" and j.get("kind") == "generation.shard":
            a["tokens"] += int((results_of(jid) or {}).get("tokens") or 0)
    order = ["model build", "generation", "training", "evaluation", "merge"]
    return sorted(acc.values(), key=lambda r: (order.index(r["phase"]) if r["phase"] in order else 99, r["phase"]))


def source_lines(state: dict) -> list[str]:
    """Which pita ran the run (each start and resume records it in state.json's ``runs``)."""
    from pita.core.provenance import source_line

    seen = []
    for r in state.get("runs", []):
        if r.get("pita") and source_line(r["pita"]) not in seen:
            seen.append(source_line(r["pita"]))
    if not seen:
        return []
    return [f"- software: {seen[0]}" if len(seen) == 1 else
            "- software (the run was resumed by another version): " + "; ".join(seen)]


def platform_lines(state: dict) -> list[str]:
    """Where the jobs computed (each one's last attempt, ``pita.core.provenance``), one line per
    distinct platform: two runs whose lines differ are not expected to agree to the last digit."""
    from pita.core.provenance import summary

    seen: dict[str, int] = {}
    for j in state.get("jobs", {}).values():
        last = next((a for a in reversed(j.get("attempts") or []) if a.get("platform")), None)
        if last is not None:
            line = summary(last["platform"])
            seen[line] = seen.get(line, 0) + 1
    if not seen:
        return []
    if len(seen) == 1:
        return [f"- platform: {next(iter(seen))} (every job; see docs/guide.md, \"Reproducibility\")"]
    return ["- platforms (docs/guide.md, \"Reproducibility\"):"] + [f"  - {line}: {n} job{'s' if n != 1 else ''}"
                                                             for line, n in sorted(seen.items(), key=lambda x: -x[1])]


def oom_lines(state: dict) -> list[str]:
    """Jobs whose batch an out-of-memory retry changed (their last attempt ran at another size
    than planned): a training job keeps its effective batch (micro-batch halved, accumulation
    raised), a sampling job samples the same rows in smaller batches."""
    out = []
    for jid, j in sorted(state.get("jobs", {}).items()):
        last = (j.get("attempts") or [None])[-1]
        r = (last or {}).get("oom_resized")
        if r:
            out.append(f"  - `{jid}`: {r['param']} {r['planned']} -> {r['used']}")
    if not out:
        return []
    return [f"- sizes changed by out-of-memory retries ({len(out)} job{'s' if len(out) != 1 else ''}; "
            f"training keeps its effective batch, accumulation rises):"] + out


def duration_table(state: dict) -> list[dict]:
    """Planned against measured seconds per job kind: the completed attempts that recorded both
    (the duration model's ``planned_s``, what the scheduler expected after learned corrections,
    and the wall time from the worker's start to its end)."""
    by: dict = {}
    for entry in state.get("jobs", {}).values():
        for a in entry.get("attempts", []):
            if a.get("status") == "ok" and a.get("duration_key") and a.get("planned_s"):
                d = by.setdefault(a["duration_key"], {"kind": a["duration_key"], "jobs": 0, "planned_s": 0.0,
                                                      "expected_s": 0.0, "measured_s": 0.0})
                d["jobs"] += 1
                d["planned_s"] += float(a["planned_s"])
                d["expected_s"] += float(a.get("expected_s") or a["planned_s"])
                d["measured_s"] += float(a["seconds"])
    return sorted(by.values(), key=lambda d: -d["measured_s"])


def duration_lines(state: dict) -> list[str]:
    rows = duration_table(state)
    if not rows:
        return []
    return ["### Durations: planned against measured", "",
            "Per job kind, summed over its completed jobs: the duration model's seconds "
            "(pita/plans/durations.py), what the scheduler expected after the corrections earlier runs taught "
            "(`<system.cache_dir>/durations.json`), and the measured wall time (worker start to end). Later "
            "plans and runs of this cache use the measured / planned ratios; `pita plan --calibrate RUN` uses "
            "this run's.", "",
            _md_table(["job kind", "jobs", "planned s", "expected s", "measured s", "measured / planned"],
                      [[d["kind"], d["jobs"], _f(d["planned_s"], 1), _f(d["expected_s"], 1), _f(d["measured_s"], 1),
                        _f(d["measured_s"] / d["planned_s"], 2)] for d in rows]), ""]


def _md_table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _f(v, nd=3) -> str:
    return "" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _fairness_notes(run: RunPaths, rows: list[dict], swept: set, roster: Roster) -> list[str]:
    """What every row was given: the preference budget, and how eta was chosen."""
    try:
        cfg = run_config(run)
        budget, val = cfg.data_collection.pairs_per_prompt, cfg.eval.validation_prompts
    except Exception:  # noqa: BLE001 - an unreadable config only loses these two lines
        return []
    out = []
    pref = sorted(a for a in {r["algorithm"] for r in rows} if a in roster.preference_pairs)
    if pref:
        out.append(f"- preference budget: {budget} labelled pairs per prompt and round for every "
                   f"preference-learning method ({', '.join(pref)}; `data_collection.pairs_per_prompt`), "
                   f"each pair labelled once")
    if swept:
        chosen = any(r.get("selected") for r in rows if r["algorithm"] in swept)
        out.append(f"- eta of {', '.join(sorted(swept))}: chosen per round on up to {val} validation prompts carved "
                   f"from the training data (`eval.validation_prompts`; rows in `results/validation.csv`), never on "
                   f"the test split; the test rows of every eta are kept for the frontier" if chosen else
                   f"- eta of {', '.join(sorted(swept))}: not chosen (no validation prompts: "
                   f"`eval.validation_prompts=0`); every eta's test row is shown")
    return out


def _ci(v, lo, hi, nd=3, signed=False) -> str:
    """``0.312 [0.281, 0.344]``; the value alone when there is no interval."""
    if v is None:
        return ""
    f = (lambda x: f"{x:+.{nd}f}") if signed else (lambda x: f"{x:.{nd}f}")
    return f(v) + (f" [{f(lo)}, {f(hi)}]" if lo is not None and hi is not None else "")


def sort_rows(rows: list[dict], roster: Roster = Roster()) -> list[dict]:
    """Base first, then algorithms in the roster's (registry) order, then eval dataset, family,
    training dataset, round, eta."""
    order = ["base"] + roster.order({r["algorithm"] for r in rows})
    return sorted(rows, key=lambda r: (order.index(r["algorithm"]), r["eval_dataset"], r["family"],
                                       r["train_dataset"], int(r["round"]), float(r["eta"])))


def eta_cell(r: dict, swept: set) -> str:
    """The eta of an algorithm that sweeps it (the chosen one marked), blank for every other."""
    if r.get("variant"):  # a control's setting (T=0.7, n=4) or a grid's
        return str(r["variant"]) + (" (chosen)" if r.get("selected") else "")
    if r["algorithm"] not in swept:
        return ""
    return f"{float(r['eta']):g}" + (" (chosen)" if r.get("selected") else "")


def headline_rows(rows: list[dict], roster: Roster = Roster()) -> list[dict]:
    """Per (eval dataset, family, training dataset, algorithm): the last round's row at the eta
    chosen on validation (the base model's single row; a sweep without a choice is left out)."""
    last: dict[tuple, dict] = {}
    for r in rows:
        if not (r["algorithm"] == "base" or r.get("selected")):
            continue
        key = (r["eval_dataset"], r["family"], r["train_dataset"], r["algorithm"])
        if key not in last or int(r["round"]) > int(last[key]["round"]):
            last[key] = r
    rows = sort_rows(list(last.values()), roster)
    return sorted(rows, key=lambda r: r["eval_dataset"])  # stable: per dataset, base first, then algorithms


def sample_counts(rows: list[dict]) -> str:
    """``arith: 64 prompts × 8 samples; sentiment: ...`` (one entry when every dataset agrees)."""
    per: dict[str, set] = {}
    for r in rows:
        per.setdefault(r["eval_dataset"], set()).add((r.get("prompts"), r.get("n")))
    text = {ds: " or ".join(f"{p} test prompts × {n} samples" for p, n in sorted(v, key=str)) for ds, v in per.items()}
    if len(set(text.values())) == 1:
        return f"{next(iter(text.values()))} per prompt (every dataset)"
    return "; ".join(f"{ds}: {t}" for ds, t in sorted(text.items()))


def headline_table(rows: list[dict], swept: set, roster: Roster = Roster()) -> str:
    head = headline_rows(rows, roster)
    multi_fam = len({r["family"] for r in rows}) > 1
    cross = any(r["train_dataset"] != r["eval_dataset"] for r in rows if r["algorithm"] != "base")
    header = ["dataset"] + (["family"] if multi_fam else []) + ["algorithm"] + (["trained on"] if cross else []) + \
        ["round", "η", "metric", "value [95% CI]", "KL [95% CI]", "KL/token", "gain over base [95% CI]"]
    tab = []
    for r in head:
        m = metric_of(r)
        tab.append([r["eval_dataset"]] + ([r["family"]] if multi_fam else []) + [r["algorithm"]] +
                   ([r["train_dataset"] if r["algorithm"] != "base" else ""] if cross else []) +
                   ["" if r["algorithm"] == "base" else r["round"], eta_cell(r, swept), m,
                    _ci(r.get(m), r.get(f"{m}_ci_lo"), r.get(f"{m}_ci_hi")),
                    _ci(r.get("kl"), r.get("kl_ci_lo"), r.get("kl_ci_hi")), _f(r.get("kl_per_token"), 4),
                    "(reference)" if r["algorithm"] == "base" else
                    _ci(r.get("gain"), r.get("gain_ci_lo"), r.get("gain_ci_hi"), signed=True)])
    return _md_table(header, tab)


def full_table(rows: list[dict], swept: set, roster: Roster = Roster()) -> str:
    tab = []
    for r in sort_rows(rows, roster):
        m = metric_of(r)
        tab.append([r["algorithm"], r["family"], r["train_dataset"] if r["algorithm"] != "base" else "",
                    r["eval_dataset"], "" if r["algorithm"] == "base" else r["round"], eta_cell(r, swept), m,
                    _f(r.get(m)), _span(r.get(f"{m}_ci_lo"), r.get(f"{m}_ci_hi")),
                    _f(r.get("maj@n")), _f(r.get("kl")), _span(r.get("kl_ci_lo"), r.get("kl_ci_hi")),
                    _f(r.get("kl_per_token"), 4), _f(r.get("kl_logratio")),
                    "" if r.get("gain") is None else f"{r['gain']:+.3f}",
                    _span(r.get("gain_ci_lo"), r.get("gain_ci_hi"), signed=True),
                    _f(r.get("train_device_s"), 0), _f(r.get("eval_device_s"), 0)])
    return _md_table(["algorithm", "family", "train", "eval", "round", "η", "metric", "value", "95% CI", "maj@n",
                      "KL", "KL 95% CI", "KL/token", "KL log-ratio", "gain", "gain 95% CI", "train dev-s",
                      "eval dev-s"], tab)


def _span(lo, hi, nd=3, signed=False) -> str:
    if lo is None or hi is None:
        return ""
    return f"[{lo:+.{nd}f}, {hi:+.{nd}f}]" if signed else f"[{lo:.{nd}f}, {hi:.{nd}f}]"


def _interval_note(rows: list[dict]) -> str:
    methods = sorted({r.get("ci_method") for r in rows if r.get("ci_method")})
    from pita.report.intervals import NORMAL

    text = ("Intervals are 95%: " + "; ".join(methods) + ". The gain over base is paired: the row and the base "
            "model's row of the same dataset, on the same resampled prompts.")
    if NORMAL in methods:
        old = sum(1 for r in rows if r.get("ci_method") == NORMAL)
        text += (f" {old} row(s) have no saved per-sample records (a run made before they were kept): their "
                 f"intervals are value ± 1.96 stderr, and their gain's treats row and base as independent.")
    return text


def matched_section(extras: dict, roster: Roster) -> list[str]:
    """The KL-matched headline (pita/report/matched.py) as markdown lines."""
    from pita.report.matched import matched_tables

    km = extras.get("kl_matched") or {}
    cells = km.get("cells") or []
    if not cells:
        return []
    return ["### Headline: every method at equal KL", "",
            f"Each method's {cells[0]['metric']} at KL = {', '.join(f'{b:g}' for b in km['budgets'])} "
            f"{km.get('unit', 'nats per sequence')} (`{km.get('budgets_from', 'eval.kl_budgets')}`), read on its "
            "series where the validation KL reaches each budget, on the test prompts, with 95% intervals. A mark "
            "says what a cell is (interp., wide, chord, not reached) and its number the note under the table "
            "that says why; how to read it: \"Reading the headline\" below.", ""] + \
        matched_tables(cells, roster.order({c["algorithm"] for c in cells}), km.get("differences"))


def reading_section(extras: dict) -> list[str]:
    """How the headline table is made and what each mark means (after the tables, so the report's
    first screen is the table itself)."""
    km = extras.get("kl_matched") or {}
    if not km.get("cells"):
        return []
    est = ", ".join(km.get("estimator") or []) or "exact per-step"
    return ["### Reading the headline", "",
            "Each method's rows form series, one per round and arm, ordered by strength (η; the snapshots along "
            "training, the final policy last; a colder temperature; a larger n), each starting at the base model. "
            "A budget is read on a series where its *validation* KL reaches it, between the two points around it, "
            "and the *test* value is read at the same weight: KL places the point, no metric picks one, so a "
            "method that hurts shows a negative gain. Where several rounds or arms reach a budget, the latest round "
            "(then the first arm) is read, unless another beats it on validation by more than 1.96 standard errors "
            "of their difference; the note says what validation saw and the smallest difference it could tell "
            "apart. Each cell's method cites its validation reading (value ± standard error at each budget). "
            "A value with no mark is measured (a point whose validation KL is within 10% of the budget); "
            "'interp.': between two points (their validation KLs in the note); 'wide': between points further "
            "apart in KL than `eval.wide_ratio` (4x by default), a line across a stretch no point measured; "
            "'chord': between the base model and the series' first point; 'not reached': no series reaches the "
            f"budget (the note says where they end and what stopped a search), nothing is extrapolated. KL estimator: {est}. "
            "Intervals: 95%, the test prompts resampled and each draw read at the same weight; the gain, and the "
            "difference of two methods (measured or interpolated cells), are paired on the same draws. Two rows need no training "
            "(`eval.controls`): `control: temperature`, the base model sampled colder (its KL exact, as every "
            "row's), and `control: best-of-n`, the best of n base samples by a score available at test time "
            "(the reward model, or on a verifier task the run's learned proxy; `control: best-of-n by value`: "
            "ranked by Q#'s round-0 value model instead, Q#'s own supervision), its KL measured from the pool's "
            "distinct completions and their probabilities (`kl_bound`: log n − (n−1)/n, which it never "
            "exceeds): a method that does not beat them at equal KL is not shown to do more than "
            "sharpen or rerank the base model.", ""]


def budget_section(budgets: list[dict], roster: Roster | None = None) -> list[str]:
    """What each method received (results/final_results.json ``budgets``): samples, labels,
    optimizer steps and training compute, over all its rounds."""
    if not budgets:
        return []
    order = roster.order({b["algorithm"] for b in budgets}) if roster else sorted({b["algorithm"] for b in budgets})
    rank = {a: i for i, a in enumerate(order)}
    rows = sorted(budgets, key=lambda b: (b["family"], b["train_dataset"], rank.get(b["algorithm"], len(rank))))
    flops = lambda x: "" if x is None else f"{x:.3g}"  # noqa: E731
    return ["### What each method received", "",
            "Over all its rounds: completions sampled for training (roll-ins and GRPO's online samples included) "
            "and their tokens, completions scored by the task's reward (the labels it paid for), the examples "
            "its training jobs trained on, in one unit for every method: labelled completions (a value model's "
            "returns, both completions of each kept preference pair, GRPO's online completions), optimizer steps of its training jobs (value, proxy and policy models), training "
            "FLOPs (6 x trainable parameters x tokens) and device-seconds. Unequal budgets are part of a "
            "comparison's reading.", "",
            _md_table(["algorithm", "family", "dataset", "rounds", "samples", "tokens", "labels", "examples",
                       "optimizer steps", "train FLOPs", "device-s"],
                      [[b["algorithm"], b["family"], b["train_dataset"], b["rounds"], b["sequences"], b["tokens"],
                        b["labels"], b.get("examples", ""), b["optimizer_steps"], flops(b.get("train_flops")),
                        _f(b.get("device_s"), 1)] for b in rows]), ""] + supervision_lines(rows)


def scorer_section(scorers: list[dict], roster: Roster | None = None) -> list[str]:
    """How well each learned scorer (value models, proxies) orders one prompt's completions, beside
    how well it orders the prompts (results/final_results.json ``scorers``, the validation pool)."""
    if not scorers:
        return []
    order = roster.order({c["algorithm"] for c in scorers}) if roster else sorted({c["algorithm"] for c in scorers})
    rank = {a: i for i, a in enumerate(order)}
    rows = sorted(scorers, key=lambda c: (c["family"], c["train_dataset"], rank.get(c["algorithm"], len(rank)),
                                          c["round"], c["model"]))
    blind = [c for c in rows if c.get("chance")]

    def agree(c):
        if c.get("agreement") is None:
            return "no pair differs"
        se = f" ± {c['agreement_se']:.3f}" if c.get("agreement_se") not in (None, float("inf")) else ""
        return f"{c['agreement']:.3f}{se}" + (" (chance)" if c.get("chance") else "")
    return ["### What each learned scorer can tell apart", "",
            "Each value model and proxy reward model scores the validation pool (the base model's samples of the "
            "validation prompts, the best-of-n pool): *within prompts*, of the pairs of one prompt's completions "
            "whose outcomes differ, the share it orders as their outcomes are (0.5 is chance; ± its standard "
            "error over prompts); *between prompts*, how well its mean per prompt orders the prompts by their "
            "outcome. Guidance chooses among one prompt's continuations: a scorer at chance within prompts "
            "gives it nothing to follow, whatever it knows about which prompts are hard. "
            f"{len(blind)} of {len(rows)} scorers rank within prompts no better than chance (not above 0.5 by "
            "two standard errors).", "",
            _md_table(["algorithm", "family", "dataset", "round", "model", "within prompts", "pairs",
                       "between prompts", "prompts x pool"],
                      [[c["algorithm"], c["family"], c["train_dataset"], c["round"], c["model"], agree(c), c["pairs"],
                        _f(c.get("prompt_agreement"), 3), f"{c['prompts']} x {c['pool']}"] for c in rows]), ""]


def choice_section(choices: list[dict], roster: Roster | None = None) -> list[str]:
    """How sure each validation choice was (results/final_results.json ``validation_choices``)."""
    if not choices:
        return []
    order = roster.order({c["algorithm"] for c in choices}) if roster else sorted({c["algorithm"] for c in choices})
    rank = {a: i for i, a in enumerate(order)}
    rows = sorted(choices, key=lambda c: (c["family"], c["train_dataset"], rank.get(c["algorithm"], len(rank)),
                                          c["round"]))
    close = [c for c in rows if c["margin_se"] is not None and c["margin"] < 2 * c["margin_se"]]

    def ratio(c):
        return "" if not c["margin_se"] else f"{c['margin'] / c['margin_se']:.1f}"
    return ["### How sure each validation choice was", "",
            "The per-round table below shows, for each method and round, the η, arm or setting with the best "
            "validation metric (the headline does not choose by it: it places each budget by KL). The margin "
            "over the runner-up and its standard error (paired over the validation prompts where their samples "
            "are saved) say how sure that choice was, and *tells apart* the smallest difference this "
            f"validation could tell apart (1.96 standard errors). {len(close)} of {len(rows)} choices are within "
            "2 standard errors of their runner-up: there another validation draw may well have chosen "
            "differently.", "",
            _md_table(["algorithm", "family", "dataset", "round", "chosen", "validation", "runner-up", "margin",
                       "SE", "margin / SE", "tells apart", "SE from"],
                      [[c["algorithm"], c["family"], c["train_dataset"], c["round"], c["chosen"],
                        _f(c["chosen_value"], 3), f"{c['runner_up']} ({_f(c['runner_up_value'], 3)})",
                        f"{c['margin']:+.3f}", _f(c["margin_se"], 3), ratio(c),
                        _f(1.96 * c["margin_se"], 3) if c["margin_se"] else "", c["se_kind"]] for c in rows]), ""]


def supervision_lines(budgets: list[dict]) -> list[str]:
    """Which of PITA and Q# (the two value-guided methods a comparison sets side by side) trained
    on more examples, and by how much, per family and dataset: their difference at equal KL may
    be one of supervision as well as of method."""
    out = []
    by = {(b["family"], b["train_dataset"], b["algorithm"]): b for b in budgets}
    for (fam, ds, a), b in sorted(by.items()):
        q = by.get((fam, ds, "QSharp"))
        if a != "PITA" or q is None or not b.get("examples") or not q.get("examples"):
            continue
        pe, qe = int(b["examples"]), int(q["examples"])
        if pe == qe:
            out.append(f"PITA and Q# trained on equal examples on {fam} / {ds} ({pe}).")
        else:
            more, less = ("PITA", "Q#") if pe > qe else ("Q#", "PITA")
            out.append(f"Supervision on {fam} / {ds}: {more} trained on {max(pe, qe)} examples, {less} on "
                       f"{min(pe, qe)} ({max(pe, qe) / min(pe, qe):.2f}x); a difference between them is one of "
                       f"supervision as well as of method.")
    return out + ([""] if out else [])


def render(run: RunPaths, rows: list[dict] | None = None, roster: Roster | None = None,
           extras: dict | None = None) -> Path:
    """Write results/report.md (and the plots); returns its path. ``roster``: the algorithms'
    order, colours and which learn from preference pairs (the command line passes the
    registry's); without it, the order of the run's config.yaml."""
    roster = roster if roster is not None else Roster.of_run(run)
    state = json.loads(run.state.read_text()) if run.state.exists() else {"jobs": {}}
    f = run.results / "final_results.json"
    if rows is None or extras is None:
        from pita.report.results import read_results

        saved_rows, saved_extras = read_results(f) if f.exists() else ([], {})
        rows = saved_rows if rows is None else rows
        extras = saved_extras if extras is None else extras
    if rows and any("ci_method" not in r for r in rows):  # results written before intervals were stored
        add_intervals(rows, run)
    plots = run.results / "plots"
    plots.mkdir(parents=True, exist_ok=True)

    def result_of(jid):
        p = run.job(jid).result
        return json.loads(p.read_text()) if p.exists() else None

    lines = [f"# Run report: {run.root.parent.name} / {run.root.name}", ""]
    started = [j.get("started") for j in state["jobs"].values() if j.get("started")]
    finished = [j.get("finished") for j in state["jobs"].values() if j.get("finished")]
    counts: dict[str, int] = {}
    for j in state["jobs"].values():
        counts[j.get("state", "PENDING")] = counts.get(j.get("state", "PENDING"), 0) + 1
    wall = f"; {max(finished) - min(started):.0f} s of wall time" if started and finished else ""
    lines += [f"{len(state['jobs'])} jobs ({', '.join(f'{k.lower()} {v}' for k, v in sorted(counts.items()))}){wall}; "
              "the run's details under \"Run\" at the end.", ""]
    import os

    link = Path(os.path.relpath(run.config.resolve(), run.results.resolve())).as_posix()  # a report written elsewhere (--out) too
    run_lines = ["## Run", ""]
    if started and finished:
        run_lines.append(f"- first job started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(min(started)))}, "
                         f"last finished {time.strftime('%H:%M:%S', time.localtime(max(finished)))}: "
                         f"{max(finished) - min(started):.0f} s of wall time")
    run_lines.append(f"- configuration: [`config.yaml`]({link}) (the resolved config that ran; "
                     "`resume_from` reloads it)")
    run_lines += source_lines(state)
    run_lines += platform_lines(state)
    run_lines += oom_lines(state)
    run_lines.append("- files: `results/final_results.json`, `results/results.csv`, `results/cells/`, "
                     "`run.log`, `state.json`")
    run_lines.append("")
    lines.append("## Results")
    lines.append("")
    if rows:
        swept = swept_algorithms(rows)
        lines += matched_section(extras, roster)
        lines += reading_section(extras)
        lines.append(f"Every row evaluates {sample_counts(rows)}. {_interval_note(rows)}")
        lines.append("")
        lines += _fairness_notes(run, rows, swept, roster) + [""]
        lines += budget_section(extras.get("budgets") or [], roster)
        from pita.report.labels import label_table

        from pita.report.labels import returns_table, supervision_table

        quality = (label_table(extras.get("label_quality") or []) + supervision_table(extras.get("supervision") or [])
                   + returns_table(extras.get("returns_filter") or []))
        if quality:
            lines += ["### Label quality", ""] + quality
        lines += scorer_section(extras.get("scorers") or [], roster)
        lines += choice_section(extras.get("validation_choices") or [], roster)
        lines += ["### Last round, η chosen on validation", "", headline_table(rows, swept, roster), ""]
        if any(r["algorithm"] in swept for r in rows) and not any(r.get("selected") for r in rows
                                                                  if r["algorithm"] in swept):
            lines += ["Value-guided algorithms are missing above: no η was chosen (no validation prompts).", ""]
        lines += [f"### Every row ({len(rows)})", "", full_table(rows, swept, roster), ""]
        lines.append("KL is KL(pi || pi_ref) per sequence in nats, the mean over the evaluated samples of the exact "
                     "KL of the two next-token distributions at every step, summed along the sampled path (never "
                     "negative): the distribution each token was drawn from (after the nucleus when eval.top_p < 1) "
                     "against the same untruncated reference at the evaluation's temperature for every row, so the "
                     "base model's KL is 0 at top_p 1 and what its nucleus removes below it. KL/token divides the summed KL by the steps taken (tokens and EOS); \"KL log-ratio\" "
                     "is the older single-sample estimate, the mean of log pi(y|x) - log pi_ref(y|x). Value-guided "
                     "rows at η 0 are the reference itself: the base model's evaluation, reused. η is blank for "
                     "algorithms that do not sweep it.")
        lines.append("")
        for eds in sorted({r["eval_dataset"] for r in rows}):
            fp = plot_frontier(rows, eds, plots, roster, [c for c in (extras.get("kl_matched") or {}).get("cells", [])
                                                          if c["eval_dataset"] == eds])
            rp = plot_rounds(rows, eds, plots, roster)
            lines += [f"### {eds}", "", f"![frontier]({fp.relative_to(run.results)})",
                      f"![rounds]({rp.relative_to(run.results)})", ""]
    else:
        lines.append("No evaluation finished; see `python -m pita status` for what failed.")
        lines.append("")
    curves = training_curves(run.jobs_dir)
    if curves:
        lines += ["## Training", "", "Per step, from each training job's `jobs/<id>/metrics.jsonl`.", ""]
        for ds in sorted(curves):
            tp = plot_training(curves[ds], ds, plots, roster)
            if tp is not None:
                lines += [f"![training {ds}]({tp.relative_to(run.results)})", ""]
    lines.append("## Compute")
    lines.append("")
    comp = compute_table(state, result_of)
    lines.append(_md_table(["phase", "jobs", "wall s (sum)", "device-s", "tokens sampled", "peak RSS GiB"],
                           [[c["phase"], c["jobs"], _f(c["wall_s"], 1), _f(c["device_s"], 1), c["tokens"],
                             _f(c["peak_rss_gb"], 2)] for c in comp]))
    lines.append("")
    lines += duration_lines(state)
    tl = plot_timeline(state, plots, phase_of)
    if tl is not None:
        lines += [f"![timeline]({tl.relative_to(run.results)})", ""]
    failed = [(jid, j) for jid, j in sorted(state["jobs"].items()) if j.get("state") == "FAILED"]
    if failed:
        lines += ["## Failures", ""]
        lines += [f"- `{jid}`: {j.get('error')} (log: `{j.get('log')}`)" for jid, j in failed]
        lines.append("")
    lines += run_lines
    path = run.results / "report.md"
    path.write_text("\n".join(lines))
    return path
