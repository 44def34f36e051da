"""Your own dataset, dataset config and reward, from a folder outside the checkout: Hydra's own
composition (``+dataset@datasets.NAME=<a dataset config>``), a config group folder of your own
(``hydra.searchpath``) and ``datasets.NAME.reward=module:function``."""

from __future__ import annotations

import csv
import glob
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import only_run

pytestmark = pytest.mark.integration
PITA = str(Path(sys.executable).parent / "pita")


def pita(args, cwd, timeout=600):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run([PITA, *args, "executor.progress=off"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def gsm8k_file(path: Path, n: int = 24) -> None:
    rng = random.Random(0)
    with path.open("w") as f:
        for i in range(n):
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            f.write(json.dumps({"question": f"What is {a} plus {b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}",
                                "split": "train" if i < n - 8 else "test"}) + "\n")


def test_your_own_dataset_and_reward_function_run_under_their_own_names(tmp_path, tiny_cache):
    """One run from a folder outside the checkout with two datasets of the user's: mymath (a GSM8K
    file under its own name) and myrev (the sentiment task scored by myreward:length, a function
    in that folder). Every table, file and plot says mymath / myrev, never gsm8k; every completion
    the run scored on myrev (data collection, evaluation) has reward len(completion) / 100."""
    gsm8k_file(tmp_path / "mymath.jsonl")
    (tmp_path / "myreward.py").write_text(REWARD)
    r = pita(["run", "experiment=smoke", "experiment.name=own", "experiment.algos=[DPO]",
              "+dataset@datasets.mymath=gsm8k", "datasets.mymath.path=mymath.jsonl",
              "+dataset@datasets.myrev=sentiment", "datasets.myrev.reward=myreward:length",
              "experiment.datasets=[mymath,myrev]", f"system.cache_dir={tiny_cache}"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path / "outputs", "own")
    rows = list(csv.DictReader((run / "results" / "results.csv").open()))
    assert {r["train_dataset"] for r in rows} == {"mymath", "myrev"} == {r["eval_dataset"] for r in rows}
    for f in ("results.csv", "report.md", "final_results.json"):
        assert "gsm8k" not in (run / "results" / f).read_text(), f
    plots = [Path(p).name for p in glob.glob(str(run / "results" / "plots" / "*"))]
    assert "frontier_mymath.png" in plots and "frontier_myrev.png" in plots and not [p for p in plots if "gsm8k" in p]
    jobs = json.loads((run / "state.json").read_text())["jobs"]
    assert all("gsm8k" not in j for j in jobs) and any(".mymath." in j for j in jobs)
    scored = 0
    for f in glob.glob(str(run / "jobs" / "*myrev*" / "checkpoints" / "chunk-*.jsonl")):
        for line in open(f):
            rec = json.loads(line)
            if "completion" in rec:
                assert rec["reward"] == pytest.approx(len(rec["completion"]) / 100), rec
                scored += 1
            if "chosen" in rec:
                assert rec["chosen_reward"] == pytest.approx(len(rec["chosen"]) / 100)
                scored += 1
    assert scored > 20
    assert all(float(r["mean_reward"]) > 0 for r in rows if r["eval_dataset"] == "myrev")


def test_a_dataset_config_in_your_own_folder_is_found_through_hydras_search_path(tmp_path):
    gsm8k_file(tmp_path / "mymath.jsonl")
    (tmp_path / "conf" / "dataset").mkdir(parents=True)
    (tmp_path / "conf" / "dataset" / "mydata.yaml").write_text(
        "# my data, in GSM8K's format\nname: mydata\nbase: gsm8k\npath: mymath.jsonl\n")
    r = pita(["plan", "--json", "experiment=smoke", "experiment.algos=[]", "hydra.searchpath=[file://conf]",
              "+dataset@datasets.mydata=mydata", "experiment.datasets=[mydata]"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ids = [j["id"] for j in json.loads(r.stdout)["jobs"]]
    assert any(".mydata." in i for i in ids) and not any("gsm8k" in i for i in ids)
    r = pita(["plan", "experiment=smoke", "+dataset@datasets.mydata=mydata", "experiment.datasets=[mydata]"], tmp_path)
    assert r.returncode == 2 and "dataset='mydata' is not known" in r.stderr  # without the search path


REWARD = '''
def length(prompts, completions):
    return [len(c) / 100 for c in completions]

def text(prompts, completions):
    return "not numbers"

def short(prompts, completions):
    return []

def boom(prompts, completions):
    raise RuntimeError("no GPU here")
'''


@pytest.mark.parametrize("target, needle", [
    ("myreward:text", "must return one number per completion"),
    ("myreward:short", "returned 0 scores for 1 completions"),
    ("myreward:boom", "raised RuntimeError: no GPU here"),
    ("myreward:nope", "myreward has no function 'nope'"),
    ("nosuch:f", "cannot import 'nosuch'"),
    ("no-colon", "must be module:function"),
])
def test_a_reward_function_that_cannot_score_is_exit_2_naming_the_key(tmp_path, target, needle):
    (tmp_path / "myreward.py").write_text(REWARD)
    r = pita(["plan", "experiment=smoke", "+dataset@datasets.myrev=sentiment", f"datasets.myrev.reward={target}",
              "experiment.datasets=[myrev]"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert "datasets.myrev.reward" in r.stderr and needle in r.stderr, r.stderr


def test_a_model_family_of_your_own_by_name_from_your_own_config_folder(tmp_path):
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mine.yaml").write_text(
        "name: mine\nreference: builtin:tiny/reference\nguidance: builtin:tiny/guidance\ndtype: float32\n")
    r = pita(["plan", "--json", "experiment=smoke", "hydra.searchpath=[file://conf]", "model=mine"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    plan = json.loads(r.stdout)
    assert plan["model"] == "mine" and any(".mine." in j["id"] for j in plan["jobs"])
