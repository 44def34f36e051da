"""The trainer class every TRL-trained job builds, and FSDP2 helpers."""

from __future__ import annotations

import contextlib
import functools

from pita.training.models import empty_here, load_model


def job_trainer(cls):
    """``cls`` (a TRL trainer) as every training job builds it.

    - It also shards on CPU. accelerate turns FSDP on for GPU process groups only; with gloo it
      silently trains data-parallel. Where the job asked for FSDP and accelerate chose plain
      multi-CPU, this enables accelerate's own FSDP2 path on the gloo group (FSDP2's fully_shard
      runs there), with the mixed precision accelerate's GPU state would set, so the job's code
      path is the one a GPU node runs.
    - TRL's frozen reference is sharded like the policy (:func:`layered_reference_sharding`).
    - GRPO samples its generation batch (micro-batch x ``steps_per_generation`` rows a device) in
      calls of ``rows_per_generate`` rows (:func:`pita.core.memory.generate_rows`: the rows the
      sampling phase fits, which the plan computed and prices), not one call of the whole batch
      (TRL's, whose cache the plan could not bound) nor one per micro-batch (sequential calls
      that each run to the longest completion). An OOM retry that halves the micro-batch halves
      the rows a call too. A sharded policy stays gathered while it samples
      (:func:`gathered_for_generation`)."""

    class JobTrainer(cls):
        def __init__(self, *args, **kw):
            sharded = kw.get("args") is not None and kw["args"].fsdp_plugin_args is not None
            with layered_reference_sharding(cls, empty=sharded and empty_here({"sharding": "fsdp"})):
                super().__init__(*args, **kw)

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

            acc = self.accelerator
            if self.args.fsdp_plugin_args is None or acc.distributed_type != DistributedType.MULTI_CPU:
                return
            plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            if acc.state.mixed_precision != "no":  # as AcceleratorState does for an FSDP group on GPUs
                plugin.set_mixed_precision(acc.state.mixed_precision)

            def as_fsdp():
                from accelerate.state import PartialState

                acc.state.fsdp_plugin = plugin
                acc.state.distributed_type = DistributedType.FSDP
                # as AcceleratorState records it on a GPU group: every later AcceleratorState()
                # copies PartialState's shared fields over its own, so without this the state read
                # multi-CPU again (and the trainer's no_sync, clipping and saving took DDP's path)
                PartialState._shared_state["distributed_type"] = DistributedType.FSDP

            for name in ("prepare", "prepare_model"):
                def prepare(*args, _inner=getattr(acc, name), **kw):
                    as_fsdp()
                    return _inner(*args, **kw)

                setattr(acc, name, prepare)
            as_fsdp()
            self._as_fsdp = as_fsdp
            self.is_fsdp_enabled = True

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, *args, **kw):  # GRPO's sampling
            vllm = getattr(self.args, "use_vllm", False)
            rows = self.generate_rows()
            with gathered_for_generation(self.model_wrapped, enabled=not vllm):
                if vllm or images is not None or multimodal_fields or len(prompt_ids) <= rows:
                    return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kw)
                completions = []
                for a in range(0, len(prompt_ids), rows):  # a micro-batch of rows per generate call
                    ids, logprobs = super()._generate_single_turn(prompt_ids[a:a + rows], None, multimodal_fields,
                                                                  *args, **kw)
                    if logprobs is not None:  # only vLLM returns them, and vLLM is not chunked
                        raise RuntimeError("TRL returned sampling log-probs from a chunked generate call")
                    completions += ids
                return completions, None

        rows_per_generate: int | None = None  # the plan's (set by the job); None: one micro-batch a call
        rows_per_generate_micro: int = 0  # the micro-batch it was planned with

        def generate_rows(self) -> int:
            """Rows per generate call: the plan's, scaled down with the micro-batch an OOM retry
            halved; one micro-batch without a plan's number."""
            micro = max(1, int(self.args.per_device_train_batch_size))
            if not self.rows_per_generate:
                return micro
            rows = int(self.rows_per_generate)
            if 0 < micro < self.rows_per_generate_micro:
                rows = rows * micro // self.rows_per_generate_micro
            return max(1, rows)

        def _save_checkpoint(self, *args, **kw):  # a checkpoint of shards is written by every rank
            if getattr(self, "_as_fsdp", None):
                self._as_fsdp()
            return super()._save_checkpoint(*args, **kw)

        def _load_from_checkpoint(self, *args, **kw):
            if getattr(self, "_as_fsdp", None):
                self._as_fsdp()
            return super()._load_from_checkpoint(*args, **kw)

    JobTrainer.__name__ = JobTrainer.__qualname__ = f"Job{cls.__name__}"
    return JobTrainer


@contextlib.contextmanager
def layered_reference_sharding(cls, empty: bool = False):
    """While ``cls`` (a TRL trainer) is built, its frozen reference is sharded one decoder layer per
    FSDP unit, as accelerate shards the policy. TRL's ``prepare_fsdp`` calls ``fully_shard`` on the
    reference's root alone, so every reference forward all-gathers the whole model on every rank
    beside the policy's live activations (8B in bf16: 16 GB per rank, where the plan counts 16/k);
    per layer, one layer is gathered at a time. TRL resolves ``prepare_fsdp`` from its trainer
    modules, so it is replaced there for the duration of the constructor (TRL is bounded < 1.17)."""
    import sys

    mods = {sys.modules[k.__module__] for k in cls.__mro__ if hasattr(sys.modules.get(k.__module__), "prepare_fsdp")}
    saved = {m: (m.prepare_fsdp, getattr(m, "create_model_from_path", None)) for m in mods}
    try:
        for m, (prepare, create) in saved.items():
            m.prepare_fsdp = functools.partial(_shard_reference_layers, prepare)
            if create is not None:
                m.create_model_from_path = functools.partial(_reference_from_path, create, empty)
        yield
    finally:
        for m, (prepare, create) in saved.items():
            m.prepare_fsdp = prepare
            if create is not None:
                m.create_model_from_path = create


def _reference_from_path(create, empty: bool, model_id, *args, **kw):
    """TRL's reference as TRL builds it; ``empty`` (a sharded job's ranks other than 0): built
    without its weights, which come from rank 0 in :func:`_shard_reference_layers`."""
    if not empty:
        return create(model_id, *args, **kw)
    return load_model(model_id, kw.get("dtype") or "float32", kw.get("attn_implementation"), empty=True)


def _shard_reference_layers(prepare, model, accelerator):
    """Shard ``model`` into the units accelerate gives the policy (FSDP2, TRANSFORMER_BASED_WRAP):
    each decoder layer (the ``_no_split_modules`` classes), the input embeddings when they are not
    tied to the head, and the tail (final norm, head, and the tied embeddings) as one group; then
    TRL's ``prepare`` shards the root. The reference runs forward passes only, so every unit is
    resharded after its forward. A job's plugin reads the weights on rank 0 alone
    (``cpu_ram_efficient_loading``), so there accelerate's own ``fsdp2_prepare_model`` does this
    and sends the shards; the explicit units below serve a plugin without that setting
    (bench.memory_truth's fake-tensor rank, which has no peers to receive from)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    plugin = accelerator.state.fsdp_plugin
    if (plugin is not None and plugin.fsdp_version == 2 and not isinstance(model, FSDPModule)
            and getattr(plugin, "cpu_ram_efficient_loading", False)):
        # rank 0 alone holds the weights: accelerate's own preparation shards the reference into
        # the policy's units and sends each rank its shards. Frozen first, so it stays in its
        # dtype (accelerate upcasts trainable parameters to fp32 master weights)
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        model.requires_grad_(False)
        model = fsdp2_prepare_model(accelerator, model)
    elif plugin is not None and plugin.fsdp_version == 2 and not isinstance(model, FSDPModule):
        names = set(getattr(model, "_no_split_modules", None) or [])
        mesh = getattr(accelerator, "torch_device_mesh", None)
        if mesh is not None:
            mesh = mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)]
        kw = {"reshard_after_forward": True, "offload_policy": plugin.cpu_offload,
              "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(), "mesh": mesh}
        for layer in [m for m in model.modules() if type(m).__name__ in names]:
            fully_shard(layer, **kw)
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
        tied = embed is not None and head is not None and embed.weight is head.weight
        if embed is not None and not tied:
            fully_shard(embed, **kw)
        norm = getattr(getattr(model, "base_model", None), "norm", None)
        tail = [m for m in (norm, *((embed, head) if tied else (head,))) if m is not None]
        if tail:
            fully_shard(tail, **kw)
    return prepare(model, accelerator)


@contextlib.contextmanager
def gathered_for_generation(model, enabled: bool = True):
    """While GRPO samples with a sharded policy (transformers' generate, no vLLM), every FSDP unit
    stays gathered after its first forward instead of being resharded: otherwise each decoded
    token all-gathers the whole model again (an 8B policy: about 16 GB of traffic per token per
    rank). Afterwards every unit is resharded and keeps its own setting. The gathered policy in
    the compute dtype is counted in the job's memory estimate (pita/plans/memory.py)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)] if enabled else []
    before = []
    for u in units:
        group = getattr(u._get_fsdp_state(), "_fsdp_param_group", None)  # torch's own record of the setting
        before.append(getattr(group, "post_forward_mesh_info", True) is not None)
        u.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for u, flag in zip(units, before):
            u.set_reshard_after_forward(flag, recurse=False)
            u.reshard()


def fsdp_units(model) -> int:
    """How many FSDP units ``model`` is sharded into (0: not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in model.modules()) if model is not None else 0


def is_sharded(model) -> bool:
    """Whether the model's parameters are FSDP2 shards (DTensors)."""
    return any(hasattr(w, "to_local") for w in model.parameters())


def rank_parameters(model) -> list[int]:
    """The parameters each rank holds (a sharded parameter counts its local shard): one entry per
    rank, gathered from every rank (a collective: every rank calls it)."""
    import torch.distributed as dist

    local = sum(int(w.to_local().numel()) if hasattr(w, "to_local") else int(w.numel()) for w in model.parameters())
    if not (dist.is_available() and dist.is_initialized()):
        return [local]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, local)
    return [int(x) for x in out]
