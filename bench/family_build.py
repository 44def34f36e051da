"""The tiny family's reference built as a run builds it: one process, or two sharing each step.

    python -m bench.family_build [--json] [--steps 60] [--neighbour]

Runs the reference's ``model.build_tiny`` job through the executor's local backend (the demo's
path: one CPU device, or both, one thread each), each into a fresh cache, with ``--steps``
pretraining steps (the family trains 600), and prints per variant: the job's wall seconds, the
build's own seconds (the part's ``.built`` report: the worker's start-up apart, the ranks' start
included), and a digest of the weights. The digests of all variants should be equal: the build's arithmetic does not depend
on how many processes share it, nor on the load. ``--neighbour`` repeats both beside a 2-thread
torch matmul loop. Nothing is asserted; do not time it while other heavy work runs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEIGHBOUR = ("import torch\ntorch.set_num_threads(2)\na = torch.randn(384, 384)\n"
             "while True:\n    a = torch.tanh(a @ a)\n")


@contextlib.contextmanager
def neighbour(on: bool):
    if not on:
        yield
        return
    p = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        yield
    finally:
        p.kill()
        p.wait()


def build(root: Path, devices: int, steps: int) -> dict:
    from safetensors.torch import load_file

    from pita.core.backends import make_backend
    from pita.core.executor import Executor, ExecutorSettings
    from pita.core.gpu_manager import GPUManager
    from pita.core.graph import JobGraph
    from pita.core.job import Job, Resources
    from pita.core.logs import setup_logging
    from pita.core.paths import RunPaths
    from pita.models import family_jobs, tiny  # noqa: F401  (registers model.build_tiny)

    cache = root / "cache"
    tiny.prepare_tiny_family(cache, 0)
    job = Job(id="model.tiny.reference", kind="model.build_tiny", group="model",
              params={"cache_dir": str(cache), "seed": 0, "part": "reference",
                      "path": tiny.family_paths(cache, 0)["reference"], "steps": steps},
              resources=Resources(devices=devices, memory_gb=0.5))
    gpus = GPUManager.from_inventory(2, 8e9, kind="cpu")
    run = RunPaths.create(root, "bench")
    setup_logging(run.run_log, console=False)
    settings = ExecutorSettings(progress="off", poll_interval_s=0.02, threads_per_job=1)
    t0 = time.time()
    summary = Executor(JobGraph([job]).validate([d.total_bytes for d in gpus.devices]), gpus,
                       make_backend("local", worker_start="forkserver"), run, settings).run()
    wall = time.time() - t0
    if summary.exit_code != 0:
        return {"error": (run.job(job.id).log).read_text()[-2000:]}
    report = json.loads((tiny.family_dir(cache, 0) / "reference" / ".built").read_text())
    w = load_file(str(tiny.family_dir(cache, 0) / "reference" / "model.safetensors"))
    digest = hashlib.sha256(b"".join(w[k].numpy().tobytes() for k in sorted(w))).hexdigest()[:16]
    return {"processes": 2 if devices >= 2 else 1, "job_wall_s": round(wall, 1), "built_s": report["built_s"],
            "digest": digest}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--neighbour", action="store_true", help="also beside a 2-thread torch matmul loop")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = []
    for loaded in ([False, True] if a.neighbour else [False]):
        for devices in (1, 2):
            with tempfile.TemporaryDirectory(prefix="pita-bench-family-") as d, neighbour(loaded):
                r = build(Path(d), devices, a.steps)
            out.append({"neighbour": loaded, "steps": a.steps, **r})
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for r in out:
            print(f"{'beside a neighbour' if r['neighbour'] else 'idle':18s} {r.get('processes', '?')} process(es): "
                  f"job {r.get('job_wall_s')} s, build {r.get('built_s')} s, weights {r.get('digest', r.get('error'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
