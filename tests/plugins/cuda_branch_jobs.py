"""Training job kinds that run the job's own function on its CUDA branch on this CPU
(``bench.cuda_branch``): bf16 autocast, FSDP2's mixed-precision policy and the reference in bf16,
as a GPU node runs them, with the arithmetic on the CPU. A k-device job runs on k gloo ranks
(torchrun), each of which drives the branch before it calls the job function; the ranks import
this module, so the test puts ``tests/`` and the repository on ``PYTHONPATH``."""

from __future__ import annotations

from pita.core.job import add_kind_module, job_kind

add_kind_module("plugins.cuda_branch_jobs")


@job_kind("test.dpo_on_cuda_branch")
def dpo_on_cuda_branch(ctx):
    from pita.algos.distributed import run_distributed, world_size

    p = ctx.params
    if int(p.get("devices", 1)) > 1 and world_size() == 1:
        return run_distributed(ctx, "test.dpo_on_cuda_branch", int(p["devices"]))
    from bench.cuda_branch import drive_cuda_branch

    drive_cuda_branch()
    from pita.algos import dpo

    return dpo.dpo_train(ctx)
