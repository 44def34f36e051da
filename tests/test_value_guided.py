"""PITA / Q# / Q#-HF: the round structure of the plan, bad input, checkpoints, training, a smoke run."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from helpers import assert_same_gradient, cli, record_optimizer_gradients
from pita.core.errors import ConfigError, JobError

pytestmark = pytest.mark.integration


def compose(tiny_cache, *overrides):
    from hydra import compose as hc, initialize_config_dir

    from pita.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hc(config_name="config", overrides=["experiment.workload=experiment", "experiment.datasets=[arith]",
                                                    "experiment.algos=[PITA,QSharp,QSharp-HF]",
                                                    f"system.cache_dir={tiny_cache}", "datasets.arith.toy_train_size=40",
                                                    "datasets.arith.toy_test_size=16", *overrides])


SHARED = ("algos.PITA.pair_mode=sampled", "algos.PITA.cut_points=2", "algos.PITA.rollin=sampled")  # PITA's roll-outs as Q#'s


def data_of(jobs, recipe: str) -> str:
    """Id prefix of round 0's shared collection of ``recipe`` (named by its request's hash)."""
    [p] = {j.rsplit(".", 1)[0] for j in jobs if j.startswith(f"data.tiny.arith.r0.{recipe}-")}
    return p


def test_rounds_chain_through_guidance_and_warm_starts(tiny_cache):
    from pita.core.graph import JobGraph
    from pita.plans import build_plan

    # PITA's sampled pairs: the three share round 0's roll-outs (its default greedy-vs-sampled
    # pairs are a collection of their own: test_pita_pairs_a_greedy_continuation_with_a_sampled_one_by_default)
    cfg = compose(tiny_cache, "experiment.rounds=2", *SHARED)
    jobs = build_plan(cfg, [int(8e9)] * 2)
    g = JobGraph(jobs).validate([int(8e9)] * 2)
    by = g.by_id
    VR = data_of(by, "value_rollouts")
    for algo in ("PITA", "QSharp", "QSharp-HF"):
        p = f"{algo}.tiny.arith"
        r1 = by[f"{p}.r1.gen.s0"]
        assert r1.deps == [f"{p}.r0.train"]
        assert r1.params["request"]["policy"]["guidance"]["from_job"] == f"{p}.r0.train"
        assert by[VR + ".s0"].params["request"]["policy"]["guidance"] is None
        t1 = by[f"{p}.r1.train"]
        assert t1.params["warm_start"] == f"{p}.r0.train"
        # rounds aggregate; round 0 comes from the reference, collected once for all three
        assert t1.params["data"] == [VR + ".merge", f"{p}.r1.gen.merge"]
        assert by[f"{p}.r1.eval.merge"].kind == "eval.merge"
        assert by[f"{p}.r1.eval.s0"].params["request"]["policy"]["guidance"]["from_job"] == f"{p}.r1.train"
        # eta 0 is not sampled again: its row is the base model's evaluation
        assert 0.0 not in by[f"{p}.r1.eval.s0"].params["request"]["etas"]
        assert by[f"{p}.r1.eval.merge"].params["base_eval"] == "base.tiny.arith.eval.merge"
        assert "base.tiny.arith.eval.merge" in by[f"{p}.r1.eval.merge"].deps
    assert by["QSharp-HF.tiny.arith.r1.proxy"].params["data"] == [VR + ".merge",
                                                                 "QSharp-HF.tiny.arith.r1.gen.merge"]
    assert by["PITA.tiny.arith.r0.train"].params["loss"] == "bce"
    assert by["QSharp-HF.tiny.arith.r0.train"].params["loss"] == "mle"
    assert "base.tiny.arith.eval.merge" in by


@pytest.mark.parametrize("override,needle", [
    ("algos.PITA.loss=bcee", "did you mean 'bce'"),
    ("algos.QSharp.mode=bernouli", "did you mean 'bernoulli'"),
    ("algos.QSharp.num_atoms=1", "algos.QSharp.num_atoms=1 must be >= 2"),
    ("algos.PITA.eta=-1", "must be >= 0"),
    ("algos.PITA.top_k=0", "top_k=0"),
    ("algos.PITA.top_k=100000", "larger than the vocabulary"),
    ("algos.QSharp.lm_prior=-1", "algos.QSharp.lm_prior=-1.0 must be >= 0"),
    ("experiment.algos=[PITAA]", "did you mean 'PITA'"),
    ("algos.PITA.mode=mle", "algos.PITA.mode=mle does not fit algos.PITA.loss=bce (its default on arith"),
    ("algos.QSharp-HF.mode=bernoulli", "algos.QSharp-HF.mode=bernoulli does not fit algos.QSharp-HF.loss=mle"),
])
def test_bad_algorithm_settings_are_refused_before_work(tiny_cache, override, needle):
    from pita.plans import build_plan

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("'", "'")):
        build_plan(compose(tiny_cache, override), [int(8e9)])


@pytest.mark.parametrize("override,needle", [
    ("+eval.datasets_by_train.arithh=[arith]", "did you mean 'arith'"),
    ("+eval.datasets_by_train.arith=[]", "eval.datasets_by_train.arith is empty"),
    ("+eval.datasets_by_train.arith=[gsm9k]", "eval.datasets_by_train.arith='gsm9k' is not known .did you mean 'gsm8k'"),
])
def test_bad_cross_dataset_evaluation_is_refused(tiny_cache, override, needle):
    from pita.plans import build_plan

    with pytest.raises(ConfigError, match=needle):
        build_plan(compose(tiny_cache, override), [int(8e9)])


def test_cross_dataset_evaluation_plans_an_eval_per_dataset_and_a_base_for_each(tiny_cache):
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.algos=[QSharp]",
                                                "+eval.datasets_by_train.arith=[arith,sentiment]"), [int(8e9)])}
    assert {"base.tiny.arith.eval.merge", "base.tiny.sentiment.eval.merge", "QSharp.tiny.arith.r0.eval.merge",
            "QSharp.tiny.arith.r0.eval-sentiment.merge"} <= set(jobs)
    x = jobs["QSharp.tiny.arith.r0.eval-sentiment.merge"].params["labels"]
    assert (x["train_dataset"], x["eval_dataset"], x["task"]) == ("arith", "sentiment", "reward")
    # the sentiment evaluation waits for the guidance it uses, and for the reward model that scores it
    assert jobs["QSharp.tiny.arith.r0.eval-sentiment.s0"].deps == ["QSharp.tiny.arith.r0.train",
                                                                   "model.tiny.reward_sentiment"]


def test_v_min_must_be_below_v_max(tiny_cache):
    from pita.plans import build_plan

    with pytest.raises(ConfigError, match="v_min=1.0 must be <"):
        build_plan(compose(tiny_cache, "algos.QSharp.v_min=1.0", "algos.QSharp.v_max=0.0"), [int(8e9)])


def test_incompatible_warm_start_and_mode_are_refused(tiny, tmp_path):
    from pita.guidance.decode import GuidedDecoder
    from pita.guidance.value_model import HeadSpec, ValueModel

    vm = ValueModel.create(tiny["guidance"], loss="mle", num_atoms=5, v_min=0, v_max=1)
    vm.save(tmp_path / "ck")
    with pytest.raises(ConfigError, match="incompatible head"):
        ValueModel.load(tmp_path / "ck", expect=HeadSpec("bce", 5, 0.0, 1.0, 128))
    ValueModel.load(tmp_path / "ck", expect=HeadSpec("mle", 5, 0.0, 1.0, 128))
    with pytest.raises(ConfigError, match="needs guidance.mode=mle"):
        GuidedDecoder(vm, "bernoulli", 1.0)
    with pytest.raises(ConfigError, match="top_k"):
        GuidedDecoder(vm, "mle", 1.0, top_k=0)
    with pytest.raises(ConfigError, match="not a guidance checkpoint"):
        ValueModel.load(tmp_path)


@pytest.mark.parametrize("head", ["reference", "embedding", "q"])
def test_value_training_learns_which_candidate_succeeds(tiny, head):
    """Continuations starting with token A succeed, with token B fail: after training,
    p(success | s, A) > 0.8 and p(success | s, B) < 0.2 for the shared state s, read at decoding
    the way the guided decoder reads it (the reference head: both candidates in one pass over
    the prompt's cache)."""
    from pita.guidance.train import SeqExample, TrainSettings, train
    from pita.guidance.value_model import ValueModel

    vm = ValueModel.create(tiny["guidance"], loss="bce", head=head)
    prompt, A, B = [5, 6, 7, 8], 20, 30
    ex = [SeqExample(prompt + [A, 9, 9], 4, 1.0), SeqExample(prompt + [B, 9, 9], 4, 0.0)] * 32
    curve = train(vm, ex, TrainSettings(epochs=12, lr=3e-3, token_budget=256), pad_id=0)
    assert curve[-1]["loss"] < curve[0]["loss"] * 0.5
    with torch.no_grad():
        ids = torch.tensor([prompt])
        h, past = vm.hidden(ids, torch.ones_like(ids), use_cache=True)
        if head != "reference":
            out = vm.scores(h[0, -1], torch.tensor([A, B]))
        else:
            out = vm.candidate_scores(past, torch.ones_like(ids), torch.tensor([len(prompt)]), torch.tensor([[A, B]]))[0]
        p = torch.sigmoid(out[..., 0])
    assert p[0] > 0.8 and p[1] < 0.2


def test_the_head_starts_from_the_backbone_lm_prior(tiny):
    """bce: the logit starts as log p_LM(a|s) (+ a small learned term), so a likelier candidate
    starts with a higher value; mle: a likelier candidate starts with a higher expected return;
    lm_prior=0 and the Bradley-Terry proxy start without the prior."""
    from pita.guidance.value_model import ValueModel
    from pita.losses.value import atoms

    ids = torch.tensor([[1, 40, 41, 42, 43]])
    vocab = torch.arange(120).unsqueeze(0)
    with torch.no_grad():
        vm = ValueModel.create(tiny["guidance"], loss="bce", head="embedding").eval()
        h, _ = vm.hidden(ids)
        lp = torch.log_softmax(vm.backbone.lm_head(h[:, -1]), -1)[0, :120]
        out = vm.scores(h[:, -1], vocab)[0, :, 0]
        assert torch.corrcoef(torch.stack([out, lp]))[0, 1] > 0.99
        assert (out - lp).abs().max() < 0.5
        best, worst = int(lp.argmax()), int(lp.argmin())
        assert lp[best] - lp[worst] > 1.0  # a trained LM, not a flat one: the two candidates differ
        mle = ValueModel.create(tiny["guidance"], loss="mle", num_atoms=5, v_min=0.0, v_max=1.0, head="embedding").eval()
        logits = mle.scores(h[:, -1], torch.tensor([[best, worst]]))[0]  # [2 candidates, 5 atoms]
        prior = lp[[best, worst]].unsqueeze(-1) * torch.linspace(-1.0, 1.0, 5)  # w_lm's start times log p
        delta = float((logits - prior).abs().max())  # the small learned term, w_o(gelu(z)) with w_o ~ N(0, 0.01²)
        assert delta < 0.5
        v = atoms(0.0, 1.0, 5)
        ev, ev_prior = torch.softmax(logits, -1) @ v, torch.softmax(prior, -1) @ v
        # the prior alone ranks the likelier candidate higher (softmax(c * lp) @ atoms grows with lp)
        assert ev_prior[0] > ev_prior[1]
        # the learned term moves every logit by at most delta, so each probability by a factor in
        # [e^-2δ, e^2δ] and (atoms >= 0) each expected return too: the ranking keeps that margin
        margin = math.log(ev_prior[0] / ev_prior[1])
        assert margin > 4 * delta  # the prior's ranking outweighs anything the learned term can do
        assert math.log(ev[0] / ev[1]) >= margin - 4 * delta > 0
        for vm0 in (ValueModel.create(tiny["guidance"], loss="bce", lm_prior=0.0, head="embedding"),
                    ValueModel.create(tiny["guidance"], loss="bradley_terry", head="embedding")):
            assert float(vm0.w_lm.abs().sum()) == 0.0
            assert float(vm0.scores(h[:, -1], vocab).std()) < 0.05


def test_an_all_tied_preference_set_fails_the_proxy_job_with_a_reason(tmp_path, monkeypatch):
    from pita.guidance import proxy, rollouts

    recs = [{"id": "x", "cut": 0, "reward": 1.0, "prompt_ids": [1], "prefix_ids": [], "continuation_ids": [2]},
            {"id": "x", "cut": 0, "reward": 1.0, "prompt_ids": [1], "prefix_ids": [], "continuation_ids": [3]}]
    ctx = SimpleNamespace(params={"data": ["m"], "seed": 0, "beta": 1.0, "label_seed": 0, "bt_sampling": True,
                                  "pairs_per_prompt": 4}, log=None, paths=None)
    monkeypatch.setattr(rollouts, "read_rounds", lambda c, merges: [dict(r) for r in recs])
    with pytest.raises(JobError, match="no preference pairs"):
        proxy.proxy_train(ctx)


def test_an_all_tied_pita_pair_set_fails_the_value_job_with_a_reason(monkeypatch):
    from pita.algos import value_guided
    from pita.guidance import rollouts

    recs = [{"id": "x", "cut": 0, "reward": 0.0, "prompt_ids": [1], "prefix_ids": [], "continuation_ids": [2]},
            {"id": "x", "cut": 0, "reward": 0.0, "prompt_ids": [1], "prefix_ids": [], "continuation_ids": [3]}]
    ctx = SimpleNamespace(params={"data": ["m"], "seed": 0, "beta": 1.0, "algo": "PITA", "label_seed": 0,
                                  "bt_sampling": True, "pairs_per_prompt": 4}, log=None, paths=None)
    monkeypatch.setattr(rollouts, "read_rounds", lambda c, merges: [dict(r) for r in recs])
    with pytest.raises(JobError, match="all 1 preference pairs are ties"):
        value_guided.value_train(ctx)


def test_smoke_experiment_writes_results_for_every_algorithm_and_eta(tmp_path, tiny_cache):
    r = cli(["experiment.name=vg", "experiment.workload=experiment", "experiment.datasets=[arith]",
             "experiment.algos=[PITA,QSharp,QSharp-HF]",
             "experiment.rounds=1", f"system.cache_dir={tiny_cache}", "datasets.arith.toy_train_size=24",
             "datasets.arith.toy_test_size=8", "eval.n=2", "algos.PITA.etas=[0.0,2.0]",
             "algos.QSharp.etas=[0.0,2.0]", "algos.QSharp-HF.etas=[0.0,2.0]",
             "+eval.datasets_by_train.arith=[arith,sentiment]", "datasets.sentiment.toy_test_size=6",
             "eval.controls=[]", "eval.eta_search_steps=0"],  # the grid's etas alone (the search: test_eta_search.py)
            tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    [run] = list((tmp_path / "vg").iterdir())
    from pita.report.results import read_results

    rows = read_results(run / "results" / "final_results.json")[0]
    got = {(x["algorithm"], x["eval_dataset"], x["eta"]) for x in rows}
    assert got == {("base", "arith", 0.0), ("base", "sentiment", 0.0)} | {
        (a, d, e) for a in ("PITA", "QSharp", "QSharp-HF") for d in ("arith", "sentiment") for e in (0.0, 2.0)}
    for x in rows:
        assert x["train_dataset"] == ("sentiment" if x["algorithm"] == "base" and x["eval_dataset"] == "sentiment"
                                      else "arith")
        if x["eval_dataset"] == "arith":
            assert 0.0 <= x["pass@1"] <= 1.0 and x["prompts"] == 8 and x["n"] == 2
        else:  # arith-trained value models guiding the reference on sentiment, scored by its reward model
            assert x["mean_reward"] is not None and x["prompts"] == 6
        # eta = 0 is the reference itself: exactly the base model's row (its records are reused,
        # not recomputed: pita/eval/jobs.py)
        if x["eta"] == 0.0:
            assert x["kl"] == 0.0
            if x["algorithm"] != "base":
                base = next(b for b in rows if b["algorithm"] == "base" and b["eval_dataset"] == x["eval_dataset"])
                for m in ("pass@1", "pass@1_stderr", "maj@n", "mean_reward", "prompts", "n", "kl"):
                    assert x.get(m) == base.get(m), (x["algorithm"], x["eval_dataset"], m)
        cell = run / "results" / "cells" / (f"{x['algorithm']}.tiny.{x['train_dataset']}.r{x['round']}."
                                            f"{x['eval_dataset']}.eta{x['eta']:g}.json")
        assert json.loads(cell.read_text()) == x
    assert "pass@1" in r.stdout and (run / "results" / "results.csv").exists()
    # eta chosen on validation prompts carved from the training data: one selected row per cell
    val = json.loads((run / "results" / "validation.json").read_text())
    assert {v["algorithm"] for v in val} == {"base", "PITA", "QSharp", "QSharp-HF"}
    assert all(v["eval_dataset"] == "arith" and v["prompts"] == 6 for v in val)  # 24 train prompts / 4
    for a in ("PITA", "QSharp", "QSharp-HF"):
        for d in ("arith", "sentiment"):
            cell = [x for x in rows if x["algorithm"] == a and x["eval_dataset"] == d]
            assert sum(x["selected"] for x in cell) == 1
            vbest = max((v for v in val if v["algorithm"] == a), key=lambda v: (v["pass@1"], -v["eta"]))
            assert next(x for x in cell if x["selected"])["eta"] == vbest["eta"]
    curve = (run / "jobs" / "QSharp.tiny.arith.r0.train" / "metrics.jsonl").read_text().splitlines()
    assert curve and "loss" in json.loads(curve[0])


def test_pita_pairs_every_two_continuations_of_a_cut_and_the_training_leaves_ties_out():
    from pita.guidance.rollouts import continuation_pairs

    def rec(i, cut, reward):
        return {"id": "x", "cut": cut, "reward": reward, "prompt_ids": [1], "prefix_ids": [], "continuation_ids": [i]}

    recs = [rec(2, 0, 4.0), rec(3, 0, 0.0), rec(4, 0, 0.0), rec(5, 0, 0.0), rec(6, 1, 0.0), rec(7, 1, 0.0)]
    pairs = continuation_pairs(recs, seed=0, beta=50.0)  # beta 50: the draw follows the reward
    assert [(c["continuation_ids"], r["continuation_ids"], tie) for c, r, tie in pairs] == [
        ([2], [3], False), ([4], [5], True), ([6], [7], True)]


def test_pita_follows_the_one_tie_rule_and_records_its_supervision():
    """On a verifier task without a reward model most of PITA's pairs tie (both right or both
    wrong). ``data_collection.ties`` decides for every preference learner: drop (the default: a tie
    states no preference) keeps the 1 decisive pair here; draw labels each tie by a coin flip and
    keeps all 3. The job's result counts pairs, ties and the decisive rest either way."""
    from types import SimpleNamespace

    from pita.algos.pita import PITA
    from pita.guidance.rollouts import continuation_pairs

    def rec(i, cut, reward):
        return {"id": "x", "cut": cut, "reward": reward, "prompt_ids": [1], "prefix_ids": [], "continuation_ids": [i],
                "prompt": "q"}

    recs = [rec(2, 0, 4.0), rec(3, 0, 0.0), rec(4, 0, 0.0), rec(5, 0, 0.0), rec(6, 1, 4.0), rec(7, 1, 4.0)]
    drawn = continuation_pairs(recs, seed=0, beta=50.0, ties="draw")
    assert [tie for _c, _r, tie in drawn] == [False, True, True]
    assert drawn[0][0]["continuation_ids"] == [2]  # a decisive pair follows the reward as before
    # each tie's order is its own coin flip, fixed by (seed, pair): over many seeds both orders come up
    firsts = {continuation_pairs(recs, seed=s, beta=50.0, ties="draw")[1][0]["continuation_ids"][0] for s in range(16)}
    assert firsts == {4, 5}
    params = {"label_seed": 0, "beta": 50.0, "bt_sampling": True, "pairs_per_prompt": 4}
    for ties, pairs in (("draw", 3), ("drop", 1)):
        ctx = SimpleNamespace(params={**params, "ties": ties}, log=SimpleNamespace(info=lambda *a, **k: None))
        examples = PITA.value_examples(ctx, recs, "cpu")
        assert len(examples) == 2 * pairs and sorted(e.target for e in examples) == [0.0] * pairs + [1.0] * pairs
        assert ctx.label_counts["supervision"] == {"pairs": 3, "ties": 2, "decisive": 1, "tie_rule": ties,
                                                   "trained_pairs": pairs}


@pytest.mark.parametrize("rule", ["drop", "draw"])
def test_every_preference_learner_gets_the_one_tie_rule(tiny_cache, rule):
    """PITA's value training, DPO's training and both proxies (Q#-HF, GRPO-HF) read the same
    ``data_collection.ties``: one key, one default (drop)."""
    from pita.plans import build_plan

    over = ["experiment.algos=[PITA,QSharp-HF,DPO,GRPO-HF]"] + ([] if rule == "drop" else [f"data_collection.ties={rule}"])
    jobs = build_plan(compose(tiny_cache, *over), [int(8e9)])
    learners = [j for j in jobs if j.kind == "algo.proxy_train" or j.kind == "algo.dpo_train"
                or (j.kind == "algo.value_train" and j.params["algo"] == "PITA")]
    assert {j.id.split(".")[0] for j in learners} == {"PITA", "QSharp-HF", "DPO", "GRPO-HF"}
    assert {j.params["ties"] for j in learners} == {rule}


def test_a_bad_ties_setting_is_refused_naming_the_key(tiny_cache):
    from pita.plans import build_plan

    with pytest.raises(ConfigError, match=r"data_collection.ties.*keep.*drop"):
        build_plan(compose(tiny_cache, "data_collection.ties=keep"), [int(8e9)])


def test_pita_needs_an_even_number_of_continuations(tmp_path):
    from omegaconf import OmegaConf

    from pita.algos import algorithm
    from pita.config.schema import PitaConfig

    cfg = OmegaConf.structured(PitaConfig)
    cfg.algos.PITA.continuations = cfg.algos.QSharp.continuations = 3
    assert not any("even" in p for p in algorithm("PITA", cfg.algos.PITA).check(cfg, 1))  # greedy vs sampled
    cfg.algos.PITA.pair_mode = "sampled"
    assert any("continuations=3 must be even" in p for p in algorithm("PITA", cfg.algos.PITA).check(cfg, 1))
    assert not any("even" in p for p in algorithm("QSharp", cfg.algos.QSharp).check(cfg, 1))


@pytest.mark.parametrize("loss", ["bce", "mle"])
def test_micro_batches_accumulate_to_the_same_step_as_the_whole_batch(tiny, loss, monkeypatch):
    """training.micro_batch_size splits a batch into parts whose gradients add up (each weighted
    by its share of the masked tokens) to the whole batch's: the same gradient at the optimizer
    step. Compared on the gradient, relative to its norm: float32 sums in another order agree to
    ~1e-6 of it, and weighting the parts 1/3 each instead of by tokens (parts of 5, 5 and 2 rows)
    would be off by tens of percent. (Not on the weights after one Adam step: Adam divides each
    gradient by its own magnitude, so a coordinate whose gradient is near 0 moves by an amount
    that float noise decides, and a wrong scale of the whole gradient would not show at all.)"""
    from pita.guidance.train import SeqExample, TrainSettings, train
    from pita.guidance.value_model import ValueModel

    grads = record_optimizer_gradients(monkeypatch)
    ex = [SeqExample([5, 6, 7] + [20 + i] * (1 + i % 3) + [9], 3, float(i % 2)) for i in range(12)]
    curves = []
    for micro in (0, 5):
        torch.manual_seed(0)
        vm = ValueModel.create(tiny["guidance"], loss=loss, v_min=0.0, v_max=1.0)
        curves.append(train(vm, ex, TrainSettings(epochs=1, lr=1e-3, batch_size=12, token_budget=4096,
                                                  micro_batch_size=micro, grad_clip=1e9), pad_id=0))
    (c0, c1), (g0, g1) = curves, grads
    assert len(c0) == len(c1) == 1 and c0[0]["loss"] == pytest.approx(c1[0]["loss"], rel=1e-5)
    assert_same_gradient(g0, g1)


def test_every_preference_method_gets_the_same_pair_budget_labelled_once_with_one_beta(tiny_cache):
    """PITA, the Q#-HF proxy, DPO and the GRPO-HF proxy: data_collection.pairs_per_prompt labelled
    pairs per prompt and round, data_collection.bt_beta / bradley_terry_sampling for the draws, and
    the run's seed for the labels (so earlier rounds' pairs keep their labels)."""
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.algos=[PITA,QSharp-HF,DPO,GRPO-HF]",
                                                "experiment.rounds=2", "data_collection.pairs_per_prompt=3",
                                                "data_collection.bt_beta=2.5",
                                                "data_collection.bradley_terry_sampling=false"), [int(8e9)])}
    want = {"beta": 2.5, "bt_sampling": False, "label_seed": 0, "pairs_per_prompt": 3}
    for jid in ("PITA.tiny.arith.r0.train", "PITA.tiny.arith.r1.train", "QSharp-HF.tiny.arith.r1.proxy",
                "GRPO-HF.tiny.arith.r1.proxy"):
        assert {k: jobs[jid].params[k] for k in want} == want, jid
    for algo in ("DPO", "GRPO-HF"):
        req = jobs[f"{algo}.tiny.arith.r1.gen.s0"].params["request"]
        assert req["n"] == 6 and req["preferences"] == {"beta": 2.5, "sampling": False, "label_seed": 0,
                                                          "pairs_per_prompt": 3, "round": 1}  # draws keyed by round


def test_a_roll_out_design_below_the_pair_budget_is_refused(tiny_cache):
    from pita.plans import build_plan

    with pytest.raises(ConfigError, match=r"algos.PITA.cut_points x algos.PITA.continuations/2 = 1 x 2 = 2 .*"
                                          r"pairs_per_prompt=4"):
        build_plan(compose(tiny_cache, "algos.PITA.cut_points=1", "algos.PITA.pair_mode=sampled"), [int(8e9)])
    with pytest.raises(ConfigError, match=r"algos.PITA.cut_points x 1 \(a greedy and a sampled continuation per "
                                          r"cut\) = 3 x 1 = 3 .*pairs_per_prompt=4"):
        build_plan(compose(tiny_cache, "algos.PITA.cut_points=3"), [int(8e9)])


def test_pita_pairs_a_greedy_continuation_with_a_sampled_one_by_default(tiny_cache):
    """As the PITA reference code: one pair per cut, its greedy continuation against a sampled
    one, four cuts for the budget of four pairs; Q# keeps its sampled continuations."""
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.algos=[PITA,QSharp]",
                                                "experiment.rounds=1"), [int(8e9)])}
    ro = {j.id: j.params["request"]["rollouts"] for j in jobs.values()
          if j.kind == "generation.shard" and j.params["request"]["recipe"] == "value_rollouts"}
    assert {r["mode"] for r in ro.values()} == {"greedy_vs_sampled", "sampled"}
    pita = next(r for r in ro.values() if r["mode"] == "greedy_vs_sampled")
    assert pita["cut_points"] == 4


def test_pairs_respect_the_budget_and_keep_their_labels_across_rounds():
    from pita.guidance.rollouts import continuation_pairs

    def rec(i, cut, reward, rnd=0):
        return {"id": "x", "cut": cut, "reward": reward, "prompt_ids": [1], "prefix_ids": [],
                "continuation_ids": [i], "_round": rnd}

    round0 = [rec(i, cut, float(i % 3)) for cut in (0, 5) for i in range(4 * cut, 4 * cut + 4)]
    three = continuation_pairs(round0, seed=0, beta=0.5, per_prompt=3)
    assert len(three) == 3  # 4 pairs available, 3 allowed
    later = continuation_pairs(round0 + [rec(i, 2, float(i % 2), rnd=1) for i in range(50, 54)], seed=0, beta=0.5,
                               per_prompt=3)
    assert later[:3] == three and len(later) == 5  # round 0's pairs, same labels; round 1 has its own budget


def test_cut_points_are_drawn_uniformly_and_reproducibly():
    from collections import Counter

    from pita.generation.recipes import cut_offsets

    assert cut_offsets(40, 3, 0, "a/cuts") == cut_offsets(40, 3, 0, "a/cuts")
    assert cut_offsets(2, 5, 0, "a/cuts") == [0, 1] and cut_offsets(0, 2, 0, "a/cuts") == [0]
    seen = Counter(c for k in range(2000) for c in cut_offsets(10, 2, 0, f"e{k}/cuts"))
    assert set(seen) == set(range(10))  # every position, not only {0, L/2}
    assert max(seen.values()) < 1.3 * min(seen.values())  # about uniform (400 each)


def test_eta_is_chosen_on_validation_rows_never_on_test_rows():
    from pita.report.results import select_eta

    def row(eta, v, split=None):
        r = {"algorithm": "PITA", "family": "tiny", "train_dataset": "arith", "round": 0, "eval_dataset": "arith",
             "eta": eta, "pass@1": v}
        return {**r, "split": split} if split else r

    test = [row(0.0, 0.30), row(1.0, 0.31), row(4.0, 0.45)]  # the test split would pick 4
    val = [row(0.0, 0.20, "validation"), row(1.0, 0.35, "validation"), row(4.0, 0.35, "validation")]
    select_eta(test, val)
    assert [r["selected"] for r in test] == [False, True, False]  # validation's best; the tie goes to eta 1
    alone = [row(4.0, 0.45)]
    select_eta(alone, [])
    assert alone[0]["selected"]  # one eta: nothing to choose
    none = [row(0.0, 0.30), row(4.0, 0.45)]
    select_eta(none, [])
    assert not any(r["selected"] for r in none)  # a sweep without validation has no choice


def test_validation_prompts_are_carved_from_the_training_split(tiny_cache):
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.algos=[PITA,DPO]"), [int(8e9)])}
    VR = data_of(jobs, "value_rollouts")
    gen = jobs[VR + ".s0"].params["request"]
    val = jobs["PITA.tiny.arith.r0.val.s0"].params["request"]
    assert gen["dataset"]["held_out"] == val["dataset"]["held_out"] == 10  # 40 train prompts / 4
    assert jobs[VR + ".s0"].params["n_examples"] == 30  # the rest train
    assert val["split"] == "held_out" and 0.0 not in val["etas"]
    assert jobs["PITA.tiny.arith.r0.val.merge"].params["base_eval"] == "base.tiny.arith.val.merge"
    # DPO's rounds are evaluated on the same validation prompts: its frontier at equal KL is chosen there
    dval = jobs["DPO.tiny.arith.r0.val.s0"].params["request"]
    assert dval["split"] == "held_out" and "etas" not in dval or dval["etas"] == [0.0]
    assert dval["policy"]["model_from_job"] == "DPO.tiny.arith.r0.train"
    assert "base_eval" not in jobs["DPO.tiny.arith.r0.val.merge"].params
    off = {j.id for j in build_plan(compose(tiny_cache, "eval.validation_prompts=0"), [int(8e9)])}
    assert not any(".val." in j for j in off)


def test_round_zero_data_from_the_reference_is_collected_once_per_recipe(tiny_cache):
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache, "experiment.algos=[PITA,QSharp,QSharp-HF,DPO,GRPO-HF]",
                                                *SHARED), [int(8e9)])}
    gens = sorted({j.rsplit(".", 1)[0] for j in jobs if ".r0." in j and jobs[j].kind == "generation.shard"
                   and j.rsplit(".", 2)[-2] not in ("eval", "val", "eval-search")})
    VR, PP = data_of(jobs, "value_rollouts"), data_of(jobs, "preference_pairs")
    assert gens == [PP, VR]
    assert jobs["DPO.tiny.arith.r0.train"].params["data"] == PP + ".merge"
    assert jobs["PITA.tiny.arith.r0.train"].params["data"] == jobs["QSharp.tiny.arith.r0.train"].params["data"]
    # a different roll-out design is different data: collected separately
    other = {j.id for j in build_plan(compose(tiny_cache, "algos.QSharp.cut_points=3", *SHARED), [int(8e9)])}
    assert VR + ".merge" in other  # the others' data keeps its name
    assert len({j.rsplit(".", 1)[0] for j in other if j.startswith("data.tiny.arith.r0.value_rollouts-")}) == 2


def test_evaluation_shards_reserve_memory_for_their_own_batch_and_the_value_model(tiny_cache):
    """An evaluation shard is sized by eval.batch_size / eval.max_new_tokens (not the data
    collection's), and a guided one also holds the value model."""
    from pita.plans import build_plan

    def mem(*o):
        jobs = build_plan(compose(tiny_cache, "experiment.rounds=1", "experiment.algos=[PITA]", *o), [int(8e9)] * 2)
        by = {j.id: j.resources.memory_gb for j in jobs}
        return by["base.tiny.arith.eval.s0"], by["PITA.tiny.arith.r0.eval.s0"]

    base_small, guided_small = mem("eval.batch_size=8")
    base_big, guided_big = mem("eval.batch_size=512", "eval.max_new_tokens=400")
    assert base_big > base_small and guided_big > guided_small
    assert guided_small > base_small and guided_big > base_big
    assert mem("eval.batch_size=512")[0] == mem("eval.batch_size=512", "data_collection.batch_size=1")[0]


def _prompt_rows(n_prompts=3, seed=0):
    """Value rows as value_rollouts gives them: per prompt, the prompt alone and cuts along one
    roll-in, each with continuations of their own length."""
    import random

    from pita.guidance.train import SeqExample

    rng = random.Random(seed)
    out = []
    for p in range(n_prompts):
        prompt, roll = [rng.randrange(3, 200) for _ in range(30)], [rng.randrange(3, 200) for _ in range(20)]
        for cut in (0, 8, 15):
            for _ in range(3):
                cont = [rng.randrange(3, 200) for _ in range(rng.randrange(3, 12))]
                ids = prompt + roll[:cut] + cont
                out.append(SeqExample(ids, len(ids) - len(cont), rng.random(), (p, 0)))
    return out


@pytest.mark.parametrize("loss", ["bce", "mle"])
def test_a_shared_prefix_run_once_gives_the_same_loss_and_gradients(tiny, loss):
    """Rows of one prompt share its tokens and part of the roll-in: run once (one row, its KV cache
    repeated over the group's rows) and the suffixes after it, the batch's loss and every
    parameter's gradient are those of the rows run whole (float noise: 1e-5 of the gradient)."""
    from pita.guidance.train import _clip, _loss, shared_prefix_groups
    from pita.guidance.value_model import ValueModel

    ex = _prompt_rows()
    clipped = [_clip(e.ids, e.start, 512) for e in ex]
    batch = sorted(range(len(ex)), key=lambda i: ex[i].ids)  # as a prompt's rows are batched
    groups = shared_prefix_groups([clipped[i][0] for i in batch], [clipped[i][1] for i in batch],
                                  list(range(len(batch))))
    # one per prompt, sharing its 30 tokens but the last (the first scored state of a cut-0 row)
    assert len(groups) == 3 and all(L == 29 and len(g) == 9 for L, g in groups)
    torch.manual_seed(0)
    vm = ValueModel.create(tiny["guidance"], loss=loss, v_min=0.0, v_max=1.0).train()
    out = []
    for share in (False, True):
        vm.zero_grad()
        value = _loss(vm, ex, clipped, batch, False, 0, "cpu", share=share)
        value.backward()
        out.append((float(value), {n: p.grad.clone() for n, p in vm.named_parameters() if p.grad is not None}))
    (l0, g0), (l1, g1) = out
    assert l1 == pytest.approx(l0, rel=1e-6) and g0.keys() == g1.keys()
    for n in g0:
        assert float((g0[n] - g1[n]).norm()) <= 1e-5 * float(g0[n].norm()) + 1e-12, n


def test_shared_prefix_batches_keep_a_prompts_rows_together_and_train_the_same_rows(tiny):
    import random

    from pita.guidance.train import TrainSettings, _grouped_batches, train
    from pita.guidance.value_model import ValueModel

    ex = _prompt_rows(4)
    batches = _grouped_batches(ex, [len(e.ids) for e in ex], 10**6, random.Random(0), 9)
    assert sorted(i for b in batches for i in b) == list(range(len(ex)))
    assert all(len({ex[i].group for i in b}) == 1 for b in batches)  # 9 rows a prompt, 9 rows a batch
    torch.manual_seed(0)
    vm = ValueModel.create(tiny["guidance"], loss="bce")
    curve = train(vm, ex, TrainSettings(epochs=2, lr=1e-3, batch_size=9, share_prefixes=True))
    assert len(curve) == 8 and all(math.isfinite(c["loss"]) for c in curve)


def test_share_prefixes_is_a_value_guided_key_that_reaches_the_training_job(tiny_cache):
    from pita.plans import build_plan

    cfg = compose(tiny_cache, "algos.QSharp.share_prefixes=true")
    jobs = {j.id: j for j in build_plan(cfg, [int(8e9)])}
    assert jobs["QSharp.tiny.arith.r0.train"].params["share_prefixes"] is True
    assert jobs["PITA.tiny.arith.r0.train"].params["share_prefixes"] is False


def test_q_sharp_leaves_out_prompts_whose_roll_outs_all_score_the_same_as_its_reference_does():
    """The Q# reference's --drop_no_variation 1 (its default): a prompt whose returns have one
    value teaches difficulty, not which continuation is better. By hand: prompt a (1, 0, 1) stays,
    b (all 0) and c (all 1) go, d (one roll-out) goes; the counts say so."""
    from pita.algos.value_guided import drop_no_variation
    from pita.guidance.train import SeqExample

    ex = [SeqExample([1, 2], 1, t, (p, 0)) for p, ts in (("a", (1, 0, 1)), ("b", (0, 0, 0)), ("c", (1, 1)), ("d", (1,)))
          for t in ts]
    kept, count = drop_no_variation(ex)
    assert [e.group[0] for e in kept] == ["a", "a", "a"]
    assert count == {"prompts": 4, "prompts_dropped": 3, "rollouts_dropped": 6, "rule": "drop_no_variation"}
    # the same prompt in two rounds is two groups: each round's roll-outs judged on their own
    two, c2 = drop_no_variation([SeqExample([1], 0, 1.0, ("a", 0)), SeqExample([1], 0, 1.0, ("a", 1))])
    assert two == [] and c2["prompts"] == 2


def test_drop_no_variation_is_q_sharps_key_on_by_default_and_reaches_its_training_jobs(tiny_cache):
    from pita.plans import build_plan

    jobs = {j.id: j for j in build_plan(compose(tiny_cache), [int(8e9)])}
    assert jobs["QSharp.tiny.arith.r0.train"].params["drop_no_variation"] is True
    assert jobs["QSharp-HF.tiny.arith.r0.train"].params["drop_no_variation"] is True
    assert "drop_no_variation" not in jobs["PITA.tiny.arith.r0.train"].params  # PITA's pairs drop ties instead
    off = {j.id: j for j in build_plan(compose(tiny_cache, "algos.QSharp.drop_no_variation=false"), [int(8e9)])}
    assert off["QSharp.tiny.arith.r0.train"].params["drop_no_variation"] is False
