"""What the local backend's fork server imports once (``executor.worker_start=forkserver``).

Every attempt forked from that process starts with torch, transformers, datasets, TRL and the
job kinds already imported; a fresh interpreter spends 4-6 s of CPU on those imports, which on a
small machine is most of a short job. Only imports happen here: no tensor is made and CUDA is
never touched, because a process that initialised CUDA cannot be forked (the worker checks, and
starts a fresh interpreter if it was). ``PYTORCH_NVML_BASED_CUDA_CHECK`` makes any
``torch.cuda.is_available()`` a library calls while being imported ask NVML instead of CUDA.

A failed import is skipped: the job that needs the module imports it itself and reports the
error in its own log.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import warnings

IMPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ()),
    ("numpy", ()),
    ("transformers", ("AutoConfig", "AutoModelForCausalLM", "AutoModelForSequenceClassification",
                      "AutoTokenizer", "PreTrainedTokenizerFast", "LlamaConfig", "LlamaForCausalLM",
                      "LlamaForSequenceClassification")),
    ("datasets", ("Dataset", "load_from_disk")),
    ("trl", ("DPOConfig", "DPOTrainer", "GRPOConfig", "GRPOTrainer")),
    ("math_verify", ("parse", "verify")),
    ("omegaconf", ()),
    ("pita.models.lm", ()),
    ("pita.generation.jobs", ()),
    ("pita.eval.jobs", ()),
    ("pita.guidance.proxy", ()),
    ("pita.algos", ()),
)


def preload() -> list[str]:
    """Import :data:`IMPORTS`; return the modules that could not be imported."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    missing = []
    sink = io.StringIO()  # import-time banners and warnings would land on the orchestrator's console
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        for module, names in IMPORTS:
            try:
                m = importlib.import_module(module)
                for name in names:
                    getattr(m, name)
            except Exception:  # noqa: BLE001 - an optional or broken module is the job's to report
                missing.append(module)
    return missing


preload()
