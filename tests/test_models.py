"""The tiny family and the LM wrapper: budgets, batch invariance, masks, log-probs, sampling."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import assert_same_gradient, record_optimizer_gradients
from pita.core.errors import ConfigError
from pita.models.lm import LM, row_seed, sample_from

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ref(tiny):
    return LM.load(tiny["reference"])


def test_tiny_reference_is_imperfect_but_far_better_than_random(ref):
    """Random text essentially never ends in the right '#### n'; the reference must, often but not always."""
    from pita.datasets.config import dataset_config
    from pita.datasets.loading import load_examples
    from pita.rewards.verifier import verify

    ex = load_examples(dataset_config("arith", toy_test_size=100), "test")
    out = ref.generate([e.prompt for e in ex], n=2, max_new_tokens=48, seed=0, keys=[e.id for e in ex], batch_size=64)
    acc = sum(verify(s.text, e.answer).correct for o, e in zip(out, ex) for s in o) / (2 * len(ex))
    assert 0.1 < acc < 0.8, acc


def test_sentiment_reward_model_separates_labels(tiny):
    from pita.datasets.toy import sentiment_labelled
    from pita.rewards.reward_model import RewardModelScorer

    rm = RewardModelScorer(tiny["reward_sentiment"])
    data = sentiment_labelled(60, seed=123)  # reviews the RM was not trained on
    scores = rm.score(["Continue this review positively: " + " ".join(t.split()[:3]) for t, _ in data],
                      [" ".join(t.split()[3:]) for t, _ in data])
    pos = [s for s, (_, y) in zip(scores, data) if y]
    neg = [s for s, (_, y) in zip(scores, data) if not y]
    assert min(pos) > max(neg)


def test_reference_and_guidance_share_a_tokenizer_and_a_foreign_one_is_refused(tiny, tmp_path):
    from pita.models.families import check_tokenizers
    from pita.models.tiny import build_tokenizer

    check_tokenizers(tiny["reference"], tiny["guidance"])
    other = build_tokenizer(["completely different text " * 20, "zebra quartz " * 30], vocab_size=300)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ConfigError, match="cannot guide"):
        check_tokenizers(tiny["reference"], str(tmp_path / "other"))


def test_tokenizer_training_is_deterministic():
    from pita.datasets.toy import corpus
    from pita.models.tiny import build_tokenizer

    texts = [p + " " + r for p, r in corpus(0, n_arith=300, n_sentiment=100)]
    a, b = build_tokenizer(texts), build_tokenizer(texts)
    assert a.get_vocab() == b.get_vocab() and a.pad_token_id != a.eos_token_id


def test_unknown_family_lists_choices():
    from pita.models.families import load_family

    with pytest.raises(ConfigError, match="did you mean 'qwen3'"):
        load_family("qwen4")
    assert load_family("qwen3-sm").guidance == "Qwen/Qwen3-0.6B"


def test_each_sample_has_its_own_budget(ref):
    prompts = ["Ana has 3 pens. Ana gets 4 more. How many pens does Ana have? Answer after ####."] * 3
    ids = ref.encode([ref.chat_prompt(p) for p in prompts])
    out = ref.generate_ids(ids, [1, 4, 40], seeds=[1, 2, 3], temperature=0.0)
    assert len(out[0][0]) <= 1 and out[0][1] == "length"
    assert len(out[1][0]) <= 4
    alone = ref.generate_ids(ids[2:], [40], seeds=[3], temperature=0.0)
    assert out[2][:2] == alone[0][:2] and out[2][1] == "eos"  # the long row was not cut to the short ones


def test_samples_do_not_depend_on_the_batch(ref):
    """Same key -> same sample, whether alone, with other prompts, or with different padding."""
    a = "Tom has 5 cups. Tom gets 7 more. How many cups does Tom have? Answer after ####."
    b = "Continue this review positively: The plot was"
    c = "Li has 12 coins. Li gives away 3. Li gets 9 more. How many coins does Li have? Answer after ####."
    alone = ref.generate([a], n=3, seed=7, keys=["A"], max_new_tokens=30)
    mixed = ref.generate([b, a, c], n=3, seed=7, keys=["B", "A", "C"], max_new_tokens=30, batch_size=4)
    assert [s.token_ids for s in alone[0]] == [s.token_ids for s in mixed[1]]
    assert len({tuple(s.token_ids) for s in mixed[1]}) > 1  # the samples of one prompt differ


def test_pad_equal_to_eos_changes_nothing(ref):
    """Masks come from lengths: filling pads with the EOS id must give the same samples."""
    prompts = ["Tom has 5 cups. Tom gets 7 more. How many cups does Tom have? Answer after ####.",
               "Continue this review positively: The cast"]
    base = ref.generate(prompts, n=2, seed=3, max_new_tokens=20)
    saved = ref.pad_id
    try:
        ref.pad_id = ref.eos_ids[0]
        same = ref.generate(prompts, n=2, seed=3, max_new_tokens=20)
    finally:
        ref.pad_id = saved
    # bit for bit: a masked position enters every attention sum as an exact 0 (softmax of -inf),
    # and the shapes are the same, so the kernels add the same numbers in the same order
    assert [[s.token_ids for s in o] for o in base] == [[s.token_ids for s in o] for o in same]


def test_greedy_matches_transformers_generate(ref):
    p = ref.chat_prompt("Eva has 9 cards. Eva gives away 4. How many cards does Eva have? Answer after ####.")
    ids = ref.encode([p])
    ours = ref.generate_ids(ids, 24, seeds=[0], temperature=0.0)[0][0]
    hf = ref.model.generate(torch.tensor(ids), max_new_tokens=24, do_sample=False,
                            eos_token_id=ref.eos_ids, pad_token_id=ref.pad_id)[0, len(ids[0]):].tolist()
    hf = [t for t in hf if t not in ref.eos_ids]
    assert ours == hf


def test_sequence_logprobs_match_a_manual_sum_and_do_not_depend_on_the_batch(ref):
    p = ref.encode([ref.chat_prompt("Continue this review positively: The film")])[0]
    c = ref.encode(["was great and I loved it."])[0]
    with torch.no_grad():
        logits = ref.model(torch.tensor([p + c])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    manual = sum(float(lp[len(p) - 1 + i, t]) for i, t in enumerate(c))
    other = ref.encode(["Tom has 1 cup. How many cups does Tom have?"])[0]
    got = ref.sequence_logprobs([p, other], [c, c[:2]])
    assert got[0] == pytest.approx(manual, rel=1e-5, abs=1e-4)
    assert ref.sequence_logprobs([p], [c])[0] == pytest.approx(got[0], rel=1e-5, abs=1e-4)


def test_sample_from_rules():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 4)
    u = torch.tensor([0.0, 0.3, 0.6, 0.999])
    assert sample_from(logits, u, 0.0, 1.0, 0).tolist() == [3, 3, 3, 3]  # temperature 0: greedy
    assert sample_from(logits, u, 1.0, 1.0, 1).tolist() == [3, 3, 3, 3]  # top-k 1
    assert sample_from(logits, u, 1.0, 1e-6, 0).tolist() == [3, 3, 3, 3]  # top-p keeps the best
    # inverse CDF: frequencies follow softmax(logits / T)
    n = 20000
    g = torch.Generator().manual_seed(0)
    draws = sample_from(logits[:1].expand(n, 4), torch.rand(n, generator=g), 2.0, 1.0, 0)
    p = torch.softmax(logits[0] / 2.0, -1)
    freq = torch.bincount(draws, minlength=4).float() / n
    assert torch.all((freq - p).abs() < 4 * torch.sqrt(p * (1 - p) / n))
    top2 = sample_from(logits[:1].expand(n, 4), torch.rand(n, generator=g), 1.0, 1.0, 2)
    assert set(top2.tolist()) == {2, 3}


def test_row_seed_is_stable_and_distinct():
    assert row_seed(0, "a", 0) == row_seed(0, "a", 0)
    assert len({row_seed(0, "a", j) for j in range(100)} | {row_seed(1, "a", 0)}) == 101
    assert row_seed(0, "a", 0) < 2 ** 63


def test_bad_model_path_and_dtype_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot load the model"):
        LM.load(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="dtype"):
        LM.load(str(tmp_path), dtype="float8")


def _rows_alone_and_together(ref, guide_factory):
    """Every row sampled alone and in one batch whose rows end at very different steps (budgets
    1..40, EOS anywhere), so the batch drops its finished rows several times."""
    prompts = ["Tom has 5 cups. Tom gets 7 more. How many cups does Tom have? Answer after ####.",
               "Continue this review positively: The plot was",
               "Li has 12 coins. Li gives away 3. Li gets 9 more. How many coins does Li have? Answer after ####."]
    ids = [p for p in ref.encode([ref.chat_prompt(p) for p in prompts]) for _ in range(4)]
    budgets = [1, 3, 40, 8, 2, 40, 5, 40, 12, 1, 30, 6]
    seeds = list(range(100, 112))
    together = ref.generate_ids(ids, budgets, seeds, temperature=1.0, guide=guide_factory(), return_stop=True)
    alone = [ref.generate_ids([i], [b], [s], temperature=1.0, guide=guide_factory(), return_stop=True)[0]
             for i, b, s in zip(ids, budgets, seeds)]
    return together, alone


@pytest.mark.parametrize("guided", [None, "reference", "embedding"])
def test_a_batch_that_drops_its_finished_rows_gives_each_row_what_it_gets_alone(ref, tiny, guided, monkeypatch):
    from pita.guidance.decode import GuidedDecoder
    from pita.guidance.value_model import ValueModel

    vm = ValueModel.create(tiny["guidance"], loss="bce", head=guided).eval() if guided else None
    if vm is not None:
        torch.manual_seed(3)
        with torch.no_grad():
            vm.out_layer.weight.normal_(0, 1.0)  # a guide that visibly reshapes the distribution
    factory = (lambda: GuidedDecoder(vm, "bernoulli", 2.0, top_k=8)) if guided else (lambda: None)
    from transformers.cache_utils import DynamicCache

    sizes = []
    real = DynamicCache.batch_select_indices

    def spy(self, keep):
        sizes.append(len(keep))
        return real(self, keep)

    monkeypatch.setattr(DynamicCache, "batch_select_indices", spy)
    together, alone = _rows_alone_and_together(ref, factory)
    assert sizes and min(sizes) < 12  # the batch did shrink (the guide's cache with it when guided)
    for t, a in zip(together, alone):
        assert t[0] == a[0] and t[1] == a[1] and t[4] == a[4]  # tokens, finish, the EOS it stopped on
        # log-probs under policy and reference: other batch shapes sum in another order
        assert t[2] == pytest.approx(a[2], rel=1e-5, abs=1e-4) and t[3] == pytest.approx(a[3], rel=1e-5, abs=1e-4)


def test_pretraining_in_length_sorted_parts_is_one_padded_batch(monkeypatch):
    """The tiny family's pretraining splits each batch into micro-batches padded to their own
    length; the losses and the first step's gradient equal those of the whole batch padded at once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pita.models.tiny import _pretrain

    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, 40, (int(n),), generator=g).tolist() for n in torch.randint(3, 30, (50,), generator=g)]
    grads = record_optimizer_gradients(monkeypatch)
    runs = []
    for parts in (1, 4):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
        runs.append(_pretrain(model, seqs, steps=3, lr=1e-2, seed=0, pad_id=0, batch=8, parts=parts))
    l1, l4 = runs
    import random

    from pita.models.lm import pad_right

    r = random.Random(0)  # the first step's batch, padded at once, scored by transformers' own loss
    ids, mask = pad_right([seqs[r.randrange(len(seqs))] for _ in range(8)], 0)
    torch.manual_seed(0)
    with torch.no_grad():
        hf = LlamaForCausalLM(cfg)(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    assert l1[0] == pytest.approx(float(hf), rel=1e-5)
    assert l1 == pytest.approx(l4, rel=1e-5)
    assert len(grads) == 6
    assert_same_gradient(grads[0], grads[3])  # the first step's, from the same weights


def test_the_kv_cache_goes_by_the_models_own_keyword(ref, tiny, caplog, recwarn):
    """transformers 5.x renamed ``past_key_values`` to ``cache`` and warns on every call with the old
    name (74 warnings in one benchmark run's log); older releases know only the old name."""
    import logging

    from pita.guidance.decode import GuidedDecoder
    from pita.guidance.value_model import ValueModel
    from pita.models.lm import _cache_param, with_cache

    def new(input_ids=None, cache=None, use_cache=None): ...

    def old(input_ids=None, past_key_values=None, use_cache=None): ...

    assert _cache_param(new) == "cache" and _cache_param(old) == "past_key_values"
    assert list(with_cache(ref.model, "C")) == [_cache_param(type(ref.model).forward)]
    vm = ValueModel.create(tiny["guidance"], loss="bce").eval()
    caplog.set_level(logging.WARNING)
    ids = ref.encode([ref.chat_prompt("Tom has 5 cups. How many cups? Answer after ####.")]) * 2
    ref.generate_ids(ids, 6, [0, 1])
    ref.generate_ids(ids, 6, [0, 1], guide=GuidedDecoder(vm, "bernoulli", 1.0, top_k=4))
    said = [str(w.message) for w in recwarn] + [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "past_key_values" in m], said
