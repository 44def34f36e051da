"""A family's chat-template variables (model.chat_template_kwargs): Qwen3 answers instead of thinking.

The tokenizer is the tiny family's with a chat template shaped as Qwen3's (the parts that matter
here: ChatML turns, an assistant turn that splits a ``<think>`` block off its content, and the
generation prompt's ``enable_thinking`` switch), so every site pita renders a prompt at is checked
against the behaviour of the real template without downloading it.
"""

from __future__ import annotations

import shutil

import pytest

from pita.core.errors import ConfigError

pytestmark = pytest.mark.integration

# Shaped as Qwen3's template (ChatML, reasoning split off an assistant turn after the last user
# query, and the thinking switch at the generation prompt).
QWEN3_SHAPED = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
OFF = {"enable_thinking": False}
CLOSED = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def open_thinking(prompt: str) -> bool:
    """The prompt leaves the model inside (or about to open) a thinking block."""
    return prompt.endswith("<|im_start|>assistant\n") or prompt.rfind("<think>") > prompt.rfind("</think>")


@pytest.fixture
def qwen3_shaped(tiny, tmp_path):
    """A causal LM folder: the tiny reference with the Qwen3-shaped chat template."""
    from transformers import AutoTokenizer

    folder = tmp_path / "qwen3-shaped"
    shutil.copytree(tiny["reference"], folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = QWEN3_SHAPED
    tok.save_pretrained(folder)
    return str(folder)


def test_the_template_opens_a_thinking_block_unless_the_family_turns_it_off(qwen3_shaped):
    from transformers import AutoTokenizer

    from pita.models.chat import load_tokenizer

    msg = [{"role": "user", "content": "What is 2+3?"}]
    plain = AutoTokenizer.from_pretrained(qwen3_shaped).apply_chat_template(msg, tokenize=False, add_generation_prompt=True)
    assert open_thinking(plain)  # the template's default: the model thinks first
    tok = load_tokenizer(qwen3_shaped, OFF)
    for extra in ({}, {"enable_thinking": True}):  # the family's word holds over a caller's (TRL's) default
        p = tok.apply_chat_template(msg, tokenize=False, add_generation_prompt=True, **extra)
        assert p == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n" + CLOSED
        assert not open_thinking(p)
    assert load_tokenizer(qwen3_shaped, {}).chat_template == QWEN3_SHAPED  # no variables: left as it is


def test_a_saved_checkpoint_tokenizer_is_set_once_and_renders_the_same(qwen3_shaped, tmp_path):
    from pita.models.chat import load_tokenizer

    tok = load_tokenizer(qwen3_shaped, OFF)
    tok.save_pretrained(tmp_path / "ckpt")  # a trained round's policy saves its tokenizer
    again = load_tokenizer(str(tmp_path / "ckpt"), OFF)
    assert again.chat_template == tok.chat_template
    assert again.chat_template.count("set enable_thinking") == 1
    on = load_tokenizer(str(tmp_path / "ckpt"), {"enable_thinking": True})  # another value replaces it
    msg = [{"role": "user", "content": "q"}]
    assert open_thinking(on.apply_chat_template(msg, tokenize=False, add_generation_prompt=True))
    assert on.chat_template.count("set enable_thinking") == 1


def test_every_site_that_builds_a_prompt_leaves_no_open_thinking_block(qwen3_shaped):
    """Sampling and evaluation (LM.chat_prompt), the proxy and value scorers (text_ids), the
    training jobs' tokenizer (load_policy: TRL's DPO and GRPO render with it), and GRPO's prompt
    length for vLLM."""
    from trl.data_utils import maybe_apply_chat_template

    from pita.algos.grpo import longest_prompt
    from pita.guidance.proxy import text_ids
    from pita.models.chat import load_tokenizer
    from pita.models.lm import LM
    from pita.training.models import load_policy

    lm = LM.load(qwen3_shaped, chat_template_kwargs=OFF)
    assert lm.chat_prompt("What is 2+3?").endswith(CLOSED)
    assert open_thinking(LM.load(qwen3_shaped).chat_prompt("What is 2+3?"))  # without the family's variables

    tok = load_tokenizer(qwen3_shaped, OFF)
    ids = text_ids(tok, "What is 2+3?", "5", finished=True)
    assert tok.decode(ids).startswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n" + CLOSED)

    ctx = type("Ctx", (), {"log": __import__("logging").getLogger("test")})()
    p = {"policy_from": None, "reference": qwen3_shaped, "attn_impl": "sdpa", "dtype": "float32",
         "chat_template_kwargs": OFF}
    _, _, ptok = load_policy(ctx, p, cuda=False)
    user = [{"role": "user", "content": "What is 2+3?"}]
    row = maybe_apply_chat_template({"prompt": user, "chosen": [{"role": "assistant", "content": "5"}],
                                     "rejected": [{"role": "assistant", "content": "6"}]}, ptok)
    assert row["prompt"].endswith(CLOSED) and not open_thinking(row["prompt"])
    assert row["chosen"] == "5<|im_end|>\n"  # the completion alone: the answer the samples are
    assert longest_prompt(ptok, [type("E", (), {"prompt": "What is 2+3?"})()]) == \
        len(tok(row["prompt"], add_special_tokens=False)["input_ids"])


def test_the_plan_hands_the_familys_variables_to_every_job_that_renders_a_prompt(tiny_cache):
    from test_baselines import compose

    from pita.plans import build_plan

    jobs = build_plan(compose(tiny_cache, "experiment.algos=[QSharp-HF,DPO,GRPO]",
                              "+model.chat_template_kwargs.enable_thinking=false",
                              "eval.controls=[best_of_n,majority_vote]"), [int(8e9)])
    seen = set()
    for j in jobs:
        p = j.params
        if "request" in p:  # sampling and evaluation shards
            assert p["request"]["chat_template_kwargs"] == OFF, j.id
            seen.add("shards")
        elif j.kind.endswith("_train") or j.kind == "eval.scorer_quality" or \
                j.kind == "control.best_of_n" and p.get("proxy"):
            assert p.get("chat_template_kwargs") == OFF, (j.id, j.kind)
            seen.add(j.kind)
    assert {"shards", "algo.dpo_train", "algo.grpo_train", "algo.proxy_train", "control.best_of_n"} <= seen, seen
    # a family without variables plans the jobs it did (no key: the same fingerprints)
    plain = build_plan(compose(tiny_cache, "experiment.algos=[DPO]"), [int(8e9)])
    assert not any("chat_template_kwargs" in j.params or "chat_template_kwargs" in j.params.get("request", {})
                   for j in plain)


def test_the_qwen3_families_answer_and_a_bad_variable_is_refused_naming_the_key(tiny_cache):
    from test_baselines import compose

    from pita.config.validate import validate_config
    from pita.models.families import load_family

    for name in ("qwen3", "qwen3-sm"):
        assert load_family(name).chat_template_kwargs == OFF
    for override, needle in (("+model.chat_template_kwargs.enable_thinking=[1,2]",
                              "model.chat_template_kwargs.enable_thinking=[1, 2] is not a plain value"),):
        with pytest.raises(ConfigError) as e:
            validate_config(compose(tiny_cache, override))
        assert needle in str(e.value)
