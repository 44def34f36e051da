"""Host memory (RAM) of a GPU run: what each job holds on the CPU side, and the node's total.

A GPU job still passes its models through host memory: ``from_pretrained`` reads the weights into
CPU tensors before they move to the device, and a sharded job's ranks each do so. The scheduler
keeps the sum over running jobs within ``system.host_ram`` (default: this machine's memory), and
``pita plan`` refuses (exit 2) a job that alone needs more than the node has.

Per job (bytes, ``n`` = parameters of the model it loads):

    every process       HOST_PROCESS_BYTES (Python, torch, CUDA libraries)
    DPO / GRPO          the policy in fp32 (4n; LoRA's frozen base in model.dtype) and TRL's frozen
    training            reference in model.dtype (beta > 0, full fine-tuning), on the CPU until
                        the trainer places them: once for a
                        sharded job (rank 0 alone reads the weights, the other ranks receive their
                        shards: pita.training.models.load_model), once per rank otherwise.
                        Saving a sharded policy gathers the fp32 state on rank 0's CPU (4n), and
                        each mid-training checkpoint of a sharded job stages every rank's AdamW
                        shards there (8n over the node), after the loaded copies are gone; the
                        larger counts. A proxy or reward model is read whole by every rank
    value / proxy       the guidance backbone in fp32
    training
    sampling shards     the reference in model.dtype; the value model (fp32) when guided; the
                        reward model (fp32) of a reward task; a trained policy's evaluation also
                        loads the reference that scores it

On CPU devices the device memory is host memory already (the devices are carved from RAM), so
no separate host estimate is made there.
"""

from __future__ import annotations

import re

from pita.core.errors import ConfigError

HOST_PROCESS_BYTES = 3e9  # a CUDA process's own resident memory: interpreter, torch, CUDA libraries
# a sharded job's mid-training checkpoint in host memory, over the node, per parameter: AdamW's two
# fp32 moments, staged to the CPU at once (read from accelerate 1.15's save_fsdp_optimizer /
# load_fsdp_optimizer: torch's get_optimizer_state_dict with cpu_offload); bench/gpu_training.py's
# checkpoint_host measures it on a GPU
SHARDED_CHECKPOINT_BYTES_PER_PARAM = 8
_UNITS = {"": 1e9, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_size(value, key: str = "system.host_ram") -> int:
    """Bytes of ``value``: a number of GB (10^9 bytes) or a string such as 512GB, 1TB, 1.5TiB."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not a size; write e.g. {key}=1TB or {key}=512GB")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ConfigError(f"{key}={value} must be > 0 (GB), e.g. {key}=1TB")
        return int(value * 1e9)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"{key}={value!r} is not a size; write e.g. {key}=1TB, {key}=512GB or {key}=1.5TiB "
                          f"(GB = 10^9 bytes), or null for this machine's memory")
    return int(float(m.group(1)) * _UNITS[unit])


def host_ram_bytes(cfg) -> int:
    """``system.host_ram``, or this machine's total memory when it is null."""
    value = cfg.system.get("host_ram")
    if value is not None:
        return parse_size(value)
    import psutil

    return int(psutil.virtual_memory().total)


def _params(paths: dict, part: str, dataset: str | None = None) -> int:
    from pita.models.shapes import model_shape

    if part == "reward":
        return model_shape(paths["reward_models"][dataset], f"model.reward_models.{dataset}").n_params
    return model_shape(paths[part], f"model.{part}").n_params


def job_host_bytes(job, cfg, paths: dict) -> float:
    """Host bytes ``job`` holds at its peak (see the module's doc), over all its processes."""
    from pita.core.memory import bytes_per_param

    p, kind = job.params, job.kind
    dtype = bytes_per_param(cfg.model.dtype)
    if job.resources.devices == 0:
        return HOST_PROCESS_BYTES
    if kind in ("algo.dpo_train", "algo.grpo_train"):
        k = max(1, int(p.get("devices", 1) or 1))
        n = _params(paths, "reference")
        # the policy as load_policy holds it: fp32 masters, or LoRA's frozen base in model.dtype on CUDA
        policy = dtype if p.get("lora_r", 0) > 0 and dtype < 4 else 4
        models = policy * n + (dtype * n if p.get("beta", 0) > 0 and not p.get("lora_r", 0) else 0)
        sharded = p.get("sharding") == "fsdp" and k > 1
        whole = 4 * _params(paths, "guidance") if p.get("proxy") else 0.0  # every rank's own copy
        loaded = models if sharded else k * models
        # by the time it saves, the loaded copies are on the devices: the final policy gathered whole on
        # rank 0's CPU (4n); each mid-training checkpoint of a sharded job (accelerate's
        # ShardedStateDictConfig / ShardedOptimStateDictConfig with offload_to_cpu) copies every
        # rank's shards to host memory, the weights (4n over the node) and then AdamW's two moments
        # (8n), and a re-run attempt that resumes reads them back the same way
        checkpoints = SHARDED_CHECKPOINT_BYTES_PER_PARAM * n if sharded and p.get("save_steps", "auto") != 0 else 0
        save = max(4 * n, checkpoints) if sharded else 0
        return k * (HOST_PROCESS_BYTES + whole) + max(loaded, save)
    if "train" in kind or kind.endswith(".proxy"):
        return HOST_PROCESS_BYTES + 4 * _params(paths, "guidance")
    # sampling shards: the reference (or the trained policy it samples), and what sits beside it
    req = p.get("request") or p
    b = dtype * _params(paths, "reference")
    policy = req.get("policy") or {}
    if policy.get("model_from_job") and policy.get("reference"):
        b += dtype * _params(paths, "reference")  # the reference that scores a trained policy's samples
    if policy.get("guidance") or p.get("proxy") or req.get("proxy"):  # a value model, or best-of-n's proxy
        b += 4 * _params(paths, "guidance")
    ds = req.get("dataset")
    ds = ds.get("name") if isinstance(ds, dict) else ds
    from pita.rewards.function import is_function

    # the reward model the shard loads: its request's (a verifier task's evaluation loads none)
    rm = req["scoring"].get("reward_model") if isinstance(req.get("scoring"), dict) else \
        (paths.get("reward_models") or {}).get(ds)
    if ds and rm and not is_function(rm):
        b += 4 * _params(paths, "reward", ds)
    return HOST_PROCESS_BYTES + b


def apply_host_estimates(jobs, cfg, paths: dict) -> None:
    """Set every job's ``resources.host_gb`` (a GPU plan's jobs)."""
    for j in jobs:
        try:
            j.resources.host_gb = round(job_host_bytes(j, cfg, paths) / 1e9, 3)
        except (KeyError, ConfigError, OSError, ValueError):  # a part with no readable config yet (a
            # tiny family not built): the process alone
            j.resources.host_gb = HOST_PROCESS_BYTES / 1e9


def host_problems(jobs, host_bytes: int) -> list[str]:
    """One line per job kind whose jobs alone need more host memory than the node has."""
    from pita.plans.fit import job_kind

    worst: dict = {}
    for j in jobs:
        if j.resources.host_gb * 1e9 > host_bytes:
            k = job_kind(j)
            if k not in worst or j.resources.host_gb > worst[k].resources.host_gb:
                worst[k] = j
    out = []
    for k, j in worst.items():
        p = j.params
        algo = j.id.split(".")[0]
        if j.kind in ("algo.dpo_train", "algo.grpo_train") and p.get("devices", 1) > 1 and p.get("sharding") != "fsdp":
            shard = ("" if p.get("lora_r", 0) else
                     f"shard it (algos.{algo}.sharding=fsdp: rank 0 alone reads the weights), ")
            fix = (f"each of its {p['devices']} data-parallel ranks loads the whole policy on the CPU: {shard}"
                   f"lower algos.{algo}.devices, or plan for a node with more memory (system.host_ram)")
        else:
            fix = "plan for a node with more memory (system.host_ram), or a smaller model"
        out.append(f"{k}: {j.id} needs {j.resources.host_gb:.0f} GB of host memory, more than "
                   f"system.host_ram={host_bytes / 1e9:.0f} GB; {fix}")
    return out
