"""Shared helpers for the integration tests: run a graph of synthetic jobs for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pita.core.backends import make_backend
from pita.core.executor import Executor, ExecutorSettings
from pita.core.gpu_manager import GPUManager
from pita.core.graph import JobGraph
from pita.core.logs import setup_logging
from pita.core.paths import RunPaths

ROOT = Path(__file__).resolve().parent.parent


def run_graph(jobs, tmp_path, backend="local", devices=2, run=None, worker_start="forkserver", **settings):
    """Run ``jobs`` through the executor on CPU devices; local workers fork from a warm process
    (as CPU runs do) unless ``worker_start="exec"``."""
    gpus = GPUManager.from_inventory(devices, 8e9, kind="cpu")
    run = run or RunPaths.create(tmp_path, "t")
    setup_logging(run.run_log, console=False)
    s = ExecutorSettings(**{"progress": "off", "poll_interval_s": 0.02, "kill_grace_s": 2, **settings})
    be = make_backend(backend, worker_start=worker_start) if backend == "local" else make_backend(backend)
    summary = Executor(JobGraph(jobs).validate([d.total_bytes for d in gpus.devices]), gpus, be, run, s).run()
    state = json.loads(run.state.read_text())
    return summary, state, run


def cli(args, cwd, timeout=120, **kw):
    """Run run_parallel.py in a subprocess (from the repo root, outputs under ``cwd``)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if not any(a.startswith(("experiment.workload=", "experiment=", "resume_from=", "--")) for a in args):
        args = [*args, "experiment.workload=synthetic"]  # the default is the real (much longer) experiment
    return subprocess.run([sys.executable, str(ROOT / "run_parallel.py"), *args, f"system.output_dir={cwd}",
                           "executor.progress=plain"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def workers_of(run_root) -> list:
    """Live worker processes that belong to a run folder."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if "pita.core.worker" in cmd and str(run_root) in cmd:
            out.append(p)
    return out


def wait_for(cond, timeout=30.0, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(step)
    return False


def only_run(base: Path, name: str) -> Path:
    """The one run folder of experiment ``name`` under ``base``."""
    [run] = list((base / name).iterdir())
    return run


def final_state(run: Path) -> dict:
    """Job -> (state, result digest): what an uninterrupted and a resumed run must agree on."""
    jobs = json.loads((run / "state.json").read_text())["jobs"]
    out = {}
    for jid, e in jobs.items():
        res = run / "jobs" / jid / "result.json"
        out[jid] = (e["state"], json.loads(res.read_text()).get("digest") if res.exists() else None)
    return out


def record_optimizer_gradients(monkeypatch, optimizer=None) -> list:
    """Keep a copy of the gradients every ``optimizer.step`` (AdamW's by default) is about to
    apply: one list of tensors per step. Two ways of computing one step are compared on these,
    not on the weights after it: Adam divides each gradient by its own magnitude, so a coordinate
    whose gradient is near 0 moves by an amount float noise decides, and a wrong scale of the
    whole gradient would not show in the weights at all."""
    import torch

    cls = optimizer or torch.optim.AdamW
    step = cls.step
    steps: list = []

    def recording_step(opt, *a, **kw):
        steps.append([p.grad.detach().clone() for g in opt.param_groups for p in g["params"] if p.grad is not None])
        return step(opt, *a, **kw)

    monkeypatch.setattr(cls, "step", recording_step)
    return steps


def assert_same_gradient(a: list, b: list, rel: float = 1e-4) -> None:
    """Each tensor's difference within ``rel`` of its norm (float32 sums in another order agree
    to ~1e-6 of it); a tensor whose gradient is ~0 against the rest's is held to the whole's."""
    import torch

    assert len(a) == len(b) > 0
    total = float(torch.cat([g.flatten() for g in a]).norm())
    assert total > 0, "an all-zero gradient compares nothing"
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.shape == y.shape, (i, x.shape, y.shape)
        err, scale = float((x - y).norm()), max(float(x.norm()), 1e-3 * total)
        assert err <= rel * scale, f"tensor {i} {tuple(x.shape)}: |a-b| = {err:.3g}, |a| = {float(x.norm()):.3g}"


def pita_here(argv: list[str], cwd, monkeypatch) -> int:
    """``pita <argv>`` in this process (no interpreter start-up), from the folder ``cwd``."""
    from pita.entry import main

    monkeypatch.chdir(cwd)
    try:
        return main(list(argv))
    except SystemExit as e:  # argparse and the override checks exit
        return int(e.code or 0)


def as_user(argv: list[str], cwd, timeout: int = 600):
    """A command run as a user of the installed pita runs it: the venv's bin first on PATH (as
    after ``source .venv/bin/activate``), no PYTHONPATH pointing into the checkout."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def user_folder(d: Path, data_file: str, run_name: str) -> Path:
    """A user's folder for the docs checks: a GSM8K-format file ``data_file`` and a finished
    (synthetic) run of experiment ``run_name`` under outputs/."""
    rows = [{"question": f"What is {a} plus {a}?", "answer": f"#### {2 * a}", "split": "train" if a < 20 else "test"}
            for a in range(2, 26)]
    (d / data_file).write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = as_user(["pita", "run", f"experiment.name={run_name}", "experiment.workload=synthetic", "synthetic.algos=[PITA]",
                 "synthetic.datasets=[arith]", "synthetic.rounds=1", "synthetic.job_seconds=0", "executor.progress=off"], d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d

