"""The tiny family is built by the run's own jobs: planned up front, one job per part, resumable."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from helpers import cli, final_state, only_run


def _compose(cache, *overrides):
    from hydra import compose as hc, initialize_config_dir

    from pita.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hc(config_name="config", overrides=["experiment.workload=experiment", f"system.cache_dir={cache}",
                                                   *overrides])


def test_an_empty_cache_is_planned_as_build_jobs_without_training_anything(tmp_path):
    from pita.models.tiny import family_dir
    from pita.plans import build_plan

    t = time.perf_counter()
    jobs = build_plan(_compose(tmp_path, "experiment.datasets=[arith,sentiment]", "experiment.algos=[PITA,GRPO]"),
                      [int(8e9)] * 2, cuda=False)
    took = time.perf_counter() - t
    by = {j.id: j for j in jobs}
    builds = [j for j in jobs if j.kind == "model.build_tiny"]
    assert [j.id for j in builds] == ["model.tiny.reference", "model.tiny.guidance", "model.tiny.reward_sentiment"]
    # the reference holds every CPU device (all else waits for it); the others one each, beside the first jobs
    assert [j.resources.devices for j in builds] == [2, 1, 1]
    root = family_dir(tmp_path, 0)
    # the plan read every part's config and tokenizer, but no weights exist yet
    assert (root / "reference" / "config.json").exists() and (root / "guidance" / "tokenizer.json").exists()
    assert not list(root.rglob("*.safetensors"))
    assert took < 60, took
    # every job that starts from nothing waits for the reference; the reward model and the value
    # model's backbone are waited for only by the jobs that name them
    roots = [j for j in jobs if j.kind != "model.build_tiny" and
             not [d for d in j.deps if not d.startswith("model.")]]
    assert roots and all("model.tiny.reference" in j.deps for j in roots)
    assert "model.tiny.reward_sentiment" in by["base.tiny.sentiment.eval.s0"].deps
    assert "model.tiny.reward_sentiment" not in by["base.tiny.arith.eval.s0"].deps
    guided = [j for j in jobs if "model.tiny.guidance" in j.deps]
    assert guided and all(j.id.startswith("PITA.") for j in guided)
    assert not any(j.id.startswith("GRPO.") and "model.tiny.guidance" in j.deps for j in jobs)


def test_a_part_is_built_once_and_matches_the_in_process_build(tmp_path, tiny_cache):
    from safetensors.torch import load_file

    from pita.models.tiny import build_part, family_dir, part_built

    steps = []
    res = build_part(tmp_path, 0, "reward_sentiment")  # the smallest part: seconds
    assert not res["cached"] and part_built(tmp_path, 0, "reward_sentiment")
    assert not part_built(tmp_path, 0, "reference")
    assert not (family_dir(tmp_path, 0) / ".complete").exists()  # two parts still missing
    again = build_part(tmp_path, 0, "reward_sentiment", progress=lambda *a: steps.append(a))
    assert again == {"part": "reward_sentiment", "cached": True} and not steps
    a = load_file(str(family_dir(tmp_path, 0) / "reward_sentiment" / "model.safetensors"))
    b = load_file(str(family_dir(tiny_cache, 0) / "reward_sentiment" / "model.safetensors"))
    # bit for bit: both built at one thread from the same seed (pita.models.tiny), and at a fixed
    # thread count torch's CPU kernels repeat their results
    assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max().item() == 0 for k in a)
    with pytest.raises(ValueError, match="its parts are reference, guidance, reward_sentiment"):
        build_part(tmp_path, 0, "rewrad")


def _cache_without_reward_model(tiny_cache, dest):
    """A copy of the cached family whose reward model is missing (the only part quick to train)."""
    from pita.models.tiny import family_dir

    src, root = family_dir(tiny_cache, 0), family_dir(dest, 0)
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("*.lock"))
    (root / ".complete").unlink(missing_ok=True)
    for part in ("reference", "guidance"):
        (root / part / ".built").write_text(json.dumps({"built_s": 0.0}))
    (root / "reward_sentiment" / ".built").unlink(missing_ok=True)
    (root / "reward_sentiment" / "model.safetensors").unlink()
    return root


@pytest.mark.integration
def test_a_run_builds_the_missing_part_as_a_job_and_resumes_with_the_same_graph(tmp_path, tiny_cache):
    cache = tmp_path / "cache"
    root = _cache_without_reward_model(tiny_cache, cache)
    args = ["experiment.workload=experiment", "experiment.datasets=[sentiment]", "experiment.algos=[]",
            "experiment.name=fam", f"system.cache_dir={cache}", "datasets.sentiment.toy_test_size=8",
            "eval.validation_prompts=0"]
    r = cli(args, tmp_path / "out", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path / "out", "fam")
    log = (run / "run.log").read_text()
    assert "building the tiny family once (reward_sentiment: 1 job(s), one thread per process)" in log
    state = final_state(run)
    assert {j: s for j, (s, _) in state.items() if j.startswith("model.")} == {
        "model.tiny.reference": "COMPLETED", "model.tiny.reward_sentiment": "COMPLETED"}
    assert json.loads((run / "jobs" / "model.tiny.reference" / "result.json").read_text())["cached"] is True
    built = json.loads((run / "jobs" / "model.tiny.reward_sentiment" / "result.json").read_text())
    assert built["cached"] is False and (root / "reward_sentiment" / "model.safetensors").exists()
    assert (root / ".complete").exists()
    # the same run resumed plans the same graph (the build jobs stay, now no-ops)
    again = cli([f"resume_from={run}"], tmp_path / "out", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "graph" not in again.stderr
