"""Memory truth: each job kind's peak, measured on fake tensors, against the reservation the plan makes.

    python -m bench.memory_truth                       # every preset family, paper_math and paper_reward
    python -m bench.memory_truth --families llama,qwen3 --json
    python -m bench.memory_truth --families '' --experiments '' --sharded-families qwen3   # FSDP rows only
    python -m bench.memory_truth --parts fake --sharded-families ''   # every family's fake-tensor rows (minutes)

No GPU and no memory: the models are built from their shipped config.json (pita/models/shapes.py)
under torch's ``FakeTensorMode`` (CPU fake tensors, built under the job's dtype), and a dispatch
mode (``LivePeak``, MemTracker's accounting without its one-call-per-module limit) records the
peak of the live tensors each step holds, weights included. The plan is ``pita plan`` 's (gpu=auto, system.inventory=8x80GB, LoRA
for the policy trainers where full fine-tuning does not fit), so every row is measured at the batch
and lengths that plan gives the job.

What runs, per family (the code the job calls where it can run on fake tensors):

    gen.shard           the reference's forward as ``LM.generate_ids`` calls it (prefill over the
                        prompts, only the last position's logits), the sampler's step (pita.models.lm:
                        log-softmax, ``nucleus``, ``sample_from``) and one decode step with a KV cache
                        at full length (prompt + max_new_tokens); the reward model beside it
    gen.shard guided    the same with the value model (``GuidedDecoder.begin`` / ``adjust``)
    eval.shard trained  the trained policy sampling as above and the reference beside it running
                        ``LM.path_kl`` over the samples (prompt + completion): the exact KL and the
                        reference's log-probs in one pass, both models' final hidden states held at once
    value / proxy       two optimizer steps of ``pita.guidance.train``: its loss (``_loss``) on a
    training            token-budget batch of ``micro_batch_size`` rows, backward, AdamW (the
                        second step runs with AdamW's moments resident, as every later one)
    DPO / GRPO          the job's own function and TRL's trainer through Trainer.train, two
    training            optimizer steps at the planned micro-batch and accumulation, on a fake
                        process group of the planned world size where the job is sharded
                        (``bench.trainer_memory``: what runs as the job runs it and what stands in
                        for what cannot run on fake tensors are named in each row)
    control.best_of_n   the pool's merge on a verifier task: the proxy (fp32 guidance backbone)
                        scoring the samples, ``micro_batch_size`` sequences at a time (on a reward
                        task it reads the rewards the samples carry: no model, no row; ranked by
                        log-probability or majority vote: no model either); ranked by the
                        dataset's reward model: that classifier (fp32) scoring a
                        ``reward_batch_size`` batch at full length
    eval.scorer_quality  a learned scorer on the validation pool: measured as the proxy's merge

    DPO / GRPO          the jobs gpu=auto shards (full fine-tuning, FSDP over k devices; families
    sharded             SHARDED_FAMILIES, paper_math), through their own trainer as above

The sampling loop itself reads token values (``.tolist()``) and cannot run on fake tensors: a
decode step is measured once, at the longest cache. A multimodal model (Gemma 3 4B) runs its text
stack (the layers its forward runs on text; the image-token masking in front of them reads token
values), its vision tower held as weights. A real GPU adds the CUDA context
(``pita.core.memory.CUDA_CONTEXT_BYTES``) to every process and NCCL's buffers
(``NCCL_RANK_BYTES``) to every rank of a multi-device job: they are added to each measured peak.
Target: reservation >= peak and <= 1.5 x peak; the bench exits 1 when a row is outside it or could
not be measured. ``--workers 2`` measures two training rows at once (a process each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

FAMILIES = ["smollm2", "qwen3-sm", "llama", "llama-old", "gemma", "qwen3", "phi"]
SHARDED_FAMILIES = ["llama-old", "gemma", "qwen3", "phi"]  # those gpu=auto shards on 8x80GB (full fine-tuning)
LORA = ["algos.DPO.lora_r=16", "algos.GRPO.lora_r=16", "algos.GRPO-HF.lora_r=16",
        "algos.GRPO.ref_policy=previous", "algos.GRPO-HF.ref_policy=previous"]


def _plan(experiment: str, family: str):
    from pita.cli.plan import _offline, compose

    _offline()
    from pita.config.validate import validate_config
    from pita.core.gpu_manager import GPUManager, parse_inventory
    from pita.models.families import resolve_family
    from pita.plans import build_plan

    cfg = compose([f"experiment={experiment}", "gpu=auto", f"model={family}", "system.inventory=8x80GB", *LORA])
    validate_config(cfg)
    totals = [d.total_bytes for d in GPUManager.from_inventory(parse_inventory("8x80GB")).devices]
    jobs = build_plan(cfg, totals, cuda=True, plan_only=True)
    paths = resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed, defer="plan")
    return cfg, jobs, paths


def _representatives(jobs) -> dict:
    """One job per kind the bench measures (the largest reservation of the kind)."""
    from pita.plans.fit import job_kind

    out: dict = {}
    for j in jobs:
        k = job_kind(j)
        if j.kind == "algo.grpo_train":
            k = "algo.grpo_train (GRPO-HF)" if j.id.startswith("GRPO-HF") else "algo.grpo_train (GRPO)"
        if j.kind in ("generation.merge", "eval.merge", "model.build_tiny"):
            continue
        if j.kind == "control.best_of_n" and not (j.params.get("proxy") or j.params.get("value")
                                                  or j.params.get("rank") == "reward_model"):
            continue  # a reward task's merge reads the rewards its samples carry (log-prob, majority: what the
            # samples carry too): no model, no device memory
        if j.kind == "control.best_of_n" and j.params.get("rank") == "reward_model":
            k = "control.best_of_n (reward model)"
        if k not in out or j.resources.memory_gb > out[k].resources.memory_gb:
            out[k] = j
    return out


class Fake:
    """A fake-tensor session: models built from configs, peaks measured by MemTracker."""

    def __init__(self):
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.torch = torch
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)

    def model(self, ref: str, dtype: str, key: str = "model", classifier: bool = False):
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        from pita.models.shapes import model_config

        from pita.models.shapes import model_shape, text_config

        torch = self.torch
        cfg = model_config(ref, key)
        auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
        text = text_config(cfg)
        multimodal = text is not cfg and not classifier
        old = torch.get_default_dtype()
        with self.mode:
            torch.set_default_dtype(getattr(torch, dtype))
            try:
                attn = {} if classifier else {"attn_implementation": "sdpa"}  # a classifier: its default
                m = auto.from_config(text if multimodal else cfg, dtype=getattr(torch, dtype), **attn)
                if multimodal:  # its vision tower: weights the job holds, never run on text
                    rest = model_shape(ref, key).n_params - sum(q.numel() for q in m.parameters())
                    m.register_buffer("_vision_tower", torch.empty(max(0, rest), dtype=getattr(torch, dtype)))
            finally:
                torch.set_default_dtype(old)
        return m.eval()

    def peak(self, fn, *external) -> int:
        """Peak bytes of the tensors ``fn`` allocates plus those of ``external`` (modules, tensors)."""
        tracker = LivePeak()
        tracker.hold(*external)
        with self.mode, tracker:
            fn()
        return tracker.peak


class LivePeak:
    """Live tensor bytes, counted per storage (views share one), and their peak. A dispatch mode
    sees every tensor an op makes; a storage stops counting when its last tensor is collected.
    (MemTracker, which does the same per module, refuses a module called twice in one context,
    as a decode loop does.)"""

    def __init__(self):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        outer = self
        self.live: dict[int, list] = {}  # storage id -> [bytes, tensors alive]
        self.now = self.peak = 0

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    outer._add(t, weakref)
                return out

        self._mode = _Mode()

    def _add(self, t, weakref) -> None:
        import torch

        if not isinstance(t, torch.Tensor):
            return
        st = t.untyped_storage()
        key = st._cdata
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [st.nbytes(), 0]
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        weakref.finalize(t, self._drop, key)

    def _drop(self, key) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            self.now -= entry[0]
            del self.live[key]

    def hold(self, *things) -> None:
        """Count ``things`` (modules: their parameters and buffers) as live from the start."""
        import weakref

        import torch

        for x in things:
            tensors = list(x.parameters()) + list(x.buffers()) if isinstance(x, torch.nn.Module) else [x]
            for t in tensors:
                self._add(t, weakref)

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def _proxy(fake, paths: dict):
    """The run's Bradley-Terry proxy on fake tensors: the fp32 guidance backbone and its head."""
    from pita.guidance.value_model import HeadSpec, ValueModel

    bb = fake.model(paths["guidance"], "float32", "model.guidance")
    tc = bb.config.get_text_config()
    with fake.mode:
        return ValueModel(bb, HeadSpec(loss="bradley_terry", head_dim=128, vocab_size=tc.vocab_size,
                                       hidden_size=tc.hidden_size)).eval()


def _ids(torch, rows: int, length: int, vocab: int):
    return torch.randint(3, min(vocab, 30000), (rows, length))


def grow(torch, cache, n: int) -> None:
    """Lengthen every layer of a KV cache by ``n`` positions, as ``n`` decode steps would (a
    sliding-window layer keeps its window)."""
    for layer in cache.layers:
        k = torch.cat([layer.keys, layer.keys[:, :, :1].expand(-1, -1, n, -1)], dim=2)
        v = torch.cat([layer.values, layer.values[:, :, :1].expand(-1, -1, n, -1)], dim=2)
        window = getattr(layer, "sliding_window", None)
        if window:
            k, v = k[:, :, -(window - 1):], v[:, :, -(window - 1):]
        layer.keys, layer.values = k, v
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length += n


def sampling_step(torch, lm, ids, mask, new: int, top_p: float, guide=None):
    """Prefill as ``LM.generate_ids`` does, one sampler step, one decode step at full length."""
    from pita.models.lm import cache_of, keep_last_logits, nucleus, sample_from, with_cache

    model = lm.model
    B, P = ids.shape
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep_last_logits(model))
        past, logits = cache_of(res), res.logits[:, -1, :]
        del res
        if guide is not None:
            guide.begin(ids, mask, pos)
        ref_lp = torch.log_softmax(logits.float(), -1)
        final = guide.adjust(ref_lp) if guide is not None else ref_lp
        support = nucleus(final, top_p)
        q = torch.log_softmax(final.masked_fill(~support, float("-inf")), -1)
        r = torch.log_softmax(ref_lp.masked_fill(~nucleus(ref_lp, top_p), float("-inf")), -1)
        tok = sample_from(q, torch.rand(B), 1.0, 1.0, 0)
        del q, r, final, support, ref_lp
        # the cache grown to its full length (prompt + max_new_tokens - 1), then one decode step
        grow(torch, past, new - 1)
        full = torch.ones(B, P + new, dtype=mask.dtype)
        res = model(input_ids=tok.unsqueeze(-1), attention_mask=full, position_ids=(pos[:, -1:] + new),
                    use_cache=True, **with_cache(model, past), **keep_last_logits(model))
        if guide is not None:
            grow(torch, guide.past, new - 1)
            guide.advance(tok.unsqueeze(-1), full, pos[:, -1:] + new)
            guide.adjust(torch.log_softmax(res.logits[:, -1, :].float(), -1))
        torch.nn.functional.softmax(res.logits[:, -1, :].float(), -1)
        if guide is not None:
            guide.end()  # as LM.generate_ids does when its batch ends


def measure(fake: Fake, cfg, paths: dict, job) -> int:
    """Peak bytes of ``job``'s step on fake tensors."""
    from types import SimpleNamespace

    from pita.models.lm import LM
    from pita.plans.memory import PROMPT_TOKENS

    torch = fake.torch
    p = job.params
    dtype = cfg.model.dtype
    tok = SimpleNamespace(eos_token_id=2, pad_token_id=0, bos_token_id=1)
    if job.kind == "control.best_of_n" and p.get("rank") == "reward_model":  # the dataset's reward model (fp32)
        sc = p["scoring"]
        rm = fake.model(sc["reward_model"], "float32", "model.reward_models", classifier=True)
        rows, seq = int(sc["reward_batch_size"]), PROMPT_TOKENS + int(cfg.eval.max_new_tokens)
        vocab = rm.config.vocab_size

        def score_rm():
            with fake.mode, torch.no_grad():
                ids = _ids(torch, rows, seq, vocab)
                rm(input_ids=ids, attention_mask=torch.ones_like(ids))
        return fake.peak(score_rm, rm)
    if job.kind in ("control.best_of_n", "eval.scorer_quality"):  # the proxy (fp32) scores the pool in batches
        # (a learned scorer's check: a value model or a proxy, the same fp32 backbone and a small head)
        vm = _proxy(fake, paths)
        rows, seq = int(p.get("micro_batch_size") or 64), PROMPT_TOKENS + int(cfg.eval.max_new_tokens)

        def score():
            with fake.mode, torch.no_grad():
                ids = _ids(torch, rows, seq, vm.spec.vocab_size)
                vm.sequence_reward(ids, torch.ones_like(ids))
        return fake.peak(score, vm)
    if job.kind in ("generation.shard", "eval.eta_search"):  # the eta search samples as a guided shard does
        req = p["request"]
        s = req["sampling"]
        B, new = int(s["batch_size"]), int(s["max_new_tokens"])
        ref = fake.model(paths["reference"], dtype, "model.reference")
        lm = LM(ref, tok)
        ext = [ref]
        guide = None
        pol = req["policy"]
        if pol.get("guidance"):
            from pita.guidance.decode import GuidedDecoder
            from pita.guidance.value_model import HeadSpec, ValueModel

            bb = fake.model(paths["guidance"], "float32", "model.guidance")
            with fake.mode:
                vm = ValueModel(bb, HeadSpec(loss="bce", head_dim=128, vocab_size=bb.config.get_text_config().vocab_size,
                                             hidden_size=bb.config.get_text_config().hidden_size)).eval()
            g = pol["guidance"]
            guide = GuidedDecoder(vm, mode="bernoulli", eta=1.0, top_k=int(g.get("top_k", 20)))
            ext.append(vm)
        scorer = None
        if pol.get("model_from_job") and req.get("recipe") == "eval":  # the reference scores the samples
            scorer = LM(fake.model(paths["reference"], dtype, "model.reference"), tok)
            ext.append(scorer.model)
        rm_path = (req.get("scoring") or {}).get("reward_model")
        rm = fake.model(rm_path, "float32", "reward", classifier=True) if rm_path else None
        if rm is not None:
            ext.append(rm)

        def step():
            with fake.mode:
                ids = _ids(torch, B, PROMPT_TOKENS, ref.config.get_text_config().vocab_size)
                mask = torch.ones_like(ids)
            sampling_step(torch, lm, ids, mask, new, float(s.get("top_p", 1.0)), guide)
            if scorer is not None:
                prompts = [[5] * PROMPT_TOKENS] * B
                comps = [[6] * new] * B
                # as run_eval: the exact per-step KL and the reference's log-probs in one pass, both
                # models' final hidden states for the batch held at once
                try:
                    lm.path_kl(scorer, prompts, comps, [None] * B, batch_size=B, logp_ref_out=[])
                except Exception as e:  # noqa: BLE001 - the last line reads values (.tolist()): the peak is past
                    if "DataDependent" not in type(e).__name__ and "data-dependent" not in str(e).lower():
                        raise
            if rm is not None:
                rb = int((req.get("scoring") or {}).get("reward_batch_size", 32))
                with torch.no_grad():
                    rm(input_ids=_ids(torch, rb, min(512, PROMPT_TOKENS + new), 1000))
        return fake.peak(step, *ext)
    if job.kind in ("algo.value_train", "algo.proxy_train"):
        from pita.guidance.train import PairExample, SeqExample, _loss
        from pita.guidance.value_model import HeadSpec, ValueModel

        pairs = job.kind == "algo.proxy_train"
        bb = fake.model(paths["guidance"], "float32", "model.guidance")
        tc = bb.config.get_text_config()
        with fake.mode:
            vm = ValueModel(bb, HeadSpec(loss="bradley_terry" if pairs else "bce", head_dim=int(p.get("head_dim", 128)),
                                         vocab_size=tc.vocab_size, hidden_size=tc.hidden_size))
        if p.get("gradient_checkpointing"):
            enable = getattr(bb, "activation_checkpointing_enable", None) or bb.gradient_checkpointing_enable
            enable()
        seq = PROMPT_TOKENS + int(cfg.data_collection.max_new_tokens)
        micro = int(p.get("micro_batch_size") or p.get("batch_size", 32))
        rows = max(1, min(micro, int(p.get("token_budget", 8192)) // seq))
        if pairs:
            rows = max(1, min(micro, int(p.get("token_budget", 8192)) // (2 * seq)))
            ex = [PairExample([7] * seq, [8] * seq) for _ in range(rows)]
        else:
            ex = [SeqExample([7] * seq, PROMPT_TOKENS, 0.5) for _ in range(rows)]
        clipped = None if pairs else [(e.ids, e.start) for e in ex]
        vm.train()

        def step():
            # two optimizer steps: from the second on, AdamW's moments are resident while the
            # forward and backward run (the job's steady state; the first step makes them last)
            opt = torch.optim.AdamW(vm.parameters(), lr=1e-5, foreach=False)
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = _loss(vm, ex, clipped, list(range(rows)), pairs, 0, "cpu")
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss
        return fake.peak(step, vm)
    raise ValueError(f"{job.kind}: measured through the job's own trainer (measure_training)")


def _sharded_jobs(experiment: str, family: str):
    """The DPO / GRPO / GRPO-HF round-0 training jobs ``gpu=auto`` shards on 8x80GB (full fine-tuning)."""
    from pita.cli.plan import _offline, compose

    _offline()
    from pita.config.validate import validate_config
    from pita.core.gpu_manager import GPUManager, parse_inventory
    from pita.models.families import resolve_family
    from pita.plans import build_plan

    cfg = compose([f"experiment={experiment}", "gpu=auto", f"model={family}", "system.inventory=8x80GB",
                   "experiment.algos=[DPO,GRPO,GRPO-HF]"])
    validate_config(cfg)
    totals = [d.total_bytes for d in GPUManager.from_inventory(parse_inventory("8x80GB")).devices]
    jobs = build_plan(cfg, totals, cuda=True, plan_only=True)
    paths = resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed, defer="plan")
    out = {}
    for j in jobs:
        if j.kind in ("algo.dpo_train", "algo.grpo_train") and j.params.get("sharding") == "fsdp":
            name = j.id.split(".")[0]
            if name not in out:
                out[name] = j
    return cfg, out, paths


TRAINING_KINDS = ("algo.dpo_train", "algo.grpo_train")


def measured_peak(job, peak_bytes: int) -> int:
    """What a job's rank holds on a GPU, from the bytes of its tensors measured on fake tensors:
    plus the CUDA context (every process) and, on each rank of a multi-device job, NCCL's
    buffers (both outside torch's allocator)."""
    from pita.core.memory import CUDA_CONTEXT_BYTES, NCCL_RANK_BYTES

    k = int(job.params.get("devices", 1) or 1) if job.kind in TRAINING_KINDS else 1
    return int(peak_bytes) + CUDA_CONTEXT_BYTES + (NCCL_RANK_BYTES if k > 1 else 0)


def row_ratio(job, peak_bytes: int) -> float:
    """The job's reservation over its measured peak (``measured_peak``): the target is [1.0, 1.5]."""
    return job.resources.memory_bytes / measured_peak(job, peak_bytes)


def measure_training(cfg, paths: dict, job) -> dict:
    """A DPO / GRPO / GRPO-HF job's row through its own trainer (bench.trainer_memory)."""
    from bench.trainer_memory import measure_job

    return measure_job(job, cfg, paths)


def _row(experiment: str, family: str, paths: dict, kind: str, job, measure_peak) -> dict:
    """One row: ``measure_peak()`` (bytes, or a training job's row from bench.trainer_memory)
    against the job's reservation; a row that cannot be measured says why and is not measured,
    never modelled."""
    t = time.time()
    extra: dict = {}
    try:
        got = measure_peak()
        if isinstance(got, dict):
            extra = {k: got[k] for k in ("accumulation", "micro_batch", "world_size", "sync_each_batch", "built_by",
                                         "as_the_job_runs", "stand_ins") if k in got}
            got = got["peak_bytes"]
        peak, err = measured_peak(job, got), None
    except Exception as e:  # noqa: BLE001 - a row that cannot be measured says why
        peak, err = None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        if "exited" in str(e):
            err = f"{type(e).__name__}: {str(e)[-600:]}"
    row = {"experiment": experiment, "family": family, "model": paths["reference"], "kind": kind, "job": job.id,
           "sharding": job.params.get("sharding", "none"), "devices": int(job.params.get("devices", 1) or 1),
           "batch": job.params.get("batch_size"), "micro_batch_size": job.params.get("micro_batch_size"),
           "peak_gb": round(peak / 1e9, 2) if peak else None, "reserved_gb": round(job.resources.memory_gb, 2),
           "ratio": round(job.resources.memory_gb * 1e9 / peak, 2) if peak else None,
           "seconds": round(time.time() - t, 1), **extra}
    if err:
        row["error"] = err
    acc = f" accumulation {extra['accumulation']}" if "accumulation" in extra else ""
    print(f"{experiment:12s} {family:9s} {kind:40s} k={row['devices']}{acc} peak {row['peak_gb']} GB reserved "
          f"{row['reserved_gb']} GB ratio {row['ratio']} ({row['seconds']} s){' ' + err if err else ''}",
          file=sys.stderr, flush=True)
    return row


def _measure(cfg, paths, job):
    if job.kind in TRAINING_KINDS:
        return measure_training(cfg, paths, job)
    return measure(Fake(), cfg, paths, job)


def run_sharded(families: list[str], experiment: str = "paper_math", workers: int = 1) -> list[dict]:
    tasks = []
    for family in families:
        cfg, jobs, paths = _sharded_jobs(experiment, family)
        for name, job in jobs.items():
            tasks.append((experiment, family, paths, f"{job.kind} ({name})", job, cfg))
    return _run_rows(tasks, workers)


def _run_rows(tasks, workers: int) -> list[dict]:
    """The rows of ``tasks``, training rows ``workers`` at a time (each in a process of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(t):
        experiment, family, paths, kind, job, cfg = t
        return _row(experiment, family, paths, kind, job, lambda: _measure(cfg, paths, job))

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(one, tasks))


def run(families: list[str], experiments: list[str], workers: int = 1, parts=("fake", "training")) -> list[dict]:
    """The rows of ``families`` x ``experiments``: ``parts`` "fake" (the steps measured here on
    fake tensors, seconds each) and "training" (DPO / GRPO through their trainer, minutes each)."""
    import torch

    torch.set_num_threads(1)
    rows = []
    for experiment in experiments:
        for family in families:
            cfg, jobs, paths = _plan(experiment, family)
            reps = _representatives(jobs)
            # the fake-tensor steps here, one at a time; the training jobs in processes of their own
            if "fake" in parts:
                rows += [_row(experiment, family, paths, kind, job, lambda: measure(Fake(), cfg, paths, job))
                         for kind, job in reps.items() if job.kind not in TRAINING_KINDS]
            if "training" in parts:
                rows += _run_rows([(experiment, family, paths, kind, job, cfg) for kind, job in reps.items()
                                   if job.kind in TRAINING_KINDS], workers)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--experiments", default="paper_math,paper_reward")
    ap.add_argument("--sharded-families", default=",".join(SHARDED_FAMILIES),
                    help="families whose FSDP training jobs (paper_math, full fine-tuning) are measured per rank; "
                         "'' for none")
    ap.add_argument("--workers", type=int, default=1, help="training rows measured at once (a process and a "
                    "thread each)")
    ap.add_argument("--parts", default="fake,training",
                    help="which rows of --families x --experiments: fake (the steps on fake tensors, seconds each), "
                         "training (DPO / GRPO through their trainer, minutes each), or both; a session that cannot "
                         "run the whole bench runs it in parts")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = run([f for f in a.families.split(",") if f], [e for e in a.experiments.split(",") if e], a.workers,
               tuple(x for x in a.parts.split(",") if x))
    rows += run_sharded([f for f in a.sharded_families.split(",") if f], workers=a.workers)
    ok = [r for r in rows if r["ratio"] is not None]
    outside = [r for r in ok if not 1.0 <= r["ratio"] <= 1.5]
    unmeasured = [r for r in rows if r["ratio"] is None]
    summary = {"rows": rows, "within_target": len(ok) - len(outside), "measured": len(ok),
               "under_reserved": sum(r["ratio"] < 1 for r in ok), "not_measured": len(unmeasured)}
    if a.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{'experiment':12s} {'family':9s} {'kind':40s} {'k':>2s} {'acc':>3s} {'peak GB':>8s} {'reserved':>9s} "
              f"{'ratio':>6s}")
        for r in rows:
            print(f"{r['experiment']:12s} {r['family']:9s} {r['kind']:40s} {r.get('devices', 1):>2} "
                  f"{r.get('accumulation', '-'):>3} {r['peak_gb'] or '-':>8} {r['reserved_gb']:>9} {r['ratio'] or '-':>6}")
        print(f"within 1.0-1.5x: {summary['within_target']} of {summary['measured']}; "
              f"under-reserved: {summary['under_reserved']}; not measured: {len(unmeasured)}")
    for r in outside:
        print(f"outside 1.0-1.5x: {r['experiment']} {r['family']} {r['kind']} ({r['job']}): reserved "
              f"{r['reserved_gb']} GB, peak {r['peak_gb']} GB", file=sys.stderr)
    for r in unmeasured:
        print(f"not measured: {r['experiment']} {r['family']} {r['kind']} ({r['job']}): {r.get('error')}",
              file=sys.stderr)
    return 1 if outside or unmeasured else 0


if __name__ == "__main__":
    sys.exit(main())
