"""Whether every planned job fits a device, said once per job kind with the fix.

    problems = fit_problems(jobs, device_totals, memory_margin)   # [] when everything fits

``JobGraph.validate`` checks the same job by job; a plan of hundreds of evaluation shards that
all need too much would list hundreds of lines there. Here one line per (job kind, algorithm)
names how many jobs, the largest need, what a device holds, and the key that fixes it.
"""

from __future__ import annotations

from collections import OrderedDict


def sampling_policy(req: dict) -> str:
    """What samples in a generation request: "guided" (the reference with a value model),
    "trained" (a trained policy) or "reference"."""
    pol = req.get("policy") or {}
    return "guided" if pol.get("guidance") else ("trained" if pol.get("model_from_job") else "reference")


def job_kind(job) -> str:
    """A job's kind as the plan reports it: sampling shards by what they sample."""
    if job.kind != "generation.shard":
        return job.kind
    req = job.params["request"]
    what = sampling_policy(req)
    if req.get("recipe") == "eval":
        return f"eval.shard ({what})"
    return f"gen.shard ({req.get('recipe')}, {what})"


def job_algorithm(job) -> str:
    head = job.id.split(".", 1)[0]
    return {"data": "shared", "model": "family", "gen": "shared"}.get(head, head)


def _two_figures(need: float, cap: float) -> tuple[str, str]:
    """GB figures with as many decimals as it takes for them to differ (7.82 vs 7.79, not 7.8 vs 7.8)."""
    for d in (1, 2, 3):
        a, b = f"{need / 1e9:.{d}f}", f"{cap / 1e9:.{d}f}"
        if a != b:
            break
    return a, b


def fit_problems(jobs, totals: list[int], margin: float, cpu: bool = False) -> list[str]:
    """One line per (job kind, algorithm) whose jobs fit no device, naming the fix. ``cpu``: the
    devices are CPU devices, sized on the memory available now (they share it)."""
    usable = sorted((t * (1 - margin) for t in totals), reverse=True)
    groups: dict = OrderedDict()
    for j in jobs:
        r = j.resources
        if r.devices <= 0:
            continue
        cap = usable[r.devices - 1] if r.devices <= len(usable) else 0
        if r.memory_bytes > cap:
            g = groups.setdefault((job_kind(j), job_algorithm(j)), [0, j, cap])
            g[0] += 1
    out = []
    for (kind, algo), (n, j, cap) in groups.items():
        need, usable_gb = _two_figures(j.resources.memory_bytes, cap)
        where = (f"{n} {kind} job(s) of {algo} (e.g. {j.id}) need {need} GB per device, more than the "
                 f"{usable_gb} GB usable on {'one device' if j.resources.devices == 1 else f'each of {j.resources.devices} devices'} "
                 f"(executor.memory_margin={margin:g})")
        cpu_note = ""
        if cpu:
            cpu_note = (f"; on CPU, where the devices share the memory available now ({sum(totals) / 1e9:.1f} GB "
                        f"over {len(totals)} devices), also: free memory other processes hold, or give one device "
                        f"all of it (system.cpu_devices=1)" if len(totals) > 1 else
                        "; on CPU, where the device has the memory available now, also: free memory other "
                        "processes hold")
        p = j.params
        at_least = p.get("micro_batch_size") == 1 and bool(p.get("gradient_checkpointing"))
        if kind in ("algo.dpo_train", "algo.grpo_train"):
            lora = f"algos.{algo}.lora_r=16" + (f", with algos.{algo}.ref_policy=previous when experiment.rounds > 1"
                                                if kind == "algo.grpo_train" else "")
            shard = (f"shard it over more devices (algos.{algo}.sharding=fsdp algos.{algo}.devices="
                     f"{min(len(totals), 2 * max(1, p.get('devices', 1)))}; gpu=auto picks the fewest that fit)"
                     if len(totals) > max(1, p.get("devices", 1)) and not p.get("lora_r", 0) else "")
            if at_least or p.get("lora_r", 0) > 0:
                where_ = "one device" if p.get("sharding") != "fsdp" else f"{p.get('devices')} devices"
                fix = (f"this is at a micro-batch of 1 with gradient checkpointing, so full fine-tuning of this "
                       f"policy does not fit {where_}: " + (f"{shard}, " if shard else "") +
                       f"train with LoRA ({lora}), a smaller model, or shorter completions")
            else:
                fix = (f"use gpu=auto (the largest micro-batch that fits, checkpointing if needed, sharding if "
                       f"one device is not enough) or algos.{algo}.micro_batch_size=1 "
                       f"algos.{algo}.gradient_checkpointing=true, " + (f"{shard}, " if shard else "") +
                       f"or LoRA ({lora})")
        elif kind in ("algo.value_train", "algo.proxy_train"):
            fix = ("pick a smaller guidance model (model.guidance)" if at_least else
                   f"use gpu=auto, or algos.{algo}.micro_batch_size=1 algos.{algo}.gradient_checkpointing=true; or a "
                   f"smaller guidance model (model.guidance)")
        elif kind.startswith("eval"):
            fix = (f"lower eval.batch_size (now {p.get('batch_size')}) or eval.max_new_tokens, or let gpu=auto "
                   f"(system.fit_batches=true) choose the largest batch that fits")
        else:
            fix = (f"lower data_collection.batch_size (now {p.get('batch_size')}) or data_collection.max_new_tokens, "
                   f"or let gpu=auto (system.fit_batches=true) choose the largest batch that fits")
        out.append(f"{where}: {fix}{cpu_note}")
    return out + vllm_problems(jobs, totals)


# tokens vLLM runs through the model when it profiles its peak before sizing the KV cache (its
# default max_num_batched_tokens with chunked prefill on a large GPU)
VLLM_PROFILE_TOKENS = 8192


def vllm_colocate_bytes(p: dict) -> tuple[float, float, float]:
    """(weights, KV cache, profiling activations) vLLM needs in its share of a device to start for a
    GRPO job ``p``: the whole policy in model.dtype, the cache of at least one sequence at
    ``vllm_max_model_length`` (the job sets it to prompt + completion; the plan's prompt is
    PROMPT_TOKENS long), and the widest layer over its profiling batch."""
    from pita.core.memory import bytes_per_param, kv_cache_bytes, layer_transient_bytes, weights_bytes
    from pita.models.shapes import model_shape
    from pita.plans.memory import PROMPT_TOKENS

    dtype = p.get("dtype", "bfloat16")
    dtype = "bfloat16" if dtype == "float32" else dtype  # vLLM serves a float32 model in bf16 on GPUs
    shape = model_shape(p["reference"], "model.reference")
    longest = PROMPT_TOKENS + int(p.get("max_completion_length") or 0)
    return (weights_bytes(shape, dtype), kv_cache_bytes(shape, dtype, 1, longest),
            layer_transient_bytes(shape, VLLM_PROFILE_TOKENS, bytes_per_param(dtype)))


def vllm_problems(jobs, totals: list[int]) -> list[str]:
    """GRPO with vLLM colocated: vLLM holds the whole policy (in model.dtype) in its share of each
    device (vllm_gpu_memory_utilization), however many devices FSDP splits the training over, and
    it refuses to start unless what is left of the share after its profiling pass holds the KV
    cache of one sequence at its maximum length. Short of that, vLLM fails at start-up with an error
    that is not an out-of-memory (so no retry at a smaller batch would help): refused here."""
    out, seen = [], set()
    for j in jobs:
        p = j.params
        if j.kind != "algo.grpo_train" or not p.get("use_vllm") or p.get("vllm_mode") != "colocate":
            continue
        algo = job_algorithm(j)
        if algo in seen or not totals:
            continue
        share = float(p.get("vllm_gpu_memory_utilization", 0.3)) * min(totals)
        w, kv, act = vllm_colocate_bytes(p)
        if w + kv + act > share:
            seen.add(algo)
            need = min(0.95, (w + kv + act) / min(totals) + 0.01)
            out.append(f"algo.grpo_train of {algo} (e.g. {j.id}): vLLM colocated holds the whole policy "
                       f"({w / 1e9:.1f} GB in {p.get('dtype')}), its profiling pass ({act / 1e9:.1f} GB) and the KV "
                       f"cache of one sequence of prompt + completion ({kv / 1e9:.2f} GB) in "
                       f"algos.{algo}.vllm_gpu_memory_utilization={p.get('vllm_gpu_memory_utilization')} of a "
                       f"{min(totals) / 1e9:.0f} GB device ({share / 1e9:.1f} GB), also when training is sharded; "
                       f"raise it to at least {need:.2f} (less for training), use algos.{algo}.vllm_mode=server, "
                       f"or algos.{algo}.use_vllm=false")
    return out


THIS = "this machine"


def node_problems(jobs, devices) -> list[str]:
    """A k-device job needs k devices of one node: one line per algorithm whose jobs ask for more
    than the largest node has (devices of one machine all have node "")."""
    per_node: dict[str, int] = {}
    for d in devices:
        per_node[getattr(d, "node", "")] = per_node.get(getattr(d, "node", ""), 0) + 1
    if len(per_node) <= 1:
        return []
    node, most = max(per_node.items(), key=lambda kv: (kv[1], kv[0]))
    worst: dict = OrderedDict()
    for j in jobs:
        if j.resources.devices > most:
            a = job_algorithm(j)
            if a not in worst or j.resources.devices > worst[a].resources.devices:
                worst[a] = j
    return [f"algos.{a}.devices={j.resources.devices}: {j.id} needs {j.resources.devices} GPUs of one node, and the "
            f"largest node of the cluster (node {node}) has {most} ({len(per_node)} nodes, "
            f"{', '.join(f'{n or THIS}: {c}' for n, c in sorted(per_node.items()))}); set "
            f"algos.{a}.devices={most} or fewer (sharding=fsdp splits the model over them), or add a larger node"
            for a, j in worst.items()]


def job_label(job) -> str:
    """A job's kind as the plan prints it, with its algorithm where it has one."""
    algo = job_algorithm(job)
    return f"{algo} {job_kind(job)}" if algo not in ("shared", "family") else job_kind(job)
