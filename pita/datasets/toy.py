"""Toy tasks shipped with the code, generated deterministically from a seed: no download.

arith      verifiable arithmetic word problems with integer answers.
           Knobs: ``n_ops`` (operations per problem), ``max_operand``, ``ops`` (subset of + - *).
           The reference solution is "3 + 5 = 8. #### 8": one line per step, then "#### answer".
sentiment  "continue this short review": the prompt is the first words of a review; the reward
           comes from a small sentiment classifier built locally (pita/models/tiny.py) and scored
           through the same code path as real reward models.

Both also provide the text the tiny model family is trained on (``corpus``).
"""

from __future__ import annotations

import random

from pita.datasets.base import Example

NAMES = ["Tom", "Ana", "Li", "Sam", "Mia", "Omar", "Eva", "Raj", "Zoe", "Ben"]
ITEMS = ["apples", "books", "coins", "cards", "pens", "shells", "stamps", "cups"]


def _arith_problem(rng: random.Random, n_ops: int, max_operand: int, ops: str) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(1, max_operand)
    text = [f"{name} has {value} {item}."]
    steps = []
    for _ in range(n_ops):
        op = rng.choice(ops)
        if op == "-" and value <= 1:
            op = "+"
        if op == "+":
            k = rng.randint(1, max_operand)
            text.append(f"{name} gets {k} more.")
            steps.append(f"{value} + {k} = {value + k}")
            value += k
        elif op == "-":
            k = rng.randint(1, min(value - 1, max_operand))
            text.append(f"{name} gives away {k}.")
            steps.append(f"{value} - {k} = {value - k}")
            value -= k
        else:
            k = rng.randint(2, 3)
            text.append(f"{name} makes the pile {k} times as big.")
            steps.append(f"{value} * {k} = {value * k}")
            value *= k
    text.append(f"How many {item} does {name} have?")
    return " ".join(text), steps, value


def arith_examples(n: int, seed: int = 0, split: str = "train", n_ops: int = 1, max_operand: int = 9,
                   ops: str = "+-") -> list[Example]:
    """``n`` problems; the split name is mixed into the seed so train and test differ."""
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    bad = set(ops) - set("+-*")
    if not ops or bad:
        raise ValueError(f"ops={ops!r} must be a non-empty subset of '+-*'")
    rng = random.Random(f"arith/{split}/{seed}/{n_ops}/{max_operand}/{ops}")
    out = []
    for i in range(n):
        q, steps, ans = _arith_problem(rng, n_ops, max_operand, ops)
        out.append(Example(id=f"arith-{split}-{i:05d}", prompt=q, answer=str(ans), task="math",
                           meta={"solution": ". ".join(steps) + f". #### {ans}", "n_ops": n_ops}))
    return out


POSITIVE = ["great", "wonderful", "lovely", "excellent", "fun", "moving", "brilliant", "charming", "superb",
            "delightful"]
NEGATIVE = ["boring", "awful", "dull", "terrible", "weak", "messy", "bland", "painful", "poor", "tedious"]
SUBJECTS = ["The film", "This movie", "The story", "The acting", "The plot", "The ending", "The music", "The cast"]
LINKS = ["was", "felt", "seemed", "is", "turned out"]
TAILS = ["and I", "so I", "and we", "so we"]


def sentiment_sentence(rng: random.Random, positive: bool, opening: str | None = None) -> str:
    """A one-sentence review; ``opening`` (e.g. "The film was") fixes its first words."""
    words = POSITIVE if positive else NEGATIVE
    opening = opening or f"{rng.choice(SUBJECTS)} {rng.choice(LINKS)}"
    verb = rng.choice(["loved", "liked", "enjoyed"]) if positive else rng.choice(["hated", "disliked", "regretted"])
    return f"{opening} {rng.choice(words)} {rng.choice(TAILS)} {verb} it."


def sentiment_examples(n: int, seed: int = 0, split: str = "train", prefix_words: int = 3) -> list[Example]:
    """Prompts are the first words of a review of either label (balanced by construction)."""
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    rng = random.Random(f"sentiment/{split}/{seed}")
    out = []
    for i in range(n):
        positive = i % 2 == 0
        review = sentiment_sentence(rng, positive)
        prefix = " ".join(review.split()[:prefix_words])
        out.append(Example(id=f"sentiment-{split}-{i:05d}", prompt=f"Continue this review positively: {prefix}",
                           answer=None, task="reward", meta={"label": int(positive), "review": review}))
    return out


def sentiment_labelled(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """(text, label) pairs to train the toy sentiment reward model."""
    rng = random.Random(f"sentiment-rm/{seed}")
    return [(sentiment_sentence(rng, i % 2 == 0), int(i % 2 == 0)) for i in range(n)]


def corpus(seed: int = 0, n_arith: int = 4000, n_sentiment: int = 1000, max_operand: int = 20,
           template: str = "{question}") -> list[tuple[str, str]]:
    """(prompt, response) pairs the tiny reference model is pre-trained on: arith problems of one to
    three operations (so the default two-operation task is in range but not memorised) and reviews."""
    pairs = []
    for n_ops in (1, 2, 3):
        for e in arith_examples(n_arith // 3, seed, "pretrain", n_ops=n_ops, max_operand=max_operand):
            pairs.append((template.replace("{question}", e.prompt), e.meta["solution"]))
    rng = random.Random(f"corpus/{seed}")
    for e in sentiment_examples(n_sentiment, seed, "pretrain"):
        prefix = e.prompt.split(": ", 1)[1]
        words = e.meta["review"].split()
        opening = " ".join(words[:4] if words[2] == "turned" else words[:3])
        # the reference is neutral: it continues the opening in either direction
        review = sentiment_sentence(rng, rng.random() < 0.5, opening=opening)
        pairs.append((e.prompt, review[len(prefix):].strip()))
    return pairs
