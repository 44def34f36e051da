"""Data-parallel training jobs: one job, k devices, k processes (DDP through accelerate).

    result = run_distributed(ctx, "algo.dpo_train", k)     # in the job's worker

The executor gives a k-device job k devices at once (CUDA_VISIBLE_DEVICES lists them). The worker
then starts ``torch.distributed.run --nproc_per_node k -m pita.algos.distributed spec.json``;
each process runs the same job function, and the TRL / transformers Trainer inside it finds the
distributed environment (RANK, WORLD_SIZE, LOCAL_RANK) and wraps the model in DDP through
accelerate (NCCL on GPUs, gloo on CPU). Rank 0 writes the checkpoint and the result; the
worker streams every rank's output into the job log and returns rank 0's result. The effective
batch stays as configured: the job divides it by k (pita/algos/post_training.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from pita.core.errors import JobError

SPEC, RESULT = "distributed.json", "distributed-result.json"


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_distributed(ctx, kind: str, k: int) -> dict:
    deps = {d: ctx.dep_result(d) for d in _dep_ids(ctx.params)}
    from pita.core.job import kind_target

    from dataclasses import asdict

    from pita.tracking import tracker_settings

    spec = {"kind": kind, "target": kind_target(kind), "params": ctx.params, "deps": deps, "dir": str(ctx.paths.dir),
            "tracker": asdict(tracker_settings(ctx))}
    spec_file = ctx.paths.dir / SPEC
    spec_file.write_text(json.dumps(spec))
    result_file = ctx.paths.dir / RESULT
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={k}", "--nnodes=1",
           f"--master_port={_free_port()}", "-m", "pita.algos.distributed", str(spec_file)]
    ctx.log.info("data-parallel over %d processes: %s", k, " ".join(cmd[2:]))
    env = dict(os.environ)
    if os.environ.get("OMP_NUM_THREADS"):  # CPU: the job's threads are shared out between its ranks
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(max(1, int(os.environ["OMP_NUM_THREADS"]) // k))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:  # every rank's output, into the job log
        ctx.log.info("%s", line.rstrip())
    rc = proc.wait()
    if rc != 0 or not result_file.exists():
        raise JobError(f"the {k}-process training exited with code {rc}; the ranks' output is in the job log above")
    return json.loads(result_file.read_text())


def _dep_ids(params: dict) -> list[str]:
    return [v for k in ("policy_from", "data", "proxy") if isinstance(v := params.get(k), str)]


def main(spec_file: str) -> int:
    import importlib

    from pita.core.paths import JobPaths

    spec = json.loads(Path(spec_file).read_text())
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK', '0')}] %(message)s")
    from pita.tracking import TrackerSettings

    ctx = SimpleNamespace(params=spec["params"], dep_result=lambda j: spec["deps"][j],
                          paths=JobPaths(Path(spec["dir"])), log=logging.getLogger("pita.job"),
                          tracker=TrackerSettings(**spec.get("tracker", {})))
    mod, name = spec["target"].split(":")
    result = getattr(importlib.import_module(mod), name)(ctx)
    if is_rank0():
        (Path(spec["dir"]) / RESULT).write_text(json.dumps(result))
    import torch.distributed as dist

    # every rank waits for rank 0's checkpoint and result, then the group is shut down before the
    # process exits: a rank leaving with the group alive can abort in the backend's threads
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
