"""DPO, GRPO and GRPO-HF: the post-training baselines, trained with TRL.

Per (algorithm, family, dataset) and round r (the policy of round r is round r-1's trained
model; round 0 starts from the reference):

    DPO      gen[r]: preference pairs sampled from the policy (``data_collection.samples_per_prompt``
             samples per prompt, scored by reward model and/or correctness + bonus, one
             Bradley-Terry drawn pair per prompt) -> merge
             train[r]: TRL ``DPOTrainer`` from the policy; its reference policy is the original
             model (``algos.DPO.ref_policy=original``) or the round's starting policy (``previous``)
    GRPO     train[r]: TRL ``GRPOTrainer``, online on the training prompts, rewarded by the
             project's scorer: the correctness verifier (+ reward model when one is configured)
             for math, the reward model for reward tasks
    GRPO-HF  gen[r]: preference pairs from the policy -> proxy[r]: a Bradley-Terry reward model on
             the pairs of rounds 0..r (the same job kind and head as Q#-HF's proxy)
             -> train[r]: GRPO rewarded by the proxy's score of the full sequence
    eval[r]  samples from the trained policy (no guidance) on the test split, with each sample's
             log-prob under the policy and under the reference processed identically (KL)

Batch sizes are effective (global) sizes: ``batch_size`` sequences per optimizer step whatever
the number of devices, split as ``batch_size / (devices * gradient_accumulation_steps)`` per
device per micro-step. The divisibility rules TRL imposes are checked when the plan is built.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import List, Optional

from pita.core.errors import ConfigError, JobError
from pita.algos.distributed import is_rank0, run_distributed, world_size
from pita.core.job import Job, Resources, add_kind_module, job_kind

log = logging.getLogger(__name__)
add_kind_module("pita.algos.baselines")

BASELINES = ("DPO", "GRPO", "GRPO-HF")


def check_config(algo: str, c, cfg, n_devices: int) -> list[str]:
    """Every problem with ``algos.<algo>`` (and the keys it depends on), named by key."""
    k = f"algos.{algo}"
    p = []
    if not c.lr > 0:
        p.append(f"{k}.lr={c.lr} must be > 0")
    if c.beta < 0:
        p.append(f"{k}.beta={c.beta} must be >= 0 (the KL coefficient; 0 = no KL term)")
    for key in ("batch_size", "gradient_accumulation_steps", "devices", "epochs", "max_steps", "max_length"):
        if getattr(c, key) < 1:
            p.append(f"{k}.{key}={getattr(c, key)} must be >= 1")
    if c.devices > n_devices >= 1:
        p.append(f"{k}.devices={c.devices} but this machine has {n_devices} device(s); lower it")
    if c.ref_policy not in ("original", "previous"):
        from pita.core.names import unknown_name

        p.append(unknown_name(f"{k}.ref_policy", c.ref_policy, ("original", "previous")))
    micro = cfg.training.micro_batch_size
    micro = micro if isinstance(micro, int) and not isinstance(micro, bool) else -1  # auto: chosen to divide
    if micro > 0:
        per = c.devices * micro
        if c.batch_size >= 1 and c.devices >= 1 and c.batch_size % per:
            p.append(f"{k}.batch_size={c.batch_size} must be divisible by {k}.devices x training.micro_batch_size "
                     f"= {c.devices} x {micro} = {per} (the effective batch is made of micro-batches of "
                     f"{micro} per device; accumulation steps are derived)")
    elif micro == 0:  # a negative value is reported once, by the plan
        step = c.devices * c.gradient_accumulation_steps
        if c.batch_size >= 1 and step >= 1 and c.batch_size % step:
            p.append(f"{k}.batch_size={c.batch_size} must be divisible by {k}.devices x "
                     f"{k}.gradient_accumulation_steps = {c.devices} x {c.gradient_accumulation_steps} = {step} "
                     f"(it is the effective batch; each device gets batch_size / {step} per micro-step)")
    if algo == "DPO":
        if cfg.data_collection.samples_per_prompt < 2:
            p.append(f"data_collection.samples_per_prompt={cfg.data_collection.samples_per_prompt} must be >= 2 "
                     f"for {algo}: a preference pair needs two samples of the same prompt")
    else:
        if c.num_generations < 2:
            p.append(f"{k}.num_generations={c.num_generations} must be >= 2 (GRPO compares completions of "
                     f"the same prompt)")
        elif c.batch_size % c.num_generations:
            p.append(f"{k}.batch_size={c.batch_size} must be divisible by {k}.num_generations={c.num_generations} "
                     f"(each step takes batch_size / num_generations prompts), e.g. {k}.batch_size="
                     f"{max(c.num_generations, c.batch_size // c.num_generations * c.num_generations)}")
        if c.max_completion_length is not None and c.max_completion_length < 1:
            p.append(f"{k}.max_completion_length={c.max_completion_length} must be >= 1")
        if c.temperature <= 0:
            p.append(f"{k}.temperature={c.temperature} must be > 0 (GRPO samples its completions)")
        if algo == "GRPO-HF" and cfg.data_collection.samples_per_prompt < 2:
            p.append(f"data_collection.samples_per_prompt={cfg.data_collection.samples_per_prompt} must be >= 2 "
                     f"for {algo}: its proxy reward model learns from preference pairs")
    if c.lora_r < 0:
        p.append(f"{k}.lora_r={c.lora_r} must be >= 0 (0 = full fine-tuning)")
    if c.lora_r > 0 and not c.lora_target_modules:
        p.append(f"{k}.lora_target_modules is empty; name the modules LoRA adapts, e.g. [q_proj,v_proj]")
    import importlib.util

    if c.lora_r > 0 and importlib.util.find_spec("peft") is None:
        p.append(f"{k}.lora_r={c.lora_r} needs peft, which is not installed: pip install -e '.[lora]' "
                 f"(or set {k}.lora_r=0 for full fine-tuning)")
    if c.use_vllm:
        if importlib.util.find_spec("vllm") is None:
            p.append(f"{k}.use_vllm=true but vllm is not installed (GPU only: pip install vllm); "
                     f"or set {k}.use_vllm=false")
    return p


def check_lora_targets(algo: str, c, model_path: str) -> list[str]:
    """LoRA target modules must exist in the model (checked on an empty-weight copy)."""
    if c.lora_r <= 0:
        return []
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    names = {n.rsplit(".", 1)[-1] for n, _ in m.named_modules() if n}
    missing = [t for t in c.lora_target_modules if t not in names]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, mod in m.named_modules()
                         if mod.__class__.__name__ == "Linear"})
        return [f"algos.{algo}.lora_target_modules: {', '.join(missing)} not found in {model_path}; "
                f"its linear modules are: {', '.join(linear)}"]
    return []


# ---------------------------------------------------------------- planning
def plan(cfg, algo: str, ds, paths: dict, gen, n_train: int, evals: list, task: str, mem: dict,
         eval_request) -> list[Job]:
    from pita.algos.value_guided import plan_evals, training_params
    from pita.plans.generation import request_for

    c = cfg.algos[algo]
    fam = cfg.model.name
    prefix = f"{algo}.{fam}.{ds.name}"
    rm = paths["reward_models"].get(ds.name)
    jobs: list[Job] = []
    prev, merges = None, []
    train_params = {
        "algo": algo, "task": task, "dataset": _dataset_dict(ds), "reference": paths["reference"],
        "reward_model": rm, "correctness_bonus": cfg.data_collection.correctness_bonus,
        "lr": c.lr, "beta": c.beta, "epochs": c.epochs, "max_steps": c.max_steps, "batch_size": c.batch_size,
        "gradient_accumulation_steps": accumulation_steps(c, cfg), "devices": c.devices,
        "max_length": c.max_length, "ref_policy": c.ref_policy, "lora_r": c.lora_r, "lora_alpha": c.lora_alpha,
        "lora_target_modules": list(c.lora_target_modules), **training_params(cfg, c), "num_workers": c.num_workers,
        "num_generations": c.num_generations, "temperature": c.temperature,
        "max_completion_length": c.max_completion_length or cfg.data_collection.max_new_tokens,
        "use_vllm": c.use_vllm, "vllm_mode": c.vllm_mode, "vllm_gpu_memory_utilization": c.vllm_gpu_memory_utilization,
        "dtype": cfg.model.dtype, "attn_impl": cfg.system.attn_impl, "tf32": cfg.system.tf32,
        "compile": cfg.system.compile,
    }
    for r in range(cfg.experiment.rounds):
        g = f"round {r}"
        deps = [prev] if prev else []
        proxy = None
        if algo in ("DPO", "GRPO-HF"):
            req = request_for(cfg, ds, paths["reference"], rm)
            req["recipe"] = "preference_pairs"
            req["seed"] = cfg.system.seed * 1000 + r
            if prev:
                req["policy"]["model_from_job"] = prev
            gj = gen.plan(req, f"{prefix}.r{r}.gen", n_train, deps=deps, memory_gb=mem["gen"], group=g)
            jobs += gj
            merges.append(gj[-1].id)
        if algo == "GRPO-HF":
            proxy = f"{prefix}.r{r}.proxy"
            jobs.append(Job(id=proxy, kind="algo.proxy_train", deps=list(merges), group=g,
                            params={"data": list(merges), "backbone": paths["guidance"], "epochs": c.proxy_epochs,
                                    "lr": c.proxy_lr, "beta": cfg.data_collection.bt_beta,
                                    "seed": cfg.system.seed + r, "batch_size": 32, "token_budget": 8192,
                                    "head_dim": 128, "tokenizer": paths["reference"]},
                            resources=Resources(1, mem["train"]), duration_hint=2.0))
        train = f"{prefix}.r{r}.train"
        kind = "algo.dpo_train" if algo == "DPO" else "algo.grpo_train"
        tdeps = deps + ([merges[-1]] if algo == "DPO" else []) + ([proxy] if proxy else [])
        jobs.append(Job(id=train, kind=kind, deps=tdeps, group=g,
                        params={**train_params, "policy_from": prev, "data": merges[-1] if algo == "DPO" else None,
                                "proxy": proxy, "seed": cfg.system.seed * 1000 + r},
                        resources=Resources(c.devices, mem["policy_train"]), duration_hint=4.0))
        jobs += plan_evals(gen, eval_request, evals, algo, fam, ds.name, r, train, mem["gen"],
                           policy={"model_from_job": train, "reference": paths["reference"]})
        prev = train
    return jobs


def accumulation_steps(c, cfg) -> int:
    """Gradient accumulation per optimizer step: derived from training.micro_batch_size when that
    is set (batch_size / (devices x micro)), else algos.<A>.gradient_accumulation_steps."""
    micro = int(cfg.training.micro_batch_size)
    if micro > 0:
        return max(1, c.batch_size // (c.devices * micro))
    return c.gradient_accumulation_steps


def _dataset_dict(ds) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(ds))


# ---------------------------------------------------------------- training
def _training_args(cls, p: dict, out: str, cuda: bool, **extra):
    import torch

    bf16 = cuda and p["dtype"] in ("bfloat16", "float32") and torch.cuda.is_bf16_supported()
    per_device = p["batch_size"] // (p["devices"] * p["gradient_accumulation_steps"])
    return cls(output_dir=out, use_cpu=not cuda, bf16=bf16, fp16=cuda and not bf16 and p["dtype"] == "float16",
               tf32=bool(p["tf32"]) if cuda else None, torch_compile=bool(p["compile"]),
               per_device_train_batch_size=per_device,
               gradient_accumulation_steps=p["gradient_accumulation_steps"], learning_rate=p["lr"], beta=p["beta"],
               gradient_checkpointing=bool(p["gradient_checkpointing"]), seed=p["seed"], data_seed=p["seed"],
               logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True,
               dataloader_num_workers=int(p.get("num_workers", 0)),
               ddp_find_unused_parameters=False if p["devices"] > 1 else None, **extra)


def _load_policy(ctx, p: dict, cuda: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pita.models.lm import DTYPES, resolve_attn_impl

    path = ctx.dep_result(p["policy_from"])["checkpoint"] if p["policy_from"] else p["reference"]
    tok = AutoTokenizer.from_pretrained(path)
    dtype = DTYPES["float32"] if p["dtype"] == "float32" or not cuda else DTYPES[p["dtype"]]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=resolve_attn_impl(p["attn_impl"]))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return path, model, tok


def _peft(p: dict, log):
    if p["lora_r"] <= 0:
        return None
    from peft import LoraConfig

    log.info("LoRA r=%d alpha=%d on %s (merged into the saved policy)", p["lora_r"], p["lora_alpha"],
             ",".join(p["lora_target_modules"]))

    return LoraConfig(r=p["lora_r"], lora_alpha=p["lora_alpha"], target_modules=list(p["lora_target_modules"]),
                      lora_dropout=0.0, task_type="CAUSAL_LM")


def _save_policy(ctx, trainer, tok, lora: bool) -> str:
    out = ctx.paths.artifacts / "policy"
    if not trainer.is_world_process_zero():  # data-parallel: rank 0 writes the checkpoint
        return str(out)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if lora:
        model = model.merge_and_unload()  # the evaluation loads a plain model
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _train(ctx, trainer, tok, p: dict, key: str) -> tuple[dict, list[dict]]:
    """Train, write the log history and the policy; the common result and the logged rows with ``key``."""
    out = trainer.train()
    hist = trainer.state.log_history
    _write_history(ctx, hist)
    ckpt = _save_policy(ctx, trainer, tok, p["lora_r"] > 0)
    return ({"checkpoint": ckpt, "train_loss": out.training_loss, "steps": out.global_step},
            [h for h in hist if key in h])


def _write_history(ctx, history: list[dict]) -> None:
    if not is_rank0():
        return
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    with open(ctx.paths.dir / "metrics.jsonl", "w") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _cuda() -> bool:
    from pita.models.lm import default_device

    return default_device().startswith("cuda")


@job_kind("algo.dpo_train")
def dpo_train(ctx):
    from datasets import Dataset, load_from_disk
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    p = ctx.params
    if p.get("devices", 1) > 1 and world_size() == 1:
        return run_distributed(ctx, "algo.dpo_train", p["devices"])
    records = load_from_disk(ctx.dep_result(p["data"])["path"]).to_list()
    pairs = [r for r in records if r["chosen_reward"] != r["rejected_reward"] and r["chosen"] != r["rejected"]]
    if not pairs:
        raise JobError(f"DPO: none of the {len(records)} preference pairs has different rewards, so there is "
                       f"nothing to learn; raise data_collection.samples_per_prompt or the data size")
    cuda = _cuda()
    path, model, tok = _load_policy(ctx, p, cuda)
    ref_model = None
    if p["policy_from"] and p["ref_policy"] == "original":
        ref_model = AutoModelForCausalLM.from_pretrained(p["reference"], dtype=model.dtype)
    ds = Dataset.from_list([{"prompt": _user(r["prompt"]), "chosen": _assistant(r["chosen"]),
                             "rejected": _assistant(r["rejected"])} for r in pairs])
    args = _training_args(DPOConfig, p, str(ctx.paths.artifacts / "trainer"), cuda, num_train_epochs=p["epochs"],
                          max_length=p["max_length"])
    ctx.log.info("DPO from %s on %d pairs (of %d; ties dropped), reference policy %s, beta %s", path, len(pairs),
                 len(records), "original" if ref_model is not None or not p["policy_from"] else "previous", p["beta"])
    trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=ds, processing_class=tok,
                         peft_config=_peft(p, ctx.log))
    res, steps = _train(ctx, trainer, tok, p, "loss")
    return {**res, "pairs": len(pairs), "loss_first": steps[0]["loss"] if steps else None,
            "loss_last": steps[-1]["loss"] if steps else None,
            "reward_accuracy_last": steps[-1].get("rewards/accuracies") if steps else None}


class _Rewards:
    """GRPO reward functions from the project's scoring code (called by TRL with the completions and
    every dataset column as keyword arguments)."""

    def __init__(self, p: dict, proxy_ckpt: Optional[str], device: str):
        from pita.datasets.config import DatasetConfig
        from pita.datasets.loading import load_examples

        self.p, self.device = p, device
        self.examples = {e.id: e for e in load_examples(DatasetConfig(**p["dataset"]), "train")}
        self.rm = self.proxy = None
        if proxy_ckpt:
            from pita.guidance.value_model import ValueModel

            self.proxy = ValueModel.load(proxy_ckpt, device=device).eval()
        elif p["reward_model"]:
            from pita.rewards.reward_model import RewardModelScorer

            self.rm = RewardModelScorer(p["reward_model"], device=device)
        if p["task"] == "reward" and self.rm is None and self.proxy is None:
            raise JobError(f"dataset {p['dataset']['name']} is a reward task but no reward model is configured "
                           f"(model.reward_models.{p['dataset']['name']})")
        self.__name__ = "pita_reward"

    def __call__(self, prompts, completions, example_id, **kw) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        exs = [self.examples[i] for i in example_id]
        if self.proxy is not None:
            return self._proxy_scores(exs, texts)
        from pita.generation.recipes import Scorer

        scorer = Scorer(task=self.p["task"], extractor=exs[0].meta.get("extractor", "auto"),
                        bonus=float(self.p["correctness_bonus"]), rm=self.rm)
        return [float(s["reward"]) for s in scorer(exs, texts)]

    def _proxy_scores(self, exs, texts) -> list[float]:
        from pita.algos.value_guided import _score_sequences, text_ids

        if getattr(self, "_tok", None) is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.p["reference"])
        return _score_sequences(self.proxy, [text_ids(self._tok, e.prompt, t) for e, t in zip(exs, texts)],
                                self.device)


@job_kind("algo.grpo_train")
def grpo_train(ctx):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from pita.datasets.config import DatasetConfig
    from pita.datasets.loading import load_examples
    from pita.models.lm import default_device

    p = ctx.params
    if p.get("devices", 1) > 1 and world_size() == 1:
        return run_distributed(ctx, "algo.grpo_train", p["devices"])
    cuda = _cuda()
    path, model, tok = _load_policy(ctx, p, cuda)
    examples = load_examples(DatasetConfig(**p["dataset"]), "train")
    if not examples:
        raise JobError(f"GRPO: the training split of {p['dataset']['name']} is empty")
    proxy = ctx.dep_result(p["proxy"])["checkpoint"] if p.get("proxy") else None
    reward = _Rewards(p, proxy, default_device())
    ds = Dataset.from_list([{"prompt": _user(e.prompt), "example_id": e.id} for e in examples])
    extra = {}
    if p["use_vllm"]:
        extra.update(use_vllm=True, vllm_mode=p["vllm_mode"], vllm_gpu_memory_utilization=p["vllm_gpu_memory_utilization"])
    args = _training_args(GRPOConfig, p, str(ctx.paths.artifacts / "trainer"), cuda, max_steps=p["max_steps"],
                          num_generations=p["num_generations"], max_completion_length=p["max_completion_length"],
                          temperature=p["temperature"], **extra)
    ctx.log.info("GRPO from %s: %d steps, %d completions per step (%d prompts x %d), beta %s, reward %s", path,
                 p["max_steps"], p["batch_size"], p["batch_size"] // p["num_generations"], p["num_generations"],
                 p["beta"], "proxy " + proxy if proxy else ("reward model" if reward.rm else "verifier"))
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                          peft_config=_peft(p, ctx.log))
    res, steps = _train(ctx, trainer, tok, p, "reward")
    return {**res, "reward_first": steps[0]["reward"] if steps else None, "reward_last": steps[-1]["reward"] if steps else None,
            "kl_last": steps[-1].get("kl") if steps else None}
