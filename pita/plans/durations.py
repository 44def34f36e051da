"""How long each planned job would take on a GPU, for ``pita plan``'s simulated makespan.

A roofline, stated so a reader can scale it (``ASSUMED``):

    decoding   one step per generated token for each batch of rows; a step reads every weight
               once (memory-bound: bytes / HBM_BYTES_S) or does 2 x params x rows FLOPs
               (compute-bound: / (PEAK_FLOPS x MFU)), whichever is slower; the prefill adds
               2 x params x prompt tokens FLOPs
    training   6 x params x tokens FLOPs per pass (LoRA: 4 x, no weight gradients) at
               PEAK_FLOPS x MFU; DPO adds the frozen reference's forward (2 x), GRPO samples
               its completions first (decoding, as above; with use_vllm, each step's completions
               in one batch of up to VLLM_BATCH rows, weights in the model's dtype, no launch
               overhead, split over the job's devices when colocated)
    merges     1 s

The figures are the plan's card's (``pita.core.gpu_manager.CARDS``: an H100's bf16 dense 989
TFLOP/s and 3.35 TB/s unless the devices name another card) at the utilisation such jobs reach
with transformers and TRL, not peak (MFU, and 60% of the memory bandwidth): the makespan is for
comparing plans and sizing a booking, the run itself measures what happens.
"""

from __future__ import annotations

import math

PEAK_FLOPS = 989e12
MFU = 0.35
HBM_SHARE = 0.6  # of the card's memory bandwidth: what a decode step achieves with small batches
HBM_BYTES_S = HBM_SHARE * 3.35e12
MERGE_S = 1.0
VLLM_BATCH = 256  # rows vLLM decodes at once (its max_num_seqs default)
# eager transformers: a decode step costs about this much beyond the roofline (kernel launches,
# Python), which is most of a small model's step
STEP_BASE_S = 0.004
STEP_PER_LAYER_S = 0.0005


def assumed(card=None, why: str = "") -> str:
    """The duration model's assumptions, as ``pita plan`` states them (``card``: a
    pita.core.gpu_manager.Card; None: the H100 the constants describe)."""
    peak = card.tflops * 1e12 if card else PEAK_FLOPS
    hbm = card.hbm_tbs * 1e12 * HBM_SHARE if card else HBM_BYTES_S
    name = why or (card.name if card else "H100-SXM")
    return (f"durations assumed (pita/plans/durations.py) for {name}: decoding reads the weights once per token "
            f"step at {hbm / 1e12:.2f} TB/s or computes at {MFU:.0%} of {peak / 1e12:.0f} TFLOP/s, whichever is "
            f"slower, plus {STEP_BASE_S * 1e3:g} ms + {STEP_PER_LAYER_S * 1e3:g} ms per layer of launch overhead; "
            f"training 6 x params x tokens FLOPs at {MFU:.0%} of {peak / 1e12:.0f} TFLOP/s; merges {MERGE_S:g} s")


ASSUMED = assumed()


def _flops_s(flops: float, peak: float | None = None) -> float:
    return flops / ((peak or PEAK_FLOPS) * MFU)


def step_overhead(n_layers: int) -> float:
    """Seconds a transformers forward spends launching kernels and in Python, whatever the size."""
    return STEP_BASE_S + STEP_PER_LAYER_S * n_layers


def decode_seconds(n_params: int, weight_bytes: float, rows: int, batch: int, prompt: int, new: int,
                   n_layers: int = 32, overhead: bool = True, peak: float | None = None,
                   hbm: float | None = None) -> float:
    batches = math.ceil(rows / max(1, batch))
    step = max(weight_bytes / (hbm or HBM_BYTES_S), _flops_s(2 * n_params * min(rows, batch), peak)) + (
        step_overhead(n_layers) if overhead else 0.0)
    return batches * (new * step + _flops_s(2 * n_params * min(rows, batch) * prompt, peak))


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

    def __init__(self, jobs, shape, dtype: str, prompt_tokens: int, card=None):
        from pita.core.memory import bytes_per_param

        self.peak = card.tflops * 1e12 if card else PEAK_FLOPS
        self.hbm = card.hbm_tbs * 1e12 * HBM_SHARE if card else HBM_BYTES_S
        self.by_id = {j.id: j for j in jobs}
        self.shape = shape
        self.b = bytes_per_param(dtype)
        self.prompt = prompt_tokens

    def _f(self, flops: float) -> float:
        return _flops_s(flops, self.peak)

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
        if job.kind in ("generation.shard", "eval.eta_search"):
            req = p["request"]
            ref = self.shape("reference")
            if job.kind == "eval.eta_search":  # its validation prompts at one new eta a step, every step taken
                req = dict(req, etas=[0.0] * max(1, int(p.get("steps", 1))))
                rows = int(p.get("n_examples", 0)) * rows_per_example(req)
            else:
                rows = self.examples(job) * rows_per_example(req)
            wbytes = ref.n_params * self.b
            n = ref.n_params
            if (req.get("policy") or {}).get("guidance"):
                g = self.shape("guidance")
                wbytes += g.n_params * 4
                n += g.n_params
            s = req["sampling"]
            return max(1.0, decode_seconds(n, wbytes, rows, s["batch_size"], self.prompt, s["max_new_tokens"],
                                           ref.n_layers, peak=self.peak, hbm=self.hbm))
        if job.kind in ("algo.value_train", "algo.proxy_train"):
            g = self.shape("guidance")
            rows = sum(self.rows_of_merge(d) for d in p.get("data", []))
            tokens = rows * (self.prompt + 128) * int(p.get("epochs", 1))
            return max(1.0, self._f(6 * g.n_params * tokens))
        if job.kind in ("algo.dpo_train", "algo.grpo_train"):
            ref = self.shape("reference")
            per_param = 4 if p.get("lora_r", 0) > 0 else 6
            seq = self.prompt + int(p.get("max_completion_length") or p.get("max_length") or 512)
            if job.kind == "algo.dpo_train":
                rows = sum(self.rows_of_merge(d) for d in job.deps)  # completions: both sides of each pair
                tokens = rows * seq * int(p.get("epochs", 1))  # split over the job's devices (DDP or FSDP)
                return max(1.0, self._f((per_param + 2) * ref.n_params * tokens) / max(1, p["devices"]))
            from pita.datasets.config import DatasetConfig
            from pita.datasets.loading import count_examples

            try:
                prompts = count_examples(DatasetConfig(**p["dataset"]), "train", True)[0]
            except Exception:  # noqa: BLE001 - a duration is a guess; an unreadable dataset failed earlier
                prompts = 1000
            steps = p.get("max_steps") or math.ceil(float(p.get("epochs", 1)) * prompts * p["num_generations"]
                                                    / p["batch_size"])
            rows = steps * p["batch_size"]
            if p.get("use_vllm"):
                # vLLM: its own copy of the weights in the model's dtype, every step's completions in one
                # continuous batch (up to VLLM_BATCH rows), CUDA graphs instead of per-kernel launches
                sample = steps * decode_seconds(ref.n_params, ref.n_params * self.b, p["batch_size"],
                                                min(VLLM_BATCH, p["batch_size"]), self.prompt, seq - self.prompt,
                                                ref.n_layers, overhead=False, peak=self.peak, hbm=self.hbm)
                sample /= max(1, p["devices"]) if p.get("vllm_mode") == "colocate" else 1
            else:
                sample = decode_seconds(ref.n_params, ref.n_params * 4, rows, max(1, p["batch_size"] // p["devices"]),
                                        self.prompt, seq - self.prompt, ref.n_layers, peak=self.peak, hbm=self.hbm) / max(1, p["devices"])
            return max(1.0, sample + self._f((per_param + 2) * ref.n_params * rows * seq) / max(1, p["devices"]))
        if job.kind == "model.build_tiny":
            return 20.0
        return MERGE_S


# ---------------------------------------------------------------- durations that learn
LEARN_KEEP = 50  # ratios kept per key (the newest)


def duration_key(job) -> str:
    """What a measured duration teaches about: the job's kind as the plan reports it (sampling
    shards by what they sample); the family and the device class are the store's own."""
    from pita.plans.fit import job_kind

    return job_kind(job)


def _stem(job_id: str) -> str:
    """A job id without the data hashes its shared-data jobs carry (``...value_rollouts-a6d162.s0``)."""
    import re

    return re.sub(r"-[0-9a-f]{6}(?=\.|$)", "", job_id)


def device_class(cuda: bool) -> str:
    return "cuda" if cuda else "cpu"


class DurationLearner:
    """Measured / planned seconds per job kind, for one family on one class of device.

    A finished attempt's wall time (worker start to end) over the roofline's seconds for the job
    (``Job.planned_s``) is one ratio; a kind's correction is the median of its ratios. Kept in
    ``<system.cache_dir>/durations.json`` (per device class and family, the newest
    :data:`LEARN_KEEP` per kind), read by every later plan and run of that cache; ``pita plan
    --calibrate RUN ...`` reads finished runs' attempts instead."""

    def __init__(self, ratios: dict[str, list[float]] | None = None, path=None, scope: str = "",
                 apply: bool = True):
        self.ratios: dict[str, list[float]] = {k: list(v) for k, v in (ratios or {}).items()}
        self.path, self.scope = path, scope
        self.apply = apply  # False (executor.learn_durations=false): record, never correct
        self.device_classes: set[str] = set()  # from_runs: the kinds of device the runs ran on
        self.replanned: list[tuple[str, int, int]] = []  # from_runs: (run, jobs matched, jobs) planned again

    key = staticmethod(duration_key)

    # ------------------------------------------------------------------ reading
    @staticmethod
    def scope_of(family: str, cuda: bool) -> str:
        return f"{device_class(cuda)}/{family}"

    @classmethod
    def load(cls, cache_dir, family: str, cuda: bool) -> "DurationLearner":
        import json
        from pathlib import Path

        path = Path(cache_dir) / "durations.json"
        scope = cls.scope_of(family, cuda)
        ratios = {}
        try:
            ratios = json.loads(path.read_text()).get(scope, {})
        except (OSError, ValueError):
            pass
        return cls(ratios, path, scope)

    @classmethod
    def from_runs(cls, runs, replan=None) -> "DurationLearner":
        """The ratios of finished runs' completed attempts (their ``state.json``). A run whose
        attempts do not record their planned seconds (made before pita recorded them) is planned
        again by ``replan(run) -> {job id: job}`` (its config.yaml under this pita), and its jobs
        matched by id, or by id without the data hashes when the data's recipe changed since.
        ``device_classes`` says which kinds of device the runs ran on; ``replanned`` names the
        runs planned again, with how many of their jobs matched."""
        import json
        from pathlib import Path

        from pita.core.errors import ConfigError

        out = cls()
        for run in runs:
            state = Path(run) / "state.json"
            try:
                data = json.loads(state.read_text())
                jobs = data["jobs"]
            except (OSError, ValueError, KeyError) as e:
                raise ConfigError(f"--calibrate {run}: no readable state.json there ({e}); give the folder of a "
                                  f"run (outputs/<name>/<time>)") from None
            out.device_classes |= {device_class(d.get("kind") != "cpu") for d in data.get("devices") or []}
            recorded = 0
            for entry in jobs.values():
                for a in entry.get("attempts", []):
                    if a.get("status") == "ok" and a.get("planned_s") and a.get("seconds") is not None and a.get("duration_key"):
                        out.observe(a["duration_key"], float(a["planned_s"]), float(a["seconds"]))
                        recorded += 1
            if recorded or replan is None:
                continue
            planned = replan(Path(run))
            by_stem = {_stem(j): job for j, job in planned.items()}
            matched = 0
            for jid, entry in jobs.items():
                job = planned.get(jid) or by_stem.get(_stem(jid))
                if job is None or not job.planned_s:
                    continue
                done = [a for a in entry.get("attempts", []) if a.get("status") == "ok"]
                for a in done[-1:]:  # as the executor measures: its start to its end (the worker's start-up too)
                    took = (a["end"] - a["start"]) if a.get("end") and a.get("start") else a.get("duration_s")
                    if took:
                        out.observe(duration_key(job), float(job.planned_s), float(took))
                        matched += 1
            out.replanned.append((str(run), matched, len(jobs)))
        if not out.ratios:
            raise ConfigError(f"--calibrate {' '.join(map(str, runs))}: no attempt there records its planned and "
                              f"measured seconds (runs made before pita recorded them, or no job finished)")
        return out

    def factor(self, key: str) -> float | None:
        r = sorted(self.ratios.get(key) or [])
        if not r:
            return None
        m = len(r) // 2
        return r[m] if len(r) % 2 else (r[m - 1] + r[m]) / 2

    def expected(self, job) -> float:
        """The job's expected seconds: the roofline's, corrected where its kind was measured."""
        f = self.factor(duration_key(job)) if self.apply else None
        planned = job.planned_s or job.duration_hint
        return planned * f if f is not None else job.duration_hint

    # ------------------------------------------------------------------ learning
    def observe(self, key: str, planned_s: float, measured_s: float) -> None:
        if planned_s > 0 and measured_s >= 0:
            r = self.ratios.setdefault(key, [])
            r.append(measured_s / planned_s)
            del r[:-LEARN_KEEP]

    def save(self) -> None:
        """Merge this scope's ratios into the cache file (others' scopes kept), under a lock."""
        import json
        import os

        from filelock import FileLock

        if self.path is None or not self.scope:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError):
                data = {}
            data[self.scope] = self.ratios
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)

    def summary(self) -> dict:
        return {k: {"jobs": len(v), "measured_over_planned": round(self.factor(k), 3)} for k, v in sorted(self.ratios.items())}
