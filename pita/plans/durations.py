"""How long each planned job would take on a GPU, for ``pita plan``'s simulated makespan.

A roofline, stated so a reader can scale it (``ASSUMED``):

    decoding   one step per generated token for each batch of rows; a step reads every weight
               once (memory-bound: bytes / HBM_BYTES_S) or does 2 x params x rows FLOPs
               (compute-bound: / (PEAK_FLOPS x MFU)), whichever is slower; the prefill adds
               2 x params x prompt tokens FLOPs
    training   6 x params x tokens FLOPs per pass (LoRA: 4 x, no weight gradients) at
               PEAK_FLOPS x MFU; DPO adds the frozen reference's forward (2 x), GRPO samples
               its completions first (decoding, as above)
    merges     1 s

The figures are an H100's (bf16 dense 989 TFLOP/s, 3.35 TB/s HBM) at the utilisation such jobs
reach with transformers and TRL, not peak: the makespan is for comparing plans and sizing a
booking, the run itself measures what happens.
"""

from __future__ import annotations

import math

PEAK_FLOPS = 989e12
MFU = 0.35
HBM_BYTES_S = 2.0e12  # of 3.35 TB/s: what a decode step achieves with small batches
MERGE_S = 1.0
# eager transformers: a decode step costs about this much beyond the roofline (kernel launches,
# Python), which is most of a small model's step
STEP_BASE_S = 0.004
STEP_PER_LAYER_S = 0.0005
ASSUMED = ("durations assumed (pita/plans/durations.py): decoding reads the weights once per token step at "
           f"{HBM_BYTES_S / 1e12:.1f} TB/s or computes at {MFU:.0%} of {PEAK_FLOPS / 1e12:.0f} TFLOP/s, whichever "
           f"is slower, plus {STEP_BASE_S * 1e3:g} ms + {STEP_PER_LAYER_S * 1e3:g} ms per layer of launch overhead; "
           f"training 6 x params x tokens FLOPs at {MFU:.0%} of {PEAK_FLOPS / 1e12:.0f} TFLOP/s; "
           f"merges {MERGE_S:g} s")


def _flops_s(flops: float) -> float:
    return flops / (PEAK_FLOPS * MFU)


def step_overhead(n_layers: int) -> float:
    """Seconds a transformers forward spends launching kernels and in Python, whatever the size."""
    return STEP_BASE_S + STEP_PER_LAYER_S * n_layers


def decode_seconds(n_params: int, weight_bytes: float, rows: int, batch: int, prompt: int, new: int,
                   n_layers: int = 32) -> float:
    batches = math.ceil(rows / max(1, batch))
    step = max(weight_bytes / HBM_BYTES_S, _flops_s(2 * n_params * min(rows, batch))) + step_overhead(n_layers)
    return batches * (new * step + _flops_s(2 * n_params * min(rows, batch) * prompt))


def rows_per_example(req: dict) -> int:
    """Sequences one example of a generation request samples."""
    recipe = req.get("recipe")
    if recipe == "eval":
        return int(req.get("n", 1)) * max(1, len(req.get("etas") or [0]))
    if recipe == "value_rollouts":
        ro = req.get("rollouts") or {}
        return 1 + int(ro.get("cut_points", 1)) * int(ro.get("continuations", 1))
    if recipe == "prompts":
        return 0
    return int(req.get("n", 1))


class Durations:
    """Seconds per job of a plan; ``shape(part)`` gives the family's ModelShape ("reference",
    "guidance")."""

    def __init__(self, jobs, shape, dtype: str, prompt_tokens: int):
        from pita.core.memory import bytes_per_param

        self.by_id = {j.id: j for j in jobs}
        self.shape = shape
        self.b = bytes_per_param(dtype)
        self.prompt = prompt_tokens

    @staticmethod
    def examples(shard) -> int:
        """Examples of a generation shard (its chunks are chunk_size examples, the last one short)."""
        a, b = shard.params["chunks"]
        size = int(shard.params["request"]["chunk_size"])
        return max(0, min(b * size, int(shard.params.get("n_examples", b * size))) - a * size)

    def rows_of_merge(self, merge_id: str) -> int:
        m = self.by_id.get(merge_id)
        if m is None:
            return 0
        total = 0
        for sid in m.params.get("shards", []):
            s = self.by_id.get(sid)
            if s is not None and s.kind == "generation.shard":
                total += self.examples(s) * max(1, rows_per_example(s.params["request"]))
        return total

    def seconds(self, job) -> float:
        p = job.params
        if job.kind == "generation.shard":
            req = p["request"]
            ref = self.shape("reference")
            rows = self.examples(job) * rows_per_example(req)
            wbytes = ref.n_params * self.b
            n = ref.n_params
            if (req.get("policy") or {}).get("guidance"):
                g = self.shape("guidance")
                wbytes += g.n_params * 4
                n += g.n_params
            s = req["sampling"]
            return max(1.0, decode_seconds(n, wbytes, rows, s["batch_size"], self.prompt, s["max_new_tokens"],
                                           ref.n_layers))
        if job.kind in ("algo.value_train", "algo.proxy_train"):
            g = self.shape("guidance")
            rows = sum(self.rows_of_merge(d) for d in p.get("data", []))
            tokens = rows * (self.prompt + 128) * int(p.get("epochs", 1))
            return max(1.0, _flops_s(6 * g.n_params * tokens))
        if job.kind in ("algo.dpo_train", "algo.grpo_train"):
            ref = self.shape("reference")
            per_param = 4 if p.get("lora_r", 0) > 0 else 6
            seq = self.prompt + int(p.get("max_completion_length") or p.get("max_length") or 512)
            if job.kind == "algo.dpo_train":
                rows = sum(self.rows_of_merge(d) for d in job.deps)  # completions: both sides of each pair
                tokens = rows * seq * int(p.get("epochs", 1))  # split over the job's devices (DDP or FSDP)
                return max(1.0, _flops_s((per_param + 2) * ref.n_params * tokens) / max(1, p["devices"]))
            from pita.datasets.config import DatasetConfig
            from pita.datasets.loading import count_examples

            try:
                prompts = count_examples(DatasetConfig(**p["dataset"]), "train", True)[0]
            except Exception:  # noqa: BLE001 - a duration is a guess; an unreadable dataset failed earlier
                prompts = 1000
            steps = p.get("max_steps") or math.ceil(float(p.get("epochs", 1)) * prompts * p["num_generations"]
                                                    / p["batch_size"])
            rows = steps * p["batch_size"]
            sample = decode_seconds(ref.n_params, ref.n_params * 4, rows, max(1, p["batch_size"] // p["devices"]),
                                    self.prompt, seq - self.prompt, ref.n_layers) / max(1, p["devices"])
            return max(1.0, sample + _flops_s((per_param + 2) * ref.n_params * rows * seq) / max(1, p["devices"]))
        if job.kind == "model.build_tiny":
            return 20.0
        return MERGE_S
