"""Model families: a reference LM, a guidance (value) LM reading the reference's token ids, and
reward models per reward task. Defined in ``pita/conf/model/<name>.yaml``; ids may be hub ids, local
folders, or ``builtin:<family>/<part>`` for families built locally (tiny, smollm2).

    fam = load_family("qwen3-sm")              # FamilyConfig
    paths = resolve_family(fam, cache_dir, seed)  # {"reference": ..., "guidance": ..., "reward_models": {...}}
    check_tokenizers(paths["reference"], paths["guidance"])  # plan time: refuse a mismatched pair
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from omegaconf import OmegaConf

from pita.core.errors import ConfigError
from pita.core.names import unknown_name

log = logging.getLogger(__name__)

CONF_MODEL = Path(__file__).resolve().parent.parent / "conf" / "model"


@dataclass
class FamilyConfig:
    name: str = "tiny"  # the family (pita/conf/model/<name>.yaml)
    reference: str = "builtin:tiny/reference"  # the reference policy: hub id, local folder, or builtin:
    guidance: str = "builtin:tiny/guidance"  # the value model's backbone (same tokenizer as the reference)
    dtype: str = "float32"  # float32 | bfloat16 | float16
    reward_models: Dict[str, str] = field(default_factory=dict)  # dataset name -> reward model (reward tasks)
    gguf_file: Optional[str] = None  # load the reference from this GGUF file inside the repo


def family_names() -> list[str]:
    return sorted(p.stem for p in CONF_MODEL.glob("*.yaml"))


def load_family(name: str) -> FamilyConfig:
    path = CONF_MODEL / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(unknown_name("model", name, family_names()))
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(FamilyConfig), OmegaConf.load(path)))


def _builtin(ref: str, cache_dir: str, seed: int) -> str:
    fam, _, part = ref[len("builtin:"):].partition("/")
    if fam == "tiny":
        from pita.models.tiny import build_tiny_family

        paths = build_tiny_family(cache_dir, seed)
    elif fam == "smollm2":
        from pita.models.smollm2 import convert_smollm2

        paths = {"reference": convert_smollm2(cache_dir)}
    else:
        raise ConfigError(f"model id {ref!r}: builtin family {fam!r} is not known; choose builtin:tiny/... or "
                          f"builtin:smollm2/...")
    if part not in paths:
        raise ConfigError(f"model id {ref!r}: {fam} has no part {part!r}; choose one of {', '.join(sorted(paths))}")
    return paths[part]


def resolve_id(ref: str, cache_dir: str, seed: int) -> str:
    """A loadable id: builtin parts are built or fetched from the cache; others are returned as is."""
    return _builtin(ref, cache_dir, seed) if ref.startswith("builtin:") else ref


def resolve_family(fam: FamilyConfig, cache_dir: str, seed: int) -> dict:
    return {"reference": resolve_id(fam.reference, cache_dir, seed),
            "guidance": resolve_id(fam.guidance, cache_dir, seed),
            "reward_models": {k: resolve_id(v, cache_dir, seed) for k, v in fam.reward_models.items()}}


def check_tokenizers(reference: str, guidance: str) -> None:
    """The guidance model reads the reference's token ids: vocab and special tokens must agree."""
    from transformers import AutoTokenizer

    try:
        a, b = AutoTokenizer.from_pretrained(reference), AutoTokenizer.from_pretrained(guidance)
    except OSError as e:
        raise ConfigError(f"cannot load the tokenizers of {reference!r} / {guidance!r} ({str(e).splitlines()[0]})") from e
    problems = []
    if len(a) != len(b):
        problems.append(f"vocab sizes differ ({len(a)} vs {len(b)})")
    else:
        va, vb = a.get_vocab(), b.get_vocab()
        diff = [t for t in va if vb.get(t) != va[t]]
        if diff:
            problems.append(f"{len(diff)} tokens map to different ids (e.g. {diff[:3]})")
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if getattr(a, attr) != getattr(b, attr):
            problems.append(f"{attr} differs ({getattr(a, attr)} vs {getattr(b, attr)})")
    if problems:
        raise ConfigError(f"model.guidance={guidance!r} cannot guide model.reference={reference!r}: "
                          + "; ".join(problems) + ". Pick a guidance model from the same tokenizer family "
                          "(e.g. Qwen3-0.6B for Qwen3-1.7B)")
