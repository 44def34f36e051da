"""Runs one job attempt: in a spawned worker process (``python -m pita.core.worker launch.json``)
or in-process (the inline backend). Both go through :func:`execute`.

The parent sets ``CUDA_VISIBLE_DEVICES`` in the environment before this interpreter starts, so
torch only ever sees the job's own devices. The config arrives as a plain dict and is rebuilt
as an OmegaConf object here. The outcome of the attempt is written to ``attempt-<n>.json``; on
success ``result.json`` then the ``.done`` marker are written, the marker last.

Exit codes: 0 success, 1 the job raised, 3 out of memory (the parent may retry with a smaller
batch). Any other code or a signal means the worker died.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

EXIT_OK, EXIT_ERROR, EXIT_OOM = 0, 1, 3


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory, whatever torch version raised it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    msg = str(exc)
    return isinstance(exc, RuntimeError) and ("CUDA out of memory" in msg or "CUDA error: out of memory" in msg)


def _peak_memory() -> dict:
    out = {}
    try:
        import resource

        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:  # not on every platform
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_gpu_bytes"] = int(max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())))
    return out


def execute(launch: dict, logger: logging.Logger) -> dict:
    """Run the job described by ``launch``; return the attempt's outcome (never raises)."""
    from omegaconf import OmegaConf

    from pita.core.context import JobContext
    from pita.core.job import Job, resolve_target
    from pita.core.paths import RunPaths, atomic_write, atomic_write_json

    job = Job.from_dict(launch["job"])
    run = RunPaths(launch["run_dir"])
    paths = run.job(job.id)
    attempt = launch["attempt"]
    t0 = time.time()
    try:
        fn = resolve_target(launch["target"])
        cfg = OmegaConf.create(launch.get("config") or {})
        ctx = JobContext(job, attempt, paths, run, cfg, launch.get("devices", []), logger)
        logger.info("attempt %d of %s (%s) on %s, params %s", attempt, job.id, job.kind,
                    ", ".join(d.get("label", "?") for d in ctx.devices) or "host", json.dumps(job.params, sort_keys=True))
        result = fn(ctx)
        if result is None:
            result = {}
        if not isinstance(result, dict):
            raise TypeError(f"job kind {job.kind!r} returned {type(result).__name__}; it must return a dict or None")
        atomic_write_json(paths.result, result)
        atomic_write(paths.done, json.dumps({"attempt": attempt, "finished": time.time()}))
        outcome = {"status": "ok"}
    except BaseException as e:  # the job's failure is data for the parent, not a crash of the worker
        tb = traceback.format_exc()
        logger.error("job %s failed:\n%s", job.id, tb.rstrip())
        if is_oom(e):
            outcome = {"status": "oom", "error": f"{type(e).__name__}: {e}"}
        else:
            outcome = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": tb[-4000:]}
        if isinstance(e, KeyboardInterrupt):
            outcome["status"] = "cancelled"
    outcome.update(attempt=attempt, duration_s=time.time() - t0, **_peak_memory())
    return outcome


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this worker when the orchestrator dies (even by SIGKILL): no orphans."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(EXIT_ERROR)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    launch_path = Path(argv[0])
    launch = json.loads(launch_path.read_text())
    parent = launch.get("parent_pid") or os.environ.get("PITA_PARENT_PID")  # the ray backend's task process
    if parent:
        _die_with_parent(int(parent))
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger = logging.getLogger("pita.job")
    outcome = execute(launch, logger)
    from pita.core.paths import JobPaths, atomic_write_json

    atomic_write_json(JobPaths(launch_path.parent).attempt(launch["attempt"]), outcome)
    sys.stdout.flush()
    return {"ok": EXIT_OK, "oom": EXIT_OOM}.get(outcome["status"], EXIT_ERROR)


if __name__ == "__main__":
    sys.exit(main())
