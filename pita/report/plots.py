"""The report's plots (PNG, matplotlib), drawn from the results rows and the run's saved files.

    frontier_<eval dataset>.png  metric vs KL(policy || reference): one line per value-guided
                                 algorithm and round across eta (eta written at each point, the
                                 chosen eta ringed), one point per trained baseline and round,
                                 the base model as a line with its interval as a band
    rounds_<eval dataset>.png    metric vs round per algorithm (value-guided: the eta chosen on
                                 validation, written at each point)
    training_<train dataset>.png loss, reward and KL per step of every training job, from its
                                 ``metrics.jsonl``
    timeline.png                 every job attempt as a bar on the device(s) it ran on

Every plot uses one colour per algorithm and one marker and line style per round, the same in
every file; every point carries its 95% interval (``<metric>_ci_lo/_hi``, ``kl_ci_lo/_hi``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pita.report.intervals import metric_of
from pita.report.roster import BASE_COLOUR, Roster

# (marker, line style) of rounds 0, 1, 2, ...
ROUND_STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1))), ("P", (0, (3, 1, 1, 1)))]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def round_style(rnd) -> tuple:
    return ROUND_STYLES[int(rnd) % len(ROUND_STYLES)]


def _err(values, los, his):
    """Matplotlib's asymmetric error array; a missing interval draws no bar."""
    lo = [max(0.0, v - lo) if lo is not None and v is not None else 0.0 for v, lo in zip(values, los)]
    hi = [max(0.0, hi - v) if hi is not None and v is not None else 0.0 for v, hi in zip(values, his)]
    return [lo, hi]


def _legends(ax, plt, algos: list[str], rounds: list, roster: Roster, extra: list = ()):
    """Two legends outside the axes: colour = algorithm, marker and line style = round."""
    from matplotlib.lines import Line2D

    h1 = [Line2D([], [], color=roster.colour(a), lw=2.5, label=a) for a in algos] + list(extra)
    leg = ax.legend(handles=h1, title="algorithm", fontsize=7, title_fontsize=7, loc="upper left",
                    bbox_to_anchor=(1.01, 1.0))
    ax.add_artist(leg)
    leg.set_clip_on(False)  # add_artist clips to the axes, which would cut a legend placed beside them
    if rounds:
        h2 = [Line2D([], [], color="black", marker=round_style(r)[0], ls=round_style(r)[1], ms=5, label=f"round {r}")
              for r in rounds]
        ax.legend(handles=h2, title="round", fontsize=7, title_fontsize=7, loc="lower left",
                  bbox_to_anchor=(1.01, 0.0))


def _base(ax, rows: list[dict], m: str, with_point: bool):
    """The base model: a dashed line at its value, its interval as a band; returns legend handles."""
    from matplotlib.lines import Line2D

    out = []
    for b in rows:
        if b["algorithm"] != "base":
            continue
        ax.axhline(b[m], color=BASE_COLOUR, ls="--", lw=1)
        lo, hi = b.get(f"{m}_ci_lo"), b.get(f"{m}_ci_hi")
        if lo is not None and hi is not None:
            ax.axhspan(lo, hi, color=BASE_COLOUR, alpha=0.12, lw=0)
        if with_point:
            ax.plot([b.get("kl") or 0.0], [b[m]], marker="*", color=BASE_COLOUR, ms=10, ls="none")
        out.append(Line2D([], [], color=BASE_COLOUR, ls="--", marker="*" if with_point else None,
                          label=f"base {b[m]:.3f} (band: 95% CI)"))
    return out


def point_label(r: dict) -> str:
    """A point's label: its variant (a control's T=0.7 or n=4, a grid's lr=1e-05), else its η."""
    return str(r["variant"]) if r.get("variant") else f"η={float(r['eta']):g}"


def swept_algorithms(rows: list[dict]) -> set:
    """Algorithms whose rows sweep eta (value-guided): eta is meaningful only for them."""
    return {r["algorithm"] for r in rows if r["algorithm"] != "base" and float(r["eta"]) != 0.0}


def _x_scale(ax, xs: list[float]) -> str:
    """Symmetric-log x when the largest KL is far beyond the bulk (over 3x the 75th percentile),
    so that one outlier does not squeeze every other point against the axis."""
    pos = sorted(abs(x) for x in xs if x is not None and abs(x) > 0)
    if len(pos) < 4:
        return "linear"
    p75 = pos[(3 * len(pos)) // 4]
    if pos[-1] > 3 * p75:
        from matplotlib.ticker import FixedLocator, FuncFormatter

        lin = max(p75 / 4, 1e-3)
        ax.set_xscale("symlog", linthresh=lin, linscale=0.6)
        ticks = [0] + [t for t in (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100) if 0.9 * lin <= t <= pos[-1] * 1.5]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        return "symlog"
    return "linear"


def _save(fig, plt, path: Path) -> Path:
    # bbox_inches: the legends sit outside the axes and must not be cut off
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_frontier(rows: list[dict], eval_ds: str, out: Path, roster: Roster = Roster(),
                  matched: list[dict] | None = None) -> Path:
    """One panel per round (same y axis): each algorithm's points of that round, value-guided
    ones joined across eta with eta written beside each point (eta 0 is the base model's star).
    ``matched`` (the KL-matched cells of this dataset, pita/report/matched.py): the KL budgets as
    dotted vertical lines on every panel, and each method's value at each budget where it was
    measured or interpolated between two points of a series placed by validation KL (never a
    chord from the base or a wide interpolation) as a hollow diamond on the last panel."""
    from matplotlib.lines import Line2D

    plt = _plt()
    rows = [r for r in rows if r["eval_dataset"] == eval_ds]
    m = metric_of(rows[0])
    swept = swept_algorithms(rows)
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["algorithm"] != "base":
            series.setdefault((r["algorithm"], r["train_dataset"], int(r["round"])), []).append(r)
    order = roster.order({a for a, _, _ in series})
    rounds = sorted({k[2] for k in series}) or [0]
    fig, axes = plt.subplots(1, len(rounds), figsize=(4.6 * len(rounds) + 0.8, 4.6), sharey=True, squeeze=False)
    xs_all = [float(r.get("kl") or 0.0) for r in rows]
    extra = []
    for ax, rnd in zip(axes[0], rounds):
        extra = _base(ax, rows, m, with_point=True)
        for (algo, train, rr), pts in sorted(series.items(), key=lambda kv: (order.index(kv[0][0]),) + kv[0][1:]):
            if rr != rnd:
                continue
            pts = sorted(pts, key=lambda r: float(r["eta"]))
            xs, ys = [float(r.get("kl") or 0.0) for r in pts], [r[m] for r in pts]
            marker, ls = round_style(rnd)
            c = roster.colour(algo)
            ax.errorbar(xs, ys, yerr=_err(ys, [r.get(f"{m}_ci_lo") for r in pts], [r.get(f"{m}_ci_hi") for r in pts]),
                        xerr=_err(xs, [r.get("kl_ci_lo") for r in pts], [r.get("kl_ci_hi") for r in pts]),
                        color=c, marker=marker, ls=ls if len(pts) > 1 else "none", ms=5, lw=1.3, elinewidth=0.7,
                        capsize=1.5, alpha=0.85)
            if algo in swept:
                for r, x, y in zip(pts, xs, ys):
                    if float(r["eta"]) != 0.0:
                        ax.annotate(point_label(r), (x, y), textcoords="offset points", xytext=(4, 3),
                                    fontsize=6.5, color=c)
                    if r.get("selected"):
                        ax.plot([x], [y], marker="o", ms=12, mfc="none", mec=c, mew=1.4, ls="none")
        for b in sorted({c["kl_budget"] for c in matched or []}):
            ax.axvline(b, color="grey", ls=":", lw=0.8, alpha=0.7)
        if matched:  # so that every budget line is inside the axes
            ax.plot([max(c["kl_budget"] for c in matched)], [rows[0][m]], alpha=0.0)
        if rnd == rounds[-1]:
            for c in matched or []:
                if c.get("kind", "measured" if c.get("reached") else "") in ("measured", "interpolated") \
                        and c.get("value") is not None:
                    ax.plot([c["kl_budget"]], [c["value"]], marker="D", ms=6, mfc="none", mec=roster.colour(c["algorithm"]),
                            mew=1.2, ls="none")
        scale = _x_scale(ax, xs_all + [c["kl_budget"] for c in matched or []])
        ax.set_title(f"round {rnd}", fontsize=9)
        ax.set_xlabel("KL(policy || reference), nats/sequence" + ("\n(symmetric log scale)" if scale != "linear" else ""),
                      fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"{m} (error bars: 95% CI)")
    if swept:
        extra.append(Line2D([], [], marker="o", ms=10, mfc="none", mec="black", ls="none",
                            label="η chosen on validation"))
    if matched:
        extra.append(Line2D([], [], color="grey", ls=":", label="KL budgets"))
        extra.append(Line2D([], [], marker="D", ms=6, mfc="none", mec="black", ls="none",
                            label="value at a KL (placed by validation KL)"))
    _legends(axes[0][-1], plt, order, rounds, roster, extra)
    fig.suptitle(f"{eval_ds}: {m} vs KL to the reference (value-guided: one line across η)", fontsize=10)
    fig.tight_layout()
    return _save(fig, plt, out / f"frontier_{eval_ds}.png")


def plot_rounds(rows: list[dict], eval_ds: str, out: Path, roster: Roster = Roster()) -> Path:
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    rows = [r for r in rows if r["eval_dataset"] == eval_ds]
    m = metric_of(rows[0])
    swept = swept_algorithms(rows)
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    extra = _base(ax, rows, m, with_point=False)
    chosen: dict[tuple, list[dict]] = {}
    for r in rows:  # value-guided rows at the eta chosen on validation prompts, never the test's best
        if r["algorithm"] != "base" and r.get("selected"):
            chosen.setdefault((r["algorithm"], r["train_dataset"]), []).append(r)
    order = roster.order({a for a, _ in chosen})
    n_algos = max(1, len(order))
    all_rounds = sorted({int(r["round"]) for pts in chosen.values() for r in pts})
    for (algo, train), pts in sorted(chosen.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        pts = sorted(pts, key=lambda r: int(r["round"]))
        # a small sideways shift per algorithm keeps overlapping error bars apart
        shift = (order.index(algo) - (n_algos - 1) / 2) * 0.04
        xs, ys = [int(r["round"]) + shift for r in pts], [r[m] for r in pts]
        c = roster.colour(algo)
        ax.plot(xs, ys, color=c, lw=1.2)
        for r, x, y in zip(pts, xs, ys):
            marker, _ = round_style(r["round"])
            ax.errorbar([x], [y], yerr=_err([y], [r.get(f"{m}_ci_lo")], [r.get(f"{m}_ci_hi")]), color=c,
                        marker=marker, ms=5, capsize=2, elinewidth=0.8, ls="none")
            if algo in swept:
                ax.annotate(point_label(r), (x, y), textcoords="offset points", xytext=(5, 3), fontsize=6,
                            color=c)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if all_rounds:
        ax.set_xticks(all_rounds)
        ax.set_xlim(min(all_rounds) - 0.5, max(all_rounds) + 0.5)
    _legends(ax, plt, order, all_rounds, roster, extra)
    ax.set_xlabel("round (algorithms set slightly apart so that their error bars do not overlap)", fontsize=8)
    ax.set_ylabel(f"{m} (error bars: 95% CI)")
    ax.set_title(f"{eval_ds}: {m} by round (value-guided: η chosen on validation)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, plt, out / f"rounds_{eval_ds}.png")


# ---------------------------------------------------------------- training curves
# panel -> (title, which jobs, key in metrics.jsonl). "value" jobs are the value-model trainer's
# (pita/guidance/train.py: rows without a learning rate), "policy" jobs TRL's (DPO, GRPO, GRPO-HF)
PANELS = {
    "value": ("value model loss (PITA, Q#, Q#-HF)", "value", "loss"),
    "proxy": ("proxy reward model loss (Bradley-Terry)", "proxy", "loss"),
    "policy": ("policy loss (TRL)", "policy", "loss"),
    "reward": ("GRPO: mean reward of the sampled group", "policy", "reward"),
    "margin": ("DPO: implicit reward margin (chosen - rejected)", "policy", "rewards/margins"),
    "kl": ("GRPO: KL to its reference per step", "policy", "kl"),
}


def _job_kind(stage: str, rows: list[dict]) -> str:
    if stage == "proxy":
        return "proxy"
    return "policy" if any("learning_rate" in r for r in rows) else "value"


def parse_training_job(job_id: str):
    """(algorithm, family, train dataset, round, stage, arm) of
    ``<algo>.<family>.<dataset>[.<arm>].r<N>.<train|proxy>`` (the arm of a grid, e.g. ``lr1e-05``;
    "" without one), else None."""
    parts = job_id.split(".")
    if len(parts) == 6:
        arm = parts.pop(3)
    elif len(parts) == 5:
        arm = ""
    else:
        return None
    if parts[4] not in ("train", "proxy") or not parts[3][1:].isdigit() or parts[3][0] != "r":
        return None
    return parts[0], parts[1], parts[2], int(parts[3][1:]), parts[4], arm


def read_metrics(path: Path) -> list[dict]:
    """Rows of a ``metrics.jsonl`` that have a step (TRL's closing summary row has none of the curves)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row and "train_runtime" not in row:
            out.append(row)
    return out


def training_curves(jobs_dir: Path) -> dict[str, dict[tuple, list[dict]]]:
    """{train dataset: {(algorithm, round, stage, arm): metric rows}} of every training job with metrics."""
    out: dict[str, dict[tuple, list[dict]]] = {}
    if not jobs_dir.exists():
        return out
    for d in sorted(jobs_dir.iterdir()):
        key = parse_training_job(d.name)
        f = d / "metrics.jsonl"
        if key is None or not f.exists():
            continue
        rows = read_metrics(f)
        if rows:
            algo, _fam, ds, rnd, stage, arm = key
            out.setdefault(ds, {})[(algo, rnd, stage, arm)] = rows
    return out


def plot_training(curves: dict[tuple, list[dict]], dataset: str, out: Path, roster: Roster = Roster()) -> Path | None:
    """``training_<dataset>.png``: one panel per quantity that some job logged, one line per job."""
    plt = _plt()
    order = roster.order({k[0] for k in curves})
    panels = []  # (title, [(algo, rnd, arm, xs, ys)])
    for title, kind, key in PANELS.values():
        lines = []
        for (algo, rnd, stage, arm), rows in sorted(curves.items(),
                                                    key=lambda kv: (order.index(kv[0][0]), kv[0][1], kv[0][3])):
            if _job_kind(stage, rows) != kind:
                continue
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))
                   and not isinstance(r.get(key), bool) and math.isfinite(r[key])]
            if pts:
                lines.append((algo, rnd, arm, [p[0] for p in pts], [p[1] for p in pts]))
        if lines:
            panels.append((title, lines))
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols + 1.8, 3.4 * nrows), squeeze=False)
    algos, rounds = set(), set()
    flat = [ax for row in axes for ax in row]
    for ax, (title, lines) in zip(flat, panels):
        for algo, rnd, arm, xs, ys in lines:
            marker, ls = round_style(rnd)
            ax.plot(xs, ys, color=roster.colour(algo), ls=ls, marker=marker, ms=3, markevery=max(1, len(xs) // 8),
                    lw=1.0)
            if arm:  # the arms of a grid share their method's colour: each line's end names its arm
                ax.annotate(arm, (xs[-1], ys[-1]), fontsize=6, color=roster.colour(algo),
                            xytext=(2, 0), textcoords="offset points", va="center")
            algos.add(algo)
            rounds.add(rnd)
        if any(line[2] for line in lines):
            ax.margins(x=0.14)  # room for the arms' names at the lines' ends
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    _legends(flat[cols - 1], plt, roster.order(algos), sorted(rounds), roster)
    fig.suptitle(f"training on {dataset}: each training job's logged metrics per step (jobs/<id>/metrics.jsonl)",
                 fontsize=10)
    fig.tight_layout()
    return _save(fig, plt, out / f"training_{dataset}.png")


# ---------------------------------------------------------------- timeline
def plot_timeline(state: dict, out: Path, phase_of) -> Path | None:
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
    colors = {"model build": "tab:purple", "generation": "tab:blue", "training": "tab:orange",
              "evaluation": "tab:green", "merge": "tab:grey"}
    spare = iter(["tab:brown", "tab:pink", "tab:olive", "tab:cyan", "black"])
    for ph in sorted({b[3] for b in bars} - set(colors)):  # a phase of a plug-in's job kinds
        colors[ph] = next(spare, "black")
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(lanes)))
    for lane, start, dur, ph, status in bars:
        ax.barh(lanes.index(lane), dur, left=start - t0, height=0.6, color=colors[ph],
                edgecolor="red" if status not in (None, "ok") else "black", lw=0.3)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("seconds since the first job started")
    shown = [ph for ph in colors if any(b[3] == ph for b in bars)]  # every colour drawn, and only those
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[ph]) for ph in shown]
    ax.legend(handles, shown, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("jobs per device (failed attempts outlined in red)")
    fig.tight_layout()
    return _save(fig, plt, out / "timeline.png")
