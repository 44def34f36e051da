"""TRL's config for a training job: mixed precision, FSDP2, accumulation, checkpoints, vLLM."""

from __future__ import annotations

import functools

from pita.training.checkpoints import checkpoint_args

def on_cuda() -> bool:
    from pita.models.lm import default_device

    return default_device().startswith("cuda")


def _checkpointing_key(cls) -> str:
    """transformers 5.x renamed TrainingArguments' ``gradient_checkpointing`` to
    ``activation_checkpointing`` (the old name still works, with a FutureWarning per job)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def device_steps(p: dict) -> tuple[int, int]:
    """(rows per device and micro-step, accumulation steps) of a training job: from its
    micro_batch_size when set (an OOM retry halves it; accumulation rises so the effective
    batch_size stays), else from gradient_accumulation_steps. A micro-batch that does not divide
    the per-device batch becomes the largest that does below it."""
    per_device_batch = max(1, p["batch_size"] // max(1, p["devices"]))
    micro = int(p.get("micro_batch_size") or 0)
    if micro <= 0:
        acc = max(1, int(p["gradient_accumulation_steps"]))
        return max(1, per_device_batch // acc), acc
    micro = next(m for m in range(min(micro, per_device_batch), 0, -1) if per_device_batch % m == 0)
    return micro, per_device_batch // micro


SYNC_EACH_BATCH_FLOOR = "5.2"  # the first transformers whose Trainer reads sync_each_batch (its PR 43919)


@functools.lru_cache(maxsize=1)
def trainer_syncs_each_batch() -> bool:
    """Whether the installed transformers' Trainer honours accelerate's ``sync_each_batch`` (read
    from its source: a release that predates it, or a build without it, never mentions it).
    Without it the Trainer runs every micro-step but the last under ``no_sync``, and an FSDP2
    rank holds every parameter's whole gradient until the last one (an 8B policy: +32 GB)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("transformers.trainer")
    try:
        return spec is not None and "sync_each_batch" in Path(spec.origin).read_text(encoding="utf-8")
    except OSError:
        return True  # an unreadable source (a zipped install): assume a current release


@functools.lru_cache(maxsize=1)
def trl_fused_head() -> bool:
    """Whether the installed TRL computes its trainers' per-token log-probabilities with its fused
    head (``trl.kernels.chunked_logprob``, TRL 1.16: never the whole vocabulary at every position);
    an older admitted release materialises the full fp32 logits, which the memory plan then counts."""
    import importlib.util

    try:
        return importlib.util.find_spec("trl.kernels.chunked_logprob") is not None
    except ModuleNotFoundError:  # no trl.kernels at all
        return False


def accumulation_sync_problem(where: str, devices: int, accumulation: int) -> str | None:
    """The refusal of an FSDP job over ``devices`` with ``accumulation`` micro-steps per optimizer
    step on a Trainer that would keep unsharded gradients between them; None where it is fine."""
    if devices < 2 or accumulation < 2 or trainer_syncs_each_batch():
        return None
    import transformers

    return (f"{where}: FSDP over {devices} devices with {accumulation} micro-steps per optimizer step needs a "
            f"transformers whose Trainer honours sync_each_batch ({SYNC_EACH_BATCH_FLOOR} or later; this one is "
            f"{transformers.__version__}): without it every micro-step but the last keeps every parameter's whole "
            f"gradient on each rank (an 8B policy: +32 GB a rank, an OOM at every retry size). pip install -U "
            f"'transformers>={SYNC_EACH_BATCH_FLOOR}'")


def fsdp_unavailable() -> str | None:
    """Why this torch / accelerate cannot shard a model with FSDP2, or None when they can."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "this torch has no torch.distributed"
    if not dist.is_available():
        return "this torch was built without torch.distributed (no process groups, so no sharding)"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return "this torch has no FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6): upgrade torch"
    try:
        from accelerate.utils import FullyShardedDataParallelPlugin
    except ImportError:
        return "accelerate is not installed"
    import dataclasses

    if "fsdp_version" not in {f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)}:
        return "this accelerate has no FSDP2 (fsdp_version): pip install -U 'accelerate>=1.6'"
    return None


def wrapped_layers(model) -> list[str]:
    """The module classes FSDP2 shards one per unit: the model's ``_no_split_modules`` that occur in
    it. accelerate takes the whole list and refuses a name the model lacks, and a multimodal
    model's list names its vision tower's classes, some of which its config leaves out (Gemma 3 4B's
    ``SiglipMultiheadAttentionPoolingHead``): the sharded job failed before its first step."""
    present = {type(m).__name__ for m in model.modules()}
    return [c for c in (getattr(model, "_no_split_modules", None) or []) if c in present]


def fsdp_settings(p: dict, model=None) -> dict:
    """TrainingArguments' FSDP2 keys for a ``sharding=fsdp`` job: every decoder layer its own unit
    (all-gathered for its forward and backward, resharded after), the full state dict gathered
    to rank 0 for the saved policy. FSDP's own activation checkpointing replaces the Trainer's
    (which would all-gather each layer a second time)."""

    config = {"version": 2, "reshard_after_forward": True, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
              # mid-training checkpoints: each rank writes its own shard of the weights and the AdamW
              # state (torch.distributed.checkpoint), read back on the same world size; the final
              # policy is gathered whole by _save_policy, whatever this says
              "state_dict_type": "SHARDED_STATE_DICT",
              # rank 0 alone reads the weights; the other ranks build the models empty
              # (load_model) and receive their shards from rank 0 as accelerate shards them
              "cpu_ram_efficient_loading": True,
              "activation_checkpointing": bool(p["gradient_checkpointing"])}
    layers = wrapped_layers(model) if model is not None else []
    if layers:
        config["transformer_layer_cls_to_wrap"] = layers
    # transformers 5 (the floor is 5.2) takes fsdp=True with the options in fsdp_config
    return {"fsdp": True, "fsdp_config": config}


def training_args(cls, p: dict, out: str, cuda: bool, tracker=None, model=None, **extra):
    """TRL's ``cls`` (DPOConfig, GRPOConfig) from a training job's params; ``tracker``
    (``pita.tracking.tracker_settings(ctx)``) sets TRL's ``report_to``; ``model``: the policy, whose
    layers a sharded job wraps (:func:`wrapped_layers`)."""
    import torch

    from pita.tracking import prepare_trl

    # mixed precision on CUDA: autocast in bf16 (fp16 where bf16 is unsupported or asked for),
    # fp32 master weights (load_policy)
    bf16 = cuda and p["dtype"] in ("bfloat16", "float32") and torch.cuda.is_bf16_supported()
    per_device, accumulation = device_steps(p)
    checkpointing = bool(p["gradient_checkpointing"])
    if p.get("sharding") == "fsdp":
        refused = accumulation_sync_problem(f"algos.{p.get('algo', '<A>')}", int(p["devices"]), accumulation)
        if refused:  # an OOM retry halves the micro-batch and raises the accumulation: checked per attempt
            from pita.core.errors import JobError

            raise JobError(refused)
        extra.update(fsdp_settings(p, model))
        checkpointing = False  # FSDP's own (fsdp_config.activation_checkpointing)
        # every micro-step reduce-scatters its gradients. Without this the trainer runs each
        # micro-step but the last under accelerate's no_sync, which for FSDP2 is
        # set_requires_gradient_sync(False): every rank then holds each parameter's whole
        # (unsharded) gradient in the reduce dtype until the last micro-step, 4 bytes x every
        # parameter per rank (an 8B policy: +32 GB), and an OOM retry, which halves the micro-batch
        # and doubles the accumulation, would bring on the very memory that failed
        extra["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    extra.setdefault("model_init_kwargs", reference_init_kwargs(p, cuda))
    args = cls(output_dir=out, use_cpu=not cuda, bf16=bf16, fp16=cuda and not bf16 and p["dtype"] == "float16",
               tf32=bool(p["tf32"]) if cuda else None, torch_compile=bool(p["compile"]),
               per_device_train_batch_size=per_device,
               gradient_accumulation_steps=accumulation, learning_rate=p["lr"], beta=p["beta"],
               **{_checkpointing_key(cls): checkpointing}, seed=p["seed"], data_seed=p["seed"],
               logging_steps=1, **prepare_trl(tracker), **checkpoint_args(p), disable_tqdm=True,
               dataloader_num_workers=int(p.get("num_workers", 0)),
               ddp_find_unused_parameters=False if p["devices"] > 1 else None,
               # how long a rank waits in a collective: the final policy is gathered and written by
               # rank 0 while the others wait at the barrier (a 15B fp32 policy is 60 GB); 2 h, named
               # rather than left to the default (30 min)
               ddp_timeout=7200,
               # fused AdamW (transformers 5.24's default, named: the default has moved between releases).
               # torch's foreach AdamW holds a copy of every second moment while it steps: 4 more bytes
               # per parameter at the peak, measured on an H100 (bench/gpu_check.py)
               optim="adamw_torch_fused", **extra)
    if args.fsdp_plugin_args is not None and (args.bf16 or args.fp16):
        args.fsdp_plugin_args["mixed_precision_policy"] = fsdp_mixed_precision(
            torch.bfloat16 if args.bf16 else torch.float16)
    return args


def fsdp_mixed_precision(half) -> dict:
    """FSDP2's mixed-precision policy for a sharded job under bf16 / fp16 (accelerate's plugin
    takes it as a dict). The forward and backward run in the half dtype (``param_dtype``).
    ``reduce_dtype`` fp32: accelerate's own policy reduces the gradients in the half dtype; in fp32
    they match what sharding=none's DDP all-reduce gives (fp32 gradients of fp32 master weights).
    ``output_dtype`` fp32: FSDP casts every float in the root module's output to it, and what TRL's
    trainers get there is the fused head's per-token log-probabilities (computed in fp32), which
    they sum per sequence; cast to bf16 first, a sum of 128-256 nats resolves whole nats, and
    sharded and unsharded runs of one config gave different margins and losses. Casting the
    log-probabilities up costs nothing; outputs that are logits (generation) become fp32 too,
    one position per row."""
    import torch

    return {"param_dtype": half, "reduce_dtype": torch.float32, "output_dtype": torch.float32}


def reference_init_kwargs(p: dict, cuda: bool) -> dict:
    """The ``from_pretrained`` keywords TRL builds its frozen reference with (``model_init_kwargs``).

    ``device_map=None``: the reference is loaded whole on the CPU and the trainer moves it to the
    rank's device (or shards it). TRL's own default on a GPU is ``"auto"``, which it overrides
    only for DDP and DeepSpeed: under FSDP, and on a GPU shared with other jobs, accelerate would
    spread the reference over every visible GPU (or offload it to the CPU) and attach hooks that
    send activations there after the trainer has moved it to ``cuda:<rank>``: a device mismatch
    at the first reference forward. ``dtype``: the reference only runs forward passes under
    autocast, so on CUDA it is held in ``model.dtype`` (TRL otherwise copies the policy's fp32)."""
    kw = {"device_map": None}
    if cuda and p["dtype"] in ("bfloat16", "float16"):
        kw["dtype"] = p["dtype"]
    return kw


