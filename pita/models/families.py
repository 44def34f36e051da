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
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from pita.core.errors import ConfigError
from pita.core.names import unknown_name

# system.attn_impl: how every job loads a model's attention (torch-free here, so the config checks
# that run before anything starts can name the choices)
ATTN_IMPLS = ("sdpa", "eager", "flash_attention_2")

log = logging.getLogger(__name__)

CONF_MODEL = Path(__file__).resolve().parent.parent / "conf" / "model"


@dataclass
class FamilyConfig:
    name: str = "tiny"  # the family (pita/conf/model/<name>.yaml)
    reference: str = "builtin:tiny/reference"  # the reference policy: hub id, local folder, or builtin:
    guidance: str = "builtin:tiny/guidance"  # the value model's backbone (same tokenizer as the reference)
    dtype: str = "float32"  # float32 | bfloat16 | float16
    reward_models: Dict[str, str] = field(default_factory=dict)  # dataset name -> reward model (reward tasks)
    # dataset name -> what its reward model reads: completion (the completion's text alone, as the
    # PITA and Q# reference code scores IMDB) | prompt_completion (the prompt and the completion,
    # through the reward model's chat template where it has one: reward models trained on pairs,
    # such as a question-answer reward model); a dataset not listed: completion
    reward_inputs: Dict[str, str] = field(default_factory=dict)
    # dataset name -> its reward: positive_logit (the classifier's positive-class logit, or its only
    # logit) | margin (logit[1] - logit[0] of a two-label classifier); a dataset not listed: positive_logit
    reward_scores: Dict[str, str] = field(default_factory=dict)
    gguf_file: Optional[str] = None  # load the reference from this GGUF file inside the repo
    # variables the chat template renders with, wherever a prompt is built (pita/models/chat.py):
    # qwen3's {enable_thinking: false} answers at once instead of opening a thinking block
    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)


REWARD_INPUTS = ("completion", "prompt_completion")
REWARD_SCORES = ("positive_logit", "margin")


def reward_scoring(model_cfg, dataset: str) -> dict:
    """How ``dataset``'s reward model is read (job params): its input and its score."""
    return {"reward_input": str((model_cfg.get("reward_inputs") or {}).get(dataset, "completion")),
            "reward_score": str((model_cfg.get("reward_scores") or {}).get(dataset, "positive_logit"))}


def reward_scoring_problems(model_cfg) -> list[str]:
    p = []
    for key, allowed in (("reward_inputs", REWARD_INPUTS), ("reward_scores", REWARD_SCORES)):
        for ds, v in (model_cfg.get(key) or {}).items():
            if v not in allowed:
                p.append(unknown_name(f"model.{key}.{ds}", v, allowed))
    return p


def chat_template_kwargs(model_cfg) -> dict:
    """The family's chat-template variables as job params (none: no key, so the jobs of a family
    without any keep the fingerprints they had)."""
    kw = dict(model_cfg.get("chat_template_kwargs") or {})
    return {"chat_template_kwargs": kw} if kw else {}


def family_names() -> list[str]:
    return sorted(p.stem for p in CONF_MODEL.glob("*.yaml"))


def load_family(name: str) -> FamilyConfig:
    path = CONF_MODEL / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(unknown_name("model", name, family_names()))
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(FamilyConfig), OmegaConf.load(path)))


def _builtin(ref: str, cache_dir: str, seed: int, defer: bool | str = False) -> str:
    fam, _, part = ref[len("builtin:"):].partition("/")
    if fam == "tiny":
        from pita.models.tiny import build_tiny_family, prepare_tiny_family

        paths = prepare_tiny_family(cache_dir, seed) if defer else build_tiny_family(cache_dir, seed)
    elif fam == "smollm2":
        from pita.models.smollm2 import HUB_ID, convert_smollm2, converted

        # a plan that converts nothing (pita plan) sizes the model by its shipped architecture
        paths = {"reference": (converted(cache_dir) or HUB_ID) if defer == "plan" else convert_smollm2(cache_dir)}
    else:
        raise ConfigError(f"model id {ref!r}: builtin family {fam!r} is not known; choose builtin:tiny/... or "
                          f"builtin:smollm2/...")
    if part not in paths:
        raise ConfigError(f"model id {ref!r}: {fam} has no part {part!r}; choose one of {', '.join(sorted(paths))}")
    return paths[part]


def resolve_id(ref: str, cache_dir: str, seed: int, defer: bool | str = False) -> str:
    """A loadable id: builtin parts are built or fetched from the cache; others are returned as is.
    ``defer``: tiny-family parts are only prepared (tokenizer and config, no weights): a run
    builds them as jobs (:func:`family_build_jobs`). ``defer="plan"`` (pita plan) also converts
    nothing: smollm2 is its converted folder if there is one, else its hub id, sized by the
    architecture shipped with pita."""
    return _builtin(ref, cache_dir, seed, defer) if ref.startswith("builtin:") else ref


def resolve_family(fam: FamilyConfig, cache_dir: str, seed: int, defer: bool | str = False) -> dict:
    return {"reference": resolve_id(fam.reference, cache_dir, seed, defer),
            "guidance": resolve_id(fam.guidance, cache_dir, seed, defer),
            "reward_models": {k: resolve_id(v, cache_dir, seed, defer) for k, v in fam.reward_models.items()}}


def family_build_jobs(fam: FamilyConfig, cache_dir: str, seed: int, jobs: list, cuda: bool,
                      n_devices: int = 1) -> list:
    """The jobs that build the tiny family's parts this plan uses (``model.build_tiny``): every
    job in ``jobs`` waits for the parts its params name, and every root job for the reference.
    They are planned whether or not a part is cached (a cached part makes its job a no-op), so a
    resumed run plans the same graph. Returns the build jobs (none for a family not built here).

    In CPU mode the reference's build holds two logical devices where there are two: every other
    job waits for it, and two processes at one thread each train it in about 60% of one's time,
    with the same weights (:mod:`pita.models.family_jobs`). The guidance backbone, built after it
    on one device, overlaps the first data collection."""
    import json

    from pita.core.job import Job, Resources, add_kind_module
    from pita.models.tiny import PARTS, family_paths, part_built

    refs = [fam.reference, fam.guidance, *fam.reward_models.values()]
    parts = [r.split("/", 1)[1] for r in refs if r.startswith("builtin:tiny/")]
    parts = [p for p in PARTS if p in parts]
    if not parts:
        return []
    add_kind_module("pita.models.family_jobs")
    paths = family_paths(cache_dir, seed)
    builds = {p: Job(id=f"model.{fam.name}.{p}", kind="model.build_tiny", group="model",
                     params={"cache_dir": str(cache_dir), "seed": seed, "part": p, "path": paths[p]},
                     # trains on the CPU: on a GPU node it holds no GPU (a host slot)
                     resources=Resources(devices=0 if cuda else (min(2, max(1, n_devices)) if p == "reference" else 1),
                                         memory_gb=0.5),
                     duration_hint=20.0 if p != "reward_sentiment" else 5.0)
              for p in parts}
    ref = builds.get("reference")
    by_id = {j.id: j for j in jobs}
    names: dict[str, set] = {}  # job id -> the parts it, or a job it waits for, reads

    def reads(job_id: str) -> set:
        if job_id not in names:
            j = by_id[job_id]
            text = json.dumps(j.params)
            own = {p for p in builds if f'{paths[p]}"' in text or f"{paths[p]}/" in text}
            if not j.deps and ref is not None:
                own.add("reference")
            inherited = set().union(*(reads(d) for d in j.deps if d in by_id))
            # wait only for the parts no earlier job already waits for
            j.deps = [*j.deps, *(builds[p].id for p in builds if p in own - inherited)]
            names[job_id] = own | inherited
        return names[job_id]

    used = set().union(*(reads(j.id) for j in jobs)) if jobs else set()
    return [b for p, b in builds.items() if p in used]  # a part no job reads is not built


def check_tokenizers(reference: str, guidance: str, missing_ok: bool = False) -> bool:
    """The guidance model reads the reference's token ids: vocab and special tokens must agree.
    ``missing_ok`` (a plan made without the hub): a tokenizer that is neither local nor cached is
    not checked (the run checks it when it starts); returns whether the check ran."""
    from transformers import AutoTokenizer

    try:
        a, b = AutoTokenizer.from_pretrained(reference), AutoTokenizer.from_pretrained(guidance)
    except (OSError, ValueError) as e:
        if missing_ok:
            return False
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
    return True


def family_build_note(jobs) -> Optional[str]:
    """What the run will build of the tiny family before anything else ("building the tiny family
    once ..."), or None when every planned part is in the cache."""
    from pita.models.tiny import family_dir, part_built

    builds = [j.params for j in jobs if j.kind == "model.build_tiny"]
    missing = [p["part"] for p in builds if not part_built(p["cache_dir"], p["seed"], p["part"])]
    if not missing:
        return None
    return (f"building the tiny family once ({', '.join(missing)}: {len(missing)} job(s), one thread per process), "
            f"cached in {family_dir(builds[0]['cache_dir'], builds[0]['seed'])}")
