"""Memory estimates that learn from the measured peaks of finished jobs.

The plan sizes every job from a formula (:mod:`pita.core.memory`); the formula is built to be
safe, so it is often far above what a job really holds, and the scheduler then packs fewer jobs
on a device than would fit. Every attempt reports its peak, so once comparable jobs have finished
their peaks say what the next ones will need:

    learned = max(observed peaks) x 1.2 + 256 MiB, rounded up to 64 MiB,
              never below a quarter of the planned estimate, never above the largest device

Comparable jobs (one *memory key*): the same job kind, device count, planned estimate (which
carries the model's shape, dtype, batch and sequence length as the planner saw them), device
unit, and the values of the params that shape memory beyond what the formula sees
(:data:`MEMORY_PARAMS`: batch and length settings, which models are loaded and how, the dataset,
whose prompts set the sequence length). A param that names an earlier job (a policy trained by
``DPO...r0.train``) counts as that job's kind, so round 1's evaluations learn from round 0's.

Safety rules:
- lowering waits for two measured jobs of the key; raising (a job measured above the estimate)
  takes one. Only jobs that completed at their planned params are measured: a failed attempt,
  or a job that ran out of memory and was retried with a smaller batch, teaches nothing;
- a job that runs out of memory while admitted below its planned estimate puts its key back on
  the planned estimate for the rest of the run (and on resume: the attempt record says so); it
  is retried once at its planned batch and estimate before the usual halving, since the packing,
  not the batch, was the likely cause (a raised estimate is never lowered by an OOM). A job
  killed by SIGKILL while below its planned estimate (the kernel's OOM killer, on host memory)
  does the same to its key, and follows the crash rules (``executor.crash_retries``);
- jobs on several devices keep their planned estimate (their ranks are processes the worker does
  not measure).

Units: a peak is compared with what the scheduler compares estimates with, a device's memory.
On GPUs: the larger of torch's peak reserved memory (the caching allocator's hold on the
device; ``max_memory_allocated`` would leave out its fragmentation) plus the CUDA context
(:data:`pita.core.memory.CUDA_CONTEXT_BYTES`, which torch does not count and the planned
estimate includes), and the process tree's use as NVML reported it while the job ran. On CPU
devices (host memory shared out): the worker's peak resident set (``ru_maxrss``; its largest
child's if that is larger). A worker forked from the warm process counts the pages it shares
with it, so the figure is high, never low. A job that declares its own peak (the synthetic
stand-ins: ``ctx.report_peak``) is taken at its word.

The learner holds no clock and no processes: the executor and the benchmark's simulation
(``bench/memory_learning.py``) drive the same code.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from pita.core.memory import CUDA_CONTEXT_BYTES

LEARN_FACTOR = 1.2  # learned = max peak x this + LEARN_SLACK_BYTES
LEARN_SLACK_BYTES = 256 * 2**20
LEARN_QUANTUM_BYTES = 64 * 2**20  # estimates rounded up to this: noise in peaks moves nothing
FLOOR_FRACTION = 0.25  # a learned estimate never goes below this share of the planned one
MIN_JOBS_TO_LOWER = 2  # measured jobs of a key before its estimate may go below the planned one

# Param names (the last part of a nested param's path) whose values shape a job's memory beyond
# what its planned estimate already carries. Jobs whose values differ never share what they learn.
MEMORY_PARAMS = frozenset({
    # batch and length
    "batch_size", "micro_batch_size", "token_budget", "max_new_tokens", "max_completion_length",
    "max_length", "num_generations", "n", "continuations", "cut_points", "reward_batch_size", "top_k",
    # which models are loaded, and how
    "model", "model_from_job", "reference", "backbone", "guidance", "from_job", "reward_model", "dtype",
    "lora_r", "lora_target_modules", "head_dim", "num_atoms", "mode", "gradient_checkpointing",
    "attn_impl", "compile", "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "devices",
    # what the job does (generation recipes, the synthetic stand-ins' stages) and on which data
    "recipe", "stage", "task",
})
# ... and these (last two parts of the path): the dataset sets the prompts' length.
MEMORY_PARAM_PATHS = frozenset({("dataset", "name")})

UNITS = {"gpu": "GPU memory (torch reserved + CUDA context, or NVML)", "rss": "peak RSS (host memory)"}


def _leaves(obj: Any, path: tuple = ()) -> Iterable[tuple[tuple, Any]]:
    if isinstance(obj, dict):
        for k in sorted(obj):
            yield from _leaves(obj[k], path + (str(k),))
    else:
        yield path, obj


def memory_key(job, unit: str, kinds_by_id: dict[str, str] | None = None) -> str | None:
    """The key under which ``job``'s peak is learned and applied; None for jobs that keep their
    planned estimate (host jobs, jobs on several devices)."""
    if job.resources.devices != 1:
        return None
    kinds_by_id = kinds_by_id or {}

    def value(v):
        if isinstance(v, str) and v in kinds_by_id:
            return f"job:{kinds_by_id[v]}"  # a model trained by an earlier job: its kind, not its round
        if isinstance(v, list):
            return [value(x) for x in v]
        return v

    shape = {".".join(p): value(v) for p, v in _leaves(job.params)
             if p and (p[-1] in MEMORY_PARAMS or tuple(p[-2:]) in MEMORY_PARAM_PATHS)}
    ident = {"kind": job.kind, "unit": unit, "devices": job.resources.devices,
             "planned": job.resources.memory_bytes, "params": shape}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{job.kind}/{digest}"


def device_peak(extra: dict, unit: str, sampled_bytes: int = 0) -> int | None:
    """An attempt's peak in the unit its device's capacity is counted in (see the module's
    docstring); None when it was not measured in that unit."""
    declared = extra.get("peak_declared_bytes")
    if declared is not None:
        return int(declared)
    if unit == "gpu":
        torch_peak = extra.get("peak_gpu_reserved_bytes") or extra.get("peak_gpu_bytes") or 0
        peak = max(int(torch_peak) + CUDA_CONTEXT_BYTES if torch_peak else 0, int(sampled_bytes or 0))
    else:
        peak = max(int(extra.get("peak_rss_bytes") or 0), int(extra.get("peak_rss_children_bytes") or 0))
    return peak or None


@dataclass
class Change:
    """An estimate that moved: what the executor logs and the state records."""

    key: str
    kind: str
    like: str  # a job of the key, for people
    old: int
    new: int
    planned: int
    jobs: int
    max_peak: int
    why: str  # "learned" | "restored" | "oom"

    def line(self) -> str:
        gb = 1e9
        if self.why == "oom":
            return (f"memory estimate for {self.kind} jobs like {self.like}: back to the planned "
                    f"{self.new / gb:.2f} GB (from {self.old / gb:.2f} GB) for the rest of the run: a job "
                    f"admitted on the lowered estimate ran out of memory")
        src = "finished job" if self.why == "learned" else "job(s) of the earlier run(s) of this folder"
        return (f"memory estimate for {self.kind} jobs like {self.like}: "
                f"{self.old / gb:.2f} -> {self.new / gb:.2f} GB, "
                f"learned from {self.jobs} {src}{'s' if self.why == 'learned' and self.jobs != 1 else ''} "
                f"(max peak {self.max_peak / gb:.2f} GB x {LEARN_FACTOR:g} + {LEARN_SLACK_BYTES / gb:.2f} GB; "
                f"planned {self.planned / gb:.2f} GB)")


@dataclass
class _Entry:
    kind: str
    like: str
    planned: int
    jobs: int = 0
    max_peak: int = 0
    learned: int | None = None  # None: the planned estimate applies
    distrusted: bool = False
    seen: set = field(default_factory=set)


class MemoryLearner:
    """Per memory key: the peaks of finished jobs, and the estimate the scheduler should use.

    ``cap_bytes``: the most any single-device estimate may be (the largest device's usable
    memory), so a job whose peak was measured high still fits somewhere."""

    def __init__(self, graph, unit: str, cap_bytes: int, enabled: bool = True):
        if unit not in UNITS:
            raise ValueError(f"unit={unit!r}: choose one of {', '.join(UNITS)}")
        self.graph, self.unit, self.cap, self.enabled = graph, unit, int(cap_bytes), enabled
        kinds = {j.id: j.kind for j in graph.jobs}
        self.key_of: dict[str, str | None] = {j.id: memory_key(j, unit, kinds) for j in graph.jobs}
        self.entries: dict[str, _Entry] = {}
        for j in graph.jobs:
            k = self.key_of[j.id]
            if k is not None and k not in self.entries:
                self.entries[k] = _Entry(j.kind, j.id, j.resources.memory_bytes)

    # ------------------------------------------------------------------ what the scheduler asks
    def estimate(self, job_id: str) -> int:
        """Bytes to reserve per device for ``job_id`` now."""
        k = self.key_of.get(job_id)
        e = self.entries.get(k) if k else None
        if e is not None and e.learned is not None and self.enabled:
            return e.learned
        return self.graph[job_id].resources.memory_bytes

    def is_lowered(self, job_id: str) -> bool:
        """The estimate is below the planned one now (the risky direction)."""
        return self.estimate(job_id) < self.graph[job_id].resources.memory_bytes

    # ------------------------------------------------------------------ what the executor tells
    def observe(self, job_id: str, peak_bytes: int, why: str = "learned") -> Change | None:
        """A job that completed at its planned params peaked at ``peak_bytes`` (device unit)."""
        k = self.key_of.get(job_id)
        if k is None or peak_bytes is None or peak_bytes < 0:
            return None
        e = self.entries[k]
        if job_id in e.seen:  # the same job counted once (resume reads its records again)
            return None
        e.seen.add(job_id)
        e.jobs += 1
        e.max_peak = max(e.max_peak, int(peak_bytes))
        return self._update(k, why)

    def distrust(self, job_id: str) -> Change | None:
        """``job_id`` ran out of memory while admitted below its planned estimate: its key never
        goes below the planned estimate again (this run, and a resume that reads the attempt
        record); measured peaks may still raise it."""
        k = self.key_of.get(job_id)
        if k is None:
            return None
        e = self.entries[k]
        old = self.estimate(job_id)
        e.distrusted = True
        if e.learned is not None and e.learned < e.planned:
            e.learned = None
        if old >= e.planned:
            return None
        return Change(k, e.kind, e.like, old, e.planned, e.planned, e.jobs, e.max_peak, "oom")

    def restore(self, saved_jobs: dict) -> list[Change]:
        """Learn from the attempt records of an earlier run of the same folder (``state["jobs"]``):
        completed attempts marked learnable, and OOMs on learned estimates."""
        changes: dict[str, Change] = {}
        for jid, entry in sorted(saved_jobs.items()):
            for a in entry.get("attempts", []) or []:
                m = a.get("memory") or {}
                k = m.get("key")
                if k not in self.entries or self.key_of.get(jid) != k:
                    continue  # another unit, another plan: not comparable
                if m.get("lowered") and (a.get("status") == "oom" or killed(a)):
                    c = self.distrust(jid)
                elif a.get("status") == "ok" and m.get("learn") and m.get("peak_bytes") is not None:
                    c = self.observe(jid, int(m["peak_bytes"]), why="restored")
                else:
                    continue
                if c is not None:
                    first = changes.get(k)
                    changes[k] = c if first is None else Change(k, c.kind, c.like, first.old, c.new, c.planned,
                                                                c.jobs, c.max_peak, c.why)
        return [c for c in changes.values() if c.old != c.new]

    def _update(self, k: str, why: str) -> Change | None:
        e = self.entries[k]
        target = learned_estimate(e.max_peak, e.planned, self.cap)
        if target < e.planned and (e.jobs < MIN_JOBS_TO_LOWER or e.distrusted):
            target = None  # one measurement may raise an estimate, not lower it; nor may an OOM's key
        if target == e.planned:
            target = None
        old = e.learned if e.learned is not None else e.planned
        e.learned = target
        new = target if target is not None else e.planned
        if new == old or not self.enabled:
            return None
        return Change(k, e.kind, e.like, old, new, e.planned, e.jobs, e.max_peak, why)

    # ------------------------------------------------------------------ for people
    def summary(self) -> dict:
        """What the state records under ``memory_estimates`` (keys with at least one measured job)."""
        out = {}
        for k, e in sorted(self.entries.items()):
            if not e.jobs and not e.distrusted:
                continue
            cur = e.learned if (e.learned is not None and self.enabled) else e.planned
            status = ("learned (raised)" if cur > e.planned
                      else "learned" if cur < e.planned
                      else "planned: a job ran out of memory on a lowered estimate" if e.distrusted
                      else "learning is off (executor.learn_memory=false)" if not self.enabled
                      else f"planned: waiting for {MIN_JOBS_TO_LOWER} measured jobs" if e.jobs < MIN_JOBS_TO_LOWER
                      else "planned: the measured peaks need it")
            out[k] = {"kind": e.kind, "like": e.like, "planned_gb": round(e.planned / 1e9, 3),
                      "estimate_gb": round(cur / 1e9, 3), "jobs": e.jobs, "max_peak_gb": round(e.max_peak / 1e9, 3),
                      "unit": self.unit, "status": status}
        return out


def killed(attempt: dict) -> bool:
    """An attempt that died of SIGKILL: how the kernel's OOM killer ends a process that ran the
    host out of memory (or someone's ``kill -9``: either way, not a peak to trust)."""
    return attempt.get("status") == "died" and attempt.get("exit_code") == -9


def learned_estimate(max_peak: int, planned: int, cap: int) -> int:
    """max peak x LEARN_FACTOR + LEARN_SLACK_BYTES, rounded up to LEARN_QUANTUM_BYTES, at least
    FLOOR_FRACTION of the planned estimate, at most ``cap``."""
    raw = max_peak * LEARN_FACTOR + LEARN_SLACK_BYTES
    est = int(math.ceil(raw / LEARN_QUANTUM_BYTES) * LEARN_QUANTUM_BYTES)
    est = max(est, int(math.ceil(planned * FLOOR_FRACTION)))
    return min(est, int(cap))


def status_lines(state: dict) -> list[str]:
    """``pita status``: the estimates a run has learned (from its state)."""
    est = state.get("memory_estimates") or {}
    if not est:
        return []
    lines = ["memory estimates (learned from measured peaks; executor.learn_memory):"]
    for k, e in sorted(est.items(), key=lambda kv: (kv[1].get("kind", ""), kv[0])):
        lines.append(f"  {e.get('kind')} like {e.get('like')}: planned {e.get('planned_gb', 0):.2f} GB, "
                     f"now {e.get('estimate_gb', 0):.2f} GB, max peak {e.get('max_peak_gb', 0):.2f} GB "
                     f"over {e.get('jobs', 0)} job(s) ({e.get('status')})")
    return lines
