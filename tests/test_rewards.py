"""Rewards: answer extraction / verification, Bradley–Terry preference labels, reward-model scoring.

Run: .venv/bin/python -m pytest -q tests/test_rewards.py

The reward-model tests build a tiny Llama sequence classifier and a byte-level BPE tokenizer in
a temporary folder (no download); its weights are drawn with a large init range so that scores
differ by whole units between inputs and a misplaced pad or position would show.
"""

from __future__ import annotations

import logging
import math
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from pita.core.errors import ConfigError
from pita.rewards.preferences import bt_probability, make_pairs, sample_preference
from pita.rewards.verifier import Verdict, extract_answer, normalize_answer, same_answer, score_math, verify

# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, mode, expected",
    [
        (r"so the answer is \boxed{\frac{a^{2}}{b_{1}}}.", "boxed", r"\frac{a^{2}}{b_{1}}"),
        (r"first \boxed{3}, finally \boxed{\{1, 2\}}", "boxed", r"\{1, 2\}"),  # last box, literal braces
        (r"\fbox{7} is it", "boxed", "7"),
        (r"\boxed{3} and then \boxed{4", "boxed", "3"),  # truncated last box: last complete one
        (r"\boxed{18 \text{ dollars}}", "boxed", r"18 \text{ dollars}"),  # units are math-verify's to drop
        (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", "boxed", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"),
        (r"\boxed{11,\! 111,\! 100}", "boxed", "11111100"),
        (r"\boxed{(2,12) \cup (12,102)}", "boxed", r"(2,12) \cup (12,102)"),
        (r"\boxed{\$1{,}250.}", "boxed", "1250"),
        ("She sold 48 + 24 = 72 clips.\n#### 72", "hash", "72"),
        ("#### $1,000.", "hash", "1000"),
        ("#### -3/4 of it", "hash", "-3/4"),
        ("The total is 1,000 apples.", "last_number", "1000"),
        ("from 3-5 we get -7.5.", "last_number", "-7.5"),  # a range's hyphen is no minus sign
        (r"it costs \$18.", "last_number", "18"),
        (r"so it is \frac{3}{4}", "last_number", "3/4"),
        ("x = 3/4", "last_number", "3/4"),
        (r"\boxed{5} #### 6 and 7", "auto", "5"),  # boxed wins
        ("#### 6 and then 7", "auto", "6"),  # then hash
        ("no marker, just 12 and 13", "auto", "13"),  # then the last number
        ("no answer at all", "auto", None),
        ("#### 6", "boxed", None),
    ],
)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_unknown_mode_names_the_mode_and_the_choices():
    with pytest.raises(ValueError, match=r"'boxd'.*auto, boxed, hash, last_number"):
        extract_answer("1", "boxd")
    with pytest.raises(ValueError, match="boxd"):
        verify("1", "1", mode="boxd")


# --------------------------------------------------------------------------- verification


@pytest.mark.parametrize(
    "completion, gold, correct",
    [
        (r"\boxed{\frac{1}{2}}", "0.5", True),
        ("the answer is 0.5", r"\frac{1}{2}", True),
        ("#### 3/4", "0.75", True),
        (r"\boxed{\dfrac{3}{4}}", "3/4", True),
        (r"\boxed{\frac{2}{3}}", "0.5", False),
        ("#### 0.333333", r"\frac{1}{3}", True),  # math-verify's 6-place rounding
        ("#### 0.33", r"\frac{1}{3}", False),
        ("#### 72", "72", True),
        ("#### 71", "72", False),
        ("so 1,000 in all", "1000", True),
        ("#### 1000", "1,000", True),
        (r"The ticket costs \$18.", "18", True),
        (r"\boxed{\$18}", "18", True),
        (r"\boxed{18 \text{ dollars}}", "18", True),
        ("it drops to -5", "-5", True),
        ("it drops to -5", "5", False),
        (r"\boxed{x^2+2x+1}", "(x+1)^2", True),  # symbolic equivalence via math-verify
        (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}", True),
        ("reasoning... #### 72", "She sold 72 clips.\n#### 72", True),  # gold given as a solution
    ],
)
def test_verify(completion, gold, correct):
    v = verify(completion, gold)
    assert v.correct is correct, v
    assert (v.reason == "") is correct


# Normalisation must never change what a gold answer means. One test per class of real
# competition answers that it used to damage; each checks the right answer and a plausible wrong
# one that the damaged gold used to accept.


def test_matrix_row_break_followed_by_a_space_keeps_every_entry():
    """``\\\\ `` (row break, then a space) once lost a backslash: the gold parsed as its first entry."""
    gold = r"\begin{pmatrix} 2 \\ -1/2 \\ 7 \end{pmatrix}"
    for right in (gold, r"\begin{pmatrix}2\\-1/2\\7\end{pmatrix}",
                  r"\begin{pmatrix} 2 \\ -\frac{1}{2} \\ 7 \end{pmatrix}"):
        assert verify(rf"so \boxed{{{right}}}", gold).correct, right
    for wrong in ("2", "7", r"\begin{pmatrix} 2 \\ 7 \\ -1/2 \end{pmatrix}", r"\begin{pmatrix} 2 \\ -1/2 \end{pmatrix}"):
        assert not verify(rf"so \boxed{{{wrong}}}", gold).correct, wrong
    square = r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"
    assert verify(r"\boxed{\begin{pmatrix}1&2\\3&4\end{pmatrix}}", square).correct
    assert not verify(r"\boxed{\begin{pmatrix} 1 & 2 \end{pmatrix}}", square).correct  # first row alone
    assert not verify(r"\boxed{1}", square).correct


def test_thousands_separator_with_negative_thin_space_is_one_number():
    """``4,\\! 096,\\! 000`` is MATH's way to write 4096000; it once became the set {4, 96, 0}."""
    gold = r"4,\! 096,\! 000"
    for right in ("4096000", "4,096,000", r"4{,}096{,}000", r"4,\!096,\!000", r"4\,096\,000"):
        assert verify(rf"\boxed{{{right}}}", gold).correct, right
    for wrong in ("4, 096, 000", r"\{4, 96, 0\}", "4096", "4096001"):
        assert not verify(rf"\boxed{{{wrong}}}", gold).correct, wrong
    assert verify("#### 1,234", r"1,\!234").correct


def test_comma_between_digits_inside_intervals_and_pairs_is_a_separator():
    """``(1,250)`` once had its comma read as a thousands separator, making the interval 1250."""
    gold = r"(-5,1) \cup (1,250)"
    for right in (gold, r"(-5, 1) \cup (1, 250)", r"\left(-5, 1\right) \cup \left(1, 250\right)"):
        assert verify(rf"\boxed{{{right}}}", gold).correct, right
    assert verify(r"\boxed{(-5,1) \cup (1,250)}", r"(-5, 1) \cup (1, 250)").correct  # spaces on the gold side
    for wrong in (r"(-5, 1) \cup (1, 251)", "(-5, 250)", r"[-5, 1) \cup (1, 250)", "1250"):
        assert not verify(rf"\boxed{{{wrong}}}", gold).correct, wrong
    assert verify(r"\boxed{(12, 102)}", "(12,102)").correct  # an ordered pair, not 12102
    assert not verify(r"\boxed{12102}", "(12,102)").correct


MATH500_SHAPES = [
    # (gold as stored, an equivalent rewriting or None, a plausible wrong answer)
    (r"\frac{14}{3}", "14/3", r"\frac{3}{14}"),
    (r"\dfrac{9}{4}", "2.25", r"\frac{9}{2}"),
    (r"-\frac{1}{2}", "-0.5", r"\frac{1}{2}"),
    (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}", r"\frac{\sqrt{2}}{2}"),
    (r"\text{(C)}", "C", r"\text{(D)}"),
    (r"\text{(B)}", "(B)", "(E)"),
    (r"3\sqrt{13}", r"\sqrt{117}", r"3\sqrt{11}"),
    (r"2 \sqrt{2}", r"\sqrt{8}", r"2\sqrt{3}"),
    (r"4\sqrt[3]{2}", r"\sqrt[3]{128}", r"4\sqrt{2}"),
    (r"\frac{2\pi}{3}", r"\frac{2}{3}\pi", r"\frac{\pi}{3}"),
    (r"x \in [-2,7]", "[-2, 7]", "[-2, 7)"),
    (r"\{1,2,3\}", r"\{3, 2, 1\}", r"\{1, 2\}"),
    (r"2, -3", "-3, 2", "2, 3"),
    (r"90^\circ", "90", "45"),
    (r"\$18.90", "18.9", "18.09"),
    (r"18.90", r"\$18.90", "19.80"),
    (r"25\%", "25", "20"),
    (r"p - q", "-q + p", "q - p"),
    (r"\infty", None, r"-\infty"),
    (r"(3, -1)", "(3,-1)", "(-1, 3)"),
    (r"(-\infty, 0) \cup (0, \infty)", r"(-\infty,0)\cup(0,\infty)", r"(-\infty, \infty)"),
    (r"(2,12) \cup (12,102)", r"(2, 12) \cup (12, 102)", r"(2, 102)"),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", "1"),
    (r"\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}",
     r"\begin{pmatrix} -\frac{1}{3} \\ \frac{2}{3} \\ \frac{5}{3} \end{pmatrix}", "-1/3"),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
     r"\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}"),
    (r"10^{10}", "10000000000", "10^{9}"),
    (r"3 \times 10^{5}", "300000", "30000"),
    (r"11,\! 111,\! 111,\! 100", "11111111100", "11, 111, 111, 100"),
    (r"5\text{ cm}", "5", "6"),
    (r"y = 2x + 3", "y = 3 + 2x", "y = 3x + 2"),
    (r"\text{Monday}", None, r"\text{Tuesday}"),
    ("1,000", "1000", "100"),  # GSM8K-style thousands comma
]


@pytest.mark.parametrize("gold, rewritten, wrong", MATH500_SHAPES, ids=[g for g, _, _ in MATH500_SHAPES])
def test_gold_answers_in_competition_shapes(gold, rewritten, wrong):
    """Each gold matches itself boxed as a model would write it, an equivalent rewriting, and not a
    plausible wrong answer."""
    assert verify(rf"The answer is \boxed{{{gold}}}.", gold).correct
    if rewritten is not None:
        assert verify(rf"The answer is \boxed{{{rewritten}}}.", gold).correct
    assert not verify(rf"The answer is \boxed{{{wrong}}}.", gold).correct


def test_normalisation_keeps_latex_that_only_math_verify_should_read():
    assert normalize_answer(r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}") == r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"
    assert normalize_answer(r"(2,12) \cup (12,102)") == r"(2,12) \cup (12,102)"
    assert normalize_answer(r"a \leftarrow b") == r"a \leftarrow b"  # no blind "\left" removal
    assert normalize_answer(r"11,\! 111,\! 100") == "11111100"
    assert normalize_answer(r"\$1{,}250.") == "1250"
    assert normalize_answer("1, 2, 3") == "1, 2, 3"  # a list stays a list


def test_same_answer_is_mathematical_equivalence():
    assert same_answer(r"\frac{1}{2}", "0.5") and same_answer("0.5", r"\dfrac{1}{2}")
    assert same_answer("1,000", "1000") and same_answer(r"\text{(C)}", "C")
    assert same_answer(r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}")
    assert not same_answer("-1/3", r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}")
    assert not same_answer("0.5", "0.4") and not same_answer("", "") and not same_answer("x", "y")
    assert same_answer(r"\frac{}{", r"\frac{}{")  # unparsable: equal only to its own text


def test_no_answer_is_incorrect_with_a_reason():
    assert verify("I do not know.", "4") == Verdict(False, None, "no answer found")
    assert verify("#### 4", "4", mode="boxed").reason == "no answer found"


@pytest.mark.parametrize(
    "completion",
    [
        r"\boxed{\frac{}{}\sqrt}",
        r"\boxed{\frac{",
        r"\boxed{}}}{{\left( \right. ^^ _ \\}",
        r"\boxed{\begin{matrix} 1 & \end{pmatrix}}",
        r"\boxed{2^{2^{2^{2^{10}}}}}",  # would not finish (nothing can interrupt it): refused
        r"\boxed{(10!)!}",
        r"\boxed{9^{99999999}}",
        "\\boxed{" + "x+" * 400 + "1}",
        "",
    ],
)
def test_garbage_never_raises(completion):
    v = verify(completion, "4")
    assert v.correct is False and v.reason


def test_huge_expressions_are_refused_with_a_reason():
    assert verify(r"\boxed{9^{9^{9^{9}}}}", "4").reason.startswith("parse error:")
    assert verify(r"\boxed{2^{10}}", "1024").correct  # an ordinary power still goes through


def test_verify_in_worker_threads():
    """math-verify's signal timeouts only work in the main thread; ours are off, so threads work."""
    cases = [(r"\boxed{\frac{1}{2}}", "0.5", True), (r"\boxed{x^2}", "x^{2}", True), ("#### 7", "8", False)]
    jobs = [cases[i % len(cases)] for i in range(50)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda c: verify(c[0], c[1]), jobs))
    assert [v.correct for v in got] == [c[2] for c in jobs]
    assert all(v.reason in ("", "mismatch") for v in got), {v.reason for v in got}


def test_score_math():
    comps = [r"\boxed{4}", "#### 5", "nothing"]
    assert score_math(comps, ["4", "4", "4"], "auto") == [1.0, 0.0, 0.0]
    assert score_math(comps, ["4", "4", "4"], "auto", correctness_bonus=2.0, rm_scores=[0.5, -1.0, 0.25]) == [
        2.5,
        -1.0,
        0.25,
    ]
    with pytest.raises(ValueError, match="2 gold"):
        score_math(comps, ["4", "4"], "auto")


# --------------------------------------------------------------------------- Bradley–Terry


def test_bt_probability_by_hand():
    # σ(1) = 1 / (1 + e^-1) = 0.731058...; σ(2 * (0.5 - 1.5)) = σ(-2) = 0.119203...
    assert bt_probability(1.0, 0.0) == pytest.approx(0.7310585786)
    assert bt_probability(0.5, 1.5, beta=2.0) == pytest.approx(0.1192029220)
    assert bt_probability(3.0, -7.0, beta=0.0) == 0.5
    assert bt_probability(1000.0, -1000.0) == 1.0 and bt_probability(-1000.0, 1000.0) == 0.0  # no overflow


def test_bt_sampling_frequency_matches_sigmoid():
    """r_a - r_b = 1, beta = 1: P(choose a) = σ(1) = 0.7311; SE over 4000 keys = 0.0070."""
    n, p = 4000, 1 / (1 + math.exp(-1))
    wins = sum(sample_preference([1.0, 0.0], seed=0, key=f"prompt-{i}", beta=1.0)[0] == 0 for i in range(n))
    se = math.sqrt(p * (1 - p) / n)
    assert abs(wins / n - p) < 3 * se, (wins / n, p)


def test_beta_zero_is_a_coin_flip():
    n = 4000
    picks = [sample_preference([5.0, 0.0], seed=1, key=f"k{i}", beta=0.0) for i in range(n)]
    assert all(res[2] == 0.5 for res in picks)
    assert abs(sum(res[0] == 0 for res in picks) / n - 0.5) < 3 * math.sqrt(0.25 / n)


def test_sampling_is_deterministic_per_seed_and_key():
    draws = lambda seed: [sample_preference([0.2, 0.0], seed, f"k{i}")[0] for i in range(200)]  # noqa: E731
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)  # a different seed gives different labels
    one = sample_preference([0.2, 0.0], 7, "k3")
    assert [sample_preference([0.2, 0.0], 7, "k3") for _ in range(5)] == [one] * 5


def test_sampling_false_takes_the_argmax():
    p_hi = bt_probability(0.9, 0.1)
    assert sample_preference([0.1, 0.9], seed=0, key="a", sampling=False) == (1, 0, pytest.approx(p_hi))
    # More than two: highest vs lowest.
    c, r, p = sample_preference([0.5, 2.0, -1.0, 1.0], seed=0, key="a", sampling=False)
    assert (c, r) == (1, 2) and p == pytest.approx(bt_probability(2.0, -1.0))
    # Ties go to the lower index; all equal -> (0, 1).
    assert sample_preference([1.0, 3.0, 3.0, 0.0, 0.0], 0, "a", sampling=False)[:2] == (1, 3)
    assert sample_preference([2.0, 2.0, 2.0], 0, "a", sampling=False) == (0, 1, 0.5)


def test_sampling_can_go_against_the_reward_and_reports_p():
    res = [sample_preference([1.0, 0.0], 0, f"k{i}") for i in range(200)]
    flipped = [r for r in res if r[0] == 1]
    assert flipped and all(r[1] == 0 and r[2] == pytest.approx(1 - 0.7310585786) for r in flipped)


def test_fewer_than_two_candidates():
    assert sample_preference([1.0], 0, "a") is None
    assert sample_preference([], 0, "a") is None


def test_negative_beta_names_the_key():
    with pytest.raises(ConfigError, match=r"data_collection\.bt_beta=-0\.5"):
        sample_preference([1.0, 0.0], 0, "a", beta=-0.5)
    with pytest.raises(ConfigError, match=r"data_collection\.bt_beta"):
        make_pairs([], seed=0, beta=float("nan"), sampling=True)


def test_make_pairs():
    groups = [
        {"id": "p0", "prompt": "Q0", "completions": ["a", "b", "c"], "rewards": [0.0, 2.0, 1.0]},
        {"id": "p1", "prompt": "Q1", "completions": ["only"], "rewards": [1.0]},
        {"id": "p2", "prompt": "Q2", "completions": ["x", "y"], "rewards": [-1.0, 1.0]},
    ]
    pairs = make_pairs(groups, seed=0, beta=1.0, sampling=False)
    assert pairs == [
        {"id": "p0", "prompt": "Q0", "chosen": "b", "rejected": "a", "chosen_reward": 2.0,
         "rejected_reward": 0.0, "p_chosen": pytest.approx(bt_probability(2.0, 0.0))},
        {"id": "p2", "prompt": "Q2", "chosen": "y", "rejected": "x", "chosen_reward": 1.0,
         "rejected_reward": -1.0, "p_chosen": pytest.approx(bt_probability(1.0, -1.0))},
    ]  # fmt: skip
    # Sampled labels depend only on (seed, id): the same with the other groups removed.
    sampled = make_pairs(groups, seed=3, beta=1.0, sampling=True)
    assert make_pairs(groups[2:], seed=3, beta=1.0, sampling=True) == sampled[1:]
    with pytest.raises(ValueError, match="'bad'"):
        make_pairs([{"id": "bad", "prompt": "", "completions": ["a"], "rewards": [1.0, 2.0]}], 0, 1.0, True)


# --------------------------------------------------------------------------- reward model

CORPUS = [
    "What is two plus two? The answer is four.",
    "Tom has 3 apples and gets 5 more, so he has 8 apples.",
    "The movie was wonderful, I loved every minute of it.",
    "The service was slow and the food was cold.",
    "Natalia sold clips to 48 of her friends in April.",
] * 20
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
)


def _tokenizer(chat_template: str | None, pad: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    kw = dict(bos_token="<s>", eos_token="</s>", model_max_length=128)
    if pad:
        kw["pad_token"] = "<pad>"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kw)
    if chat_template:
        fast.chat_template = chat_template
    return fast


def _llama_config(tok, **kw):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.3, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory):
    """Folders: "chat" (tokenizer with a chat template and a pad token), "plain" (no template,
    no pad token), "lm" (a causal LM, not a reward model), "two" (a 2-label classifier).
    "chat" and "plain" hold the same weights."""
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("rm")
    tok = _tokenizer(CHAT_TEMPLATE, pad=True)
    model = LlamaForSequenceClassification(_llama_config(tok, num_labels=1))
    dirs = {}
    for name, t in (("chat", tok), ("plain", _tokenizer(None, pad=False))):
        d = root / name
        model.save_pretrained(d)
        t.save_pretrained(d)
        dirs[name] = d
    d = root / "lm"
    LlamaForCausalLM(_llama_config(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    dirs["lm"] = d
    d = root / "two"
    LlamaForSequenceClassification(_llama_config(tok, num_labels=2)).save_pretrained(d)
    tok.save_pretrained(d)
    dirs["two"] = d
    return dirs


PROMPTS = ["What is two plus two?", "Tom has 3 apples.", "Review:", "Q", "Natalia sold clips to 48 friends."]
PROMPTS = PROMPTS * 2
COMPLETIONS = [
    "four", "He gets 5 more, so 8 apples in all.", "The movie was wonderful, I loved it.", "The food was cold",
    "48", "", "8", "The service was slow and the food was cold, slow and cold and slow.", "four four four", "x",
]  # fmt: skip


@pytest.mark.parametrize("variant", ["chat", "plain"])
def test_scores_do_not_depend_on_batching_or_order(rm_dirs, variant):
    from pita.rewards.reward_model import RewardModelScorer

    ref = RewardModelScorer(rm_dirs[variant], batch_size=1).score(PROMPTS, COMPLETIONS)
    assert len(ref) == len(PROMPTS) and all(isinstance(s, float) for s in ref)
    assert max(ref) - min(ref) > 0.1, ref  # distinct inputs give distinct scores: the check has teeth
    for bs in (2, 3, 32):
        got = RewardModelScorer(rm_dirs[variant], batch_size=bs).score(PROMPTS, COMPLETIONS)
        assert got == pytest.approx(ref, rel=1e-5, abs=1e-5), bs
    perm = list(range(len(PROMPTS)))
    random.Random(0).shuffle(perm)
    shuffled = RewardModelScorer(rm_dirs[variant], batch_size=4).score(
        [PROMPTS[i] for i in perm], [COMPLETIONS[i] for i in perm]
    )
    assert shuffled == pytest.approx([ref[i] for i in perm], rel=1e-5, abs=1e-5)


def test_batches_are_formed_by_length(rm_dirs):
    """Sorted longest first, batches of 2 are padded only to their own longest member."""
    from pita.rewards.reward_model import RewardModelScorer

    scorer = RewardModelScorer(rm_dirs["plain"], batch_size=2)
    widths, forward = [], scorer.model.forward
    scorer.model.forward = lambda input_ids, **kw: widths.append(input_ids.shape[1]) or forward(input_ids, **kw)
    scorer.score(PROMPTS, COMPLETIONS)
    lengths = [len(scorer.tokenizer(p + c)["input_ids"]) for p, c in zip(PROMPTS, COMPLETIONS)]
    lengths.sort(reverse=True)
    assert widths == lengths[::2]


def test_scores_match_a_direct_forward_of_the_rendered_text(rm_dirs):
    """The chat RM renders (user=prompt, assistant=completion) with its template; the plain RM
    (no template) scores prompt + completion. Both match one unpadded forward pass."""
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from pita.rewards.reward_model import RewardModelScorer

    prompt, completion = "What is two plus two?", "The answer is four."
    model = LlamaForSequenceClassification.from_pretrained(rm_dirs["chat"]).eval()
    tok = AutoTokenizer.from_pretrained(rm_dirs["chat"])
    text = tok.apply_chat_template(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False
    )
    assert text.startswith("<s><|user|>What")
    with torch.no_grad():
        def direct(s, special):
            ids = tok(s, add_special_tokens=special, return_tensors="pt")["input_ids"]
            return model(input_ids=ids).logits[0, 0].item()

        want_chat, want_plain = direct(text, False), direct(prompt + completion, True)
    assert abs(want_chat - want_plain) > 1e-3  # the two renderings are told apart
    got_chat = RewardModelScorer(rm_dirs["chat"]).score([prompt], [completion])[0]
    got_plain = RewardModelScorer(rm_dirs["plain"]).score([prompt], [completion])[0]
    assert got_chat == pytest.approx(want_chat, abs=1e-5)
    assert got_plain == pytest.approx(want_plain, abs=1e-5)


def test_truncation_is_counted_and_warned(rm_dirs, caplog):
    from pita.rewards.reward_model import RewardModelScorer

    scorer = RewardModelScorer(rm_dirs["plain"], batch_size=2, max_length=12)
    long = "The service was slow and the food was cold. " * 5
    with caplog.at_level(logging.WARNING, logger="pita.rewards.reward_model"):
        scores = scorer.score(["Q", "Review:", "Q"], ["four", long, long])
    assert scorer.truncated == 2 and len(scores) == 3
    assert any("truncated 2 of 3" in r.getMessage() for r in caplog.records), caplog.text
    # A truncated input scores as its first max_length tokens.
    ids = scorer.tokenizer("Review:" + long)["input_ids"][:12]
    assert scores[1] == pytest.approx(scorer.score([""], [scorer.tokenizer.decode(ids)])[0], abs=1e-5)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pita.rewards.reward_model"):
        scorer.score(["Q"], ["four"])
    assert scorer.truncated == 2 and not caplog.records


def test_default_max_length_is_the_tokenizers_capped(rm_dirs):
    from pita.rewards.reward_model import RewardModelScorer

    assert RewardModelScorer(rm_dirs["chat"]).max_length == 128


def test_causal_lm_checkpoint_is_refused(rm_dirs):
    from pita.rewards.reward_model import RewardModelScorer

    with pytest.raises(ConfigError, match=r"LlamaForCausalLM.*not a sequence classifier") as e:
        RewardModelScorer(rm_dirs["lm"])
    assert str(rm_dirs["lm"]) in str(e.value)


def test_checkpoint_without_architectures_but_no_score_head_is_refused(rm_dirs, tmp_path):
    import json
    import shutil

    from pita.rewards.reward_model import RewardModelScorer

    d = tmp_path / "lm-no-arch"
    shutil.copytree(rm_dirs["lm"], d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["architectures"]
    (d / "config.json").write_text(json.dumps(cfg))
    refused = r"LlamaForSequenceClassification.*no trained score head.*score\.weight"
    with pytest.raises(ConfigError, match=refused):
        RewardModelScorer(d)


def test_two_label_classifier_scores_logit_difference(rm_dirs):
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from pita.rewards.reward_model import RewardModelScorer

    model = LlamaForSequenceClassification.from_pretrained(rm_dirs["two"]).eval()
    tok = AutoTokenizer.from_pretrained(rm_dirs["two"])
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "four"}], tokenize=False
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        lo, hi = model(input_ids=ids).logits[0].tolist()
    assert abs(hi - lo) > 1e-3
    scores = RewardModelScorer(rm_dirs["two"], batch_size=2).score(["Q", "R"], ["four", "x"])
    assert scores[0] == pytest.approx(hi - lo, abs=1e-5)


def test_the_completion_alone_scored_as_the_positive_logit(rm_dirs):
    """As the PITA and Q# reference code scores IMDB: the completion's text alone (no prompt, no
    chat template), and a two-label classifier's positive logit, not the margin."""
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from pita.rewards.reward_model import RewardModelScorer

    model = LlamaForSequenceClassification.from_pretrained(rm_dirs["two"]).eval()
    tok = AutoTokenizer.from_pretrained(rm_dirs["two"])
    with torch.no_grad():
        lo, hi = model(input_ids=tok("four", return_tensors="pt")["input_ids"]).logits[0].tolist()
    got = RewardModelScorer(rm_dirs["two"], inputs="completion", score="positive_logit").score(["Q", "R"],
                                                                                               ["four", "four"])
    assert got == pytest.approx([hi, hi], abs=1e-5)  # the prompt is not read
    margin = RewardModelScorer(rm_dirs["two"], inputs="completion", score="margin").score(["Q"], ["four"])
    assert margin == pytest.approx([hi - lo], abs=1e-5) and abs(lo) > 1e-3


def test_reward_scoring_follows_the_family_and_a_bad_value_exits_2(tmp_path):
    from omegaconf import OmegaConf

    from helpers import cli
    from pita.models.families import reward_scoring

    fam = OmegaConf.load(str(__import__("pita.cli", fromlist=["CONF_DIR"]).CONF_DIR / "model" / "llama.yaml"))
    assert reward_scoring(fam, "imdb") == {"reward_input": "completion", "reward_score": "positive_logit"}
    assert reward_scoring(fam, "tldr")["reward_input"] == "prompt_completion"
    r = cli(["experiment.name=rs", "+model.reward_inputs.imdb=prompt"], tmp_path)
    assert r.returncode == 2 and "model.reward_inputs.imdb" in r.stderr and "prompt_completion" in r.stderr


@pytest.mark.parametrize("bs", [0, -1, 2.5, True])
def test_bad_batch_size_is_refused(rm_dirs, bs):
    from pita.rewards.reward_model import RewardModelScorer

    with pytest.raises(ConfigError, match=r"data_collection\.reward_batch_size"):
        RewardModelScorer(rm_dirs["chat"], batch_size=bs)


def test_missing_path_gives_advice(tmp_path):
    from pita.rewards.reward_model import RewardModelScorer

    with pytest.raises(ConfigError, match="could not be loaded.*local path"):
        RewardModelScorer(str(tmp_path / "no-such-rm"))


def test_make_pairs_per_group_pairs_disjoint_completions_each_labelled_once():
    groups = [{"id": "q", "prompt": "p", "completions": ["a", "b", "c", "d", "e"], "rewards": [1.0, 0.0, 0.0, 0.0, 5.0]}]
    pairs = make_pairs(groups, seed=0, beta=1.0, sampling=False, per_group=3)
    # 5 completions make 2 disjoint pairs (1-2, 3-4); the budget of 3 cannot be met by the fifth alone
    assert [(p["chosen"], p["rejected"], p["pair"]) for p in pairs] == [("a", "b", 0), ("c", "d", 1)]
    again = make_pairs(groups, seed=0, beta=1.0, sampling=True, per_group=2)
    assert again == make_pairs(groups, seed=0, beta=1.0, sampling=True, per_group=2)


def test_math_verify_timeout_notice_stays_out_of_the_logs():
    """math-verify warns once per process that its timeouts are off; they are off on purpose (the
    verifier bounds the work itself), so the notice must not reach job.log and run.log."""
    import subprocess
    import sys

    code = ("import logging; logging.basicConfig(level=logging.INFO); "
            "from pita.rewards.verifier import verify; "
            "print(verify(r'so \\boxed{(2, 12) \\cup (12, 102)}', r'(2,12) \\cup (12,102)').correct)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
    assert "Timeout is disabled" not in r.stderr, r.stderr


def test_math_verify_timeouts_are_on_in_a_main_thread_and_the_bound_is_ours_elsewhere(monkeypatch):
    """math-verify's signal-based timeouts work in a main thread only: on there (job workers,
    torchrun ranks, TRL reward calls), off in other threads, where _too_costly bounds the time."""
    import threading

    from pita.rewards import verifier

    seen = []
    real = verifier._mv_verify

    def spy(gold, answer, timeout_seconds=5, **kw):
        seen.append(timeout_seconds)
        return real(gold, answer, timeout_seconds=timeout_seconds, **kw)

    monkeypatch.setattr(verifier, "_mv_verify", spy)
    assert verifier.verify("\\boxed{x+x}", "2x").correct
    th = threading.Thread(target=lambda: verifier.verify("\\boxed{y+y}", "2y"))
    th.start()
    th.join()
    assert seen == [verifier.VERIFY_TIMEOUT_S, None]


@pytest.mark.parametrize("answer, gold", [
    ("\\boxed{(x+1)^{3000}}", "x^{3000}+1"),  # sympy would expand 3001 terms: 30+ s unbounded
    ("\\boxed{(2y-1)^{500}}", "1"),
])
def test_a_large_power_of_an_expression_with_a_variable_is_not_expanded(answer, gold):
    import threading
    import time

    from pita.rewards.verifier import verify

    out = {}

    def run():
        t0 = time.perf_counter()
        out["v"], out["s"] = verify(answer, gold), time.perf_counter() - t0

    th = threading.Thread(target=run)  # no signal could stop it here
    th.start()
    th.join(60)
    assert not th.is_alive() and out["s"] < 5
    assert not out["v"].correct and "power over 200" in out["v"].reason


@pytest.mark.parametrize("completion, gold, correct", [
    # a number is never pulled out of a larger expression: these were scored correct
    (r"So the answer is $\frac{1+\sqrt{5}}{2}$.", "2", False),
    (r"Thus $-[0,1)$", "1", False),
    ("so the result is 2^10", "10", False),  # an exponent is no answer (a miss, not a false match)
    # an unboxed final answer in a math span is read whole, as math-verify reads it: these were scored wrong
    (r"so it is $(1,4.5)$", r"(1,\frac{9}{2})", True),
    (r"we get $\frac{x}{7}+\frac{2}{7}$", r"\frac{x+2}{7}", True),
    (r"answer \( (9+1) \)", "10", True),
    # plain text answers keep working, currency dollars included
    ("It costs $18 and $20 in total, so 38.", "38", True),
    ("She sold 48 + 24 = 72 clips.", "72", True),
    ("the answer is (5).", "5", True),
    ("The answer is $72$.", "72", True),
])
def test_unboxed_answers_are_read_whole_never_a_number_out_of_an_expression(completion, gold, correct):
    assert verify(completion, gold).correct is correct


@pytest.mark.parametrize("completion, gold, correct", [
    (r"The roots are \boxed{3} \quad\text{and}\quad \boxed{-1}.", "-1, 3", True),   # one answer set, several boxes
    (r"\boxed{5}, \boxed{7}", r"\boxed{5}\boxed{7}", True),
    (r"\boxed{5} and \boxed{7}", "5", False),           # a hedge between two answers is not the answer
    (r"First \boxed{2}. Then, after more work, \boxed{9}", "9", True),  # text between: only the last box
    (r"So the ratio is $\frac{2}{5},$ as claimed", r"\frac{2}{5}", True),  # the sentence's comma is not the answer's
])
def test_answer_sets_in_several_boxes_and_trailing_punctuation(completion, gold, correct):
    from pita.rewards.verifier import verify

    assert verify(completion, gold).correct is correct
