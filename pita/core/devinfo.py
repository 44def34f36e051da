"""What a process runs on, in the words a user greps a log for.

    set_local_device()                 # rank r of a k-device job: torch.cuda.set_device(LOCAL_RANK)
    describe_process("sdpa", assigned) # one line for the job log: CUDA_VISIBLE_DEVICES=..., LOCAL_RANK=...,
                                       # device=cuda:0, uuid=GPU-..., attention=sdpa

The UUID is what CUDA itself reports for the process's device (torch.cuda.get_device_properties)
once CUDA is initialised, else the UUID the executor assigned: a device CUDA numbers differently
from NVML shows up as two different UUIDs in the same line.
"""

from __future__ import annotations

import os
import sys


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def set_local_device() -> str:
    """Make ``cuda:LOCAL_RANK`` this process's current CUDA device (where a GPU is visible) and
    return the device every model of the process goes to."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank())
    return process_device()


def process_device() -> str:
    """``cuda:LOCAL_RANK`` where a GPU is visible, else ``cpu``."""
    import torch

    return f"cuda:{local_rank()}" if torch.cuda.is_available() else "cpu"


def cuda_uuid(index: int | None = None) -> str | None:
    """The UUID CUDA reports for ``index`` (default: the current device), as NVML writes it
    (``GPU-…``); None where CUDA is not initialised (asking would create a context)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    i = torch.cuda.current_device() if index is None else index
    uuid = str(getattr(torch.cuda.get_device_properties(i), "uuid", "") or "")
    if not uuid:
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def resolved_attention(requested: str | None) -> str | None:
    """The attention setting as the job was given it (the model load logs the kernel it got)."""
    return f"{requested} (system.attn_impl)" if requested else None


def describe_process(attn_impl: str | None = None, assigned: list[dict] | None = None) -> str:
    """One line: CUDA_VISIBLE_DEVICES, LOCAL_RANK, the device and its UUID, the attention kernel."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    parts = [f"CUDA_VISIBLE_DEVICES={visible if visible is not None else '(unset)'}",
             f"LOCAL_RANK={os.environ.get('LOCAL_RANK', '(unset)')}"]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        parts.append(f"device=cuda:{torch.cuda.current_device()}")
    uuid = cuda_uuid()
    if uuid:
        parts.append(f"uuid={uuid}")
    elif assigned:
        gpus = [d.get("uuid") for d in assigned if d.get("kind") == "cuda" and d.get("uuid")]
        parts.append(f"uuid={','.join(gpus)} (assigned)" if gpus else "device=cpu")
    else:
        parts.append("device=cpu" if torch is None or not torch.cuda.is_available() else "device=cuda")
    attention = resolved_attention(attn_impl)
    if attention:
        parts.append(f"attention={attention}")
    return "devices: " + ", ".join(parts)
