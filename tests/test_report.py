"""results/report.md and its plots, from a run's saved files; `python -m pita report`."""

import json
import subprocess
import sys

import pytest

from pita.core.paths import RunPaths


def _row(algo, rnd, eta, value, kl, ds="arith"):
    m = "pass@1" if ds == "arith" else "mean_reward"
    return {"algorithm": algo, "family": "tiny", "train_dataset": ds, "round": rnd, "eval_dataset": ds,
            "eta": eta, m: value, f"{m}_stderr": 0.01, "kl": kl, "kl_stderr": 0.001, "n": 4, "prompts": 8}


def _attempt(start, dur, dev, status="ok"):
    devices = [{"kind": "cpu", "index": dev}] if dev is not None else []
    return {"attempt": 1, "start": start, "end": start + dur, "duration_s": dur, "devices": devices,
            "status": status, "peak_rss_bytes": 2**30}


@pytest.fixture()
def run(tmp_path):
    run = RunPaths(tmp_path / "exp" / "2026-01-01_00-00-00")
    run.root.mkdir(parents=True)
    rows = [_row("base", 0, 0.0, 0.25, 0.0), _row("PITA", 0, 0.0, 0.26, 0.0), _row("PITA", 0, 2.0, 0.30, 0.1),
            _row("PITA", 1, 2.0, 0.31, 0.12), _row("DPO", 0, 0.0, 0.27, 0.2), _row("DPO", 1, 0.0, 0.28, 0.3),
            _row("base", 0, 0.0, -0.2, 0.0, ds="sentiment"), _row("GRPO", 0, 0.0, 1.5, 0.4, ds="sentiment")]
    run.results.mkdir()
    (run.results / "final_results.json").write_text(json.dumps(rows))
    jobs = {
        "PITA.tiny.arith.r0.gen.s0": {"kind": "generation.shard", "state": "COMPLETED", "attempts": [_attempt(0, 10, 0)]},
        "PITA.tiny.arith.r0.train": {"kind": "algo.value_train", "state": "COMPLETED",
                                     "attempts": [_attempt(10, 20, 1)]},
        "DPO.tiny.arith.r0.train": {"kind": "algo.dpo_train", "state": "FAILED", "error": "boom", "log": "x/job.log",
                                    "attempts": [_attempt(10, 5, 0, "error")]},
        "PITA.tiny.arith.r0.eval.s0": {"kind": "generation.shard", "state": "COMPLETED",
                                       "attempts": [_attempt(30, 4, 0)]},
        "PITA.tiny.arith.r0.eval.merge": {"kind": "eval.merge", "state": "COMPLETED",
                                          "attempts": [_attempt(34, 1, None)]},
    }
    run.state.write_text(json.dumps({"jobs": jobs}))
    (run.root / "config.yaml").write_text("experiment:\n  name: exp\n")
    jp = run.job("PITA.tiny.arith.r0.gen.s0")
    jp.dir.mkdir(parents=True)
    jp.result.write_text(json.dumps({"chunks": [0, 1], "records": 8, "tokens": 321}))
    return run


def test_the_report_has_the_table_the_plots_compute_failures_and_config(run):
    from pita.report.report import render

    path = render(run)
    text = path.read_text()
    assert "| PITA | tiny | arith | arith | 1 | 2 | pass@1 | 0.310 | [0.290, 0.330] |" in text  # no records: +-1.96 se
    assert "value ± 1.96 stderr" in text
    for png in ("frontier_arith", "frontier_sentiment", "rounds_arith", "rounds_sentiment", "timeline"):
        f = run.results / "plots" / f"{png}.png"
        assert f.stat().st_size > 1000 and f.read_bytes()[:4] == b"\x89PNG"
        assert f"plots/{png}.png" in text
    assert "| generation | 1 | 10.0 | 10.0 | 321 | 1.00 |" in text
    assert "| training | 2 | 25.0 | 25.0 | 0 |" in text
    assert "`DPO.tiny.arith.r0.train`: boom (log: `x/job.log`)" in text
    assert "[`config.yaml`](../config.yaml)" in text and "name: exp" not in text  # linked, not dumped


def test_compute_accounting_counts_device_seconds_over_every_device_held(run):
    from pita.report.report import compute_table

    state = json.loads(run.state.read_text())
    state["jobs"]["PITA.tiny.arith.r0.train"]["attempts"][0]["devices"].append({"kind": "cpu", "index": 0})
    by = {r["phase"]: r for r in compute_table(state, lambda jid: None)}
    assert by["training"]["wall_s"] == 25.0 and by["training"]["device_s"] == 45.0


def test_pita_report_rerenders_from_the_command_line_and_refuses_a_missing_run(run, tmp_path):
    (run.results / "report.md").unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-m", "pita", "report", str(run.root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (run.results / "report.md").exists()
    r = subprocess.run([sys.executable, "-m", "pita", "report", str(tmp_path / "nope")], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "nope" in r.stderr


def test_each_row_carries_the_compute_behind_it():
    from pita.report.results import add_compute

    def job(kind, dur, ndev=1):
        return {"kind": kind, "state": "COMPLETED",
                "attempts": [{"duration_s": dur, "devices": [{}] * ndev}]}

    state = {"jobs": {
        "PITA.tiny.arith.r0.gen.s0": job("generation.shard", 10), "PITA.tiny.arith.r0.gen.merge": job("generation.merge", 1, 0),
        "PITA.tiny.arith.r0.train": job("algo.value_train", 20), "PITA.tiny.arith.r1.gen.s0": job("generation.shard", 30),
        "PITA.tiny.arith.r1.train": job("algo.value_train", 40, 2),
        "PITA.tiny.arith.r1.eval.s0": job("generation.shard", 12), "PITA.tiny.arith.r1.eval-sentiment.s0": job("generation.shard", 99),
        "base.tiny.arith.eval.s0": job("generation.shard", 7)}}
    rows = [_row("PITA", 1, 0.0, 0.3, 0.0), _row("PITA", 1, 2.0, 0.3, 0.1), _row("PITA", 0, 2.0, 0.3, 0.1),
            _row("base", 0, 0.0, 0.25, 0.0)]
    tokens = {"PITA.tiny.arith.r0.gen.s0": 100, "PITA.tiny.arith.r1.gen.s0": 50}
    add_compute(rows, state, lambda jid: {"tokens": tokens.get(jid, 0)})
    assert rows[0]["train_device_s"] == 10 + 1 + 20 + 30 + 80 and rows[0]["tokens"] == 150
    assert rows[0]["eval_device_s"] == 6.0  # 12 device-s over the two etas evaluated together
    assert rows[2]["train_device_s"] == 31 and rows[2]["tokens"] == 100 and rows[2]["eval_device_s"] == 0
    assert rows[3]["train_device_s"] == 0 and rows[3]["eval_device_s"] == 7


def test_shared_round_zero_data_counts_towards_every_row_that_used_it():
    from pita.report.results import add_compute

    def job(kind, dur, deps=()):
        return {"kind": kind, "state": "COMPLETED", "deps": list(deps), "attempts": [{"duration_s": dur, "devices": [{}]}]}

    d = "data.tiny.arith.r0.value_rollouts-abc123"
    state = {"jobs": {f"{d}.s0": job("generation.shard", 10), f"{d}.merge": job("generation.merge", 1, [f"{d}.s0"]),
                      "PITA.tiny.arith.r0.train": job("algo.value_train", 20, [f"{d}.merge"]),
                      "QSharp.tiny.arith.r0.train": job("algo.value_train", 5, [f"{d}.merge"])}}
    rows = [_row("PITA", 0, 2.0, 0.3, 0.1), _row("QSharp", 0, 2.0, 0.3, 0.1)]
    add_compute(rows, state, lambda jid: {"tokens": 100 if jid == f"{d}.s0" else 0})
    assert [r["train_device_s"] for r in rows] == [31, 16] and [r["tokens"] for r in rows] == [100, 100]


# ---------------------------------------------------------------- intervals, headline, full table
def test_bootstrap_draws_are_paired_and_reproduce_the_point_estimate_of_constant_columns():
    """Prompts with (num, den) = (1, 1) and (3, 3): every draw's ratio is 1. Two identical
    columns drawn together differ by exactly 0 in every draw (paired), and the seed fixes the draws."""
    from pita.eval.metrics import bootstrap_ratios, percentile_interval

    d = bootstrap_ratios({"a": ([1, 3], [1, 3])}, resamples=50, seed=3)
    assert d["a"] == [1.0] * 50
    d = bootstrap_ratios({"b": ([0.0, 1.0, 0.5], [1, 1, 1]), "c": ([0.0, 1.0, 0.5], [1, 1, 1])}, resamples=200, seed=3)
    assert all(x - y == 0 for x, y in zip(d["b"], d["c"]))
    assert d == bootstrap_ratios({"b": ([0.0, 1.0, 0.5], [1, 1, 1]), "c": ([0.0, 1.0, 0.5], [1, 1, 1])},
                                 resamples=200, seed=3)
    lo, hi = percentile_interval(d["b"])
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    with pytest.raises(ValueError, match="different numbers of prompts"):
        bootstrap_ratios({"a": ([1], [1]), "b": ([1, 2], [1, 1])})


PROMPTS, SAMPLES = 24, 4


def _records(p_correct, eta, logp_gap=0.0, seed=0):
    """Per-sample records of one evaluation: prompt i's samples are correct with probability p_correct(i)."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(PROMPTS):
        for s in range(SAMPLES):
            ok = rng.random() < p_correct(i)
            out.append({"id": f"q{i:02d}", "eta": eta, "sample": s, "correct": ok, "extracted": "1" if ok else "2",
                        "logp": -5.0 + logp_gap * (1 + (i % 3)), "logp_ref": -5.0})
    return out


def _eval_job(run, jid, labels, by_eta: dict, reused: dict | None = None):
    """An eval.merge's saved records and result, as pita/eval/jobs.py writes them."""
    from datasets import Dataset

    from pita.eval.metrics import summarize

    results, records = [], []
    if reused:
        results.append({**reused, **labels, "eta": 0.0, "reused_from": "base.tiny.arith.eval.merge"})
    for eta, recs in by_eta.items():
        records += recs
        groups = {}
        for r in recs:
            groups.setdefault(r["id"], []).append(r)
        results.append({**labels, "eta": eta, **summarize([groups[k] for k in sorted(groups)], "math")})
    jp = run.job(jid)
    jp.dir.mkdir(parents=True)
    if records:
        Dataset.from_list(records).save_to_disk(str(jp.artifacts / "data"))
    jp.result.write_text(json.dumps({"labels": labels, "results": results}))
    return results


@pytest.fixture()
def recorded_run(tmp_path):
    """base; PITA rounds 0-1 sweeping eta {0, 1, 2} with validation choosing 2 in round 1; DPO rounds 0-1.
    PITA r1 at eta 2 is the base model's samples with prompts 0-5 made correct: it never loses a prompt."""
    run = RunPaths(tmp_path / "exp" / "2026-01-01_00-00-00")
    run.results.mkdir(parents=True)
    lab = lambda a, r, split=None: {"algorithm": a, "family": "tiny", "train_dataset": "arith", "round": r,  # noqa: E731
                                    "eval_dataset": "arith", "task": "math", **({"split": split} if split else {})}
    base_p = lambda i: 0.2 + 0.6 * (i % 5) / 4  # noqa: E731
    base_recs = _records(base_p, 0.0, seed=1)
    base_row = _eval_job(run, "base.tiny.arith.eval.merge", lab("base", 0), {0.0: base_recs})[0]
    better = [{**r, "eta": 2.0, "correct": r["correct"] or int(r["id"][1:]) < 6, "logp": r["logp"] + 0.3}
              for r in base_recs]
    _eval_job(run, "PITA.tiny.arith.r0.eval.merge", lab("PITA", 0),
              {1.0: _records(base_p, 1.0, 0.1, seed=2), 2.0: _records(base_p, 2.0, 0.2, seed=3)}, reused=base_row)
    _eval_job(run, "PITA.tiny.arith.r1.eval.merge", lab("PITA", 1),
              {1.0: _records(base_p, 1.0, 0.1, seed=4), 2.0: better}, reused=base_row)
    for r in (0, 1):
        _eval_job(run, f"PITA.tiny.arith.r{r}.val.merge", lab("PITA", r, "validation"),
                  {0.0: _records(lambda i: 0.3, 0.0, seed=5), 1.0: _records(lambda i: 0.6 - 0.4 * r, 1.0, seed=6),
                   2.0: _records(lambda i: 0.2 + 0.5 * r, 2.0, seed=7)})
        _eval_job(run, f"DPO.tiny.arith.r{r}.eval.merge", lab("DPO", r), {0.0: _records(base_p, 0.0, 0.5, seed=8 + r)})
    jobs = {d.name: {"kind": "eval.merge", "state": "COMPLETED", "attempts": []} for d in run.jobs_dir.iterdir()}
    run.state.write_text(json.dumps({"jobs": jobs}))
    (run.root / "config.yaml").write_text("experiment:\n  name: exp\n  datasets: [arith]\nsystem:\n  seed: 0\n"
                                          "datasets:\n  arith:\n    path: null\n")
    return run


def test_every_row_carries_bootstrap_intervals_and_a_paired_gain(recorded_run):
    from pita.report import results

    rows = results.write(recorded_run)
    by = {(r["algorithm"], r["round"], r["eta"]): r for r in rows}
    for r in rows:
        assert r["ci_method"].startswith("bootstrap")
        assert r["pass@1_ci_lo"] <= r["pass@1"] <= r["pass@1_ci_hi"] and r["pass@1_ci_lo"] < r["pass@1_ci_hi"]
        assert r["kl_ci_lo"] <= r["kl"] <= r["kl_ci_hi"]
    base, best = by[("base", 0, 0.0)], by[("PITA", 1, 2.0)]
    assert "gain" not in base and best["selected"] and not by[("PITA", 1, 1.0)]["selected"]
    assert best["gain"] == pytest.approx(best["pass@1"] - base["pass@1"]) and best["gain"] > 0
    # paired: the row never loses a prompt to the base, so no resample shows a loss; an interval that
    # treated the two as independent would reach well below 0
    assert 0.0 <= best["gain_ci_lo"] < best["gain"] < best["gain_ci_hi"]
    independent = best["gain"] - 1.96 * (best["pass@1_stderr"] ** 2 + base["pass@1_stderr"] ** 2) ** 0.5
    assert independent < 0
    # eta 0 is the base model's evaluation: its records, the same interval, a gain of exactly 0
    reused = by[("PITA", 1, 0.0)]
    assert (reused["pass@1_ci_lo"], reused["pass@1_ci_hi"]) == (base["pass@1_ci_lo"], base["pass@1_ci_hi"])
    assert reused["gain"] == reused["gain_ci_lo"] == reused["gain_ci_hi"] == 0.0
    csv_header = (recorded_run.results / "results.csv").read_text().splitlines()[0]
    assert "pass@1_ci_lo" in csv_header and "gain_ci_hi" in csv_header


def test_the_report_opens_with_the_headline_then_every_row_sorted(recorded_run):
    from pita.cli.report import algorithm_roster
    from pita.report import results
    from pita.report.report import render

    rows = results.write(recorded_run)
    by = {(r["algorithm"], r["round"], r["eta"]): r for r in rows}
    text = render(recorded_run, rows, algorithm_roster()).read_text()
    matched = text[text.index("### Headline: every method at equal KL"):text.index("### Last round, η chosen")]
    assert [ln.split(" | ")[0][2:] for ln in matched.splitlines() if ln.startswith("| ")][:4] == [
        "algorithm", "base (KL 0)", "PITA", "DPO"]
    # the first screen is the headline table: it starts within the report's first lines, and each of its
    # cells is a value, an interval and a short mark (the reasons are numbered notes below it)
    first = text.splitlines()
    top = next(i for i, ln in enumerate(first) if ln.startswith("| algorithm"))
    assert top < 15, first[:top]
    table = first[top:first.index("", top)]
    assert max(len(c.strip()) for ln in table for c in ln.split("|")[1:-1]) <= 40, table
    head = text[text.index("### Last round, η chosen"):text.index("### Every row")]
    lines = [ln for ln in head.splitlines() if ln.startswith("| arith")]
    assert [ln.split(" | ")[1] for ln in lines] == ["base", "PITA", "DPO"]  # base first, then registry order
    best, dpo = by[("PITA", 1, 2.0)], by[("DPO", 1, 0.0)]
    assert (f"| arith | PITA | 1 | 2 (chosen) | pass@1 | {best['pass@1']:.3f} [{best['pass@1_ci_lo']:.3f}, "
            f"{best['pass@1_ci_hi']:.3f}] | {best['kl']:.3f} [{best['kl_ci_lo']:.3f}, {best['kl_ci_hi']:.3f}] | "
            f"{best['kl_per_token']:.4f} | {best['gain']:+.3f} [{best['gain_ci_lo']:+.3f}, {best['gain_ci_hi']:+.3f}] |") in head
    assert f"| arith | DPO | 1 |  | pass@1 | {dpo['pass@1']:.3f} [" in head  # no eta for a baseline
    assert "| arith | base |  |  | pass@1 |" in head and "(reference)" in head
    assert f"{PROMPTS} test prompts × {SAMPLES} samples" in text and text.count("prompts × ") == 1
    full = text[text.index("### Every row"):text.index("KL is KL(pi || pi_ref)")]
    order = [(ln.split(" | ")[0][2:], ln.split(" | ")[4], ln.split(" | ")[5]) for ln in full.splitlines()
             if ln.startswith("| ") and not ln.startswith("| algorithm")]
    assert order == [("base", "", ""), ("PITA", "0", "0"), ("PITA", "0", "1 (chosen)"), ("PITA", "0", "2"),
                     ("PITA", "1", "0"), ("PITA", "1", "1"), ("PITA", "1", "2 (chosen)"), ("DPO", "0", ""),
                     ("DPO", "1", "")]
    assert "[`config.yaml`](../config.yaml)" in text and "name: exp" not in text


def test_training_curves_are_drawn_from_each_jobs_metrics(tmp_path):
    from pita.report.plots import plot_training, training_curves

    jobs = tmp_path / "jobs"
    rows = {"PITA.tiny.arith.r0.train": [{"epoch": 0, "step": s, "loss": 0.7 - 0.01 * s} for s in range(1, 9)],
            "PITA.tiny.arith.r1.train": [{"epoch": 0, "step": s, "loss": 0.6 - 0.01 * s} for s in range(1, 9)],
            "QSharp-HF.tiny.arith.r0.proxy": [{"epoch": 0, "step": s, "loss": 0.69} for s in range(1, 5)],
            "GRPO.tiny.arith.r0.train": [{"loss": 0.01, "reward": 0.1 * s, "kl": 0.01 * s, "step": s}
                                         for s in range(1, 6)] + [{"train_runtime": 3.0, "train_loss": 0.0, "step": 5}],
            "DPO.tiny.sentiment.r0.train": [{"loss": 0.69, "rewards/margins": 0.1 * s, "step": s} for s in range(1, 4)],
            # the arms of a learning-rate grid are plotted too, each line named by its arm
            "DPO.tiny.arith.lr1e-05.r0.train": [{"loss": 0.69, "step": s} for s in range(1, 4)],
            "DPO.tiny.arith.lr1e-04-beta5e-01.r0.train": [{"loss": 0.6, "step": s} for s in range(1, 4)],
            "data.tiny.arith.r0.value_rollouts-abc.merge": [{"step": 1, "loss": 9.0}]}
    for jid, rs in rows.items():
        (jobs / jid).mkdir(parents=True)
        (jobs / jid / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    curves = training_curves(jobs)
    assert sorted(curves) == ["arith", "sentiment"]
    assert sorted(curves["arith"]) == [("DPO", 0, "train", "lr1e-04-beta5e-01"), ("DPO", 0, "train", "lr1e-05"),
                                       ("GRPO", 0, "train", ""), ("PITA", 0, "train", ""), ("PITA", 1, "train", ""),
                                       ("QSharp-HF", 0, "proxy", "")]
    assert len(curves["arith"][("GRPO", 0, "train", "")]) == 5  # TRL's closing summary row is not a step
    for ds in curves:
        f = plot_training(curves[ds], ds, tmp_path)
        assert f == tmp_path / f"training_{ds}.png" and f.read_bytes()[:4] == b"\x89PNG"


def test_every_algorithm_keeps_one_colour_and_every_round_one_style():
    from pita.cli.report import algorithm_roster
    from pita.report.plots import round_style
    from pita.report.roster import PALETTE

    colour_of = algorithm_roster().colour
    algos = ["PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"]
    colours = [colour_of(a) for a in algos]
    assert len(set(colours)) == len(algos) and colour_of("base") not in colours
    assert all(c in PALETTE for c in colours) and colour_of("PITA") == colour_of("PITA")
    assert len({round_style(r) for r in range(4)}) == 4


def test_the_timeline_legend_names_every_phase_drawn_and_no_other(tmp_path, monkeypatch):
    """A model build (or a plug-in's job kind) gets a colour and a legend entry of its own; a phase
    with no bar gets none."""
    from pita.report import plots
    from pita.report.report import phase_of

    seen = {}

    def keep(fig, plt, path):
        ax = fig.axes[0]
        seen["labels"] = [t.get_text() for t in ax.get_legend().get_texts()]
        seen["colors"] = {tuple(p.get_facecolor()) for p in ax.patches}
        plt.close(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    jobs = {"model.tiny.reference": {"kind": "model.build_tiny", "attempts": [_attempt(100, 50, 0)]},
            "x.r0.gen.s0": {"kind": "generation.shard", "attempts": [_attempt(150, 5, 1)]},
            "x.r0.train": {"kind": "algo.value_train", "attempts": [_attempt(155, 5, 0)]},
            "x.custom": {"kind": "copycat.think", "attempts": [_attempt(160, 1, 1)]}}
    plots.plot_timeline({"jobs": jobs}, tmp_path, phase_of)
    assert seen["labels"] == ["model build", "generation", "training", "copycat"]
    assert len(seen["colors"]) == 4  # one colour per phase, none reused


def test_the_console_table_gives_the_reference_no_round():
    from pita.report.results import table

    lines = table([_row("base", 0, 0.0, 0.25, 0.0), _row("PITA", 1, 2.0, 0.3, 0.1)]).splitlines()
    base, pita = (line.split() for line in lines[1:3])
    assert base[:3] == ["base", "arith", "-"] and pita[:3] == ["PITA", "arith", "1"]


def test_the_console_table_names_each_arm_and_control_setting():
    """Rows of a grid's arms (or a control's settings) share η; each row shows its variant, the
    validation choice starred, and long algorithm names keep the columns aligned."""
    from pita.report.results import table

    arms = [{**_row("DPO", 0, 0.0, p, k), "variant": v, "selected": v == "lr=5e-06"}
            for v, p, k in (("lr=5e-07", 0.27, 0.04), ("lr=5e-06", 0.48, 2.8))]
    lines = table(arms + [{**_row("control: temperature", 0, 0.5, 0.3, 0.8), "variant": "T=0.5"}]).splitlines()
    assert [line.split()[3] for line in lines[1:3]] == ["lr=5e-07", "lr=5e-06*"]
    assert lines[3].startswith("control: temperature arith") and "T=0.5" in lines[3]
    assert len({line.index("pass@1") for line in lines[1:4]}) == 1


def _twin(run, tmp_path, name: str = "twin", **changes):
    """A copy of ``run`` whose config.yaml has ``changes`` (dotted keys) applied: another seed of
    the same experiment by default."""
    import shutil

    from omegaconf import OmegaConf

    twin = tmp_path / name / run.root.name
    shutil.copytree(run.root, twin)
    cfg = OmegaConf.load(twin / "config.yaml")
    for key, value in {"system.seed": 1, **changes}.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    OmegaConf.save(cfg, twin / "config.yaml")
    return twin


def test_pita_report_pools_several_seed_runs_at_equal_kl(recorded_run, tmp_path, capsys):
    """``pita report RUN RUN2 --out X``: each run re-rendered, then the KL-matched table pooled
    over them; runs made with other KL budgets are refused (exit 2)."""
    from pita.cli.report import report_main

    twin = _twin(recorded_run, tmp_path)
    out = tmp_path / "pooled"
    assert report_main([str(recorded_run.root), str(twin)], out=str(out)) == 0
    text = (out.parent / "pooled.md").read_text()
    assert "mean of 2 seeds" in text and "| PITA |" in text
    pooled = json.loads((out.parent / "pooled.json").read_text())
    single = json.loads((recorded_run.results / "final_results.json").read_text())["kl_matched"]["cells"]
    # two seeds with the same rows: the single run's values
    assert [c["value"] for c in pooled["cells"]] == [c["value"] for c in single]
    twin2 = _twin(recorded_run, tmp_path, "twin2", **{"eval.kl_budgets": [0.2]})
    assert report_main([str(recorded_run.root), str(twin2)]) == 2
    assert "eval.kl_budgets differ" in capsys.readouterr().err


def test_pita_report_refuses_to_pool_one_seed_twice_or_other_experiments(recorded_run, tmp_path, capsys):
    """Pooled runs are seeds of one experiment: the same system.seed twice, or runs that differ in
    datasets (names or files), model or algorithms, exit 2 saying which key and which runs, and
    nothing pooled is written."""
    from pita.cli.report import report_main

    same = _twin(recorded_run, tmp_path, "same", **{"system.seed": recorded_run_seed(recorded_run)})
    out = tmp_path / "pooled"
    assert report_main([str(recorded_run.root), str(same)], out=str(out)) == 2
    err = capsys.readouterr().err
    assert "system.seed=" in err and "2 runs" in err and "too narrow" in err and not out.with_suffix(".md").exists()
    other = _twin(recorded_run, tmp_path, "other", **{"experiment.datasets": ["sentiment"]})
    assert report_main([str(recorded_run.root), str(other)], out=str(out)) == 2
    err = capsys.readouterr().err
    assert "experiment.datasets differs between the runs" in err and "sentiment" in err
    moved = _twin(recorded_run, tmp_path, "moved", **{"datasets.arith.path": "/elsewhere/arith.jsonl"})
    assert report_main([str(recorded_run.root), str(moved)]) == 2
    assert "datasets.arith.path differs" in capsys.readouterr().err


def test_pooling_a_run_that_has_not_finished_leaves_out_its_partial_methods_and_says_so(recorded_run, tmp_path,
                                                                                        capsys):
    """A seed still running (or stopped) pools only the methods whose evaluations it finished: a
    method with an η or an arm missing there is left out for that run, its rows say "1 of 2
    seeds", and the report and stderr name the run, its counts and those methods. Without the base
    model's evaluations a run cannot be pooled (exit 2)."""
    from pita.cli.report import report_main
    from pita.core.paths import RunPaths
    from pita.core.state import StateStore

    twin = _twin(recorded_run, tmp_path)
    store = StateStore(RunPaths.open_existing(twin, "test").state)
    jobs = store.read()["jobs"]
    labels = {j: j.split(".")[0] for j in jobs}  # this state has no fingerprints: the ids' heads
    pita_eval = next(j for j, a in labels.items() if a == "PITA")
    store.update_jobs({pita_eval: {"state": "PENDING"}})
    store.close()
    out = tmp_path / "pooled"
    assert report_main([str(recorded_run.root), str(twin)], out=str(out)) == 0
    err = capsys.readouterr().err
    assert f"warning: {twin}: {len(jobs) - 1} of {len(jobs)} jobs completed (1 pending)" in err
    assert "PITA: evaluations not all done there" in err
    text = (out.parent / "pooled.md").read_text()
    assert "| PITA (1 of 2 seeds) |" in text and "**Not finished:**" in text
    assert "| DPO |" in text  # finished in both: a whole pair of seeds
    pooled = json.loads((out.parent / "pooled.json").read_text())["cells"]
    assert {c["seeds"] for c in pooled if c["algorithm"] == "PITA"} == {1}
    assert {c["seeds"] for c in pooled if c["algorithm"] == "DPO"} == {2}
    base_eval = next(j for j, a in labels.items() if a == "base")
    store = StateStore(RunPaths.open_existing(twin, "test").state)
    store.update_jobs({base_eval: {"state": "RUNNING"}})
    store.close()
    assert report_main([str(recorded_run.root), str(twin)], out=str(out)) == 2
    assert "the base model's evaluations are not done in" in capsys.readouterr().err


def recorded_run_seed(run):
    from omegaconf import OmegaConf

    return OmegaConf.load(run.config).system.seed


def test_pita_report_reads_a_run_at_other_kl_budgets_and_refuses_bad_ones(recorded_run, tmp_path, capsys):
    """``--kl-budgets``: the same rows read at other budgets, said in the report and saved; the
    pooled comparison takes them too (runs of different eval.kl_budgets then pool); a bad list
    exits 2 naming the flag and writes nothing."""
    from pita.cli.report import report_main

    assert report_main([str(recorded_run.root)]) == 0
    saved = json.loads((recorded_run.results / "final_results.json").read_text())
    assert report_main([str(recorded_run.root)], kl_budgets="0.01,0.3") == 0
    got = json.loads((recorded_run.results / "final_results.json").read_text())
    km = got["kl_matched"]
    assert km["budgets"] == [0.01, 0.3] and km["budgets_from"] == "pita report --kl-budgets"
    assert sorted({c["kl_budget"] for c in km["cells"]}) == [0.01, 0.3]
    assert got["rows"] == saved["rows"]  # a reading of the same rows
    assert "(`pita report --kl-budgets`)" in (recorded_run.results / "report.md").read_text()
    twin = _twin(recorded_run, tmp_path, **{"eval.kl_budgets": [0.2]})
    assert report_main([str(recorded_run.root), str(twin)], out=str(tmp_path / "p"), kl_budgets="0.3") == 0
    assert json.loads((tmp_path / "p.json").read_text())["budgets"] == [0.3]
    before = (recorded_run.results / "final_results.json").read_text()
    for bad, said in (("0.1,0", "--kl-budgets=[0.1, 0.0]"), ("0.1,x", "--kl-budgets='0.1,x'")):
        capsys.readouterr()
        assert report_main([str(recorded_run.root)], kl_budgets=bad) == 2
        err = capsys.readouterr().err
        assert said in err and "e.g. --kl-budgets" in err
    assert (recorded_run.results / "final_results.json").read_text() == before
    assert report_main([str(recorded_run.root)]) == 0  # back to the run's eval.kl_budgets
    assert json.loads((recorded_run.results / "final_results.json").read_text())["kl_matched"]["budgets_from"] == \
        "eval.kl_budgets"


def test_pita_report_out_leaves_the_run_as_it_was_and_a_changing_reread_keeps_the_old_files(recorded_run, tmp_path,
                                                                                             capsys):
    """One run with --out DIR: the report, tables and plots go to DIR and the run's results/ is
    byte for byte what it was. Without --out, a re-read that changes the run's files says which,
    keeps the previous ones under results/previous/<time>/, and prints the headline tables; a
    re-read that changes nothing says nothing of the kind."""
    from pita.cli.report import report_main

    assert report_main([str(recorded_run.root)]) == 0
    capsys.readouterr()
    files = {p: p.read_bytes() for p in recorded_run.results.rglob("*") if p.is_file()}
    out = tmp_path / "at-0.3"
    assert report_main([str(recorded_run.root)], out=str(out), kl_budgets="0.3") == 0
    printed = capsys.readouterr().out
    assert {p: p.read_bytes() for p in recorded_run.results.rglob("*") if p.is_file()} == files
    assert json.loads((out / "final_results.json").read_text())["kl_matched"]["budgets"] == [0.3]
    assert (out / "report.md").exists() and (out / "results.csv").exists() and any((out / "plots").iterdir())
    assert "### Headline" in printed and "| algorithm |" in printed and f"{recorded_run.results} is unchanged" in printed
    [link] = [ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("- configuration:")]
    target = link.split("](", 1)[1].split(")", 1)[0]
    assert (out / target).resolve() == (recorded_run.root / "config.yaml").resolve()
    assert report_main([str(recorded_run.root)], kl_budgets="0.3") == 0
    printed = capsys.readouterr().out
    assert "report.md, final_results.json changed" in printed
    [kept] = list((recorded_run.results / "previous").iterdir())
    assert (kept / "final_results.json").read_bytes() == files[recorded_run.results / "final_results.json"]
    assert report_main([str(recorded_run.root)], kl_budgets="0.3") == 0
    assert "changed" not in capsys.readouterr().out
