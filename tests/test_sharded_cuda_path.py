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

        from pita.algos.post_training import training_args

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


def test_fsdp_reduces_gradients_in_fp32_under_bf16(cuda_args):
    """accelerate's FSDP2 policy for bf16 reduces gradients in bf16 (sharding=none's DDP reduces
    fp32 gradients); the job's plugin arguments keep the forward in bf16 and reduce in fp32, as
    accelerate's CUDA state sets them up (set_mixed_precision without override)."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    args = cuda_args()
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    plugin.set_mixed_precision("bf16")  # what AcceleratorState does on a CUDA FSDP group
    mp = plugin.mixed_precision_policy
    assert (mp.param_dtype, mp.reduce_dtype, mp.output_dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)
    # mid-training checkpoints are written as shards, one per rank
    assert str(plugin.state_dict_type).endswith("SHARDED_STATE_DICT")


def test_no_checkpoint_is_written_right_after_a_resume():
    """training.save_steps=auto: the pacer counts steps from where the job stands when training
    begins; a resumed job (global_step 16) saves again only after a whole interval."""
    from types import SimpleNamespace

    from transformers import TrainerControl

    from pita.algos.post_training import checkpoint_pacer

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
