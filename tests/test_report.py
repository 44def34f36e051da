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
    assert "| PITA | tiny | arith | 1 | arith | 2.00 | pass@1 | 0.310 |" in text
    for png in ("frontier_arith", "frontier_sentiment", "rounds_arith", "rounds_sentiment", "timeline"):
        f = run.results / "plots" / f"{png}.png"
        assert f.stat().st_size > 1000 and f.read_bytes()[:4] == b"\x89PNG"
        assert f"plots/{png}.png" in text
    assert "| generation | 1 | 10.0 | 10.0 | 321 | 1.00 |" in text
    assert "| training | 2 | 25.0 | 25.0 | 0 |" in text
    assert "`DPO.tiny.arith.r0.train`: boom (log: `x/job.log`)" in text
    assert "name: exp" in text


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
