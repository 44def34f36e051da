"""Memory truth: each job kind's peak, measured on fake tensors, against the reservation the plan makes.

    python -m bench.memory_truth                       # every preset family, paper_math and paper_reward
    python -m bench.memory_truth --families llama,qwen3 --json
    python -m bench.memory_truth --families '' --experiments '' --sharded-families qwen3   # FSDP rows only

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
    value / proxy       one optimizer step of ``pita.guidance.train``: its loss (``_loss``) on a
    training            token-budget batch of ``micro_batch_size`` rows, backward, AdamW
    DPO / GRPO          TRL's trainers cannot run on fake tensors; their step is rebuilt: the policy
    training            (fp32, AdamW, LoRA adapters where planned) on chosen + rejected rows (DPO) or the
                        completions (GRPO, with its sampling KV cache), TRL's frozen reference forward
                        in model.dtype, per-token log-probs over the vocabulary in fp32
    control.best_of_n   the pool's merge: the proxy (fp32 guidance backbone) scoring the samples,
                        ``micro_batch_size`` sequences at a time

    DPO / GRPO          the jobs gpu=auto shards (full fine-tuning, FSDP over k devices; families
    sharded             SHARDED_FAMILIES, paper_math): one rank measured on its own (``measure_sharded``):
                        a fake process group of world size k, the policy and TRL's reference sharded
                        into the job's units, two steps under torch's FSDPMemTracker

The sampling loop itself reads token values (``.tolist()``) and cannot run on fake tensors: a
decode step is measured once, at the longest cache. A multimodal model (Gemma 3 4B) runs its text
stack (the layers its forward runs on text; the image-token masking in front of them reads token
values), its vision tower held as weights. A real GPU adds the CUDA context
(``pita.core.memory.CUDA_CONTEXT_BYTES``) to every process: it is added to each measured peak.
Target: reservation >= peak and <= 1.5 x peak.
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


def _policy_step_shape(cfg, job) -> tuple[bool, int, int, int]:
    """(DPO?, rows per forward, completion tokens, sequence length) of a DPO / GRPO training step."""
    from pita.algos.post_training import device_steps
    from pita.plans.memory import PROMPT_TOKENS

    p = job.params
    micro, _ = device_steps(p)
    dpo = job.kind == "algo.dpo_train"
    new = int(p.get("max_completion_length") or cfg.data_collection.max_new_tokens)
    seq = PROMPT_TOKENS + new
    if p.get("max_length"):
        seq = min(seq, int(p["max_length"]))
    return dpo, (2 * micro if dpo else micro), new, seq


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


def measure(fake: Fake, cfg, paths: dict, job) -> int:
    """Peak bytes of ``job``'s step on fake tensors."""
    from types import SimpleNamespace

    from pita.models.lm import LM
    from pita.plans.memory import PROMPT_TOKENS

    torch = fake.torch
    p = job.params
    dtype = cfg.model.dtype
    tok = SimpleNamespace(eos_token_id=2, pad_token_id=0, bos_token_id=1)
    if job.kind == "control.best_of_n":  # the pool's merge: the proxy (fp32) scores the samples in batches
        vm = _proxy(fake, paths)
        rows, seq = int(p.get("micro_batch_size") or 64), PROMPT_TOKENS + int(cfg.eval.max_new_tokens)

        def score():
            with fake.mode, torch.no_grad():
                ids = _ids(torch, rows, seq, vm.spec.vocab_size)
                vm.sequence_reward(ids, torch.ones_like(ids))
        return fake.peak(score, vm)
    if job.kind == "generation.shard":
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
            opt = torch.optim.AdamW(vm.parameters(), lr=1e-5, foreach=False)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = _loss(vm, ex, clipped, list(range(rows)), pairs, 0, "cpu")
            loss.backward()
            opt.step()
        return fake.peak(step, vm)
    # DPO / GRPO: TRL's step rebuilt (see the module's doc)
    ref_shape_path = paths["reference"]
    policy = fake.model(ref_shape_path, "float32", "model.reference")
    ext = [policy]
    lora = p.get("lora_r", 0) > 0
    if lora:
        from unittest import mock

        from peft import LoraConfig, get_peft_model

        # peft moves each new adapter to its base layer's device with Module.to, which cannot swap a
        # fake parameter in place; everything is on the one fake CPU device, in fp32, already
        with fake.mode, mock.patch.object(torch.nn.Module, "to", lambda self, *a, **k: self):
            policy = get_peft_model(policy, LoraConfig(r=p["lora_r"], lora_alpha=p["lora_alpha"],
                                                       target_modules=list(p["lora_target_modules"]), task_type="CAUSAL_LM"))
        ext = [policy]
    elif p.get("beta", 0) > 0:
        ext.append(fake.model(ref_shape_path, dtype, "model.reference"))
    if p.get("gradient_checkpointing"):
        (policy.get_base_model() if lora else policy).gradient_checkpointing_enable()
    dpo, rows, new, seq = _policy_step_shape(cfg, job)
    reference = ext[1] if len(ext) > 1 else None
    proxy = None
    if p.get("proxy"):  # GRPO-HF: the proxy reward model (fp32) scores the completions
        proxy = _proxy(fake, paths)
        ext.append(proxy)
    rm = None
    if p.get("reward_model") and not p.get("proxy"):  # GRPO on a reward task: the reward model scores
        rm = fake.model(p["reward_model"], "float32", "reward", classifier=True)
        ext.append(rm)
    policy.train()

    def step():
        from pita.models.lm import cache_of

        ids = _ids(torch, rows, seq, 30000)
        opt = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=1e-6, foreach=False)
        if not dpo:  # GRPO samples its completions first: the policy's KV cache at full length
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                res = policy(input_ids=ids[:, :PROMPT_TOKENS], use_cache=True, logits_to_keep=1)
                past = cache_of(res)
                grow(torch, past, new)
                del res, past
            if proxy is not None:
                with torch.no_grad():
                    proxy.sequence_reward(ids, torch.ones_like(ids))
            if rm is not None:
                rb = int(cfg.data_collection.reward_batch_size)
                with torch.no_grad():
                    for a in range(0, rows, rb):
                        rm(input_ids=_ids(torch, min(rb, rows - a), seq, 1000))
        from trl.trainer.utils import selective_log_softmax  # what TRL's trainers call

        keep = {} if dpo else {"logits_to_keep": new + 1}  # GRPO scores the completion tokens only
        tgt = ids if dpo else ids[:, -(new + 1):]
        with torch.no_grad():
            if reference is not None:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    ref_lp = selective_log_softmax(reference(input_ids=ids, **keep).logits, tgt)
            else:
                ref_lp = torch.zeros(tgt.shape)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = policy(input_ids=ids, **keep).logits
        lp = selective_log_softmax(logits, tgt)
        del logits
        loss = (lp - ref_lp).sum(-1).mean()
        loss.backward()
        opt.step()
    return fake.peak(step, *ext)


def measure_sharded(cfg, paths: dict, job) -> int:
    """One rank's peak bytes of a ``sharding=fsdp`` DPO / GRPO training job over k devices, without
    the other ranks: a fake process group of world size k (rank 0), the device mesh made before
    fake tensors, the policy (fp32 master weights) and TRL's frozen reference (model.dtype) sharded
    into the units the job gives them (``_shard_reference_layers``: a unit per decoder layer, the
    embeddings, the tail, the root), the mixed-precision policy the job's arguments give FSDP on
    CUDA (bf16 compute, fp32 reduction), and the step of :func:`measure` under torch's
    ``FSDPMemTracker`` (which counts the all-gathered units as they live and die)."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from types import SimpleNamespace

    from pita.algos.post_training import _shard_reference_layers, gathered_for_generation
    from pita.plans.memory import PROMPT_TOKENS

    p, dtype = job.params, cfg.model.dtype
    k = int(p["devices"])
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=k, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (k,), mesh_dim_names=("dp_shard",))  # before any fake tensor
        half = torch.bfloat16
        mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32, output_dtype=half)
        acc = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=SimpleNamespace(
            fsdp_version=2, cpu_offload=None, mixed_precision_policy=mp, reshard_after_forward=True)),
            torch_device_mesh=mesh, parallelism_config=SimpleNamespace(fsdp_dim_names=("dp_shard",)))
        fake = Fake()
        proxy = _proxy(fake, paths) if p.get("proxy") else None
        policy = fake.model(paths["reference"], "float32", "model.reference")
        reference = fake.model(paths["reference"], dtype, "model.reference") if p.get("beta", 0) > 0 else None

        def root(m, _acc):
            fully_shard(m, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
            return m

        with fake.mode:
            if p.get("gradient_checkpointing"):
                policy.gradient_checkpointing_enable()
            policy = _shard_reference_layers(root, policy, acc)
            if reference is not None:
                reference = _shard_reference_layers(root, reference, acc)
            opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, foreach=False)
        dpo, rows, new, seq = _policy_step_shape(cfg, job)
        policy.train()
        tracker = FSDPMemTracker(mod=policy, optm=opt)
        tracker.track_external(*[m for m in (reference, proxy) if m is not None])
        from trl.trainer.utils import selective_log_softmax

        from pita.models.lm import cache_of

        def step(ids):
            if not dpo:  # GRPO samples with the sharded policy first, its units kept gathered as the
                # job's trainer keeps them (gathered_for_generation): its KV cache at full length
                with torch.no_grad(), gathered_for_generation(policy):
                    res = policy(input_ids=ids[:, :PROMPT_TOKENS], use_cache=True, logits_to_keep=1)
                    past = cache_of(res)
                    grow(torch, past, new)
                    del res, past
                if proxy is not None:  # GRPO-HF: the proxy (fp32, whole on every rank) scores the completions
                    with torch.no_grad():
                        proxy.sequence_reward(ids, torch.ones_like(ids))
            keep = {} if dpo else {"logits_to_keep": new + 1}
            tgt = ids if dpo else ids[:, -(new + 1):]
            with torch.no_grad():
                # as measure() does: TRL's selective_log_softmax on the logits as the model returns
                # them (bf16 under the mixed-precision policy), a row at a time in fp32
                ref_lp = (selective_log_softmax(reference(input_ids=ids, **keep).logits, tgt)
                          if reference is not None else torch.zeros(tgt.shape))
            lp = selective_log_softmax(policy(input_ids=ids, **keep).logits, tgt)
            loss = (lp - ref_lp).sum(-1).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

        # two steps: AdamW's state exists from the first step's end, so the second step's forward
        # and backward run beside it (a single step's peak misses that: the steady state is larger)
        with fake.mode, tracker:
            for _ in range(2):
                step(_ids(torch, rows, seq, 30000))
        snap = tracker.get_tracker_snapshot("peak")
        if os.environ.get("PITA_BENCH_BREAKDOWN"):
            print({str(d): {c: round(b / 1e9, 2) for c, b in v.items()} for d, v in snap.items()}, file=sys.stderr)
        return max(int(v.get("Total", 0)) for v in snap.values())
    finally:
        dist.destroy_process_group()


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


def _row(experiment: str, family: str, paths: dict, kind: str, job, measure_peak) -> dict:
    """One row: ``measure_peak()`` (bytes, the CUDA context added here) against the job's
    reservation; a row that cannot be measured says why."""
    from pita.core.memory import CUDA_CONTEXT_BYTES

    t = time.time()
    try:
        peak, err = measure_peak() + CUDA_CONTEXT_BYTES, None
    except Exception as e:  # noqa: BLE001 - a row that cannot be measured says why
        peak, err = None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    row = {"experiment": experiment, "family": family, "model": paths["reference"], "kind": kind, "job": job.id,
           "sharding": job.params.get("sharding", "none"), "devices": int(job.params.get("devices", 1) or 1),
           "batch": job.params.get("batch_size"), "micro_batch_size": job.params.get("micro_batch_size"),
           "peak_gb": round(peak / 1e9, 2) if peak else None, "reserved_gb": round(job.resources.memory_gb, 2),
           "ratio": round(job.resources.memory_gb * 1e9 / peak, 2) if peak else None,
           "seconds": round(time.time() - t, 1)}
    if err:
        row["error"] = err
    print(f"{experiment:12s} {family:9s} {kind:40s} k={row['devices']} peak {row['peak_gb']} GB reserved "
          f"{row['reserved_gb']} GB ratio {row['ratio']} ({row['seconds']} s){' ' + err if err else ''}",
          file=sys.stderr, flush=True)
    return row


def run_sharded(families: list[str], experiment: str = "paper_math") -> list[dict]:
    rows = []
    for family in families:
        cfg, jobs, paths = _sharded_jobs(experiment, family)
        for name, job in jobs.items():
            rows.append(_row(experiment, family, paths, f"{job.kind} ({name})", job,
                             lambda: measure_sharded(cfg, paths, job)))
    return rows


def run(families: list[str], experiments: list[str]) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    rows = []
    for experiment in experiments:
        for family in families:
            cfg, jobs, paths = _plan(experiment, family)
            for kind, job in _representatives(jobs).items():
                rows.append(_row(experiment, family, paths, kind, job, lambda: measure(Fake(), cfg, paths, job)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--experiments", default="paper_math,paper_reward")
    ap.add_argument("--sharded-families", default=",".join(SHARDED_FAMILIES),
                    help="families whose FSDP training jobs (paper_math, full fine-tuning) are measured per rank; "
                         "'' for none")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = run([f for f in a.families.split(",") if f], [e for e in a.experiments.split(",") if e])
    rows += run_sharded([f for f in a.sharded_families.split(",") if f])
    ok = [r for r in rows if r["ratio"] is not None]
    summary = {"rows": rows, "within_target": sum(1 <= r["ratio"] <= 1.5 for r in ok), "measured": len(ok),
               "under_reserved": sum(r["ratio"] < 1 for r in ok)}
    if a.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{'experiment':12s} {'family':9s} {'kind':40s} {'k':>2s} {'peak GB':>8s} {'reserved':>9s} {'ratio':>6s}")
        for r in rows:
            print(f"{r['experiment']:12s} {r['family']:9s} {r['kind']:40s} {r.get('devices', 1):>2} "
                  f"{r['peak_gb'] or '-':>8} {r['reserved_gb']:>9} {r['ratio'] or '-':>6}")
        print(f"within 1.0-1.5x: {summary['within_target']} of {summary['measured']}; "
              f"under-reserved: {summary['under_reserved']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
