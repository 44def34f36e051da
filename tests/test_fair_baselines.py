"""The baselines as their methods define them, and compared on equal terms: GRPO's loss and
reward scaling named (the paper's by default), GRPO-HF with GRPO's sample budget, preference
draws of their own in every round."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from pita.core.errors import ConfigError
from test_baselines import compose

pytestmark = pytest.mark.integration


def _train_params(tiny_cache, job_id, *overrides):
    from pita.plans import build_plan

    jobs = build_plan(compose(tiny_cache, *overrides), [int(8e9)])
    return {j.id: j for j in jobs}, next(j for j in jobs if j.id == job_id).params


@pytest.mark.parametrize("overrides, loss, scaling", [
    ((), "grpo", "group"),  # the GRPO paper: per-completion token mean, advantages over the group's std
    (("algos.GRPO.loss_type=dr_grpo", "algos.GRPO.scale_rewards=none"), "dr_grpo", "none"),
    (("algos.GRPO.loss_type=dapo",), "dapo", "group"),
])
def test_grpo_names_its_loss_and_reward_scaling_to_trl(tiny_cache, tmp_path, overrides, loss, scaling):
    from pita.algos.grpo import grpo_trainer
    from pita.core.paths import JobPaths

    _, p = _train_params(tiny_cache, "GRPO.tiny.arith.r0.train", "experiment.algos=[GRPO]", "experiment.rounds=1",
                         "algos.GRPO.max_steps=1", *overrides)
    ctx = SimpleNamespace(params=p, dep_result=lambda j: None, paths=JobPaths(tmp_path / "job"),
                          log=logging.getLogger("test"))
    trainer, _ = grpo_trainer(ctx, p)
    assert trainer.args.loss_type == loss
    assert str(trainer.args.scale_rewards) == scaling


@pytest.mark.parametrize("override, needle", [
    ("algos.GRPO.loss_type=ppo", "algos.GRPO.loss_type"),
    ("algos.GRPO-HF.scale_rewards=std", "algos.GRPO-HF.scale_rewards"),
])
def test_a_bad_grpo_loss_or_scaling_is_refused(tiny_cache, override, needle):
    from pita.plans import build_plan

    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, override), [int(8e9)])
    assert needle in str(e.value)


def test_grpo_hf_samples_as_many_completions_as_grpo_by_default(tiny_cache):
    from pita.algos.grpo import grpo_steps

    by, grpo = _train_params(tiny_cache, "GRPO.tiny.arith.r0.train", "experiment.rounds=1")
    hf = by["GRPO-HF.tiny.arith.r0.train"].params
    for key in ("batch_size", "num_generations", "epochs", "max_steps", "max_completion_length", "temperature",
                "loss_type", "scale_rewards", "beta"):
        assert hf[key] == grpo[key], key
    assert grpo_steps(hf, 40) * hf["batch_size"] == grpo_steps(grpo, 40) * grpo["batch_size"]


def test_each_rounds_preference_pairs_get_draws_of_their_own(tiny_cache):
    """Round r's pairs are drawn with a key that carries r: two rounds with the same prompts and
    rewards do not repeat round 0's coin flips (they did: the key was the prompt id alone)."""
    from pita.rewards.preferences import make_pairs

    groups = [{"id": f"q{i}", "prompt": "p", "completions": ["a", "b"], "rewards": [0.50, 0.51]} for i in range(400)]
    r0 = [x["chosen"] for x in make_pairs(groups, 0, beta=1.0, sampling=True, round=0)]
    r1 = [x["chosen"] for x in make_pairs(groups, 0, beta=1.0, sampling=True, round=1)]
    again = [x["chosen"] for x in make_pairs(groups, 0, beta=1.0, sampling=True, round=1)]
    assert r1 == again  # a round's draws are still reproducible
    differ = sum(a != b for a, b in zip(r0, r1)) / len(r0)
    assert 0.35 < differ < 0.65  # near-tied rewards: independent draws disagree about half the time
    by, _ = _train_params(tiny_cache, "DPO.tiny.arith.r1.train", "experiment.algos=[DPO]", "experiment.rounds=2")
    rounds = sorted(j.params["request"]["preferences"]["round"] for j in by.values()
                    if j.kind == "generation.shard" and j.params["request"].get("recipe") == "preference_pairs")
    assert set(rounds) == {0, 1}


def test_qsharp_reward_targets_are_min_max_normalised_and_the_bounds_stored(tiny_cache, tmp_path):
    """Q# on sentiment (raw reward-model scores): the value job trains on targets in [0, 1], with
    bce / bernoulli guidance by default, and its checkpoint records the reward range; with
    normalize_targets=none it regresses the raw scores over mle atoms, as before."""
    from pita.algos.value_guided import minmax_targets
    from pita.guidance.train import SeqExample

    ex, bounds = minmax_targets([SeqExample([1, 2], 1, t) for t in (-3.0, 1.0, 5.0)])
    assert [e.target for e in ex] == [0.0, 0.5, 1.0] and bounds == (-3.0, 5.0)
    assert [e.target for e in minmax_targets([SeqExample([1], 0, 2.0)] * 2)[0]] == [0.0, 0.0]
    common = ("experiment.datasets=[sentiment]", "experiment.rounds=1", "experiment.algos=[PITA,QSharp,QSharp-HF]",
              "datasets.sentiment.toy_train_size=40", "datasets.sentiment.toy_test_size=16")
    by, p = _train_params(tiny_cache, "QSharp.tiny.sentiment.r0.train", *common)
    assert (p["normalize_targets"], p["loss"]) == ("minmax", "bce")
    assert by["QSharp-HF.tiny.sentiment.r0.train"].params["normalize_targets"] == "minmax"
    assert by["PITA.tiny.sentiment.r0.train"].params["normalize_targets"] == "none"
    _, raw = _train_params(tiny_cache, "QSharp.tiny.sentiment.r0.train", *common,
                           "algos.QSharp.normalize_targets=none")
    assert (raw["normalize_targets"], raw["loss"]) == ("none", "mle")


@pytest.mark.parametrize("override, needle", [
    ("algos.PITA.normalize_targets=minmax", "PITA has no reward targets to normalise"),
    ("algos.QSharp.normalize_targets=zscore", "algos.QSharp.normalize_targets"),
])
def test_a_normalisation_switch_that_cannot_apply_is_refused(tiny_cache, override, needle):
    from pita.plans import build_plan

    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, override, "experiment.algos=[PITA,QSharp]"), [int(8e9)])
    assert needle in str(e.value) and override.split("=")[0] in str(e.value)


def test_proxies_hold_out_a_share_of_prompts_and_a_bad_share_is_refused(tiny_cache):
    from pita.guidance.proxy import held_out
    from pita.plans import build_plan

    ids = [f"arith-{i}" for i in range(2000)]
    out = [i for i in ids if held_out(i, 0.1, 0)]
    assert 150 < len(out) < 250 and out == [i for i in ids if held_out(i, 0.1, 0)]  # a fixed draw per prompt
    assert not any(held_out(i, 0.0, 0) for i in ids)
    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.rounds=1", "experiment.algos=[GRPO-HF]",
                                                "algos.GRPO-HF.proxy_heldout=0.2"), [int(8e9)])}
    assert jobs["GRPO-HF.tiny.arith.r0.proxy"].params["heldout"] == 0.2
    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, "experiment.algos=[GRPO-HF]", "algos.GRPO-HF.proxy_heldout=0.7"), [int(8e9)])
    assert "algos.GRPO-HF.proxy_heldout=0.7" in str(e.value)
