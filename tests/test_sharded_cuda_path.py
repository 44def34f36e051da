"""What a sharded (FSDP) training job does on a GPU node, checked on CPU by driving TRL, transformers
and accelerate down their CUDA branches where they make the decision: the keywords that reach
``from_pretrained`` for TRL's frozen reference, and the FSDP2 mixed-precision policy accelerate
builds from the job's arguments. No GPU is needed; only the device the libraries believe they
are on is changed."""

from __future__ import annotations

import pytest


def _params(**kw):
    p = {"dtype": "bfloat16", "gradient_checkpointing": True, "sharding": "fsdp", "tf32": False, "compile": False,
         "batch_size": 8, "devices": 2, "micro_batch_size": 4, "gradient_accumulation_steps": 1, "lr": 1e-6,
         "beta": 0.1, "seed": 0, "save_steps": 2}
    p.update(kw)
    return p


@pytest.fixture
def cuda_args(monkeypatch, tmp_path):
    """training_args(..., cuda=True) on this CPU machine: transformers' hardware checks (bf16 needs
    a GPU) are what would refuse it; everything the job's code decides runs as on a GPU."""
    import torch
    from transformers import TrainingArguments

    monkeypatch.setattr(TrainingArguments, "_validate_args", lambda self: None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)

    def make(cls_name="DPOConfig", **kw):
        import trl

        from pita.training.arguments import training_args

        extra = {"num_generations": 4} if cls_name == "GRPOConfig" else {}
        return training_args(getattr(trl, cls_name), _params(**kw), str(tmp_path / "out"), True, **extra)

    return make


@pytest.mark.parametrize("config", ["DPOConfig", "GRPOConfig"])
def test_trls_reference_is_loaded_whole_on_a_gpu_for_the_trainer_to_place(cuda_args, tiny, monkeypatch, config):
    """On a GPU, TRL builds its frozen reference with device_map="auto" unless the kwargs say
    otherwise (it overrides that for DDP and DeepSpeed only). Under FSDP accelerate would then
    spread the reference over every GPU of the job and hook its layers there, and the trainer's
    move to cuda:<rank> leaves the hooks sending activations elsewhere. The job's kwargs must reach
    from_pretrained with device_map=None, in the reference's half dtype."""
    import transformers
    from accelerate import PartialState
    from trl.trainer import utils as trl_utils

    import torch

    class OnCuda:  # what PartialState reports on a GPU rank
        device = torch.device("cuda", 0)

    monkeypatch.setattr(trl_utils, "PartialState", lambda *a, **k: OnCuda())
    seen = []
    real = transformers.PreTrainedModel.from_pretrained.__func__

    def record(cls, path, *args, **kw):
        seen.append(dict(kw))
        kw["device_map"] = None  # this machine has no GPU to map onto
        return real(cls, path, *args, **kw)

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(record))
    args = cuda_args(config)
    assert args.bf16
    ref = trl_utils.create_model_from_path(tiny["reference"], **dict(args.model_init_kwargs))
    assert seen and seen[-1]["device_map"] is None, seen
    assert seen[-1]["dtype"] == torch.bfloat16 and ref.dtype == torch.bfloat16
    assert PartialState  # the real class is untouched outside TRL's module


def test_fsdp_reduces_gradients_and_returns_log_probs_in_fp32_under_bf16(cuda_args):
    """accelerate's FSDP2 policy for bf16 reduces gradients in bf16 and casts the root's output to
    bf16 (sharding=none's DDP reduces fp32 gradients, and TRL sums the fused head's fp32 per-token
    log-probs); the job's plugin arguments keep the forward in bf16, reduce in fp32 and return fp32,
    as accelerate's CUDA state sets them up (set_mixed_precision without override)."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    args = cuda_args()
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    plugin.set_mixed_precision("bf16")  # what AcceleratorState does on a CUDA FSDP group
    mp = plugin.mixed_precision_policy
    assert (mp.param_dtype, mp.reduce_dtype, mp.output_dtype) == (torch.bfloat16, torch.float32, torch.float32)
    # mid-training checkpoints are written as shards, one per rank
    assert str(plugin.state_dict_type).endswith("SHARDED_STATE_DICT")


def test_no_checkpoint_is_written_right_after_a_resume():
    """training.save_steps=auto: the pacer counts steps from where the job stands when training
    begins; a resumed job (global_step 16) saves again only after a whole interval."""
    from types import SimpleNamespace

    from transformers import TrainerControl

    from pita.training.checkpoints import checkpoint_pacer

    pacer = checkpoint_pacer({"save_steps": "auto"}, n_params=10_000_000)
    pacer.interval, pacer.step_s = 4, 0.1
    state = SimpleNamespace(global_step=16, max_steps=100)
    control = TrainerControl()
    pacer.on_train_begin(None, state, control)
    saved = []
    for step in range(17, 25):
        state.global_step = step
        control = TrainerControl()
        pacer.on_step_begin(None, state, control)
        pacer.on_step_end(None, state, control)
        if control.should_save:
            saved.append(step)
            pacer.interval, pacer.last_step = 4, step  # on_save, without a collective
    assert saved == [20, 24], saved


def test_grpo_sampling_gathers_each_unit_once_not_once_per_token(tiny, monkeypatch):
    """One rank of a 2-rank FSDP2 policy (a fake process group: no peer is needed to count
    collectives): transformers' generate re-gathers every unit at every decoded token unless the
    units stay gathered for the generation, as the job's trainer keeps them."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as fpg
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoModelForCausalLM

    from pita.training.sharding import fsdp_units, gathered_for_generation

    gathers = []
    real = fpg.FSDPParamGroup.unshard

    def counted(self, *a, **k):  # an all-gather happens when the group is sharded and none is pending
        if self._all_gather_result is None and not self.is_unsharded:
            gathers.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(fpg.FSDPParamGroup, "unshard", counted)
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2,))
        model = AutoModelForCausalLM.from_pretrained(tiny["reference"]).eval()
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        units = fsdp_units(model)
        ids = torch.tensor([[5, 6, 7]])

        def generate():
            gathers.clear()
            with torch.no_grad():
                model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
            return len(gathers)

        per_token = generate()
        with gathered_for_generation(model):
            once = generate()
        assert 1 <= once <= units, (once, units)  # each unit at most once (the root may stay gathered)
        assert per_token >= 6 * once, (per_token, once)
        # afterwards the units are sharded again and reshard after each forward as before
        assert generate() == per_token
    finally:
        dist.destroy_process_group()


def test_an_nccl_out_of_memory_in_a_collective_is_an_oom_not_a_crash():
    """A sharded job's collective that cannot allocate NCCL's buffers raises DistBackendError, not
    torch's OutOfMemoryError: it is still the job out of memory (retried at half the micro-batch)."""
    import torch.distributed as dist

    from pita.core.worker import is_oom

    nccl = dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with "
                                 "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nLast error:\n"
                                 "Cuda failure 'out of memory'")
    assert is_oom(nccl)
    assert is_oom(RuntimeError("NCCL WARN Failed to CUDA calloc 6291456 bytes"))
    assert not is_oom(dist.DistBackendError("NCCL error: remote process exited or there was a network error"))
    assert not is_oom(ValueError("out of memory"))



def test_a_sharded_jobs_ranks_other_than_0_read_no_weights(tiny, monkeypatch):
    """Rank 1 of a sharded job builds the policy without reading the checkpoint (rank 0 sends its
    shards when accelerate shards it; the 2-rank tests check the loss matches one process): host
    memory does not grow with the ranks. Its buffers (rotary frequencies) are real, tied weights
    stay tied, and data-parallel ranks still read their own copy."""
    import logging
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM

    from pita.training.models import load_policy

    ref = AutoModelForCausalLM.from_pretrained(tiny["reference"])
    reads = []
    real = AutoModelForCausalLM.from_pretrained.__func__
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda cls, *a, **k: (reads.append(a[0]), real(cls, *a, **k))[1]))
    ctx = SimpleNamespace(log=logging.getLogger("test"), dep_result=lambda j: {})
    p = {"policy_from": None, "reference": tiny["reference"], "attn_impl": "sdpa", "sharding": "fsdp"}
    for k, v in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)
    _, model, _ = load_policy(ctx, p, cuda=False)
    assert reads == []
    assert sum(w.numel() for w in model.parameters()) == sum(w.numel() for w in ref.parameters())
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied as in the checkpoint
    for (name, b), (_, rb) in zip(model.named_buffers(), ref.named_buffers()):
        assert torch.equal(b, rb), name
    assert model.config._name_or_path == tiny["reference"]  # what TRL builds its reference from
    load_policy(ctx, {**p, "sharding": "none"}, cuda=False)  # data-parallel: every rank reads
    monkeypatch.setenv("RANK", "0")
    load_policy(ctx, p, cuda=False)  # rank 0 of a sharded job reads
    assert len(reads) == 2


@pytest.mark.parametrize("config", ["DPOConfig", "GRPOConfig"])
def test_every_trainer_steps_with_fused_adamw_on_cuda(cuda_args, config):
    """Fused AdamW for TRL's trainers (named, not left to transformers' default) and for the value
    and proxy trainers (pita.guidance.train): torch's foreach AdamW, its default on CUDA, holds a
    copy of every second moment while it steps, above the plan's estimate (measured on an H100)."""
    from transformers.trainer import Trainer

    from pita.guidance.train import optimizer_kwargs

    args = cuda_args(config)
    assert getattr(args.optim, "value", args.optim) == "adamw_torch_fused"
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    assert kwargs.get("fused") is True, (cls, kwargs)
    assert optimizer_kwargs("cuda:0") == {"fused": True} and optimizer_kwargs("cpu") == {}
