"""Dataset adapters, loading and their errors, on small local files: no network, no hub.

Fixtures write GSM8K-shaped jsonl, MATH-shaped parquet, TL;DR-shaped csv and an IMDB-shaped
DatasetDict folder (train/test, sorted by label like the hub's) into a temporary folder.

    python -m pytest -q tests/test_datasets.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import datasets
import pytest
from omegaconf import OmegaConf

from pita.core.errors import ConfigError
from pita.datasets.base import DATASETS
from pita.datasets.config import DatasetConfig, check_dataset_config, dataset_config, default_dataset_configs
from pita.datasets.loading import load_examples

ROOT = Path(__file__).resolve().parent.parent
N_GSM = 30
N_IMDB = 20  # per split: 10 negative then 10 positive


@pytest.fixture(scope="module", autouse=True)
def hf_cache(tmp_path_factory):
    """datasets caches what it reads from local files: keep that cache out of the home folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_cache")))
        yield


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Write every fixture file once."""
    d = tmp_path_factory.mktemp("data")
    files = {}
    files["gsm8k"] = d / "gsm8k.jsonl"
    with open(files["gsm8k"], "w") as f:
        for i in range(N_GSM):
            f.write(json.dumps({"question": f"Question {i}?", "answer": f"Work {i}.\n#### {i * 1000:,}"}) + "\n")

    files["gsm8k_split"] = d / "gsm8k_split.jsonl"
    with open(files["gsm8k_split"], "w") as f:
        for i in range(12):
            f.write(json.dumps({"question": f"Q{i}", "answer": f"#### {i}",
                                "split": "train" if i < 8 else "test"}) + "\n")

    files["math"] = d / "math.parquet"
    datasets.Dataset.from_list([
        {"problem": f"Problem {i}", "answer": ["\\frac{1}{2}", "(1,2)", "3"][i % 3], "solution": "s",
         "level": i % 5 + 1, "subject": "Algebra", "split": "test" if i < 10 else "train"}
        for i in range(16)]).to_parquet(str(files["math"]))

    files["tldr"] = d / "tldr.csv"
    datasets.Dataset.from_list([
        {"prompt": f"SUBREDDIT: r/test\n\nTITLE: t{i}\n\nPOST: body, with a comma {i}\n\nTL;DR:",
         "completion": f" summary {i}"} for i in range(10)]).to_csv(str(files["tldr"]), index=False)

    def imdb_rows(split):
        return [{"text": f"Review {split} {i}<br /><br />word{i} one two three four five six seven",
                 "label": int(i >= N_IMDB // 2)} for i in range(N_IMDB)]

    files["imdb"] = d / "imdb_dd"
    datasets.DatasetDict({s: datasets.Dataset.from_list(imdb_rows(s)) for s in ("train", "test")}).save_to_disk(
        str(files["imdb"]))

    files["math_no_split"] = d / "math_no_split.jsonl"  # MATH-500 as published: one file, no split column
    with open(files["math_no_split"], "w") as f:
        for i, ans in enumerate([r"\begin{pmatrix} -1/3 \\ 2/3 \end{pmatrix}", r"11,\! 111", r"(2,12) \cup (12,102)"]):
            f.write(json.dumps({"problem": f"P{i}", "solution": "s", "answer": ans, "subject": "Algebra",
                                "level": 1, "unique_id": f"u{i}"}) + "\n")

    files["aime"] = d / "aime.jsonl"
    with open(files["aime"], "w") as f:
        for i in range(5):
            f.write(json.dumps({"problem": f"AIME {i}", "answer": 100 + i}) + "\n")
    return {k: str(v) for k, v in files.items()}


def gsm(data, **kw):
    """The single gsm8k file, trainable on purpose: these tests check shuffles, caps and held-out."""
    return dataset_config("gsm8k", path=data["gsm8k"], **{"allow_train_on_test": True, **kw})


def ids(examples):
    return [e.id for e in examples]


# -- adapters: one raw row -> Example ------------------------------------------------------------

def test_gsm8k_row_parsing_strips_thousands_separators():
    adapter = DATASETS.get("gsm8k")(dataset_config("gsm8k", answer_extractor="hash"))
    ex = adapter.to_example({"question": " Natalia sold 1,000 clips. ", "answer": "48 + 952 = 1,000\n#### 1,000"},
                            17, "test")
    assert ex.id == "gsm8k-test-00017"
    assert ex.answer == "1000" and ex.task == "math"
    assert ex.prompt == 'Natalia sold 1,000 clips.\nPlease reason step by step, and put your final answer after "####".'
    assert ex.meta["extractor"] == "hash" and ex.meta["row"] == 17


def test_gsm8k_answer_without_hashes_names_field_and_row():
    adapter = DATASETS.get("gsm8k")(dataset_config("gsm8k"))
    with pytest.raises(ConfigError) as e:
        adapter.to_example({"question": "q", "answer": "just 5"}, 4, "train")
    assert "datasets.gsm8k.answer_field='answer'" in str(e.value) and "row 4" in str(e.value)


def test_gsm8k_file_ids_match_their_rows(data):
    ex = load_examples(gsm(data), "test")
    assert len(ex) == N_GSM
    for e in ex:  # the id's number is the row's index in the file, whatever the shuffle
        i = int(e.id.rsplit("-", 1)[1])
        assert e.prompt.startswith(f"Question {i}?") and e.answer == str(i * 1000)
    assert {e.meta["split"] for e in ex} == {"test"} and ex[0].meta["source"] == data["gsm8k"]


def test_math500_parquet_keeps_answers_verbatim_and_uses_boxed(data):
    ex = load_examples(dataset_config("math500", path=data["math"]), "test")
    assert len(ex) == 10  # the file's split column picks the test rows
    by_row = {e.meta["row"]: e for e in ex}
    assert by_row[1].answer == "(1,2)" and by_row[0].answer == "\\frac{1}{2}"  # no comma stripping here
    assert by_row[0].prompt.endswith("within \\boxed{}.") and by_row[0].prompt.startswith("Problem 0\n")
    assert by_row[0].meta["level"] == 1 and by_row[0].meta["subject"] == "Algebra"


def test_math500_train_is_refused_without_a_path():
    cfg = dataset_config("math500")
    assert cfg.train_split is None
    for split in ("train", "held_out"):
        with pytest.raises(ConfigError) as e:
            load_examples(dataclasses.replace(cfg, held_out=1), split)
        msg = str(e.value)
        assert "datasets.math500.train_split=None" in msg and "test set" in msg
        assert "another dataset" in msg and "datasets.math500.path=" in msg


def test_math500_train_from_a_path_is_allowed(data):
    ex = load_examples(dataset_config("math500", path=data["math"]), "train")
    assert len(ex) == 6 and all(e.id.startswith("math500-train-") for e in ex)


def test_aime_uses_its_only_split_as_test_and_stringifies_answers(data):
    for name in ("aime22to24", "aime2024", "aime2025"):
        cfg = dataset_config(name, path=data["aime"])
        assert (cfg.train_split, cfg.test_split) == (None, "train")
        ex = load_examples(cfg, "test")
        assert sorted(e.answer for e in ex) == ["100", "101", "102", "103", "104"]
        assert all(e.id.startswith(f"{name}-test-") and "\\boxed{}" in e.prompt for e in ex)
        with pytest.raises(ConfigError, match="evaluation set only"):
            load_examples(dataset_config(name), "train")


def test_imdb_prompt_is_a_clean_prefix_and_the_test_subset_mixes_labels(data):
    cfg = dataset_config("imdb", path=data["imdb"], test_cap=6)
    ex = load_examples(cfg, "test")
    assert len(ex) == 6 and {e.meta["label"] for e in ex} == {0, 1}
    # The fixture is sorted by label like the hub's split: without the shuffle a cap of 6 would be one label.
    assert {r["label"] for r in datasets.load_from_disk(data["imdb"])["test"].select(range(6))} == {0}
    e = ex[0]
    i = e.meta["row"]
    assert e.prompt == f"Continue this review positively: Review test {i} word{i} one two three four"
    assert e.answer is None and e.task == "reward" and "<br" not in e.prompt
    short = load_examples(dataclasses.replace(cfg, prefix_words=2), "test")
    assert all(len(x.prompt.split(": ", 1)[1].split()) == 2 for x in short)


def test_tldr_csv_prompt_is_kept_verbatim(data):
    ex = load_examples(dataset_config("tldr", path=data["tldr"]), "test")
    assert len(ex) == 10
    e = ex[0]
    i = e.meta["row"]
    assert e.prompt == f"SUBREDDIT: r/test\n\nTITLE: t{i}\n\nPOST: body, with a comma {i}\n\nTL;DR:"
    assert e.answer is None and e.task == "reward" and e.meta["reference"] == f" summary {i}"


# -- shuffling, caps, held-out ----------------------------------------------------------------

def test_seeded_shuffle_is_deterministic_and_depends_on_the_seed(data):
    a, b = ids(load_examples(gsm(data, seed=1), "train")), ids(load_examples(gsm(data, seed=1), "train"))
    c = ids(load_examples(gsm(data, seed=2), "train"))
    assert a == b
    assert a != c and sorted(a) == sorted(c)
    assert a != sorted(a)  # actually shuffled


def test_caps_keep_a_prefix_of_the_shuffled_order(data):
    full = ids(load_examples(gsm(data), "train"))
    capped = ids(load_examples(gsm(data, train_cap=5, test_cap=3), "train"))
    assert capped == full[:5]
    assert len(load_examples(gsm(data, train_cap=5, test_cap=3), "test")) == 3
    assert len(load_examples(gsm(data, train_cap=10 ** 6), "train")) == N_GSM  # a cap above the size is no-op


def test_held_out_is_disjoint_from_train_and_unaffected_by_the_cap(data):
    cfg = gsm(data, held_out=7)
    train, held = ids(load_examples(cfg, "train")), ids(load_examples(cfg, "held_out"))
    assert len(held) == 7 and len(train) == N_GSM - 7
    assert not set(train) & set(held) and len(set(train) | set(held)) == N_GSM
    assert ids(load_examples(dataclasses.replace(cfg, train_cap=4), "held_out")) == held
    assert all(e.meta["split"] == "held_out" for e in load_examples(cfg, "held_out"))


def test_split_column_picks_rows_per_split(data):
    cfg = dataset_config("gsm8k", path=data["gsm8k_split"])
    assert sorted(e.answer for e in load_examples(cfg, "train")) == sorted(str(i) for i in range(8))
    assert sorted(e.answer for e in load_examples(cfg, "test")) == ["10", "11", "8", "9"]
    with pytest.raises(ConfigError) as e:
        load_examples(dataclasses.replace(cfg, test_split="validation"), "test")
    assert "datasets.gsm8k.test_split='validation'" in str(e.value) and "['test', 'train']" in str(e.value)


def test_training_on_a_single_file_without_split_column_is_refused(data):
    """One table with no split column is the test split; training on it would train on the
    evaluation rows, so train and held_out are refused, naming the file, the key and the fixes."""
    cfg = dataset_config("gsm8k", path=data["gsm8k"], held_out=2)
    assert len(load_examples(cfg, "test")) == N_GSM  # evaluating on it is fine
    for split in ("train", "held_out"):
        with pytest.raises(ConfigError) as e:
            load_examples(cfg, split)
        msg = str(e.value)
        assert f"datasets.gsm8k.path={data['gsm8k']!r}" in msg and "no 'split' column" in msg
        assert "evaluation rows" in msg and f"the {N_GSM} rows" in msg
        for fix in ("add a 'split' column", "DatasetDict.save_to_disk", "datasets.gsm8k.train_split=null",
                    "datasets.gsm8k.allow_train_on_test=true"):
            assert fix in msg, fix
    with pytest.raises(ConfigError, match="datasets.math500.train_split=None marks math500 as an evaluation-only"):
        load_examples(dataset_config("math500", path=data["math_no_split"]), "train")
    assert len(load_examples(dataset_config("math500", path=data["math_no_split"]), "test")) == 3


def test_a_save_to_disk_table_without_split_column_is_refused_for_training_too(data, tmp_path):
    folder = tmp_path / "one_table"
    datasets.Dataset.from_list([{"question": "q", "answer": "#### 1"}] * 3).save_to_disk(str(folder))
    cfg = dataset_config("gsm8k", path=str(folder))
    assert len(load_examples(cfg, "test")) == 3
    with pytest.raises(ConfigError, match="datasets.gsm8k.allow_train_on_test=true"):
        load_examples(cfg, "train")


def test_allow_train_on_test_serves_the_single_file_to_every_split(data):
    tr, te = load_examples(gsm(data), "train"), load_examples(gsm(data), "test")
    assert sorted(e.answer for e in tr) == sorted(e.answer for e in te)
    assert tr[0].id.startswith("gsm8k-train-") and te[0].id.startswith("gsm8k-test-")
    with pytest.raises(ConfigError, match="allow_train_on_test='yes': must be true or false"):
        load_examples(gsm(data, allow_train_on_test="yes"), "train")


def test_dataset_dict_folder_picks_the_split_by_name(data):
    cfg = dataset_config("imdb", path=data["imdb"])
    assert all("Review train" in e.prompt for e in load_examples(cfg, "train"))
    with pytest.raises(ConfigError) as e:
        load_examples(dataclasses.replace(cfg, test_split="unsupervised"), "test")
    assert "datasets.imdb.test_split='unsupervised'" in str(e.value) and "['test', 'train']" in str(e.value)


# -- toy tasks ---------------------------------------------------------------------------------

def test_arith_is_deterministic_and_follows_its_knobs():
    cfg = dataset_config("arith", toy_train_size=40, toy_test_size=10, n_ops=2, ops="*", held_out=5, seed=3)
    a, b = load_examples(cfg, "train"), load_examples(cfg, "train")
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b] and len(a) == 35
    assert all(e.meta["solution"].count("*") == 2 for e in a)
    assert all(int(e.answer) == int(e.meta["solution"].rsplit("#### ", 1)[1]) for e in a)
    assert a[0].prompt.endswith(' Answer after ####.')
    assert len(load_examples(cfg, "test")) == 10 and not set(ids(a)) & set(ids(load_examples(cfg, "held_out")))
    assert [e.prompt for e in load_examples(dataclasses.replace(cfg, seed=4), "train")] != [e.prompt for e in a]


def test_sentiment_is_deterministic_with_both_labels_in_a_capped_test():
    cfg = dataset_config("sentiment", toy_test_size=50, test_cap=8, seed=1)
    a, b = load_examples(cfg, "test"), load_examples(cfg, "test")
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b] and len(a) == 8
    assert {e.meta["label"] for e in a} == {0, 1}
    assert all(e.task == "reward" and e.answer is None for e in a)
    assert all(e.prompt.startswith("Continue this review positively: ") and len(e.prompt.split(": ", 1)[1].split()) == 3
               for e in a)


# -- errors --------------------------------------------------------------------------------------

def test_unknown_dataset_name_suggests_the_closest():
    for call in (lambda: dataset_config("gsm9k"), lambda: load_examples(DatasetConfig(name="gsm9k"), "test")):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert "'gsm9k' is not known" in msg and "did you mean 'gsm8k'" in msg and "math500, sentiment, tldr" in msg


def test_unknown_override_field_suggests_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'test_cap'"):
        dataset_config("gsm8k", test_capp=5)


def test_missing_file_unsupported_extension_and_bad_folder(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_examples(dataset_config("gsm8k", path=str(tmp_path / "nope.jsonl")), "test")
    assert f"datasets.gsm8k.path='{tmp_path / 'nope.jsonl'}'" in str(e.value) and "does not exist" in str(e.value)
    txt = tmp_path / "data.txt"
    txt.write_text("hello")
    with pytest.raises(ConfigError) as e:
        load_examples(dataset_config("gsm8k", path=str(txt)), "test")
    assert "unsupported extension '.txt'" in str(e.value) and ".jsonl" in str(e.value)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="not one written by Dataset.save_to_disk"):
        load_examples(dataset_config("gsm8k", path=str(tmp_path / "folder")), "test")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is an empty file"):
        load_examples(dataset_config("gsm8k", path=str(empty)), "test")


def test_missing_question_field_names_field_row_and_present_fields(tmp_path):
    p = tmp_path / "gaps.jsonl"
    rows = [{"question": f"q{i}", "answer": "#### 1"} for i in range(5)]
    rows[3] = {"query": "q3", "answer": "#### 1"}
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError) as e:
        load_examples(dataset_config("gsm8k", path=str(p)), "test")
    msg = str(e.value)
    assert "datasets.gsm8k.question_field='question'" in msg and "row 3 " in msg and "['answer', 'query']" in msg


def test_missing_answer_field_names_field_and_row(data):
    with pytest.raises(ConfigError) as e:
        load_examples(dataset_config("math500", path=data["math"], answer_field="final"), "test")
    msg = str(e.value)
    assert "datasets.math500.answer_field='final'" in msg and "row " in msg and "'problem'" in msg


def test_empty_split_and_held_out_leaving_nothing(monkeypatch, data):
    # datasets itself refuses to write or read empty local files, but a hub split can be empty.
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"question": []}))
    with pytest.raises(ConfigError) as e:
        load_examples(dataset_config("gsm8k"), "test")
    assert "datasets.gsm8k.test_split='test'" in str(e.value) and "has no rows" in str(e.value)
    monkeypatch.undo()
    with pytest.raises(ConfigError) as e:
        load_examples(gsm(data, held_out=N_GSM), "train")
    assert f"datasets.gsm8k.held_out={N_GSM}" in str(e.value) and f"only {N_GSM} rows" in str(e.value)
    with pytest.raises(ConfigError, match="datasets.gsm8k.held_out=0: the held_out split is empty"):
        load_examples(gsm(data), "held_out")
    with pytest.raises(ConfigError, match="must be smaller than toy_train_size=10"):
        load_examples(dataset_config("arith", toy_train_size=10, held_out=10), "train")


def test_bad_caps_and_sizes_are_all_reported_at_once():
    cfg = dataset_config("arith", train_cap=0, test_cap=2.5, held_out=-1, toy_train_size=0, toy_test_size="9",
                         n_ops=0, ops="+/")
    with pytest.raises(ConfigError) as e:
        load_examples(cfg, "test")
    msg = str(e.value)
    assert "7 problems" in msg
    for needle in ("datasets.arith.train_cap=0", "datasets.arith.test_cap=2.5", "datasets.arith.held_out=-1",
                   "datasets.arith.toy_train_size=0", "datasets.arith.toy_test_size='9'", "datasets.arith.n_ops=0",
                   "datasets.arith.ops='+/'"):
        assert needle in msg
    assert "positive integer" in msg


def test_hub_unreachable_suggests_a_local_path(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError(f"Couldn't reach '{args[0]}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConfigError) as e:
        load_examples(dataset_config("gsm8k"), "test")
    msg = str(e.value)
    assert "datasets.gsm8k.hub_id='openai/gsm8k'" in msg and "split 'test'" in msg
    assert "unreachable" in msg and "datasets.gsm8k.path=" in msg and "OfflineModeIsEnabled" in msg


def test_config_without_source_and_toys_with_one_are_refused():
    with pytest.raises(ConfigError) as e:
        load_examples(DatasetConfig(name="gsm8k"), "test")
    assert "datasets.gsm8k.hub_id=None and datasets.gsm8k.path=None" in str(e.value)
    assert "openai/gsm8k" in str(e.value)
    with pytest.raises(ConfigError, match=r"datasets.arith.path='x.jsonl': arith is generated"):
        load_examples(dataset_config("arith", path="x.jsonl"), "train")
    with pytest.raises(ConfigError, match="split='dev' is not known"):
        load_examples(dataset_config("arith"), "dev")


def test_answer_field_must_match_the_task():
    reward = check_dataset_config(dataset_config("imdb", answer_field="label"))
    assert len(reward) == 1 and "datasets.imdb.answer_field='label'" in reward[0] and "reward task" in reward[0]
    math = check_dataset_config(dataset_config("gsm8k", answer_field=None))
    assert len(math) == 1 and "datasets.gsm8k.answer_field=None" in math[0]


def test_answer_extractor_is_validated_and_stored(data):
    with pytest.raises(ConfigError, match="answer_extractor='boxd' is not known .*did you mean 'boxed'"):
        load_examples(gsm(data, answer_extractor="boxd"), "test")
    ex = load_examples(gsm(data, answer_extractor="last_number"), "test")
    assert {e.meta["extractor"] for e in ex} == {"last_number"}


# -- prompt templates ----------------------------------------------------------------------------

def test_prompt_template_override_and_validation(data):
    ex = load_examples(gsm(data, prompt_template="Solve: {question} Answer in \\boxed{}."), "test")
    i = ex[0].meta["row"]
    assert ex[0].prompt == f"Solve: Question {i}? Answer in \\boxed{{}}."
    with pytest.raises(ConfigError) as e:
        load_examples(gsm(data, prompt_template="Solve: {q}"), "test")
    assert "datasets.gsm8k.prompt_template='Solve: {q}'" in str(e.value) and "{question}" in str(e.value)


# -- configs and YAML ----------------------------------------------------------------------------

def test_every_registered_dataset_has_a_valid_default_and_a_matching_yaml():
    defaults = default_dataset_configs()
    assert sorted(defaults) == DATASETS.names()
    assert set(defaults) == {"gsm8k", "math500", "aime22to24", "aime2024", "aime2025", "imdb", "tldr", "arith",
                             "sentiment"}
    yamls = {p.stem for p in (ROOT / "pita" / "conf" / "dataset").glob("*.yaml")}
    assert yamls == set(defaults)
    for name, cfg in defaults.items():
        assert check_dataset_config(cfg) == [], name
        text = (ROOT / "pita" / "conf" / "dataset" / f"{name}.yaml").read_text()
        assert text.startswith("# ")
        merged = OmegaConf.merge(OmegaConf.structured(DatasetConfig), OmegaConf.create(text))
        assert OmegaConf.to_object(merged) == cfg, name
