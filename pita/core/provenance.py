"""What a job's numbers depend on besides its config and seed: the machine and the kernels.

    from pita.core.provenance import describe, summary
    describe()   # {"cpu": {"model", "isa", "cores"}, "torch": {"version", "cpu_capability", "blas",
                 #   "threads", ...}, "cuda": {...} | None, "python", "libraries": {...}}
    summary(d)   # "AMD EPYC, AVX512 kernels, torch 2.13.0+cpu, MKL 2024.2, 1 thread"

The worker writes ``describe()`` into every ``attempt-<n>.json`` (the worker, not the
orchestrator: with the ray backend the two run on different machines, and only the process that
computes knows which kernels it ran), and the report lists the distinct summaries of a run's
jobs. What a reader may expect (docs/guide.md, "Reproducibility"): for the same seed on the same
machine the results are the same, and the tiny family's build is the same bit for bit whatever
the thread count and load; across CPUs (another vector ISA, another BLAS build) and across GPUs
float sums round differently, so trained weights and sampled tables differ. Two runs whose
summaries differ are not expected to give the same digits.

Cheap (no import that the job did not already make): torch is described only when the job
imported it, since a job that never imported torch computed nothing with it.
"""

from __future__ import annotations

import os
import platform as _platform
import re
import sys
from importlib import metadata

_LIBRARIES = ("transformers", "trl", "accelerate", "datasets", "numpy")


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``'s ``model name``), or what Python can tell."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def _blas(torch) -> str | None:
    """The BLAS torch was built with, and its version where the build says it."""
    shown = torch.__config__.show()
    for pattern, name in ((r"Math Kernel Library Version ([\w.]+)", "MKL"), (r"OpenBLAS ([\w.]+)", "OpenBLAS")):
        m = re.search(pattern, shown)
        if m:
            return f"{name} {m.group(1)}"
    m = re.search(r"BLAS_INFO=(\w+)", shown)
    return m.group(1) if m else None


def _torch(torch) -> dict:
    out = {
        "version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the vector ISA its CPU kernels chose
        "blas": _blas(torch),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }
    if torch.backends.mkldnn.is_available():
        v = getattr(torch.backends.mkldnn, "version", None)
        out["onednn"] = ".".join(map(str, v())) if callable(v) else True
    return out


def _cuda(torch) -> dict | None:
    if not torch.cuda.is_available():
        return None
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"name": p.name, "capability": f"{p.major}.{p.minor}"})
    return {"version": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "devices": devices,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


_SOURCE: dict | None = None


def source() -> dict:
    """Which pita computed: its version and, when it runs from a git checkout, the commit and
    whether tracked files differed from it (``dirty``). Asked once per process."""
    global _SOURCE
    if _SOURCE is None:
        import subprocess
        from pathlib import Path

        # the package this module belongs to is loaded already (a parent package always is)
        out = {"version": getattr(sys.modules.get("pita"), "__version__", None) or _version("pita")}
        root = Path(__file__).resolve().parents[2]
        if (root / ".git").exists():
            try:
                git = ["git", "-C", str(root)]
                head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
                if head.returncode == 0:
                    out["commit"] = head.stdout.strip()
                    st = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                        text=True, timeout=10)
                    out["dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
            except (OSError, subprocess.SubprocessError):
                pass
        _SOURCE = out
    return dict(_SOURCE)


def source_line(src: dict | None = None) -> str:
    """``pita 0.1.0 (commit 1a2b3c4d5e6f, uncommitted changes)``, or ``pita 0.1.0`` off a checkout."""
    src = source() if src is None else src
    line = f"pita {src.get('version')}"
    if src.get("commit"):
        line += f" (commit {src['commit'][:12]}{', uncommitted changes' if src.get('dirty') else ''})"
    return line


def describe() -> dict:
    """This process's platform, as far as it decides the job's floating-point results."""
    from pita.core.gpu_manager import usable_cores

    out = {
        "pita": source(),
        "host": _platform.node(),
        "cpu": {"model": cpu_model(), "machine": _platform.machine(), "cores": usable_cores()},
        "python": _platform.python_version(),
        "thread_budget": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
        "libraries": {n: v for n in _LIBRARIES if n in sys.modules and (v := _version(n))},
    }
    if os.environ.get("MKL_CBWR"):  # MKL's reproducibility mode, when the user pinned one
        out["mkl_cbwr"] = os.environ["MKL_CBWR"]
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = _torch(torch)
        out["cuda"] = _cuda(torch) if torch.cuda.is_initialized() else None
    return out


def summary(d: dict) -> str:
    """One line a reader compares between two runs: CPU, kernel ISA, torch, BLAS, threads, GPUs
    (which pita computed is said apart: :func:`source_line`)."""
    parts = [d.get("cpu", {}).get("model", "unknown CPU")]
    t = d.get("torch")
    if t:
        parts.append(f"{t.get('cpu_capability')} kernels")
        parts.append(f"torch {t.get('version')}")
        if t.get("blas"):
            parts.append(t["blas"])
        n = t.get("threads")
        parts.append(f"{n} thread{'s' if n != 1 else ''}")
    else:
        parts.append("no torch")
    cuda = d.get("cuda")
    if cuda:
        names = sorted({g["name"] for g in cuda.get("devices", [])})
        parts.append(f"{', '.join(names)} (CUDA {cuda.get('version')})")
    return ", ".join(parts)
