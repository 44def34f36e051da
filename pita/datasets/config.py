"""``DatasetConfig``: every knob of one dataset, typed for Hydra's structured configs.

Build one with its dataset's defaults, then override:

    cfg = dataset_config("gsm8k", test_cap=100)        # == pita/conf/dataset/gsm8k.yaml + test_cap
    problems = check_dataset_config(cfg)                # every problem at once, [] when fine
    examples = load_examples(cfg, "test")               # pita/datasets/loading.py

A bare ``DatasetConfig(name=...)`` carries generic defaults (no hub id, "question"/"answer"
fields) and is refused for hub datasets until ``hub_id`` or ``path`` is set: the per-dataset
values live in the adapters (pita/datasets/adapters.py) and reach configs through
``dataset_config`` and the YAML files, never by silent fallback.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional

from pita.core.errors import ConfigError
from pita.core.names import unknown_name
from pita.datasets.adapters import DATASETS, KEY, key

EXTRACTORS = ("auto", "boxed", "hash", "last_number")
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass
class DatasetConfig:
    # what the run calls the dataset (its key under datasets.*, in every table, file and plot): a
    # registered dataset (gsm8k, math500, aime22to24, aime2024, aime2025, imdb, tldr, arith,
    # sentiment), or a name of your own whose format is ``base``'s
    name: str
    # the registered dataset whose format and defaults this one has: set when datasets.NAME composes
    # another's config (+dataset@datasets.NAME=gsm8k); null = ``name`` itself
    base: Optional[str] = None
    hub_id: Optional[str] = None  # Hugging Face dataset repo, e.g. openai/gsm8k (unused when path is set)
    hub_config: Optional[str] = None  # the repo's config name, e.g. "main" for gsm8k
    # Local data replacing the hub: a .jsonl/.json/.parquet/.csv file, or a folder written by
    # Dataset.save_to_disk / DatasetDict.save_to_disk. A file with a "split" column has its rows
    # picked by train_split / test_split; a single table without one is the evaluated test split,
    # and training on it is refused unless allow_train_on_test is set.
    path: Optional[str] = None
    # Train on a path that is one table with no "split" column, i.e. on the very rows evaluated as
    # the test split. Off: such a train split is a ConfigError naming the file and the fixes.
    allow_train_on_test: bool = False
    train_split: Optional[str] = "train"  # null: the dataset has no train split (evaluation sets)
    test_split: Optional[str] = "test"  # the split evaluated
    question_field: str = "question"  # the column holding the question (or the prompt of a reward task)
    answer_field: Optional[str] = "answer"  # null for reward tasks (no gold answer)
    # The prompt given to the model, with a {question} placeholder; null = the adapter's template.
    prompt_template: Optional[str] = None
    train_cap: Optional[int] = None  # at most this many train examples (after shuffling); null = all
    test_cap: Optional[int] = None  # at most this many test examples; null = all
    held_out: int = 0  # train examples set aside (after the seeded shuffle) as the "held_out" split
    seed: int = 0  # shuffling, and generation of the toy tasks
    # How the verifier extracts a final answer from model outputs on this dataset; stored in every
    # Example.meta["extractor"]. auto | boxed (\boxed{...}) | hash ("#### x") | last_number.
    answer_extractor: str = "auto"
    # a reward task scored by a Python function of your own instead of a reward model:
    # module:function, imported from reward_dir (the folder the run was started in); see
    # pita/rewards/function.py. null: model.reward_models.<name>
    reward: Optional[str] = None
    reward_dir: Optional[str] = None  # the folder datasets.<name>.reward is imported from; null: where the run starts
    prefix_words: int = 8  # imdb / sentiment: words of the review kept in the prompt
    n_ops: int = 2  # arith: operations per problem
    max_operand: int = 20  # arith: operands drawn from 1..max_operand
    ops: str = "+-"  # arith: a subset of "+-*"
    toy_train_size: int = 128  # arith / sentiment: generated train examples (the demo's size)
    toy_test_size: int = 32  # arith / sentiment: generated test examples


FIELDS = [f.name for f in dataclasses.fields(DatasetConfig)]


def dataset_config(name: str, **overrides: Any) -> DatasetConfig:
    """The config of a registered dataset with its adapter's defaults, then ``overrides``."""
    adapter = DATASETS.get(name, field=key(name, "name"))
    bad = [unknown_name(f"a field of {KEY}.{name}", k, FIELDS) for k in overrides if k not in FIELDS]
    if "name" in overrides:
        bad.append(f"{key(name, 'name')}: pass the name once, as the first argument")
    if bad:
        raise ConfigError(bad)
    return DatasetConfig(name=name, **{**adapter.defaults(), **overrides})


def default_dataset_configs() -> dict[str, DatasetConfig]:
    """One config per registered dataset, with its defaults (what pita/conf/dataset/*.yaml hold)."""
    return {name: dataset_config(name) for name in DATASETS.names()}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def base_of(cfg: Any) -> str:
    """The registered dataset whose adapter reads ``cfg`` (its ``base``, else its ``name``)."""
    return getattr(cfg, "base", None) or cfg.name


def task_of(cfg: Any) -> str:
    """The task of the dataset ``cfg`` configures (its adapter's: math or reward)."""
    return DATASETS.get(base_of(cfg)).task


def check_dataset_config(cfg: Any) -> list[str]:
    """Every problem with ``cfg`` (a DatasetConfig or an equivalent DictConfig), one line each."""
    if base_of(cfg) not in DATASETS:
        if getattr(cfg, "base", None):
            return [unknown_name(key(cfg.name, "base"), cfg.base, DATASETS.names())]
        return [unknown_name(key(cfg.name, "name"), cfg.name, DATASETS.names())
                + f"; for data of your own, build it on one of them: +dataset@datasets.{cfg.name}=<that one> (or set "
                  f"{key(cfg.name, 'base')})"]
    adapter = DATASETS.get(base_of(cfg))
    p: list[str] = []
    if getattr(cfg, "reward", None) is not None:
        from pita.rewards.function import target_problem

        bad = target_problem(cfg.reward, key(cfg.name, "reward"))
        if bad:
            p.append(bad)
        elif adapter.task != "reward":
            p.append(f"{key(cfg.name, 'reward')}={cfg.reward!r}: {cfg.name} is a math task, scored by the verifier "
                     f"against its gold answers; a reward function scores reward tasks (build yours on one: "
                     f"+dataset@datasets.{cfg.name}=imdb or tldr)")

    def need(cond: bool, field: str, rule: str) -> None:
        if not cond:
            p.append(f"{key(cfg.name, field)}={getattr(cfg, field)!r}: {rule}")

    for f in ("train_cap", "test_cap"):
        v = getattr(cfg, f)
        need(v is None or (_is_int(v) and v >= 1), f,
             "must be a positive integer, or null for no cap (a cap of 0 would leave the split empty)")
    need(_is_int(cfg.held_out) and cfg.held_out >= 0, "held_out",
         "must be an integer >= 0 (train examples set aside; 0 = none)")
    need(_is_int(cfg.seed), "seed", "must be an integer")
    if cfg.answer_extractor not in EXTRACTORS:
        p.append(unknown_name(key(cfg.name, "answer_extractor"), cfg.answer_extractor, EXTRACTORS))
    t = cfg.prompt_template
    need(t is None or (isinstance(t, str) and "{question}" in t), "prompt_template",
         "must contain the placeholder {question} (where the question goes), or be null for the default: "
         f"{adapter.prompt_template!r}")
    need(_is_int(cfg.prefix_words) and cfg.prefix_words >= 1, "prefix_words", "must be a positive integer")

    if adapter.generated:
        for f in ("toy_train_size", "toy_test_size", "n_ops", "max_operand"):
            need(_is_int(getattr(cfg, f)) and getattr(cfg, f) >= 1, f, "must be a positive integer")
        ops = cfg.ops
        need(isinstance(ops, str) and ops != "" and not set(ops) - set("+-*"), "ops",
             "must be a non-empty subset of '+-*', e.g. '+-'")
        for f in ("path", "hub_id"):
            need(getattr(cfg, f) is None, f, f"{cfg.name} is generated from the seed and its knobs; set it to null")
        if _is_int(cfg.held_out) and _is_int(cfg.toy_train_size) and cfg.toy_train_size >= 1:
            need(cfg.held_out < cfg.toy_train_size, "held_out",
                 f"must be smaller than toy_train_size={cfg.toy_train_size} so that train keeps examples")
        return p

    if cfg.path is None and cfg.hub_id is None:
        p.append(f"{key(cfg.name, 'hub_id')}=None and {key(cfg.name, 'path')}=None: say where the data is, e.g. "
                 f"{key(cfg.name, 'hub_id')}={adapter.hub_id} or {key(cfg.name, 'path')}=<file or save_to_disk folder> "
                 f"(dataset_config({cfg.name!r}) and pita/conf/dataset/{cfg.name}.yaml carry the defaults)")
    if cfg.path is not None:
        path = os.path.expanduser(str(cfg.path))
        ext = os.path.splitext(path)[1].lower()
        if not os.path.exists(path):
            need(False, "path", "does not exist; fix the path, or set it to null to load "
                 f"{cfg.hub_id or adapter.hub_id} from the hub")
        elif os.path.isfile(path) and ext not in FILE_FORMATS:
            need(False, "path", f"has the unsupported extension {ext or '(none)'!r}; use one of "
                 f"{', '.join(FILE_FORMATS)} or a folder written by save_to_disk")
    need(isinstance(cfg.question_field, str) and cfg.question_field != "", "question_field",
         "must name the field that holds the question")
    if adapter.task == "math":
        need(isinstance(cfg.answer_field, str) and cfg.answer_field != "", "answer_field",
             f"{cfg.name} is a math task and needs the field that holds the gold answer, e.g. {adapter.answer_field!r}")
    else:
        need(cfg.answer_field is None, "answer_field",
             f"{cfg.name} is a reward task (scored by a reward model, no gold answer); set it to null")
    need(isinstance(cfg.allow_train_on_test, bool), "allow_train_on_test",
         "must be true or false (true: train on a single-table path that is also the test split)")
    need(cfg.test_split is None or isinstance(cfg.test_split, str), "test_split", "must be a split name or null")
    need(cfg.train_split is None or isinstance(cfg.train_split, str), "train_split", "must be a split name or null")
    return p


def validate_dataset_config(cfg: Any) -> None:
    """Raise one ConfigError listing every problem with ``cfg``."""
    problems = check_dataset_config(cfg)
    if problems:
        raise ConfigError(problems)
