"""A training job's CUDA branch, driven on a CPU machine: what a GPU node runs, decided where it is
decided, without a GPU.

    drive_cuda_branch()        # in the process that then calls a training job's function

After it, the job believes it is on CUDA (``on_cuda()``), so its arguments take their GPU values
(bf16 autocast, tf32, FSDP2's mixed-precision policy, the reference in ``model.dtype``, LoRA's
frozen base in ``model.dtype``); transformers' hardware checks, which would refuse bf16 and tf32
here, pass; and accelerate runs its CPU process group (gloo, or a fake one), where
``pita.training.sharding.job_trainer`` turns it into FSDP as accelerate does on a GPU group. The
arithmetic then runs on the CPU in bf16 where the GPU would. Used by ``bench.trainer_memory`` (on
fake tensors) and by the tests that compare sharded and unsharded training under bf16.
"""

from __future__ import annotations

import os
import sys

JOB_MODULES = ("pita.training.arguments", "pita.algos.dpo", "pita.algos.grpo")


def drive_cuda_branch(monkeypatch=None) -> None:
    """Drive this process's training jobs down their CUDA branch; with pytest's ``monkeypatch``,
    every change is undone after the test."""
    import torch
    import transformers.training_args as training_args
    from transformers import TrainingArguments

    set_attr = monkeypatch.setattr if monkeypatch is not None else setattr
    set_env = monkeypatch.setenv if monkeypatch is not None else os.environ.__setitem__
    set_env("ACCELERATE_USE_CPU", "true")  # accelerate's CPU process group: gloo, or a fake one
    set_env("ACCELERATE_TORCH_DEVICE", "cpu")  # "cpu", not "cpu:0", which fake tensors tell apart
    set_attr(TrainingArguments, "_validate_args", lambda self: None)  # "bf16 / tf32 need a GPU"
    set_attr(training_args, "is_torch_tf32_available", lambda: True)
    set_attr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    for name in JOB_MODULES:  # every module that asks on_cuda() by its own name
        __import__(name)
        set_attr(sys.modules[name], "on_cuda", lambda: True)
