"""One adapter per dataset, registered by name in ``DATASETS``: where the data lives, which
fields hold the question and the answer, the prompt template, and how a raw row becomes an
``Example``.

    adapter = DATASETS.get("gsm8k")(cfg)          # cfg: a DatasetConfig (pita/datasets/config.py)
    adapter.to_example({"question": "...", "answer": "... #### 1,000"}, index=17, split="test")
    -> Example(id="gsm8k-test-00017", prompt="...\\nPlease reason ...", answer="1000", task="math", ...)

Loading, shuffling, held-out carving and caps are not done here but in pita/datasets/loading.py;
the defaults each adapter declares become a ``DatasetConfig`` through
``pita.datasets.config.dataset_config(name)`` (and pita/conf/dataset/<name>.yaml).

Ids use the row's index in its source split *before* shuffling, so an example keeps its id
whatever the seed or caps ("gsm8k-train-00017" is row 17 of the train split, also when it was set
aside as held-out).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pita.core.errors import ConfigError
from pita.datasets.base import DATASETS, Example
from pita.datasets.toy import arith_examples, sentiment_examples

KEY = "datasets"  # config keys are reported as datasets.<name>.<field>

HASH_TEMPLATE = '{question}\nPlease reason step by step, and put your final answer after "####".'
BOXED_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
POSITIVE_TEMPLATE = "Continue this review positively: {question}"
ARITH_TEMPLATE = "{question} Answer after ####."


def key(name: str, field: str) -> str:
    """The dotted config key of one field of dataset ``name``'s config, for error messages."""
    return f"{KEY}.{name}.{field}"


def apply_template(template: str, question: str) -> str:
    # str.replace, not str.format: templates hold literal braces such as "\boxed{}".
    return template.replace("{question}", question)


def as_answer(value: Any) -> str:
    """Gold answers as text: 204 and 204.0 both become "204"."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


class DatasetAdapter:
    """Base adapter. Subclasses set the class attributes and override what differs."""

    hub_id: ClassVar[str | None] = None
    hub_config: ClassVar[str | None] = None
    train_split: ClassVar[str | None] = "train"  # None: the dataset has no train split
    test_split: ClassVar[str | None] = "test"
    question_field: ClassVar[str] = "question"
    answer_field: ClassVar[str | None] = "answer"  # None for reward tasks
    prompt_template: ClassVar[str] = "{question}"
    task: ClassVar[str] = "math"  # "math" (verifiable answer) or "reward" (scored by a reward model)
    generated: ClassVar[bool] = False  # toy tasks: built from the seed, no hub and no path
    prefix_words: ClassVar[int] = 8  # reward tasks made of review prefixes
    no_train: ClassVar[str] = ""  # why there is no train split, when train_split is None

    def __init__(self, cfg: Any):  # a DatasetConfig (config.py imports this module, not the reverse)
        self.cfg = cfg
        self.name = cfg.name

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The DatasetConfig fields this dataset sets (the rest keep the dataclass defaults)."""
        return dict(hub_id=cls.hub_id, hub_config=cls.hub_config, train_split=cls.train_split,
                    test_split=cls.test_split, question_field=cls.question_field, answer_field=cls.answer_field,
                    prompt_template=cls.prompt_template, prefix_words=cls.prefix_words)

    @property
    def template(self) -> str:
        return self.cfg.prompt_template or self.prompt_template

    @property
    def source(self) -> str:
        return self.cfg.path or self.cfg.hub_id or "toy"

    # -- rows -> Examples -------------------------------------------------------------------
    def field(self, row: dict, name_key: str, index: int, split: str) -> Any:
        """``row[cfg.<name_key>]``, or a ConfigError naming the field, the row and its fields."""
        name = getattr(self.cfg, name_key)
        value = row.get(name)
        if value is None:
            has = sorted(k for k, v in row.items() if v is not None)
            raise ConfigError(
                f"{key(self.name, name_key)}={name!r}: row {index} of the {split} split of {self.source} has no "
                f"{name!r} field; the row has the fields {has}. Set {key(self.name, name_key)} to the field "
                f"that holds the {name_key.replace('_field', '')}, or fix the data")
        return value

    def question(self, row: dict, index: int, split: str) -> str:
        return str(self.field(row, "question_field", index, split)).strip()

    def answer(self, row: dict, index: int, split: str) -> str | None:
        if self.task != "math":
            return None
        return as_answer(self.field(row, "answer_field", index, split))

    def meta(self, row: dict) -> dict[str, Any]:
        return {}

    def to_example(self, row: dict, index: int, split: str) -> Example:
        """``index``: the row's position in its source split; ``split``: "train" or "test"."""
        return Example(id=f"{self.name}-{split}-{index:05d}",
                       prompt=apply_template(self.template, self.question(row, index, split)),
                       answer=self.answer(row, index, split), task=self.task,
                       meta={"source": self.source, "row": index, "extractor": self.cfg.answer_extractor,
                             **self.meta(row)})

    # -- toy tasks --------------------------------------------------------------------------
    def generate(self, split: str) -> list[Example]:
        raise NotImplementedError(f"{self.name} is not a generated dataset")


@DATASETS.register("gsm8k")
class GSM8K(DatasetAdapter):
    hub_id, hub_config = "openai/gsm8k", "main"
    prompt_template = HASH_TEMPLATE

    def answer(self, row: dict, index: int, split: str) -> str:
        text = str(self.field(row, "answer_field", index, split))
        if "####" not in text:
            f = self.cfg.answer_field
            raise ConfigError(
                f"{key(self.name, 'answer_field')}={f!r}: row {index} of the {split} split of {self.source} has no "
                f"'#### <answer>' in its {f!r} field ({text[-80:]!r}); GSM8K answers end with '#### <number>'. "
                f"Point answer_field at the GSM8K-style solution, or fix the data")
        # "#### 1,000" -> "1000": GSM8K writes thousands separators; the verifier compares numbers.
        return text.rsplit("####", 1)[1].strip().replace(",", "")

    def meta(self, row: dict) -> dict[str, Any]:
        return {"solution": str(row.get(self.cfg.answer_field, ""))}


@DATASETS.register("math500")
class MATH500(DatasetAdapter):
    hub_id = "HuggingFaceH4/MATH-500"
    train_split = None
    question_field = "problem"
    prompt_template = BOXED_TEMPLATE
    no_train = "MATH-500 is a test set only, and training on the test set is not allowed"

    def meta(self, row: dict) -> dict[str, Any]:
        return {k: row[k] for k in ("level", "subject") if row.get(k) is not None}


@DATASETS.register("aime22to24")
class AIME22to24(DatasetAdapter):
    hub_id = "AI-MO/aimo-validation-aime"  # AIME 2022-2024; its only split, "train", is our test set
    train_split, test_split = None, "train"
    question_field = "problem"
    prompt_template = BOXED_TEMPLATE
    no_train = "AIME 2022-2024 is an evaluation set only (its hub split 'train' is used as test)"


@DATASETS.register("aime2024")
class AIME2024(AIME22to24):
    hub_id = "HuggingFaceH4/aime_2024"
    no_train = "AIME 2024 is an evaluation set only (its hub split 'train' is used as test)"


@DATASETS.register("aime2025")
class AIME2025(AIME22to24):
    hub_id = "yentinglin/aime_2025"
    no_train = "AIME 2025 is an evaluation set only (its hub split 'train' is used as test)"


_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)


@DATASETS.register("imdb")
class IMDBGen(DatasetAdapter):
    """IMDBGen: continue the first words of a movie review positively (scored by a sentiment RM).

    The hub's splits are sorted by label, so only the seeded shuffle before the cap gives a test
    subset with both labels; the label is kept in ``meta["label"]``.
    """

    hub_id, hub_config = "stanfordnlp/imdb", "plain_text"
    question_field = "text"
    answer_field = None
    task = "reward"
    prompt_template = POSITIVE_TEMPLATE

    def question(self, row: dict, index: int, split: str) -> str:
        text = _BR.sub(" ", str(self.field(row, "question_field", index, split)))
        return " ".join(text.split()[: self.cfg.prefix_words])

    def meta(self, row: dict) -> dict[str, Any]:
        return {"label": row.get("label")}


@DATASETS.register("tldr")
class TLDR(DatasetAdapter):
    """Reddit TL;DR: the ``prompt`` field already reads "SUBREDDIT: ... POST: ... TL;DR:"."""

    hub_id = "trl-lib/tldr"
    question_field = "prompt"
    answer_field = None
    task = "reward"

    def question(self, row: dict, index: int, split: str) -> str:
        # No strip: the prompt ends exactly where the summary should start.
        return str(self.field(row, "question_field", index, split))

    def meta(self, row: dict) -> dict[str, Any]:
        ref = row.get("completion")
        return {"reference": ref} if ref is not None else {}


class ToyAdapter(DatasetAdapter):
    """Generated from the config's knobs and seed (pita/datasets/toy.py)."""

    generated = True

    def size(self, split: str) -> int:
        return self.cfg.toy_train_size if split == "train" else self.cfg.toy_test_size

    def to_example(self, row: Example, index: int, split: str) -> Example:
        question = row.prompt if (getattr(self.cfg, "base", None) or self.name) == "arith" else row.prompt.split(": ", 1)[1]
        return Example(id=row.id, prompt=apply_template(self.template, question), answer=row.answer,
                       task=row.task, meta={**row.meta, "source": "toy", "row": index,
                                            "extractor": self.cfg.answer_extractor})


@DATASETS.register("arith")
class Arith(ToyAdapter):
    # Short, because the tiny family is pre-trained on exactly this form (pita/models/tiny.py).
    prompt_template = ARITH_TEMPLATE

    def generate(self, split: str) -> list[Example]:
        c = self.cfg
        return arith_examples(self.size(split), c.seed, split, n_ops=c.n_ops, max_operand=c.max_operand, ops=c.ops)


@DATASETS.register("sentiment")
class Sentiment(ToyAdapter):
    answer_field = None
    task = "reward"
    prompt_template = POSITIVE_TEMPLATE
    prefix_words = 3

    def generate(self, split: str) -> list[Example]:
        return sentiment_examples(self.size(split), self.cfg.seed, split, prefix_words=self.cfg.prefix_words)
