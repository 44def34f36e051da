"""Load one split of a dataset as a list of ``Example``.

    from pita.datasets.config import dataset_config
    from pita.datasets.loading import load_examples
    test = load_examples(dataset_config("gsm8k", path="data/gsm8k.jsonl", test_cap=100), "test")

Every split is reproducible from the config alone:

1. the rows of the source split (held_out comes from train): generated for the toy tasks, read
   from ``cfg.path`` when set, else from the Hugging Face hub. A path that is one table with no
   ``split`` column is the test split; its train split is refused (it would train on the
   evaluation rows) unless ``allow_train_on_test`` is set;
2. a seeded shuffle of the row indices (``random.Random(cfg.seed)``);
3. train only: the first ``held_out`` shuffled rows are the held_out split, the rest are train,
   so the two never share a row;
4. the cap (``train_cap`` / ``test_cap``) keeps the first rows of what is left: a random subset,
   which matters for datasets stored sorted by label (IMDB);
5. each kept row becomes an Example through the dataset's adapter (ids use the row's index
   before shuffling, so they do not depend on the seed).

Bad input raises ConfigError naming the key, the value and the fix. ``datasets`` is imported
lazily: it takes a second to import and most processes never load data.
"""

from __future__ import annotations

import os
import random
from typing import Any

from pita.core.errors import ConfigError
from pita.core.names import unknown_name
from pita.datasets.adapters import DATASETS, DatasetAdapter, key
from pita.datasets.base import Example
from pita.datasets.config import FILE_FORMATS, base_of, validate_dataset_config

SPLITS = ("train", "test", "held_out")


def load_examples(cfg: Any, split: str) -> list[Example]:
    """The examples of ``split`` ("train", "test" or "held_out") of the dataset ``cfg`` describes."""
    validate_dataset_config(cfg)
    if split not in SPLITS:
        raise ConfigError(unknown_name("split", split, SPLITS))
    if split == "held_out" and cfg.held_out == 0:
        raise ConfigError(f"{key(cfg.name, 'held_out')}=0: the held_out split is empty; set "
                          f"{key(cfg.name, 'held_out')}=N to set aside N train examples")
    adapter = DATASETS.get(base_of(cfg))(cfg)
    source = "test" if split == "test" else "train"
    rows = adapter.generate(source) if adapter.generated else _source_rows(cfg, adapter, source)
    n = len(rows)
    if n == 0:
        raise ConfigError(f"{key(cfg.name, source + '_split')}={_split_name(cfg, source)!r}: the {source} split of "
                          f"{adapter.source} has no rows; point {key(cfg.name, 'path')} at data with rows")

    order = list(range(n))
    random.Random(cfg.seed).shuffle(order)
    if source == "train":
        if cfg.held_out >= n:
            raise ConfigError(f"{key(cfg.name, 'held_out')}={cfg.held_out}: the train split of {adapter.source} has "
                              f"only {n} rows, so none would be left for train; set held_out below {n}")
        order = order[:cfg.held_out] if split == "held_out" else order[cfg.held_out:]
    cap = {"train": cfg.train_cap, "test": cfg.test_cap}.get(split)
    if cap is not None:
        order = order[:cap]

    picked = [rows[i] for i in order] if isinstance(rows, list) else rows.select(order).to_list()
    out = []
    for i, row in zip(order, picked):
        ex = adapter.to_example(row, i, source)
        ex.meta["split"] = split
        out.append(ex)
    return out


def _split_name(cfg: Any, source: str) -> str | None:
    return cfg.train_split if source == "train" else cfg.test_split


def _source_rows(cfg: Any, adapter: DatasetAdapter, source: str):
    """The rows of the source split, as a ``datasets.Dataset``."""
    name = _split_name(cfg, source)
    if cfg.path is not None:
        # Local data may hold a split the hub lacks (e.g. a train set for MATH-500).
        return _from_path(cfg, name or source, f"{source}_split")
    if name is None:
        why = adapter.no_train if source == "train" and adapter.no_train else f"{cfg.name} has no {source} split"
        other = "train on another dataset (e.g. gsm8k) or " if source == "train" else ""
        raise ConfigError(f"{key(cfg.name, source + '_split')}=None: {why}. To use a {source} split, {other}set "
                          f"{key(cfg.name, 'path')}=<a jsonl/json/parquet/csv file or save_to_disk folder with "
                          f"{source} rows>")
    return _from_hub(cfg, name)


def _from_hub(cfg: Any, split_name: str):
    import datasets

    try:
        return datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=split_name)
    except Exception as e:  # offline, not cached, no such split: all mean "use a local copy"
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise ConfigError(
            f"{key(cfg.name, 'hub_id')}={cfg.hub_id!r} (config {cfg.hub_config!r}, split {split_name!r}) could not "
            f"be loaded ({reason}): the Hugging Face hub is unreachable or the dataset is not cached. Save it where "
            f"there is network (Dataset.save_to_disk or to_json) and set {key(cfg.name, 'path')}=<that file or "
            f"folder>") from e


def _from_path(cfg: Any, split_name: str, split_key: str):
    import datasets

    path = os.path.expanduser(str(cfg.path))
    kp = key(cfg.name, "path")
    if os.path.isdir(path):
        try:
            obj = datasets.load_from_disk(path)
        except FileNotFoundError as e:
            raise ConfigError(f"{kp}={cfg.path!r} is a folder but not one written by Dataset.save_to_disk or "
                              f"DatasetDict.save_to_disk; point it at such a folder or at a jsonl/json/parquet/csv "
                              f"file") from e
        except Exception as e:  # e.g. datasets cannot read back a saved table with no rows
            raise ConfigError(f"{kp}={cfg.path!r} could not be read by datasets.load_from_disk ({type(e).__name__}: "
                              f"{e}); save it again with save_to_disk, or export it to jsonl/parquet") from e
        if isinstance(obj, datasets.DatasetDict):
            if split_name not in obj:
                raise ConfigError(f"{key(cfg.name, split_key)}={split_name!r}: the DatasetDict at {cfg.path!r} has no "
                                  f"split {split_name!r}; its splits are {sorted(obj)}. Set "
                                  f"{key(cfg.name, split_key)} to one of them")
            return obj[split_name]
        ds = obj
    else:
        fmt = FILE_FORMATS[os.path.splitext(path)[1].lower()]  # the extension was validated
        if os.path.getsize(path) == 0:  # datasets fails on these with a bare StopIteration
            raise ConfigError(f"{kp}={cfg.path!r} is an empty file (0 bytes); point it at a file with rows")
        try:
            ds = datasets.load_dataset(fmt, data_files=path, split="train")
        except Exception as e:
            raise ConfigError(f"{kp}={cfg.path!r} could not be read as {fmt} ({type(e).__name__}: {e}); fix the "
                              f"file or convert it to jsonl/parquet") from e
    if "split" not in ds.column_names:  # one table: it is the test split
        if split_key == "train_split" and not cfg.allow_train_on_test:
            raise ConfigError(_train_on_test_problem(cfg, ds))
        return ds
    values = ds["split"]
    keep = [i for i, v in enumerate(values) if v == split_name]
    if not keep:
        raise ConfigError(f"{key(cfg.name, split_key)}={split_name!r}: no row of {cfg.path!r} has split={split_name!r} "
                          f"in its 'split' column, which holds {sorted(set(map(str, values)))}. Set "
                          f"{key(cfg.name, split_key)} to one of them")
    return ds.select(keep)


def _train_on_test_problem(cfg: Any, ds: Any) -> str:
    """Why training on a single table without a split column is refused, and the fixes."""
    kp, ktr = key(cfg.name, "path"), key(cfg.name, "train_split")
    rows = f"the {ds.num_rows} rows of {cfg.path!r}"
    if cfg.train_split is None:
        head = (f"{ktr}=None marks {cfg.name} as an evaluation-only set and {kp}={cfg.path!r} has no 'split' "
                f"column, so it has no train rows: training would use {rows}, the ones evaluated")
    else:
        head = (f"{kp}={cfg.path!r} is one table with no 'split' column, so it serves the test split that is "
                f"evaluated and training on it would train on the evaluation rows ({rows})")
    return (f"{head}. Fix it with one of: add a 'split' column whose values pick the rows "
            f"({ktr}={cfg.train_split!r}, {key(cfg.name, 'test_split')}={cfg.test_split!r}); point {kp} at a "
            f"folder written by DatasetDict.save_to_disk with separate train and test splits; set {ktr}=null "
            f"for an evaluation-only set and train on another dataset; or set "
            f"{key(cfg.name, 'allow_train_on_test')}=true to train on the evaluation rows knowingly")


# Rows of the hub splits the dataset presets name (pita/conf/dataset/), so a plan made where the
# hub cannot be reached (``pita plan``) sizes and shards their jobs as a run would.
HUB_ROWS = {
    ("openai/gsm8k", "main", "train"): 7473, ("openai/gsm8k", "main", "test"): 1319,
    ("HuggingFaceH4/MATH-500", None, "test"): 500,
    ("HuggingFaceH4/aime_2024", None, "train"): 30,
    ("yentinglin/aime_2025", None, "train"): 30,
    ("AI-MO/aimo-validation-aime", None, "train"): 90,
    ("stanfordnlp/imdb", "plain_text", "train"): 25000, ("stanfordnlp/imdb", "plain_text", "test"): 25000,
    ("trl-lib/tldr", None, "train"): 116722, ("trl-lib/tldr", None, "test"): 6553,
}


def count_examples(cfg: Any, split: str, known_rows: bool = False) -> tuple[int, str, bool]:
    """(examples, task, assumed) of ``split``: loaded as :func:`load_examples` loads them, or with
    ``known_rows``, when the hub cannot give the rows, counted from :data:`HUB_ROWS` with the same
    held_out split and caps (``assumed`` is then True)."""
    try:
        ex = load_examples(cfg, split)
        return len(ex), (ex[0].task if ex else DATASETS.get(base_of(cfg)).task), False
    except ConfigError:
        if not known_rows or cfg.path is not None:
            raise
        source = "test" if split == "test" else "train"
        n = HUB_ROWS.get((cfg.hub_id, cfg.hub_config, _split_name(cfg, source)))
        if n is None:
            raise
    if source == "train":
        if cfg.held_out >= n:
            raise ConfigError(f"{key(cfg.name, 'held_out')}={cfg.held_out}: the train split of {cfg.hub_id} has only "
                              f"{n} rows, so none would be left for train; set held_out below {n}")
        n = cfg.held_out if split == "held_out" else n - cfg.held_out
    cap = {"train": cfg.train_cap, "test": cfg.test_cap}.get(split)
    return (min(n, cap) if cap is not None else n), DATASETS.get(base_of(cfg)).task, True
