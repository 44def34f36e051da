"""The models a training job loads, as it holds them."""

from __future__ import annotations

def empty_here(p: dict) -> bool:
    """Whether this process builds the job's sharded models without their weights: a rank other
    than 0 of a sharded job, whose shards come from rank 0 when the model is sharded."""
    from pita.core.ranks import rank, world_size

    return p.get("sharding") == "fsdp" and world_size() > 1 and rank() != 0


def load_model(path: str, dtype, attn_impl: str | None = None, empty: bool = False):
    """``AutoModelForCausalLM.from_pretrained(path)``, or with ``empty`` the same model built with
    uninitialised parameters and its buffers real (rotary frequencies are computed, not stored),
    reading no weights: host memory does not grow with a sharded job's ranks (each
    would otherwise hold the whole fp32 policy). accelerate's ``cpu_ram_efficient_loading``
    sends every rank its shards from rank 0's copy when the model is sharded. (transformers
    5.24 reads the weights on every rank even under that setting, hence this.)"""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {"attn_implementation": attn_impl} if attn_impl else {}
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if not empty:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    from accelerate import init_empty_weights
    from transformers import GenerationConfig

    config = AutoConfig.from_pretrained(path)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kw)
    # uninitialised host storage rather than the meta device: accelerate tells the parameters
    # apart by their data pointers when it swaps them for their shards (every meta tensor's is 0).
    # Pages never written are never resident, so this costs address space, not memory
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.to_empty(device="cpu")
    for name, value in buffers.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        module._buffers[leaf] = value
    model.tie_weights()  # the empty parameters are made one by one: tied ones become one again
    model.config._name_or_path = str(path)  # TRL builds its reference from this name
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:  # a model without generation_config.json keeps the one from_config made
        pass
    return model


def policy_dtype(p: dict, cuda: bool):
    """The dtype the round's starting policy is loaded in.

    Full fine-tuning: fp32 whatever ``model.dtype``: the optimizer then updates fp32 master weights
    and TRL's ``bf16`` / ``fp16`` (set from ``model.dtype`` on CUDA) runs the forward and backward
    passes under autocast. AdamW on bf16 weights would lose updates smaller than bf16's
    resolution, which at fine-tuning learning rates is most of them.

    LoRA on CUDA: ``model.dtype``. The base is frozen (no optimizer touches it) and autocast would
    cast fp32 base weights to bf16 at every use anyway; held in fp32 it doubled the job's weight
    memory and its decoding bandwidth. peft keeps the adapters, which train, in fp32
    (``get_peft_model``'s ``autocast_adapter_dtype``, TRL's default)."""
    import torch

    if p.get("lora_r", 0) > 0 and cuda and p.get("dtype") in ("bfloat16", "float16"):
        return getattr(torch, p["dtype"])
    return torch.float32


def load_policy(ctx, p: dict, cuda: bool):
    """(path, model, tokenizer) of the round's starting policy: the previous round's, or the
    reference; in :func:`policy_dtype`, with the job's attention implementation."""
    from pita.models.chat import load_tokenizer
    from pita.models.lm import resolve_attn_impl

    path = ctx.dep_result(p["policy_from"])["checkpoint"] if p["policy_from"] else p["reference"]
    tok = load_tokenizer(path, p.get("chat_template_kwargs"))
    dtype = policy_dtype(p, cuda)
    model = load_model(path, dtype, resolve_attn_impl(p["attn_impl"]), empty=empty_here(p))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    ctx.log.info("policy %s: %s weights%s, attention %s", path, str(dtype).replace("torch.", ""),
                 " (a frozen LoRA base)" if p.get("lora_r", 0) > 0 else "", model.config._attn_implementation)
    return path, model, tok


def load_reference(p: dict, policy, cuda: bool):
    """The frozen reference a job loads itself (DPO after round 0 with ``ref_policy=original``;
    round 0's is the policy's own starting point, which TRL builds): forward passes only, so held
    in ``model.dtype`` on CUDA (autocast runs it there) and in the policy's dtype on the CPU, with
    the policy's attention implementation (a reference on another kernel than the policy differs
    from it at step 0). A sharded job's ranks other than 0 build it empty: rank 0 sends the shards."""
    dtype = p["dtype"] if cuda and p["dtype"] in ("bfloat16", "float16") else policy.dtype
    return load_model(p["reference"], dtype, policy.config._attn_implementation, empty=empty_here(p))


def peft_config(p: dict, log):
    if p["lora_r"] <= 0:
        return None
    from peft import LoraConfig

    log.info("LoRA r=%d alpha=%d on %s (merged into the saved policy)", p["lora_r"], p["lora_alpha"],
             ",".join(p["lora_target_modules"]))
    return LoraConfig(r=p["lora_r"], lora_alpha=p["lora_alpha"], target_modules=list(p["lora_target_modules"]),
                      lora_dropout=0.0, task_type="CAUSAL_LM")


