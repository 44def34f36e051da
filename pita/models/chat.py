"""A family's chat-template variables (``model.chat_template_kwargs``), applied where its tokenizer loads.

Some chat templates take variables besides the messages: Qwen3's ``enable_thinking`` (true by
default: the assistant's turn opens a thinking block, so an answer capped at a few hundred tokens is
mostly a truncated thought; false: the template writes an empty, closed thinking block and the model
answers). Every place pita renders a policy's prompt (sampling, evaluation, the proxy and value
scorers, TRL's DPO and GRPO trainers) must render it the same way, so the variables are baked into
the tokenizer once, when it loads: :func:`with_template_vars` puts ``{%- set name = value -%}`` in
front of its template, which holds for every ``apply_chat_template`` call, ours and the libraries',
and travels with a checkpoint's saved tokenizer. (vLLM renders with a tokenizer of its own:
GRPO passes the same variables to TRL's ``chat_template_kwargs`` as well.)

    tok = load_tokenizer(path, {"enable_thinking": False})
"""

from __future__ import annotations

import json
import re

from pita.core.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MARK = "{#- pita: model.chat_template_kwargs -#}"


def template_var_problems(kwargs, field: str = "model.chat_template_kwargs") -> list[str]:
    """What is wrong with a family's chat-template variables (names and plain values only)."""
    problems = []
    for k, v in dict(kwargs or {}).items():
        if not isinstance(k, str) or not _NAME.match(k):
            problems.append(f"{field} has the name {k!r}, which a chat template cannot read; give names such as "
                            "enable_thinking (letters, digits and _)")
        elif not isinstance(v, (bool, int, float, str)) and v is not None:
            problems.append(f"{field}.{k}={v!r} is not a plain value; give true/false, a number or a string")
    return problems


def with_template_vars(tok, kwargs) -> object:
    """``tok`` with ``kwargs`` set at the top of its chat template (in place; returned). A tokenizer
    without a chat template, or no variables, is left as it is; a template pita set before (a
    checkpoint's saved tokenizer) is set again, not twice."""
    kwargs = dict(kwargs or {})
    template = getattr(tok, "chat_template", None)
    if not kwargs or not isinstance(template, str):
        return tok
    problems = template_var_problems(kwargs)
    if problems:
        raise ConfigError(problems)
    if template.startswith(_MARK + "\n"):  # set by pita before (a saved checkpoint): set again
        template = template.split(_MARK + "\n", 2)[-1]
    head = "".join("{%- set " + k + " = " + ("none" if v is None else json.dumps(v)) + " -%}"
                   for k, v in sorted(kwargs.items()))  # JSON's true/false/"text"/1.5 are Jinja literals too
    tok.chat_template = f"{_MARK}\n{head}\n{_MARK}\n{template}"
    return tok


def load_tokenizer(path: str, chat_template_kwargs=None, **kw):
    """``AutoTokenizer.from_pretrained(path, **kw)`` with the family's chat-template variables."""
    from transformers import AutoTokenizer

    return with_template_vars(AutoTokenizer.from_pretrained(path, **kw), chat_template_kwargs)
