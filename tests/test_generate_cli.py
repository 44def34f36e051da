"""``experiment.workload=generate`` through run_parallel.py: a real-dataset path from a local file."""

from __future__ import annotations

import json

import pytest

from helpers import cli

pytestmark = pytest.mark.integration


def test_generate_from_a_local_gsm8k_file(tmp_path, tiny_cache):
    rows = [{"question": f"Ana has {i} pens. Ana gets 2 more. How many pens does Ana have?",
             "answer": f"{i} + 2 = {i + 2}\n#### {i + 2:,}"} for i in range(998, 1010)]
    f = tmp_path / "gsm8k.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli(["experiment.name=g", "experiment.workload=generate", "experiment.datasets=[gsm8k]",
             f"datasets.gsm8k.path={f}", "datasets.gsm8k.allow_train_on_test=true",  # one file, no split column
             f"system.cache_dir={tiny_cache}", "data_collection.recipe=preference_pairs",
             "data_collection.samples_per_prompt=2", "data_collection.max_new_tokens=16",
             "data_collection.chunk_size=4"], tmp_path / "out", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    [run] = list((tmp_path / "out" / "g").iterdir())
    res = json.loads((run / "jobs" / "gen.tiny.gsm8k.merge" / "result.json").read_text())
    assert res["records"] == 12 and res["recipe"] == "preference_pairs"
    state = json.loads((run / "state.json").read_text())
    shards = [j for j in state["jobs"] if ".s" in j]
    assert len(shards) == 2  # 3 chunks of 4 shared over 2 CPU devices


@pytest.mark.parametrize("args,needle", [
    (["experiment.datasets=[gsm9k]"], "did you mean 'gsm8k'"),
    (["experiment.datasets=[gsm8k]", "datasets.gsm8k.path=/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["experiment.datasets=[arith]", "data_collection.recipe=preference_pairs",
      "data_collection.samples_per_prompt=1"], "samples_per_prompt=1 must be >= 2"),
    (["experiment.datasets=[arith]", "datasets.arith.train_cap=0"], "train_cap"),
])
def test_bad_generation_input_exits_2(tmp_path, tiny_cache, args, needle):
    r = cli(["experiment.workload=generate", f"system.cache_dir={tiny_cache}", *args], tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert needle in r.stderr
