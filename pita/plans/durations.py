"""How long each planned job would take on a GPU, for ``pita plan``'s simulated makespan.

Each job kind's seconds follow what the job executes, counted as the job counts it, on a roofline
whose constants a reader can scale (``assumed()`` states them):

    decoding   one step per generated token for each batch of rows. A step reads every weight once
               and the KV cache of every row in the batch (memory-bound: bytes / HBM bandwidth), or
               does 2 x params x rows FLOPs (compute-bound), whichever is slower; transformers'
               cache grows by concatenation, so each step also copies the cache (read + write:
               HF_CACHE_PASSES reads of it a step), vLLM's paged cache is read once. Each forward
               launches its kernels (STEP_BASE_S + STEP_PER_LAYER_S x layers); a guided step runs
               the value model's own forward beside the policy's (its weights, cache and layers)
               and the guidance's top-k arithmetic (GUIDE_STEP_S); with the reference head, a
               second value-model forward of top_k tokens per row over its cache (the candidate
               pass: FLOPs, the cache's reads and copy, its launches). The prefill adds
               2 x params x prompt tokens FLOPs. Rows per example are the recipe's own
               (rollout_rows: PITA's greedy-vs-sampled cuts are 2 continuations, Q#'s are
               ``continuations``), the prompt the dataset's typical length (PROMPT_TOKENS_BY_DATASET).
    scoring    a reward model's forward over every completion (2 x its params x tokens), in
               batches of reward_batch_size, with its launches.
    DPO        trains on the pairs it keeps: with ``data_collection.ties=drop`` the decisive ones
               (all where a reward model scores the pairs, VERIFIER_DECISIVE of them where a
               verifier alone does).
    training   (6 x params, LoRA 4 x; + 2 x for the frozen reference's forward in DPO and GRPO;
               + 2 x for gradient checkpointing's second forward) x tokens FLOPs at an MFU that
               grows with the tokens of one micro-batch (training_mfu: small micro-batches of short
               sequences leave the GPU launch-bound), plus each micro-batch's launches (forward and
               backward: 3 x a forward's), the optimizer's pass over its states (memory-bound),
               and FSDP's gathers and reduce-scatters over NVLink where they exceed the compute.
               Value training reads rows of prompt + max_new_tokens (the collection's own).
    GRPO       samples each step's completions first: with transformers on each of its devices
               (its share of the rows, in the job's own generate calls: ``rows_per_generate``
               rows each, one after another, from the sampling phase's memory); with vLLM colocated, every device still runs every token
               step of its share (decoding is bound by reading the weights, which each device
               holds whole), then the trained weights are synced into vLLM each step; vLLM in
               server mode decodes the whole batch on the server's GPUs.
    jobs       load their models (LOAD_BASE_S + bytes / LOAD_BYTES_S) and training jobs save
               what they trained (bytes / SAVE_BYTES_S).
    merges     1 s

What a decode step moves was counted op by op through the job's own sampler
(``python -m bench.decode_bytes``): the weights once, the cache HF_CACHE_PASSES times, masks
and the step's logits beside them. The launch overheads were measured: bench.guided on an H100 (bench/results/gpu_h100_2026-11-27.txt)
gave the tiny family 4.43 ms per unguided step (4 layers) and 9.59 ms per guided step (4 + 3
layers); STEP_BASE_S and GUIDE_STEP_S are fitted to them at the assumed 0.5 ms per layer. The rest
is the card's datasheet (``pita.core.gpu_manager.CARDS``: an H100's bf16 dense 989 TFLOP/s and
3.35 TB/s unless the devices name another card) at the utilisation such jobs reach with
transformers and TRL, not peak. A run measures what happens, and its measured / planned seconds
per kind correct later plans (DurationLearner); ``pita plan`` says per kind which of these its
seconds are (``sources``).
"""

from __future__ import annotations

import math

PEAK_FLOPS = 989e12
MFU = 0.35  # compute-bound decoding steps and prefills
# training: MFU_MAX x t / (t + MFU_HALF_TOKENS) for t tokens in one micro-batch: 0.28 at 4 x 1k
# tokens, 0.24 at 1 x 1k, 0.15 at 1 x 256 (launch- and memory-bound kernels at small shapes).
# The ceiling is what a tuned stack publishes, not more: torchtitan's Llama-3.1-8B FSDP run on
# H100s reaches 28% MFU at 8k-token sequences with torch.compile and fused kernels; TRL's
# trainers under transformers (eager attention kernels, no compile by default, a reference
# forward and a fused log-prob head beside the policy) have no reason to beat it. It was 0.40
# (36% at 4 x 1k) until 2026-11-29; a run's measured durations per card correct it.
MFU_MAX = 0.30
MFU_HALF_TOKENS = 256
HBM_SHARE = 0.6  # of the card's memory bandwidth: what a decode step achieves with small batches
HBM_BYTES_S = HBM_SHARE * 3.35e12
MERGE_S = 1.0
VLLM_BATCH = 256  # rows vLLM decodes at once (its max_num_seqs default)
# eager transformers: a forward costs this much beyond the roofline (kernel launches, Python);
# fitted to the H100's tiny-family steps at STEP_PER_LAYER_S
STEP_BASE_S = 0.0024
STEP_PER_LAYER_S = 0.0005
GUIDE_STEP_S = 0.0012  # a guided step's own work beside the two forwards: top-k, offsets, resampling
# attention reads the cache; torch.cat copies it (read + write). Measured op by op through the
# job's own sampler (bench.decode_bytes, transformers 5.24: one decode step of 8 rows at 257
# positions moves 2.996 x the cache, for Qwen3-8B's, both Llamas' and Phi-4-mini's attention
# shapes; no K/V repeated per head at one query position, which transformers packs)
HF_CACHE_PASSES = 3
VLLM_CACHE_PASSES = 1
LOAD_BASE_S = 20.0  # a job's process: interpreter, torch and transformers imports, CUDA context
LOAD_BYTES_S = 2e9  # safetensors into GPU memory
SAVE_BYTES_S = 1e9  # a trained model written as safetensors
NVLINK_BYTES_S = 150e9  # FSDP's collectives per device, achieved
VLLM_SYNC_BASE_S = 0.5  # TRL's weight push into vLLM each step: per-parameter calls ...
VLLM_SYNC_BYTES_S = 50e9  # ... and the bytes (gathered from FSDP first when sharded)
ADAM_BYTES_PER_PARAM = 32  # a fused AdamW step reads and writes fp32 weight, gradient and two moments

# tokens of a typical prompt, chat template included (the plan's memory keeps PROMPT_TOKENS, an
# upper bound): GSM8K's questions are ~60 words, MATH's and AIME's ~80-120, IMDB's prompt is the
# review's first prefix_words words, TL;DR's a whole post (~300-400 tokens)
PROMPT_TOKENS_BY_DATASET = {"gsm8k": 150, "math500": 180, "aime22to24": 200, "aime2024": 200, "aime2025": 200,
                            "imdb": 45, "sentiment": 45, "tldr": 420, "arith": 80}


def assumed(card=None, why: str = "") -> str:
    """The duration model's assumptions, as ``pita plan`` states them (``card``: a
    pita.core.gpu_manager.Card; None: the H100 the constants describe)."""
    peak = card.tflops * 1e12 if card else PEAK_FLOPS
    hbm = card.hbm_tbs * 1e12 * HBM_SHARE if card else HBM_BYTES_S
    name = why or (card.name if card else "H100-SXM")
    return (f"durations assumed (pita/plans/durations.py) for {name}: decoding reads the weights and the KV cache "
            f"({HF_CACHE_PASSES} passes with transformers, counted by bench.decode_bytes; {VLLM_CACHE_PASSES} with "
            f"vLLM) once per token step at "
            f"{hbm / 1e12:.2f} TB/s or computes at {MFU:.0%} of {peak / 1e12:.0f} TFLOP/s, whichever is slower, plus "
            f"{STEP_BASE_S * 1e3:g} ms + {STEP_PER_LAYER_S * 1e3:g} ms per layer of launch overhead per forward "
            f"(their sum measured on an H100 at one depth; the per-layer slope assumed) and "
            f"{GUIDE_STEP_S * 1e3:g} ms per guided step; training 6 x params x tokens FLOPs "
            f"at up to {MFU_MAX:.0%} of {peak / 1e12:.0f} TFLOP/s (less for small micro-batches); loading "
            f"{LOAD_BASE_S:g} s + {LOAD_BYTES_S / 1e9:g} GB/s, saving {SAVE_BYTES_S / 1e9:g} GB/s; merges {MERGE_S:g} s")


ASSUMED = assumed()


def _flops_s(flops: float, peak: float | None = None, mfu: float = MFU) -> float:
    return flops / ((peak or PEAK_FLOPS) * mfu)


def step_overhead(n_layers: int) -> float:
    """Seconds a transformers forward spends launching kernels and in Python, whatever the size."""
    return STEP_BASE_S + STEP_PER_LAYER_S * n_layers


def training_mfu(micro_tokens: float) -> float:
    """The share of peak FLOP/s a training step reaches with ``micro_tokens`` tokens per micro-batch."""
    t = max(1.0, float(micro_tokens))
    return MFU_MAX * t / (t + MFU_HALF_TOKENS)


def decode_seconds(n_params: int, weight_bytes: float, rows: int, batch: int, prompt: int, new: int,
                   n_layers: int = 32, overhead: bool = True, peak: float | None = None,
                   hbm: float | None = None, kv_bytes_per_token: float = 0.0,
                   cache_passes: int = HF_CACHE_PASSES, step_extra: float | None = None,
                   step_params: int | None = None) -> float:
    """Seconds to sample ``new`` tokens for ``rows`` rows, ``batch`` at a time. ``kv_bytes_per_token``:
    the KV cache one row holds per position (every model that decodes); ``step_extra``: the launch
    overhead of a step (default: one forward of ``n_layers``); ``step_params``: the parameters a
    decode step runs per row (default ``n_params``; more when a step also scores candidates)."""
    batches = math.ceil(rows / max(1, batch))
    b = min(rows, batch)
    mean_len = prompt + new / 2  # the cache a step reads, averaged over the completion
    read = weight_bytes + cache_passes * kv_bytes_per_token * b * mean_len
    step = max(read / (hbm or HBM_BYTES_S), _flops_s(2 * (n_params if step_params is None else step_params) * b, peak))
    if overhead:
        step += step_overhead(n_layers) if step_extra is None else step_extra
    return batches * (new * step + _flops_s(2 * n_params * b * prompt, peak))


# The share of sampled pairs whose two rewards differ where a verifier alone labels them (4 x
# correct, no reward model): measured on the tiny family's arith, 19 of 72 pairs in the smoke
# preset and 23-30% in the demo's three seeds (docs/decisions/published-methods.md); a reward
# model's scores (alone or plus the verifier's bonus) almost never tie
VERIFIER_DECISIVE = 0.27


def decisive_share(req: dict, ties: str = "drop") -> float:
    """The share of a preference-pair collection's pairs DPO trains on: all of them when ties are
    kept (``ties=draw``) or a reward model scores the pairs, else :data:`VERIFIER_DECISIVE`."""
    if ties != "drop":
        return 1.0
    sc = req.get("scoring") or {}
    return 1.0 if sc.get("reward_model") or req.get("task") == "reward" else VERIFIER_DECISIVE


def rollout_rows(ro: dict) -> int:
    """Continuations one cut of a ``value_rollouts`` collection samples (the recipe's own count)."""
    from pita.generation.recipes import continuation_kinds

    return len(continuation_kinds(ro))


def rows_per_example(req: dict) -> int:
    """Sequences one example of a generation request samples."""
    recipe = req.get("recipe")
    if recipe == "eval":
        return int(req.get("n", 1)) * max(1, len(req.get("etas") or [0]))
    if recipe == "value_rollouts":
        ro = req.get("rollouts") or {}
        return 1 + int(ro.get("cut_points", 1)) * rollout_rows(ro)
    if recipe == "prompts":
        return 0
    return int(req.get("n", 1))


def prompt_tokens(dataset: dict | None, default: int = 256) -> int:
    """The typical prompt of a dataset (its request's or job's ``dataset`` dict)."""
    if not dataset:
        return default
    name = dataset.get("base") or dataset.get("name")
    return PROMPT_TOKENS_BY_DATASET.get(name, default)


KINDS_MEASURED = ("generation.shard", "eval.eta_search")


class Durations:
    """Seconds per job of a plan; ``shape(part)`` gives the family's ModelShape ("reference",
    "guidance", or a model's path: a reward model)."""

    def __init__(self, jobs, shape, dtype: str, prompt_tokens: int, card=None):
        from pita.core.memory import bytes_per_param

        self.peak = card.tflops * 1e12 if card else PEAK_FLOPS
        self.hbm = card.hbm_tbs * 1e12 * HBM_SHARE if card else HBM_BYTES_S
        self.by_id = {j.id: j for j in jobs}
        self.shape = shape
        self.dtype = dtype
        self.b = bytes_per_param(dtype)
        self.prompt = prompt_tokens  # when a job names no dataset

    def _f(self, flops: float, mfu: float = MFU) -> float:
        return _flops_s(flops, self.peak, mfu)

    def kv_per_token(self, shape) -> float:
        from pita.core.memory import kv_cache_bytes

        return kv_cache_bytes(shape, self.dtype, 1, 1)

    @staticmethod
    def examples(shard) -> int:
        """Examples of a generation shard (its chunks are chunk_size examples, the last one short)."""
        a, b = shard.params["chunks"]
        size = int(shard.params["request"]["chunk_size"])
        return max(0, min(b * size, int(shard.params.get("n_examples", b * size))) - a * size)

    def _shards(self, merge_id: str):
        m = self.by_id.get(merge_id)
        for sid in (m.params.get("shards", []) if m is not None else []):
            s = self.by_id.get(sid)
            if s is not None and s.kind == "generation.shard":
                yield s

    def rows_of_merge(self, merge_id: str) -> int:
        return sum(self.examples(s) * max(1, rows_per_example(s.params["request"])) for s in self._shards(merge_id))

    def request_of_merge(self, merge_id: str) -> dict:
        return next((s.params["request"] for s in self._shards(merge_id)), {})

    def load_seconds(self, *shapes, weight_bytes: float | None = None) -> float:
        b = sum(s.n_params * self.b for s in shapes) if weight_bytes is None else weight_bytes
        return LOAD_BASE_S + b / LOAD_BYTES_S

    # ------------------------------------------------------------------ kinds
    def sampling(self, job) -> float:
        p = job.params
        req = p["request"]
        ref = self.shape("reference")
        if job.kind == "eval.eta_search":  # its validation prompts at one new eta a step, every step taken
            req = dict(req, etas=[0.0] * max(1, int(p.get("steps", 1))))
            rows = int(p.get("n_examples", 0)) * rows_per_example(req)
        else:
            rows = self.examples(job) * rows_per_example(req)
        prompt = prompt_tokens(req.get("dataset"), self.prompt)
        s = req["sampling"]
        wbytes, n, kv = ref.n_params * self.b, ref.n_params, self.kv_per_token(ref)
        extra = step_overhead(ref.n_layers)
        shapes, cand = [ref], 0
        gd = (req.get("policy") or {}).get("guidance")
        if gd:
            g = self.shape("guidance")
            wbytes += g.n_params * 4  # the value model runs in float32
            n += g.n_params
            kv += self.kv_per_token(g)
            extra += step_overhead(g.n_layers) + GUIDE_STEP_S
            if gd.get("head") == "reference":
                # the candidate pass: top_k more tokens per row through the value model (FLOPs),
                # its weights read a second time, its cache read by their attention and copied by
                # the view's concatenation (read + write: as many passes as a step's own; measured by
                # bench.decode_bytes: 9.1 value-cache sizes a guided step in all, the plan's 9), and
                # its own launches. Its keys and values are no longer repeated per query head
                # (packed_gqa_sdpa): that was 8.6 value-cache sizes more a step.
                top = int(gd.get("top_k", 20))
                cand = g.n_params * (g.vocab if top == -1 else top)
                wbytes += g.n_params * 4
                kv += self.kv_per_token(g)
                extra += step_overhead(g.n_layers)
            shapes.append(g)
        secs = decode_seconds(n, wbytes, rows, s["batch_size"], prompt, s["max_new_tokens"], ref.n_layers,
                              peak=self.peak, hbm=self.hbm, kv_bytes_per_token=kv, step_extra=extra,
                              step_params=n + cand)
        secs += self.scoring(req, rows, prompt) + self.load_seconds(*shapes)
        return max(1.0, secs)

    def scoring(self, req: dict, rows: int, prompt: int) -> float:
        """A reward model's passes over ``rows`` completions (none for a verifier or a function)."""
        sc = req.get("scoring") or {}
        rm = sc.get("reward_model")
        if not rm or req.get("recipe") == "prompts":
            return 0.0
        try:
            shape = self.shape(rm)
        except Exception:  # noqa: BLE001 - a reward model whose size is unknown: a function or an unread config
            return 0.0
        tokens = rows * (prompt + req["sampling"]["max_new_tokens"])
        batch = max(1, int(sc.get("reward_batch_size") or 32))
        return (self._f(2 * shape.n_params * tokens) + math.ceil(rows / batch) * step_overhead(shape.n_layers)
                + self.load_seconds(shape))

    def train(self, shape, tokens: float, micro_rows: int, seq: int, flops_per_param: float, devices: int = 1,
              batch_rows: int = 1, rows: float = 0.0, full: bool = True, sharded: bool = False) -> float:
        """Training over ``tokens`` tokens (``rows`` sequences of ``seq``) on ``devices`` devices,
        ``micro_rows`` sequences per micro-batch and device, ``batch_rows`` per optimizer step."""
        devices = max(1, devices)
        micro_tokens = max(1, micro_rows) * seq
        compute = self._f(flops_per_param * shape.n_params * tokens, training_mfu(micro_tokens)) / devices
        micro_steps = math.ceil(max(rows, 1) / (max(1, micro_rows) * devices))
        launches = micro_steps * 3 * step_overhead(shape.n_layers)
        opt_steps = math.ceil(max(rows, 1) / max(1, batch_rows))
        opt = opt_steps * (ADAM_BYTES_PER_PARAM * shape.n_params / devices if full else 0.0) / self.hbm
        comm = micro_steps * 3 * shape.n_params * self.b / NVLINK_BYTES_S if sharded and devices > 1 else 0.0
        return max(compute, comm) + launches + opt

    def seconds(self, job) -> float:
        p = job.params
        if job.kind in KINDS_MEASURED:
            return self.sampling(job)
        if job.kind in ("algo.value_train", "algo.proxy_train"):
            g = self.shape("guidance")
            data = p.get("data", [])
            rows = sum(self.rows_of_merge(d) for d in data)
            req = self.request_of_merge(data[0]) if data else {}
            seq = prompt_tokens(req.get("dataset"), self.prompt) + int((req.get("sampling") or {}).get("max_new_tokens", 128))
            epochs = int(p.get("epochs", 1))
            flops = 6 + (2 if p.get("gradient_checkpointing") else 0)
            micro = int(p.get("micro_batch_size") or p.get("batch_size") or 8)
            secs = self.train(g, rows * seq * epochs, micro, seq, flops, rows=rows * epochs,
                              batch_rows=int(p.get("batch_size") or micro))
            return max(1.0, secs + self.load_seconds(g) + g.n_params * 4 / SAVE_BYTES_S)
        if job.kind in ("algo.dpo_train", "algo.grpo_train"):
            return max(1.0, self.policy_training(job))
        if job.kind == "control.best_of_n" and job.resources.devices > 0:
            # the pool's completions scored by a learned model (the proxy, or Q#'s value model)
            g = self.shape("guidance")
            shards = [self.by_id[s] for s in p.get("shards", []) if s in self.by_id]
            rows = sum(self.examples(s) * max(1, rows_per_example(s.params["request"])) for s in shards)
            req = shards[0].params["request"] if shards else {}
            seq = prompt_tokens(req.get("dataset"), self.prompt) + int((req.get("sampling") or {}).get("max_new_tokens", 128))
            batch = max(1, int(p.get("micro_batch_size") or 16))
            return max(1.0, self._f(2 * g.n_params * rows * seq) + math.ceil(rows / batch) * step_overhead(g.n_layers)
                       + self.load_seconds(g))
        if job.kind == "model.build_tiny":
            return 20.0
        return MERGE_S

    def policy_training(self, job) -> float:
        p = job.params
        ref = self.shape("reference")
        lora = p.get("lora_r", 0) > 0
        flops = (4 if lora else 6) + 2 + (2 if p.get("gradient_checkpointing") else 0)
        devices = max(1, int(p.get("devices", 1)))
        sharded = p.get("sharding") == "fsdp"
        prompt = prompt_tokens(p.get("dataset"), self.prompt)
        new = int(p.get("max_completion_length") or p.get("max_length") or 512)
        seq = prompt + new
        micro = int(p.get("micro_batch_size") or max(1, int(p.get("batch_size", 1)) // devices))
        saved = 0.0 if lora else ref.n_params * self.b
        fixed = self.load_seconds(ref) * (1 if lora else 2) + saved / SAVE_BYTES_S  # policy and its frozen reference
        if job.kind == "algo.dpo_train":
            # both sides of each pair it trains on: with data_collection.ties=drop, the decisive ones
            rows = sum(self.rows_of_merge(d) * decisive_share(self.request_of_merge(d), p.get("ties", "drop"))
                       for d in job.deps) * int(p.get("epochs", 1))
            rows = max(1, int(rows))
            # a micro-batch of k pairs is 2k sequences (chosen and rejected concatenated)
            return fixed + self.train(ref, rows * seq, 2 * micro, seq, flops, devices, rows=rows,
                                      batch_rows=2 * int(p.get("batch_size", 1)), full=not lora, sharded=sharded)
        from pita.datasets.config import DatasetConfig
        from pita.datasets.loading import count_examples

        try:
            prompts = count_examples(DatasetConfig(**p["dataset"]), "train", True)[0]
        except Exception:  # noqa: BLE001 - a duration is a guess; an unreadable dataset failed earlier
            prompts = 1000
        steps = p.get("max_steps") or math.ceil(float(p.get("epochs", 1)) * prompts * p["num_generations"]
                                                / p["batch_size"])
        rows = steps * p["batch_size"]
        kv = self.kv_per_token(ref)
        if p.get("use_vllm"):
            # vLLM: its own copy of the weights in the model's dtype, continuous batching (up to
            # VLLM_BATCH rows), CUDA graphs instead of per-kernel launches, a paged cache read once
            if p.get("vllm_mode") == "server":
                per_dev, wb = p["batch_size"], ref.n_params * self.b  # the server's GPU decodes every row
            else:
                per_dev = max(1, p["batch_size"] // devices)  # each device: its rows, every token step
                wb = ref.n_params * self.b
            sample = steps * decode_seconds(ref.n_params, wb, per_dev, min(VLLM_BATCH, per_dev), prompt, new,
                                            ref.n_layers, overhead=False, peak=self.peak, hbm=self.hbm,
                                            kv_bytes_per_token=kv, cache_passes=VLLM_CACHE_PASSES)
            sample += steps * (VLLM_SYNC_BASE_S + ref.n_params * self.b / VLLM_SYNC_BYTES_S)
            fixed += self.load_seconds(ref)  # vLLM's own engine (its start-up's profiling not counted)
        else:
            sample = steps * self.grpo_step_sampling(p, ref, devices, prompt, new)
        sample += self.scoring({"scoring": {"reward_model": p.get("reward_model")}, "sampling": {"max_new_tokens": new}},
                               rows, prompt) if p.get("reward_model") else 0.0
        return fixed + sample + self.train(ref, rows * seq, micro, seq, flops, devices, rows=rows,
                                           batch_rows=int(p["batch_size"]), full=not lora, sharded=sharded)


    def grpo_step_sampling(self, p: dict, ref, devices: int, prompt: int, new: int) -> float:
        """Seconds one GRPO step samples with transformers on each device: its share of the rows in
        the job's own generate calls of ``rows_per_generate`` rows (float32 master weights under
        autocast read as the model's dtype; sharded: gathered for the sampling), one call after
        another, each running to the longest completion (``pita.core.memory.generate_rows``)."""
        per_dev = max(1, int(p["batch_size"]) // max(1, devices))
        calls_rows = int(p.get("rows_per_generate") or per_dev)
        return decode_seconds(ref.n_params, ref.n_params * 4, per_dev, calls_rows, prompt, new, ref.n_layers,
                              peak=self.peak, hbm=self.hbm, kv_bytes_per_token=self.kv_per_token(ref))


def sources(jobs, learner=None, card: str | None = None, cuda: bool = True) -> dict[str, str]:
    """Per job kind (as the plan reports it), what its seconds are: "measured on <card>" where
    finished runs' jobs of that kind on that class of device correct it, "calibrated on CPU" where
    CPU runs do, else "roofline" (with its launch overheads measured on an H100)."""
    from pita.plans.fit import job_kind

    out = {}
    for j in jobs:
        k = job_kind(j)
        if k in out:
            continue
        if j.resources.devices <= 0:
            out[k] = "fixed"
            continue
        measured = learner is not None and learner.apply and learner.factor(duration_key(j)) is not None
        if measured:
            out[k] = f"measured on {card or 'GPUs'}" if cuda else "calibrated on CPU"
        else:
            out[k] = "roofline"
    return out


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
    def scope_of(family: str, cuda: bool, card: str | None = None) -> str:
        """``cpu/<family>``, ``cuda/<card>/<family>`` (a card pita knows: one card's measurements do
        not time another), or ``cuda/<family>`` (GPUs pita does not know)."""
        return f"{device_class(cuda)}/{card}/{family}" if cuda and card else f"{device_class(cuda)}/{family}"

    @classmethod
    def load(cls, cache_dir, family: str, cuda: bool, card: str | None = None) -> "DurationLearner":
        """The store's ratios for ``family`` on this class of device (``card``: the GPU's card name)."""
        import json
        from pathlib import Path

        path = Path(cache_dir) / "durations.json"
        scope = cls.scope_of(family, cuda, card)
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
