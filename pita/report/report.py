"""``results/report.md`` and its plots, from what a run saved (results, state, config).

    python -m pita report outputs/NAME/<time>      re-render from the saved files

Plots (PNG, matplotlib, under ``results/plots/``):
    frontier_<eval dataset>.png   metric vs KL(policy || reference): one line per value-guided
                                  algorithm and round across eta, one point per trained baseline
                                  and round, the base model as a horizontal line
    rounds_<eval dataset>.png     metric vs round per algorithm (value-guided: the eta chosen on validation)
    timeline.png                  every job attempt as a bar on the device(s) it ran on
Compute accounting per phase (generation, training, evaluation, merges): jobs, wall time summed
over jobs, device-seconds (wall x devices held), tokens sampled, peak resident memory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pita.core.paths import RunPaths

def metric_of(row: dict) -> str:
    return "pass@1" if row.get("pass@1") is not None else "mean_reward"


def phase_of(job_id: str, kind: str) -> str:
    if kind == "generation.shard":
        return "evaluation" if ".eval." in job_id or ".val." in job_id else "generation"
    if kind.endswith("merge"):
        return "merge"
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
    order = ["generation", "training", "evaluation", "merge"]
    return sorted(acc.values(), key=lambda r: (order.index(r["phase"]) if r["phase"] in order else 99, r["phase"]))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _dataset_axes(rows: list[dict], eval_ds: str, figsize, base_label):
    """(plt, fig, ax, the dataset's rows, its metric), with the base model drawn as a line."""
    plt = _plt()
    rows = [r for r in rows if r["eval_dataset"] == eval_ds]
    m = metric_of(rows[0])
    fig, ax = plt.subplots(figsize=figsize)
    for b in [r for r in rows if r["algorithm"] == "base"]:
        ax.axhline(b[m], color="grey", ls="--", lw=1, label=base_label(b[m]))
    return plt, fig, ax, rows, m


def _save(plt, fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_frontier(rows: list[dict], eval_ds: str, out: Path) -> Path:
    plt, fig, ax, rows, m = _dataset_axes(rows, eval_ds, (8.5, 4.5), lambda v: f"base ({v:.3f})")
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["algorithm"] != "base":
            series.setdefault((r["algorithm"], r["round"]), []).append(r)
    for (algo, rnd), pts in sorted(series.items()):
        pts = sorted(pts, key=lambda r: float(r["eta"]))
        xs, ys = [float(r.get("kl") or 0.0) for r in pts], [r[m] for r in pts]
        ax.plot(xs, ys, "o-" if len(pts) > 1 else "s", ms=4, label=f"{algo} r{rnd}")
    return _save(plt, fig, ax, out / f"frontier_{eval_ds}.png", "KL(policy || reference), nats per sequence", m,
                 f"{eval_ds}: {m} vs KL (value-guided lines run over eta)")


def plot_rounds(rows: list[dict], eval_ds: str, out: Path) -> Path:
    plt, fig, ax, rows, m = _dataset_axes(rows, eval_ds, (7.5, 4), lambda v: "base")
    chosen: dict[str, dict[int, float]] = {}
    for r in rows:  # value-guided rows at the eta chosen on validation prompts, never the test's best
        if r["algorithm"] != "base" and r.get("selected"):
            chosen.setdefault(r["algorithm"], {})[r["round"]] = r[m]
    for algo, by in sorted(chosen.items()):
        rs = sorted(by)
        ax.plot(rs, [by[x] for x in rs], "o-", label=algo)
    return _save(plt, fig, ax, out / f"rounds_{eval_ds}.png", "round", f"{m} (value-guided: eta chosen on validation)",
                 f"{eval_ds}: {m} by round")


def plot_timeline(state: dict, out: Path) -> Path | None:
    plt = _plt()
    bars = []  # (lane, start, duration, phase)
    for jid, j in state.get("jobs", {}).items():
        for at in j.get("attempts", []):
            if not at.get("start"):
                continue
            devs = at.get("devices") or []
            lanes = [f"{d.get('kind', 'dev')}{d.get('index', '?')}" for d in devs] or ["host"]
            dur = float(at.get("duration_s") or (at.get("end") or at["start"]) - at["start"])
            for lane in lanes:
                bars.append((lane, at["start"], dur, phase_of(jid, j.get("kind", "")), at.get("status")))
    if not bars:
        return None
    t0 = min(b[1] for b in bars)
    lanes = sorted({b[0] for b in bars})
    colors = {"generation": "tab:blue", "training": "tab:orange", "evaluation": "tab:green", "merge": "tab:grey"}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(lanes)))
    for lane, start, dur, ph, status in bars:
        ax.barh(lanes.index(lane), dur, left=start - t0, height=0.6, color=colors.get(ph, "tab:purple"),
                edgecolor="red" if status not in (None, "ok") else "black", lw=0.3)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("seconds since the first job started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("jobs per device (failed attempts outlined in red)")
    path = out / "timeline.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _md_table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _f(v, nd=3) -> str:
    return "" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _fairness_notes(run: RunPaths, rows: list[dict], swept: set) -> list[str]:
    """What every row was given: the preference budget, and how eta was chosen."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(run.config)
        budget, val = cfg.data_collection.pairs_per_prompt, cfg.eval.validation_prompts
    except Exception:  # noqa: BLE001 - an unreadable config only loses these two lines
        return []
    out = []
    from pita.algos import ALGORITHMS

    pref = sorted(a for a in {r["algorithm"] for r in rows}
                  if a in ALGORITHMS and ALGORITHMS.get(a).uses_preference_pairs)
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


def render(run: RunPaths, rows: list[dict] | None = None) -> Path:
    """Write results/report.md (and the plots); returns its path."""
    state = json.loads(run.state.read_text()) if run.state.exists() else {"jobs": {}}
    if rows is None:
        f = run.results / "final_results.json"
        rows = json.loads(f.read_text()) if f.exists() else []
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
    lines.append(f"- jobs: {len(state['jobs'])} ({', '.join(f'{k.lower()} {v}' for k, v in sorted(counts.items()))})")
    if started and finished:
        lines.append(f"- first job started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(min(started)))}, "
                     f"last finished {time.strftime('%H:%M:%S', time.localtime(max(finished)))}: "
                     f"{max(finished) - min(started):.0f} s of wall time")
    lines.append(f"- files: `results/final_results.json`, `results/results.csv`, `results/cells/`, "
                 f"`run.log`, `state.json`")
    lines.append("")
    lines.append("## Results")
    lines.append("")
    if rows:
        swept = {r["algorithm"] for r in rows if float(r["eta"]) != 0.0}
        lines += _fairness_notes(run, rows, swept) + [""]
        tab = []
        for r in rows:
            m = metric_of(r)
            tab.append([r["algorithm"], r["family"], r["train_dataset"], r["round"], r["eval_dataset"],
                        _f(float(r["eta"]), 2) + (" (chosen)" if r.get("selected") and r["algorithm"] in swept else ""),
                        m, _f(r.get(m)), _f(r.get(m + "_stderr")),
                        _f(r.get("maj@n")), _f(r.get("kl")), _f(r.get("kl_stderr")), r.get("n", ""),
                        _f(r.get("train_device_s"), 0), _f(r.get("eval_device_s"), 0)])
        lines.append(_md_table(["algorithm", "family", "train", "round", "eval", "eta", "metric", "value", "stderr",
                                "maj@n", "KL", "KL stderr", "n", "train dev-s", "eval dev-s"], tab))
        lines.append("")
        lines.append("KL is a Monte Carlo estimate over the evaluated samples of log pi(y|x) - log pi_ref(y|x) "
                     "(0 for the base model), against the same untruncated reference for every row; value-guided "
                     "rows at eta 0 are the reference itself: the base model's evaluation, reused.")
        lines.append("")
        for eds in sorted({r["eval_dataset"] for r in rows}):
            fp = plot_frontier(rows, eds, plots)
            rp = plot_rounds(rows, eds, plots)
            lines += [f"### {eds}", "", f"![frontier]({fp.relative_to(run.results)})",
                      f"![rounds]({rp.relative_to(run.results)})", ""]
    else:
        lines.append("No evaluation finished; see `python -m pita status` for what failed.")
        lines.append("")
    lines.append("## Compute")
    lines.append("")
    comp = compute_table(state, result_of)
    lines.append(_md_table(["phase", "jobs", "wall s (sum)", "device-s", "tokens sampled", "peak RSS GiB"],
                           [[c["phase"], c["jobs"], _f(c["wall_s"], 1), _f(c["device_s"], 1), c["tokens"],
                             _f(c["peak_rss_gb"], 2)] for c in comp]))
    lines.append("")
    tl = plot_timeline(state, plots)
    if tl is not None:
        lines += [f"![timeline]({tl.relative_to(run.results)})", ""]
    failed = [(jid, j) for jid, j in sorted(state["jobs"].items()) if j.get("state") == "FAILED"]
    if failed:
        lines += ["## Failures", ""]
        lines += [f"- `{jid}`: {j.get('error')} (log: `{j.get('log')}`)" for jid, j in failed]
        lines.append("")
    if run.config.exists():
        lines += ["## Configuration", "", "```yaml", run.config.read_text().rstrip(), "```", ""]
    path = run.results / "report.md"
    path.write_text("\n".join(lines))
    return path
