"""Sweep bookkeeping (pita/sweep.py): point folder names, headline metrics, the summary."""

from __future__ import annotations

import csv
import json

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from pita.sweep import NAME_BYTES, Sweep, headline, point_name


@pytest.mark.parametrize("overrides,swept,name", [
    (["synthetic.rounds=2", "experiment.name=x"], {"synthetic.rounds"}, "synthetic.rounds-2"),
    (["model=qwen3-sm", "experiment.datasets=[gsm8k,math500]"], {"model", "experiment.datasets"},
     "model-qwen3-sm__experiment.datasets-gsm8k+math500"),
    (["+eval.datasets_by_train.gsm8k=[gsm8k]"], {"eval.datasets_by_train.gsm8k"}, "eval.datasets_by_train.gsm8k-gsm8k"),
    (["algos.PITA.eta=0.5"], {"algos.PITA.eta"}, "algos.PITA.eta-0.5"),
    (["x=1"], set(), "point"),
])
def test_point_folders_are_named_by_the_swept_overrides(overrides, swept, name):
    assert point_name(overrides, swept) == name


@pytest.mark.parametrize("value", ["/data/my file.jsonl", "café", "a:b", "{a: 1}", "'quoted, list'", "x" * 400])
def test_point_names_are_safe_stable_and_typeable_as_resume_from(value):
    """Whatever the value: one path component of safe characters, the same name every time, a
    hash when characters were replaced (so two values never collide), and a path Hydra parses
    unquoted, so resume_from=<printed folder> works as typed."""
    name = point_name([f"datasets.gsm8k.path={value}"], {"datasets.gsm8k.path"})
    assert name == point_name([f"datasets.gsm8k.path={value}"], {"datasets.gsm8k.path"})
    assert "/" not in name and name.isascii() and len(name.encode()) <= NAME_BYTES + 9
    assert all(c.isalnum() or c in "._+@-" for c in name), name
    assert name != point_name([f"datasets.gsm8k.path={value}2"], {"datasets.gsm8k.path"})
    [o] = OverridesParser.create().parse_overrides([f"resume_from=outputs/n/sweep-2026-01-01_00-00-00/{name}"])
    assert not o.is_sweep_override() and o.value().endswith(name)


def _rows():
    def row(algo, rnd, eta, sel, acc, kl):
        return {"algorithm": algo, "family": "tiny", "train_dataset": "arith", "eval_dataset": "arith", "round": rnd,
                "eta": eta, "selected": sel, "pass@1": acc, "kl": kl}
    return [row("base", 0, 0.0, True, 0.40, 0.0), row("PITA", 0, 1.0, True, 0.45, 0.1),
            row("PITA", 1, 0.0, False, 0.40, 0.0), row("PITA", 1, 2.0, True, 0.55, 0.3),
            row("DPO", 1, 0.0, True, 0.50, 0.2)]


def test_headline_metrics_are_the_last_round_at_the_chosen_eta(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "final_results.json").write_text(json.dumps(_rows()))
    assert headline(tmp_path) == {"base arith pass@1": 0.40, "PITA arith pass@1": 0.55, "PITA arith kl": 0.3,
                                  "DPO arith pass@1": 0.50, "DPO arith kl": 0.2}
    assert headline(tmp_path / "missing") == {} and headline(None) == {}


def test_the_summary_has_a_row_per_point_with_its_metrics(tmp_path):
    sweep = Sweep(tmp_path, ["model"], [["model=a", "x=1"], ["model=b", "x=1"], ["model=c", "x=1"]])
    run = tmp_path / "model-a"
    p = sweep.start(0, tmp_path)
    assert p.folder == run
    (run / "results").mkdir(parents=True)  # what the point's run writes
    (run / "results" / "final_results.json").write_text(json.dumps(_rows()))
    sweep.end(p, 0, None, None)
    p = sweep.start(1, tmp_path)
    sweep.end(p, 1, None, None)  # no results: its metric cells stay empty
    with open(tmp_path / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["point"], r["overrides"], r["exit_code"], r["outcome"]) for r in rows] == [
        ("1", "model=a", "0", "completed"), ("2", "model=b", "1", "failed"), ("3", "model=c", "", "not run")]
    assert rows[0]["run_folder"] == str(run) and rows[1]["run_folder"] == ""
    assert float(rows[0]["PITA arith pass@1"]) == 0.55 and rows[1]["PITA arith pass@1"] == ""
    table = sweep.table()
    assert "2 of 3 point(s) ran" in table and "PITA arith pass@1" in table and "0.550" in table
