"""Every job kind's memory reservation, from the shapes of the models it loads, in the dtypes it
loads them, at the batches and lengths it runs with (formulas: ``pita/core/memory.py``).

    est = JobMemory(cfg, paths, cuda, device_totals)
    est.generation(guided=False)        # GB of one data-generation shard
    est.policy_training(algo)           # GB per device of a DPO / GRPO / GRPO-HF training job

What each job holds, as the job's code loads it:

    generation shard    the reference (model.dtype) sampling data_collection.batch_size rows, the
                        reward model (fp32) of a reward task, the value model (fp32 backbone)
                        when a round's policy is guided
    evaluation shard    the same at eval.* sizes; a trained policy's evaluation also holds the
                        reference (model.dtype), which scores the samples for the KL
    value / proxy       the guidance backbone in fp32 with AdamW, activations in bf16 autocast on
    training            CUDA (fp32 on CPU), a token-budget batch split into micro-batches
    DPO / GRPO          the policy in fp32 with AdamW (LoRA: the frozen base, in model.dtype on
    training            CUDA, plus the adapters and their optimizer state), TRL's frozen reference
                        (full fine-tuning with beta > 0; model.dtype on CUDA, fp32 on CPU), DPO's
                        chosen + rejected rows in one pass (with SDPA: the padding mask as a
                        bias and grouped keys repeated, per layer), the vLLM share of the device
                        when use_vllm, and NCCL's buffers on each rank of a multi-device job;
                        GRPO's phases one at a time (policy_phases): sampling (a KV cache of one
                        micro-batch per generate call), scoring (the reward model's or proxy's
                        pass), training (activations)

No estimate is ever 0: a model whose config cannot be read is a ConfigError (exit 2).
"""

from __future__ import annotations

from pita.core.memory import (
    CUDA_CONTEXT_BYTES,
    NCCL_RANK_BYTES,
    bytes_per_param,
    fused_head_bytes,
    generate_rows,
    generation_bytes,
    kv_cache_bytes,
    lora_params,
    scoring_bytes,
    training_bytes,
    weights_bytes,
)

# corrections the fake-tensor measurements of the jobs' own code called for (bench/memory_truth.py)
PROXY_MARGIN = 1.06
EAGER_ATTENTION_COPIES = 11  # [batch x heads x length x length] fp32 tensors of an eager DeBERTa-v2 forward

# tokens a prompt is assumed to take: the chat template plus a GSM8K / MATH problem or an IMDB /
# TL;DR prefix fits; longer prompts are what memory learning and the OOM retry are for
PROMPT_TOKENS = 256
# candidates a guided step runs through the value model with the reference head (its default top_k)
REFERENCE_CANDIDATES = 20


def planned_attn_impl(requested: str) -> str:
    """The attention a training job will run: flash_attention_2 only where flash-attn is
    installed (``pita.models.lm.resolve_attn_impl`` falls back to sdpa otherwise)."""
    if requested == "flash_attention_2":
        import importlib.util

        return requested if importlib.util.find_spec("flash_attn") is not None else "sdpa"
    return requested


class JobMemory:
    def __init__(self, cfg, paths: dict, cuda: bool, device_totals: list[int]):
        self.cfg, self.paths, self.cuda = cfg, paths, cuda
        self.totals = list(device_totals)
        self.act = "bfloat16" if cuda else "float32"  # autocast on CUDA
        self.attn_impl = planned_attn_impl(getattr(cfg.system, "attn_impl", "sdpa"))

    # ------------------------------------------------------------------ shapes
    def shape(self, part: str, dataset: str | None = None):
        from pita.models.shapes import model_shape

        if part == "reward":
            return model_shape(self.paths["reward_models"][dataset], f"model.reward_models.{dataset}")
        # (a reward function has no shape: reward_bytes leaves it out)
        return model_shape(self.paths[part], f"model.{part}")

    def reward_bytes(self, datasets, beside: float = 0.0) -> float:
        """The largest reward model any of ``datasets`` is scored by (fp32, its scoring batch):
        its weights, and what its scoring pass needs beyond ``beside`` bytes (the sampler's
        working memory, freed before scoring starts)."""
        dc = self.cfg.data_collection
        out = 0.0
        from pita.rewards.function import is_function

        for d in datasets:
            if self.paths["reward_models"].get(d) and not is_function(self.paths["reward_models"][d]):
                sh = self.shape("reward", d)
                w = weights_bytes(sh, "float32") * 1.10
                seq = PROMPT_TOKENS + self._new(False)
                work = scoring_bytes(sh, "float32", dc.reward_batch_size, seq, cuda=False, weights=False,
                                     logits=False)  # a classifier: no vocabulary
                from pita.models.shapes import eager_attention

                if eager_attention(self.paths["reward_models"][d], f"model.reward_models.{d}"):
                    # attention scores, their softmax and (DeBERTa) the relative-position terms, fp32
                    work += dc.reward_batch_size * sh.heads * seq * seq * 4 * EAGER_ATTENTION_COPIES
                out = max(out, w + max(0.0, work - beside))
        return out

    def _reward_task(self, dataset: str) -> bool:
        """Whether ``dataset`` is a reward task (scored by its reward model); a dataset whose
        adapter cannot be told here counts as one (its reward model is then reserved)."""
        try:
            from pita.datasets.config import task_of

            return task_of(self.cfg.datasets[dataset]) == "reward"
        except Exception:  # noqa: BLE001 - unknown: reserve the reward model
            return True

    def _new(self, evaluation: bool) -> int:
        return int(self.cfg.eval.max_new_tokens if evaluation else self.cfg.data_collection.max_new_tokens)

    def _value_model_bytes(self, batch: int, seq: int) -> tuple[float, float]:
        """(weights, working memory) of the value model beside a guided sampler: its fp32 backbone;
        its own KV cache and one step's scores over the candidates. The reference head's candidate
        pass adds its activations and attention weights over batch x top_k tokens, priced for every
        guided shard at REFERENCE_CANDIDATES (the default top_k; the embedding head needs less, a
        larger top_k more: memory learning corrects either from the jobs' peaks), and one layer's
        keys and values concatenated with the candidates' (the pass drops each layer's after its
        attention: a copy of the whole cache, 19 GB for qwen3's value model at 71 x 1,174 tokens,
        had set the guided shard's peak at 1,024 new tokens)."""
        sh = self.shape("guidance")
        work = kv_cache_bytes(sh, "float32", batch, seq) + batch * sh.vocab * 4 * 3
        k = REFERENCE_CANDIDATES
        work += batch * k * 4 * (8 * sh.hidden + sh.heads * (seq + k))
        work += kv_cache_bytes(sh, "float32", batch, seq + k) / max(1, sh.n_layers)
        return weights_bytes(sh, "float32") + 4 * max(self.q_head_params(a) for a in self._value_algos()), work

    def _value_algos(self) -> list:
        """The run's value-guided algorithms (their configs), or [None] without any; built once
        (the guided sampler's estimate asks for them at every batch size a fit tries)."""
        if getattr(self, "_value_algos_cache", None) is None:
            from pita.algos.base import ALGORITHMS, algorithm
            from pita.algos.value_guided import ValueGuidedAlgorithm

            out = []
            for name in self.cfg.experiment.get("algos") or []:
                if name in ALGORITHMS and name in self.cfg.algos:
                    a = algorithm(name, self.cfg.algos[name])
                    if isinstance(a, ValueGuidedAlgorithm):
                        out.append(a)
            self._value_algos_cache = out or [None]
        return self._value_algos_cache

    def q_head_params(self, algo) -> int:
        """Parameters of ``algo``'s q head (``algos.<name>.head=q``: a vocabulary x hidden x n_out
        table; n_out = num_atoms where its loss is or may be mle), 0 for the other heads."""
        c = getattr(algo, "c", None)
        if c is None or getattr(c, "head", None) != "q":
            return 0
        sh = self.shape("guidance")
        loss = getattr(c, "loss", None)
        mle = loss == "mle" or (loss is None and "mle" in {algo.default_loss(t) for t in ("math", "reward")})
        return sh.vocab * sh.hidden * (int(c.num_atoms) if mle else 1)

    # ------------------------------------------------------------------ inference jobs
    def generation(self, guided: bool = False, datasets=(), batch: int | None = None) -> float:
        """One data-generation shard (GB) at ``batch`` rows (default data_collection.batch_size)."""
        dc = self.cfg.data_collection
        if dc.memory_gb is not None:
            return float(dc.memory_gb)
        batch = int(dc.batch_size if batch is None else batch)
        dtype = self.cfg.model.dtype
        ref = self.shape("reference")
        b = generation_bytes(ref, dtype, batch, PROMPT_TOKENS, dc.max_new_tokens, cuda=self.cuda)
        working = self._working(ref, dtype, b)
        if guided:
            vw, vwork = self._value_model_bytes(batch, PROMPT_TOKENS + dc.max_new_tokens)
            b += (vw + vwork) * 1.10
            working += vwork * 1.10
        return (b + self.reward_bytes(datasets, working)) / 1e9

    def _working(self, shape, dtype: str, total: float) -> float:
        """What a sampling estimate holds beyond the weights and the context: freed once it ends."""
        return total - weights_bytes(shape, dtype) * 1.10 - (CUDA_CONTEXT_BYTES if self.cuda else 0)

    def evaluation(self, kind: str = "base", datasets=(), batch: int | None = None) -> float:
        """One evaluation shard (GB) at ``batch`` rows (default eval.batch_size): ``kind`` base (the
        reference samples), guided (the reference and the value model), trained (a trained policy
        samples, the reference scores it)."""
        dc, ev = self.cfg.data_collection, self.cfg.eval
        if dc.memory_gb is not None:
            return float(dc.memory_gb)
        batch = int(ev.batch_size if batch is None else batch)
        dtype = self.cfg.model.dtype
        ref = self.shape("reference")
        seq = PROMPT_TOKENS + int(ev.max_new_tokens)
        b = generation_bytes(ref, dtype, batch, PROMPT_TOKENS, ev.max_new_tokens, cuda=self.cuda)
        working = self._working(ref, dtype, b)
        if kind == "guided":
            vw, vwork = self._value_model_bytes(batch, seq)
            b += (vw + vwork) * 1.10
            working += vwork * 1.10
        elif kind == "trained":  # the reference beside the policy, scoring its samples once sampling is done
            scoring_only = scoring_bytes(ref, dtype, batch, seq, cuda=False, weights=False)
            b += weights_bytes(ref, dtype) * 1.10 + max(0.0, scoring_only - working)
            working = max(working, scoring_only)
        # a verifier task's evaluation never loads the reward model its training labels may use
        # (plans/experiment.py's eval_request_factory): only reward tasks' are reserved
        return (b + self.reward_bytes([d for d in datasets if self._reward_task(d)], working)) / 1e9

    def proxy_scoring(self, batch: int = 64) -> float:
        """The best-of-n control's merge (GB): the run's proxy (the fp32 guidance backbone and its
        head) scoring the pool's samples, ``batch`` sequences of prompt + completion at a time."""
        seq = PROMPT_TOKENS + int(self.cfg.eval.max_new_tokens)
        return scoring_bytes(self.shape("guidance"), "float32", batch, seq, cuda=self.cuda, logits=False) * \
            PROXY_MARGIN / 1e9

    def sampling(self, key: str, datasets=(), batch: int | None = None) -> float:
        """The estimate of sampling job kind ``key`` (gen, gen_guided, eval, eval_guided, eval_trained)."""
        if key.startswith("gen"):
            return self.generation(key == "gen_guided", datasets, batch)
        return self.evaluation({"eval": "base", "eval_guided": "guided", "eval_trained": "trained"}[key], datasets,
                               batch)

    # ------------------------------------------------------------------ training jobs
    def _micro_gc(self, algo, micro, gradient_checkpointing):
        from pita.algos.base import effective_training

        m, gc = effective_training(self.cfg, algo.c) if algo is not None else \
            (self.cfg.training.micro_batch_size, self.cfg.training.gradient_checkpointing)
        m = micro if micro is not None else m
        gc = gradient_checkpointing if gradient_checkpointing is not None else gc
        return (int(m) if isinstance(m, int) else 1), bool(gc) if isinstance(gc, bool) else True

    def value_training(self, algo=None, micro: int | None = None, gradient_checkpointing: bool | None = None,
                       proxy: bool = False) -> float:
        """A value-model training job of ``algo`` (GB): the guidance backbone in fp32 with AdamW,
        micro-batches of at most its ``token_budget`` tokens, with the embedding head the LM
        prior's log-probabilities at every position. ``proxy``: a Bradley-Terry proxy instead (chosen and rejected rows in one
        pass, its reward read at the last token only: no vocabulary-wide tensor per position)."""
        micro, gc = self._micro_gc(algo, micro, gradient_checkpointing)
        batch_size = 32 if algo is None else int((proxy and algo.proxy_batch_size) or algo.c.batch_size)
        token_budget = int(getattr(algo.c, "token_budget", 8192)) if algo is not None else 8192
        seq = PROMPT_TOKENS + int(self.cfg.data_collection.max_new_tokens)
        rows = min(batch_size, micro) if micro > 0 else batch_size
        tokens = max(1, min(token_budget, rows * seq * (2 if proxy else 1)))
        # the LM prior's log-probabilities at every position: the embedding head's alone (the
        # reference and q heads read no vocabulary-wide tensor per position)
        head = getattr(getattr(algo, "c", None), "head", "reference")
        # the rows are padded to the longest (pita.guidance.train.pad_right): the attention keeps
        # what a padding mask costs (attention_layer_bytes), for rows x seq tokens
        padded = max(1, tokens // seq)
        b = training_bytes(self.shape("guidance"), "float32", padded, tokens // padded, act_dtype=self.act,
                           cuda=self.cuda, gradient_checkpointing=gc, logits=not proxy and head == "embedding",
                           attn_impl=self.attn_impl, autocast_copies=True)
        # a q head's table in fp32 with its gradient and AdamW's two moments, and the rows it
        # gathers per position with their gradient
        q = self.q_head_params(algo)
        if q:
            sh = self.shape("guidance")
            b += 16 * q + 2 * 4 * tokens * sh.hidden * (q // (sh.vocab * sh.hidden))
        # a proxy pads chosen and rejected to one length and keeps the final states of both: the
        # fake-tensor measurements (bench/memory_truth.py) put it 3-5% above the formula
        return b * (PROXY_MARGIN if proxy else 1.0) / 1e9

    def policy_training(self, algo, micro: int | None = None, gradient_checkpointing: bool | None = None,
                        datasets=()) -> float:
        """A DPO / GRPO / GRPO-HF training job, per device (GB): its largest phase
        (``policy_phases``); ``datasets``: those its rewards may come from (GRPO on a reward task
        holds the reward model)."""
        return max(self.policy_phases(algo, micro, gradient_checkpointing, datasets).values()) / 1e9

    def generate_rows(self, algo, micro: int | None = None, gradient_checkpointing: bool | None = None,
                      datasets=()) -> int:
        """GRPO's rows per ``generate`` call on one device (``pita.core.memory.generate_rows``): the
        fewest calls of its generation batch (batch_size / devices rows) whose sampling phase fits
        the smallest device less ``executor.memory_margin``; the whole batch in one call with vLLM,
        for DPO, or where no device is known."""
        c = algo.c
        per_device = max(1, c.batch_size // max(1, c.devices))
        if algo.train_kind == "algo.dpo_train" or getattr(c, "use_vllm", False) or not self.totals:
            return per_device
        budget = min(self.totals) * (1 - float(self.cfg.executor.memory_margin))
        return generate_rows(per_device, lambda r: self.policy_phases(algo, micro, gradient_checkpointing, datasets,
                                                                      sample_rows=r)["sampling"], budget)

    def policy_phases(self, algo, micro: int | None = None, gradient_checkpointing: bool | None = None,
                      datasets=(), sample_rows: int | None = None) -> dict[str, float]:
        """Bytes per device of each phase of a training step. A GRPO step's phases come one after
        another, each freeing its working memory before the next: ``sampling`` (the KV cache;
        sharded without vLLM, every unit kept gathered by gathered_for_generation: the whole
        policy in the compute dtype beside it), ``scoring`` (the reward model's or the proxy's
        pass) and ``training`` (activations and TRL's fused head); what stays resident (weights,
        AdamW states, gradients, TRL's reference, the reward model or proxy, vLLM's share, NCCL)
        is in each. DPO has ``training`` alone. GRPO samples ``sample_rows`` rows a call (default
        :meth:`generate_rows`): the cache and the step's logits are theirs."""
        c, cfg = algo.c, self.cfg
        micro, gc = self._micro_gc(algo, micro, gradient_checkpointing)
        per_device = max(1, c.batch_size // max(1, c.devices))
        rows = min(per_device, micro) if micro > 0 else max(1, per_device // max(1, c.gradient_accumulation_steps))
        rows = max(1, rows)
        shape = self.shape("reference")
        new = int(getattr(c, "max_completion_length", 0) or cfg.data_collection.max_new_tokens)
        seq = PROMPT_TOKENS + new
        if getattr(c, "max_length", None):  # DPO truncates prompt + completion to max_length
            seq = min(seq, int(c.max_length))
        if c.lora_r > 0:
            from pita.models.shapes import lora_targets

            lora = lora_params(shape, c.lora_r, lora_targets(self.paths["reference"], c.lora_target_modules,
                                                             "model.reference"))
        else:
            lora = None
        extra = 0.0
        # LoRA's frozen base: in model.dtype on CUDA (pita.training.models.policy_dtype), fp32 on CPU
        frozen = cfg.model.dtype if lora is not None and self.cuda and cfg.model.dtype in ("bfloat16", "float16") \
            else "float32"
        shards = c.devices if getattr(c, "sharding", "none") == "fsdp" and c.devices > 1 else 1
        if c.devices > 1 and self.cuda:  # NCCL's buffers on every rank, outside torch's allocator
            extra += NCCL_RANK_BYTES
        if lora is None and max(algo.betas()) > 0:  # TRL's frozen reference (LoRA: the base itself), in model.dtype on CUDA
            ref_dtype = cfg.model.dtype if self.cuda else "float32"
            extra += weights_bytes(shape, ref_dtype) / shards
            if shards > 1:  # sharded per layer like the policy: a unit gathered whole while it runs (the
                # root's embeddings and head, the layer running and the one prefetched)
                extra += (shape.root_params + 2 * shape.layer_params) * bytes_per_param(ref_dtype)
        is_dpo = algo.train_kind == "algo.dpo_train"
        if is_dpo:
            rows *= 2  # chosen and rejected in one pass
        kv = scoring = 0.0
        if not is_dpo:  # GRPO samples its completions with the policy: a KV cache at full length
            if sample_rows is None:
                sample_rows = self.generate_rows(algo, micro, gradient_checkpointing, datasets)
            # sampled under autocast; the step's logits, their processed copy and the softmax (fp32)
            kv = kv_cache_bytes(shape, self.act, sample_rows, seq) + sample_rows * shape.vocab * 4 * 3
            if getattr(c, "use_vllm", False) and getattr(c, "vllm_mode", "") == "colocate" and self.totals:
                extra += c.vllm_gpu_memory_utilization * min(self.totals)
            if algo.trains_proxy:  # GRPO-HF: its proxy reward model (fp32, resident) scores the completions
                proxy = self.shape("guidance")
                extra += weights_bytes(proxy, "float32") * 1.10 * PROXY_MARGIN
                scoring = scoring_bytes(proxy, "float32", rows, seq, cuda=False, weights=False,
                                        logits=False) * PROXY_MARGIN
            else:  # GRPO's online reward: the reward model of a reward task (a verifier task's is the verifier)
                rewarded = [d for d in (datasets or []) if self._reward_task(d)]
                rb = self.reward_bytes(rewarded)
                work = rb - self.reward_bytes(rewarded, beside=float("inf"))
                extra += rb - work
                scoring = work

        from pita.training.arguments import trl_fused_head

        fused = trl_fused_head()

        def total(batch: int, beside: float) -> float:
            # TRL's fused head over the positions the loss reads (GRPO: the completion's), never the
            # full logits; a TRL without it: the full logits of every position
            head = fused_head_bytes(shape, batch * (seq if is_dpo else new + 1), self.act, lora is None) \
                if batch and fused else 0
            return training_bytes(shape, "float32", batch, seq, act_dtype=self.act, cuda=self.cuda,
                                  gradient_checkpointing=gc, trainable_params=lora, frozen_dtype=frozen,
                                  extra_bytes=extra + beside + head, shards=shards, logits=not fused,
                                  attn_impl=self.attn_impl)

        phases = {"training": total(rows, 0.0)}
        if not is_dpo:
            gathered = weights_bytes(shape, self.act) if shards > 1 and not getattr(c, "use_vllm", False) else 0.0
            phases.update(sampling=total(0, kv + gathered), scoring=total(0, scoring))
        return phases
