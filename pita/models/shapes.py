"""A model's architecture without its weights: what planning reads to size every job.

    cfg = model_config("Qwen/Qwen3-8B", key="model.reference")   # a transformers config
    shape = model_shape("Qwen/Qwen3-8B", key="model.reference")  # pita.core.memory.ModelShape

Where the config comes from, first match wins:

1. a local folder (a saved model): its own ``config.json``;
2. the architectures shipped with pita (``pita/models/architectures/<org>--<name>/config.json``):
   the config.json, and nothing else, of every hub model the presets in ``pita/conf/model/`` name,
   so a plan for an 8x80 GB node needs neither the hub nor the weights;
3. the local Hugging Face cache (a hub id downloaded before), or the hub where it is reachable
   (never for ``pita plan``, which runs offline).

Anything else is a ``ConfigError`` (exit 2) naming the key, the id and the fix: a plan never
sizes a model it cannot read (a 0 GB estimate would pack without limit).

Sizes are read through the config's text config (``get_text_config()``): Gemma 3 and other
multimodal configs keep the language model's sizes in a sub-config. The parameter count is exact:
the model is built on torch's ``meta`` device (no memory, a fraction of a second), so a vision
tower or an untied head is counted as the weights a job will load.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pita.core.errors import ConfigError

ARCHITECTURES = Path(__file__).resolve().parent / "architectures"


def shipped_dir(ref: str) -> Path | None:
    """The folder of the shipped config.json for hub id ``ref`` (None: not shipped)."""
    if "/" not in ref or ref.count("/") != 1:
        return None
    d = ARCHITECTURES / ref.replace("/", "--")
    return d if (d / "config.json").is_file() else None


def shipped_ids() -> list[str]:
    return sorted(p.name.replace("--", "/", 1) for p in ARCHITECTURES.iterdir() if (p / "config.json").is_file())


def _fix(key: str, ref: str) -> str:
    return (f"download its config once where the hub is reachable (hf download {ref} config.json), or set {key} "
            f"to a local folder holding the model's config.json")


@lru_cache(maxsize=None)
def _config(ref: str, key: str):
    from transformers import AutoConfig

    from pita.models.sources import looks_like_path

    if ref.startswith("builtin:"):
        raise ConfigError(f"{key}={ref!r}: a builtin model is sized from the folder it is built into; resolve it "
                          f"first (pita.models.families.resolve_id)")
    if looks_like_path(ref):
        p = Path(ref).expanduser()
        if not (p / "config.json").is_file():
            raise ConfigError(f"{key}={ref!r}: no config.json in that folder, so the model's size cannot be read; "
                              f"point {key} at a saved model (save_pretrained writes config.json)")
        try:
            return AutoConfig.from_pretrained(str(p))
        except Exception as e:  # noqa: BLE001 - an unknown model_type, a broken json
            raise ConfigError(f"{key}={ref!r}: its config.json cannot be read by transformers "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); fix the file or "
                              f"upgrade transformers") from e
    d = shipped_dir(ref)
    if d is not None:
        return AutoConfig.from_pretrained(str(d))
    try:  # the cache, or the hub where it is reachable (pita plan sets HF_HUB_OFFLINE: the cache only)
        return AutoConfig.from_pretrained(ref)
    except Exception as e:  # noqa: BLE001 - OSError (not cached), ValueError (unknown model_type)
        raise ConfigError(f"{key}={ref!r}: its architecture is not shipped with pita and its config.json is not in "
                          f"the local Hugging Face cache, so its memory cannot be planned; {_fix(key, ref)}") from e


def config_problems(cfg) -> list[str]:
    """Every model of the run whose config cannot be read (one line each, with the fix)."""
    from pita.models.sources import used_models

    problems = []
    for key, ref in used_models(cfg):
        if str(ref).startswith("builtin:"):
            continue
        try:
            model_config(str(ref), key)
        except ConfigError as e:
            problems += e.problems
    return problems


def model_config(ref: str, key: str = "model"):
    """The transformers config of ``ref`` (a folder, a shipped hub id, or a cached hub id)."""
    return _config(str(ref), key)


def text_config(cfg):
    """The language model's config (itself for a text-only model)."""
    get = getattr(cfg, "get_text_config", None)
    return get() if get is not None else cfg


@lru_cache(maxsize=None)
def _meta_model(ref: str, key: str) -> tuple[int, frozenset]:
    """(parameters, names of the Linear modules) of ``ref`` built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cfg = model_config(ref, key)
    archs = getattr(cfg, "architectures", None) or []
    auto = AutoModelForSequenceClassification if any("ForSequenceClassification" in a for a in archs) \
        else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(cfg)
    linear = frozenset(n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    return sum(p.numel() for p in model.parameters()), linear


def _count_params(ref: str, key: str) -> int:
    return _meta_model(ref, key)[0]


def linear_modules(ref: str, key: str = "model") -> frozenset:
    """Names of the model's Linear modules (what LoRA may adapt)."""
    return _meta_model(str(ref), key)[1]


# a fused projection stands for the separate ones a LoRA target list names (Phi-3 / Phi-4-mini)
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
         "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def lora_targets(ref: str, requested, key: str = "model") -> list[str]:
    """``requested`` LoRA target modules as ``ref`` names them: a separate projection the model
    fuses (q_proj in qkv_proj) becomes the fused one; names it has stay; unknown names are
    returned as they are (the caller reports them)."""
    have = linear_modules(ref, key)
    out: list[str] = []
    for t in requested:
        name = FUSED[t] if t not in have and FUSED.get(t) in have else t
        if name not in out:
            out.append(name)
    return out


def model_shape(ref: str, key: str = "model"):
    """The :class:`~pita.core.memory.ModelShape` of ``ref``: sizes from its text config, the exact
    parameter count from the model built on the meta device (the formula's estimate if that fails)."""
    from pita.core.memory import ModelShape

    cfg = model_config(ref, key)
    try:
        n = _count_params(str(ref), key)
    except Exception:  # noqa: BLE001 - a config transformers can read but not instantiate
        n = None
    try:
        return ModelShape.from_hf_config(text_config(cfg), n_params=n)
    except (AttributeError, TypeError) as e:
        raise ConfigError(f"{key}={ref!r}: its config ({type(cfg).__name__}) has no {e} where a language model's "
                          f"sizes are read (hidden_size, num_hidden_layers, vocab_size); point {key} at a causal "
                          f"language model") from e


def eager_attention(ref: str, key: str = "model") -> bool:
    """Whether transformers runs the model's attention only eagerly (no SDPA: DeBERTa-v2), so that
    a forward materialises [batch x heads x length x length] score tensors."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cfg = model_config(ref, key)
    for auto in (AutoModelForSequenceClassification, AutoModelForCausalLM):
        try:
            cls = auto._model_mapping[type(cfg)]
        except KeyError:
            continue
        return not getattr(cls, "_supports_sdpa", False)
    return False
