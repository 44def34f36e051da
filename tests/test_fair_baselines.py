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
    """Q# on sentiment (raw reward-model scores): the value job trains on targets in [0, 1] with the
    mle loss over atoms by default, as the PITA reference's Q# on reward datasets (bce on math),
    and its checkpoint records the reward range; a round whose targets are all equal carries no
    preference and maps to 0.5, not to "all worst"; with normalize_targets=none it regresses the
    raw scores over mle atoms, as before."""
    from pita.algos.value_guided import minmax_targets
    from pita.guidance.train import SeqExample

    ex, bounds = minmax_targets([SeqExample([1, 2], 1, t) for t in (-3.0, 1.0, 5.0)])
    assert [e.target for e in ex] == [0.0, 0.5, 1.0] and bounds == (-3.0, 5.0)
    assert [e.target for e in minmax_targets([SeqExample([1], 0, 2.0)] * 2)[0]] == [0.5, 0.5]
    common = ("experiment.datasets=[sentiment]", "experiment.rounds=1", "experiment.algos=[PITA,QSharp,QSharp-HF]",
              "datasets.sentiment.toy_train_size=40", "datasets.sentiment.toy_test_size=16")
    by, p = _train_params(tiny_cache, "QSharp.tiny.sentiment.r0.train", *common)
    assert (p["normalize_targets"], p["loss"]) == ("minmax", "mle")
    _, on_math = _train_params(tiny_cache, "QSharp.tiny.arith.r0.train", "experiment.algos=[QSharp]",
                               "experiment.rounds=1")
    assert on_math["loss"] == "bce"
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


def test_roll_ins_and_continuations_follow_each_reference_and_switch(tiny_cache):
    """PITA rolls in greedily and continues from the round's (guided) policy, as the PITA reference
    code; Q# and Q#-HF roll in sampled and continue from the frozen reference (the returns Q#
    estimates); algos.<A>.rollin / continue_from switch either, and a bad value names its key."""
    from pita.plans import build_plan

    def rollouts(*over):
        jobs = build_plan(compose(tiny_cache, "experiment.rounds=2", "experiment.algos=[PITA,QSharp,QSharp-HF]",
                                  *over), [int(8e9)])
        return {j.id.split(".")[0]: j.params["request"]["rollouts"] for j in jobs
                if j.kind == "generation.shard" and j.params["request"].get("recipe") == "value_rollouts"
                and ".r1." in j.id}

    got = rollouts()
    assert (got["PITA"]["rollin"], got["PITA"]["continue_from"]) == ("greedy", "policy")
    assert (got["QSharp"]["rollin"], got["QSharp"]["continue_from"]) == ("sampled", "reference")
    assert (got["QSharp-HF"]["rollin"], got["QSharp-HF"]["continue_from"]) == ("sampled", "reference")
    got = rollouts("algos.PITA.rollin=sampled", "algos.QSharp.continue_from=policy")
    assert got["PITA"]["rollin"] == "sampled" and got["QSharp"]["continue_from"] == "policy"
    with pytest.raises(ConfigError) as e:
        build_plan(compose(tiny_cache, "algos.QSharp.rollin=beam", "experiment.algos=[QSharp]"), [int(8e9)])
    assert "algos.QSharp.rollin" in str(e.value) and "greedy" in str(e.value)


def test_the_value_guided_methods_train_the_same_epochs_by_default(tiny_cache):
    """One epochs setting for PITA, Q# and Q#-HF (10, as both reference implementations train
    them); PITA's used to be 10 and the others' 2."""
    from pita.algos import ALGORITHMS

    assert {ALGORITHMS.get(a).Config().epochs for a in ("PITA", "QSharp", "QSharp-HF")} == {10}


def test_a_learning_rate_grid_trains_one_arm_per_rate_chosen_on_validation(tiny_cache):
    """algos.<A>.lr_grid: every rate is an arm with its own rounds, evaluations and validation
    rows (variant lr=<rate>), sharing round 0's data and GRPO-HF's round-0 proxy; the default grid
    under 1B parameters is wide upwards (a 135M model x1, 10, 100 of the 7B recipe's rate), from 1B
    the recipe's one rate, on the tiny family the one measured rate; lr and lr_grid together, or a bad grid, name the keys."""
    from pita.algos import algorithm
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.rounds=2", "experiment.algos=[DPO,GRPO-HF]",
                                                "algos.DPO.lr_grid=[1e-5,1e-4]", "algos.GRPO-HF.lr_grid=[5e-5,5e-4]"),
                                        [int(8e9)])}
    for lr, arm in ((1e-5, "lr1e-05"), (1e-4, "lr1e-04")):
        for r in (0, 1):
            assert jobs[f"DPO.tiny.arith.{arm}.r{r}.train"].params["lr"] == lr
            labels = jobs[f"DPO.tiny.arith.{arm}.r{r}.eval.merge"].params["labels"]
            assert labels["variant"] == f"lr={lr:g}" and labels["algorithm"] == "DPO"
            assert jobs[f"DPO.tiny.arith.{arm}.r{r}.val.merge"].params["labels"]["variant"] == f"lr={lr:g}"
    assert "DPO.tiny.arith.r0.train" not in jobs
    # round 0's pairs are collected once for both arms; GRPO-HF's round-0 proxy is trained once
    gens = {d for j in jobs.values() if j.kind == "algo.dpo_train" and ".r0." in j.id for d in j.deps}
    assert len(gens) == 1 and next(iter(gens)).startswith("data.tiny.arith.r0.preference_pairs-")
    proxies = [k for k in jobs if k.endswith(".r0.proxy") and k.startswith("GRPO-HF.")]
    assert proxies == ["GRPO-HF.tiny.arith.r0.proxy"]
    assert {jobs[f"GRPO-HF.tiny.arith.{a}.r0.train"].params["proxy"] for a in ("lr5e-05", "lr5e-04")} == set(proxies)
    assert "GRPO-HF.tiny.arith.lr5e-05.r1.proxy" in jobs and "GRPO-HF.tiny.arith.lr5e-04.r1.proxy" in jobs

    cfg = compose(tiny_cache)
    p = SimpleNamespace(policy_params=135_000_000)
    assert algorithm("DPO", cfg.algos["DPO"]).learning_rates(p) == [5e-7, 5e-6, 5e-5]
    assert algorithm("GRPO", cfg.algos["GRPO"]).learning_rates(p) == [1e-6, 1e-5, 1e-4]
    assert algorithm("GRPO", cfg.algos["GRPO"]).learning_rates(SimpleNamespace(policy_params=8_000_000_000)) == [1e-6]
    assert algorithm("DPO", cfg.algos["DPO"]).learning_rates(SimpleNamespace(policy_params=1_000_000)) == [1e-5]
    for over, needle in ((("algos.DPO.lr=1e-5", "algos.DPO.lr_grid=[1e-5]"), "set one"),
                         (("algos.DPO.lr_grid=[0.0,1e-5]",), "algos.DPO.lr_grid=[0.0, 1e-05] must list")):
        with pytest.raises(ConfigError) as e:
            build_plan(compose(tiny_cache, "experiment.algos=[DPO]", *over), [int(8e9)])
        assert needle in str(e.value)


def test_a_beta_grid_crosses_the_learning_rates_each_setting_an_arm(tiny_cache):
    """algos.<A>.beta_grid: each KL coefficient is an arm like a rate, crossed with lr_grid's rates
    (ids lr<rate>-beta<b>, variants "lr=<rate> beta=<b>"); alone it names the arms by beta; it
    replaces beta; ids carry no dots; a bad grid, or two values one id cannot tell apart, name the key."""
    from pita.algos.post_training import arm_token
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.rounds=1", "experiment.algos=[DPO,GRPO]",
                                                "algos.DPO.lr_grid=[1e-5,1e-4]", "algos.DPO.beta_grid=[0.05,0.5]",
                                                "algos.GRPO.beta_grid=[0.0,0.04]"), [int(8e9)])}
    dpo = {k: j for k, j in jobs.items() if k.startswith("DPO.") and k.endswith(".r0.train")}
    assert sorted(dpo) == [f"DPO.tiny.arith.lr{lr}-beta{b}.r0.train" for lr in ("1e-04", "1e-05")
                           for b in ("5e-01", "5e-02")]
    j = jobs["DPO.tiny.arith.lr1e-04-beta5e-02.r0.train"]
    assert (j.params["lr"], j.params["beta"]) == (1e-4, 0.05)
    labels = jobs["DPO.tiny.arith.lr1e-04-beta5e-02.r0.val.merge"].params["labels"]
    assert labels["variant"] == "lr=0.0001 beta=0.05"
    assert len({d for j in dpo.values() for d in j.deps}) == 1  # round 0's pairs are collected once
    grpo = sorted(k for k in jobs if k.startswith("GRPO.") and k.endswith(".r0.train"))
    assert grpo == ["GRPO.tiny.arith.beta0.r0.train", "GRPO.tiny.arith.beta4e-02.r0.train"]
    assert [jobs[k].params["beta"] for k in grpo] == [0.0, 0.04]
    assert jobs["GRPO.tiny.arith.beta0.r0.eval.merge"].params["labels"]["variant"] == "beta=0"
    # without a grid nothing changes: one arm, no variant, the configured beta
    [one] = [j for j in build_plan(compose(tiny_cache, "experiment.rounds=1", "experiment.algos=[DPO]",
                                           "algos.DPO.beta=0.2"), [int(8e9)]) if j.id.endswith(".train")]
    assert (one.id, one.params["beta"]) == ("DPO.tiny.arith.r0.train", 0.2)
    assert [arm_token(x) for x in (1e-5, 1.5e-5, 0.1, 0.0, 2.0)] == ["1e-05", "1p5e-05", "1e-01", "0", "2e00"]
    for over, needle in ((("algos.DPO.beta_grid=[-0.1,0.1]",), "algos.DPO.beta_grid=[-0.1, 0.1] must list"),
                         (("algos.DPO.beta_grid=[]",), "algos.DPO.beta_grid=[] must list"),
                         (("algos.DPO.lr_grid=[1.0001e-5,1.0002e-5]",), "two values share a job id")):
        with pytest.raises(ConfigError) as e:
            build_plan(compose(tiny_cache, "experiment.algos=[DPO]", *over), [int(8e9)])
        assert needle in str(e.value)


def test_the_reported_arm_and_each_rows_compute_follow_the_validation_choice():
    """select_eta chooses among the arms of a grid as among etas (the best validation metric), and
    a row's training compute is its own arm's jobs plus what the arms share."""
    from pita.report.results import add_compute, method_budgets, select_eta

    lab = {"algorithm": "DPO", "family": "tiny", "train_dataset": "arith", "round": 0, "eval_dataset": "arith",
           "eta": 0.0}
    rows = [{**lab, "variant": v, "pass@1": 0.3, "eval_job": f"DPO.tiny.arith.{a}.r0.eval.merge"}
            for v, a in (("lr=1e-05", "lr1e-05"), ("lr=0.0001", "lr1e-04"))]
    val = [{**lab, "variant": "lr=1e-05", "pass@1": 0.2}, {**lab, "variant": "lr=0.0001", "pass@1": 0.4}]
    select_eta(rows, val)
    assert [r["selected"] for r in rows] == [False, True]
    att = lambda s: {"state": "COMPLETED", "attempts": [{"duration_s": s, "devices": [0]}]}  # noqa: E731
    jobs = {"DPO.tiny.arith.lr1e-05.r0.train": {**att(10.0), "kind": "algo.dpo_train", "deps": []},
            "DPO.tiny.arith.lr1e-04.r0.train": {**att(20.0), "kind": "algo.dpo_train", "deps": []},
            "DPO.tiny.arith.lr1e-05.r0.eval.merge": {**att(1.0), "kind": "eval.merge"},
            "DPO.tiny.arith.lr1e-04.r0.eval.merge": {**att(1.0), "kind": "eval.merge"}}
    add_compute(rows, {"jobs": jobs}, lambda j: {"steps": 3})
    assert [r["train_device_s"] for r in rows] == [10.0, 20.0]
    [b] = method_budgets({"jobs": jobs}, lambda j: {"steps": 3, "train_flops": 1.0})
    assert (b["algorithm"], b["optimizer_steps"], b["device_s"], b["train_flops"]) == ("DPO", 6, 30.0, 2.0)


def test_each_methods_budget_counts_its_training_examples_and_the_report_says_who_had_more():
    """One unit for every method, labelled completions: PITA's value model trained on both
    sequences of each pair it kept, Q#'s on its returns, DPO on both completions of its 64 pairs
    (128) and GRPO on its online completions; the report says which of PITA and Q# trained on
    more examples, and by how much."""
    from pita.report.report import budget_section
    from pita.report.results import method_budgets

    att = {"state": "COMPLETED", "attempts": [{"duration_s": 1.0, "devices": [0]}], "deps": []}
    jobs = {"PITA.tiny.arith.r0.train": {**att, "kind": "algo.value_train"},
            "QSharp.tiny.arith.r0.train": {**att, "kind": "algo.value_train"},
            "DPO.tiny.arith.r0.train": {**att, "kind": "algo.dpo_train"},
            "GRPO.tiny.arith.r0.train": {**att, "kind": "algo.grpo_train"}}
    results = {"PITA.tiny.arith.r0.train": {"examples": 208, "pairs": 128, "ties": 24, "steps": 4},
               "QSharp.tiny.arith.r0.train": {"examples": 512, "steps": 8},
               "DPO.tiny.arith.r0.train": {"pairs": 64, "steps": 4},
               "GRPO.tiny.arith.r0.train": {"sequences": 96, "scored": 96, "steps": 12}}
    budgets = {b["algorithm"]: b for b in method_budgets({"jobs": jobs}, results.get)}
    assert {a: b["examples"] for a, b in budgets.items()} == {"PITA": 208, "QSharp": 512, "DPO": 128, "GRPO": 96}
    text = "\n".join(budget_section(list(budgets.values())))
    header = next(line for line in text.splitlines() if line.startswith("| algorithm"))
    assert "| labels | examples | optimizer steps |" in header
    assert "Q# trained on 512 examples, PITA on 208 (2.46x)" in text


def test_each_validation_choice_reports_its_margin_and_standard_error():
    """The chosen eta against the runner-up on the validation prompts: the margin of their metrics
    and its standard error, paired over prompts where both rows' samples are saved (the same
    prompts, so the prompts' own difficulty cancels), else from the two rows' standard errors. The
    report says how many choices are within 2 standard errors."""
    from types import SimpleNamespace

    from pita.report.report import choice_section
    from pita.report.results import validation_choices

    lab = {"algorithm": "PITA", "family": "tiny", "train_dataset": "arith", "round": 0, "eval_dataset": "arith",
           "split": "validation"}
    # four prompts, 2 samples each: eta 2 right on 6 of 8, eta 1 on 4 of 8, the base on 3
    right = {2.0: [1, 1, 1, 1, 1, 0, 1, 0], 1.0: [1, 1, 0, 1, 0, 0, 1, 0], 0.0: [1, 0, 0, 1, 0, 0, 1, 0]}
    recs = {eta: [{"id": f"p{i // 2}", "eta": eta, "sample": i % 2, "correct": bool(c)} for i, c in enumerate(cs)]
            for eta, cs in right.items()}
    store = SimpleNamespace(records=lambda job, eta: recs.get(float(eta)))
    val = [{**lab, "eta": eta, "pass@1": sum(cs) / 8, "pass@1_stderr": 0.15, "eval_job": "PITA.val"}
           for eta, cs in right.items()]
    [c] = validation_choices(val, store)
    assert (c["chosen"], c["runner_up"], c["margin"]) == ("η=2", "η=1", pytest.approx(0.25))
    # per-prompt differences of the means: 0, 0.5, 0.5, 0 -> mean 0.25, sd 0.2887, SE 0.1443
    assert c["margin_se"] == pytest.approx(0.144338, abs=1e-5) and c["se_kind"] == "paired over prompts"
    import math

    [u] = validation_choices(val)  # no samples: as if independent
    assert u["margin_se"] == pytest.approx(math.sqrt(2) * 0.15) and u["se_kind"] == "unpaired"
    text = "\n".join(choice_section([c]))
    assert "0 of 1 choices are within 2 standard errors" not in text and "1 of 1 choices" in text
    assert "| PITA | tiny | arith | 0 | η=2 | 0.750 | η=1 (0.500) | +0.250 | 0.144 | 1.7 | 0.283 | paired over prompts |" in text


def test_the_baselines_are_evaluated_along_training_at_their_snapshots(tiny_cache):
    """eval.checkpoints: each DPO / GRPO round's policy is also evaluated, on test and validation,
    at those fractions of its optimizer steps, from snapshots its training job saves: rows with
    variant "at 25%", so a baseline's frontier has points between its base and its final policy.
    A run too short for a snapshot leaves its evaluation without rows (never a failure)."""
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.algos=[DPO]", "eval.checkpoints=[0.25,0.5]"),
                                        [int(8e9)])}
    train = jobs["DPO.tiny.arith.r0.train"]
    assert train.params["snapshots"] == [0.25, 0.5]
    for tag, f, label in (("ck25", "0.25", "at 25%"), ("ck50", "0.5", "at 50%")):
        for split in ("eval", "val"):
            merge = jobs[f"DPO.tiny.arith.{tag}.r0.{split}.merge"]
            assert merge.params["labels"]["variant"] == label and merge.params["may_be_empty"]
            shard = jobs[f"DPO.tiny.arith.{tag}.r0.{split}.s0"]
            assert shard.params["request"]["policy"]["snapshot"] == f and train.id in shard.deps
    assert not [j for j in build_plan(compose(tiny_cache, "experiment.algos=[DPO]", "eval.checkpoints=[]"), [int(8e9)])
                if ".ck" in j.id]
    with pytest.raises(ConfigError, match=r"eval.checkpoints=\[1.5\] must list fractions in \(0, 1\)"):
        build_plan(compose(tiny_cache, "experiment.algos=[DPO]", "eval.checkpoints=[1.5]"), [int(8e9)])
