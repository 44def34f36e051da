"""GRPO: group-relative policy optimisation with TRL's ``GRPOTrainer``, online on the training
prompts, rewarded by the project's scorer: the correctness verifier (+ the reward model when one
is configured) on math, the reward model on reward tasks. Round r trains from round r-1's policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pita.algos.base import register_algorithm
from pita.algos.distributed import run_distributed, world_size
from pita.algos.post_training import PostTrainingAlgorithm, PostTrainingConfig, user
from pita.training.arguments import device_steps, on_cuda, training_args
from pita.training.checkpoints import train_and_save
from pita.training.models import load_policy, peft_config
from pita.training.sharding import job_trainer
from pita.core.errors import JobError
from pita.core.job import Job, add_kind_module, job_kind
from pita.core.names import unknown_name

add_kind_module("pita.algos.grpo")

VLLM_MODES = ("colocate", "server")
# TRL's names for how GRPO's token losses are averaged: grpo is the paper's (DeepSeekMath: each
# completion's token losses averaged over its length, then over completions); dapo / bnpo average
# over all tokens of the batch; dr_grpo divides by a constant (max_completion_length)
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")  # advantages divided by the group's / batch's reward std, or not


@dataclass
class GRPOConfig(PostTrainingConfig):
    # the defaults give GRPO enough samples to learn arith on the tiny family (docs/decisions/baselines-on-arith-tiny.md): a verifier reward is so sparse that at
    # 60 steps of 16 completions the update is mostly noise and a larger step size only adds noise
    batch_size: int = 64  # completions per optimizer step (batch_size / num_generations prompts)
    beta: float = 0.04
    # the round's budget is passes over the training prompts, so it scales with the data: at 1000
    # prompts, 2 passes of 8 prompts a step are the 250 steps measured in docs/decisions/baselines-on-arith-tiny.md
    epochs: float = 2.0  # passes over the training prompts per round (steps = ceil(epochs x prompts / prompts per step))
    max_steps: Optional[int] = None  # optimizer steps per round; null = derived from epochs
    num_generations: int = 8  # completions per prompt (>= 2; divides batch_size)
    temperature: float = 1.0  # sampling temperature of the completions
    max_completion_length: Optional[int] = None  # null = data_collection.max_new_tokens
    use_vllm: bool = False  # generation through vLLM (GPU only, needs vllm installed)
    vllm_mode: str = "colocate"  # TRL vLLM mode: colocate | server
    vllm_gpu_memory_utilization: float = 0.3  # colocate: the GPU share vLLM may take
    # server: GPUs of the node the vLLM server (trl vllm-serve, started by you) holds; pita plan sets
    # them aside, and a run should be given the others (system.devices)
    vllm_server_devices: int = 1
    # the loss as the GRPO paper defines it (grpo: per-completion mean of its token losses, then the
    # mean over completions) | dapo (token mean over the batch) | dr_grpo (sum / max_completion_length)
    # | bnpo; set explicitly because TRL's default moved between releases (bnpo up to 0.23, dapo after)
    loss_type: str = "grpo"
    # group (the paper: advantages over the group's reward std) | batch | none (Dr. GRPO: no std scaling)
    scale_rewards: str = "group"


@register_algorithm
class GRPO(PostTrainingAlgorithm):
    name = "GRPO"
    Config = GRPOConfig
    train_kind = "algo.grpo_train"
    lr_family = "grpo"

    def check(self, cfg, n_devices: int) -> list[str]:
        c, k = self.c, self.key
        p = super().check(cfg, n_devices)
        if c.max_steps is not None and c.max_steps < 1:
            p.append(f"{k}.max_steps={c.max_steps} must be >= 1, or null to derive it from {k}.epochs")
        if c.max_steps is None and not c.epochs > 0:
            p.append(f"{k}.epochs={c.epochs} must be > 0 (passes over the training prompts per round), "
                     f"or set {k}.max_steps")
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
        if c.vllm_mode not in VLLM_MODES:
            p.append(unknown_name(f"{k}.vllm_mode", c.vllm_mode, VLLM_MODES))
        if c.vllm_server_devices < 1:
            p.append(f"{k}.vllm_server_devices={c.vllm_server_devices} must be >= 1 (the GPUs the vLLM server holds "
                     f"in vllm_mode=server)")
        if c.loss_type not in LOSS_TYPES:
            p.append(unknown_name(f"{k}.loss_type", c.loss_type, LOSS_TYPES))
        if c.scale_rewards not in SCALE_REWARDS:
            p.append(unknown_name(f"{k}.scale_rewards", c.scale_rewards, SCALE_REWARDS))
        if (c.lora_r > 0 and max(self.betas()) > 0 and c.ref_policy == "original" and cfg.experiment.rounds > 1):
            p.append(f"{k}.lora_r={c.lora_r} with {k}.ref_policy=original over {cfg.experiment.rounds} rounds: "
                     f"with LoRA, TRL's KL reference is the adapter's base, which from round 1 on is the previous "
                     f"round's merged policy, not the original model; set {k}.ref_policy=previous to accept that, "
                     f"{k}.lora_r=0 (full fine-tuning), or experiment.rounds=1")
        return p

    def run_problems(self) -> list[str]:
        """What only the machine that runs the jobs can lack (a plan for another node does not ask)."""
        import importlib.util

        if self.c.use_vllm and importlib.util.find_spec("vllm") is None:
            return [f"{self.key}.use_vllm=true but vllm is not installed (GPU only: pip install vllm); "
                    f"or set {self.key}.use_vllm=false"]
        return []

    def train_params(self, p) -> dict:
        c, dc = self.c, p.cfg.data_collection
        from pita.models.families import reward_scoring

        # the online reward: a reward task's reward model; a verifier task's is the verifier (the
        # reward model some presets give math datasets labels preference pairs, not GRPO's rollouts)
        rm = p.paths["reward_models"].get(p.ds.name) if p.task == "reward" else None
        base = super().train_params(p)
        return {**base, "reward_model": rm,
                **reward_scoring(p.cfg.model, p.ds.name),
                "correctness_bonus": dc.correctness_bonus, "max_steps": c.max_steps, "epochs": c.epochs,
                "num_generations": c.num_generations, "temperature": c.temperature,
                "max_completion_length": c.max_completion_length or dc.max_new_tokens, "use_vllm": c.use_vllm,
                "vllm_mode": c.vllm_mode, "vllm_gpu_memory_utilization": c.vllm_gpu_memory_utilization,
                "loss_type": c.loss_type, "scale_rewards": c.scale_rewards,
                # rows per generate call (pita.core.memory.generate_rows, from the plan's memory
                # model), at the micro-batch it was planned with: an OOM retry scales it down alike
                "rows_per_generate": int(p.mem.get(f"generate_rows.{self.name}")
                                         or max(1, c.batch_size // max(1, c.devices))),
                "rows_per_generate_micro": device_steps(base)[0]}

    def plan_round(self, p, r: int, prev: str | None, merges: list[str], base: dict) -> list[Job]:
        return [self.train_job(p, r, [prev] if prev else [], {**base, "policy_from": prev, "seed": p.seed(r)})]


class Rewards:
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
            from pita.rewards.function import reward_scorer

            self.rm = reward_scorer(p["reward_model"], device=device, inputs=p.get("reward_input", "prompt_completion"),
                                    score=p.get("reward_score", "margin"))
        if p["task"] == "reward" and self.rm is None and self.proxy is None:
            raise JobError(f"dataset {p['dataset']['name']} is a reward task but no reward model is configured "
                           f"(model.reward_models.{p['dataset']['name']})")
        self.__name__ = "pita_reward"

    def __call__(self, prompts, completions, example_id, completion_ids=None, **kw) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        exs = [self.examples[i] for i in example_id]
        if self.proxy is not None:
            return self._proxy_scores(exs, texts, completion_ids)
        from pita.generation.recipes import Scorer

        scorer = Scorer(task=self.p["task"], extractor=exs[0].meta.get("extractor", "auto"),
                        bonus=float(self.p["correctness_bonus"]), rm=self.rm)
        return [float(s["reward"]) for s in scorer(exs, texts)]

    def _proxy_scores(self, exs, texts, completion_ids=None) -> list[float]:
        """The proxy's score of each completion as it was trained on pairs: with EOS when the
        completion ended, without when the length limit cut it off (TRL passes each completion's
        ids up to and including its first EOS)."""
        from pita.guidance.proxy import score_sequences, text_ids

        if getattr(self, "_tok", None) is None:
            from transformers import GenerationConfig

            from pita.models.chat import load_tokenizer

            self._tok = load_tokenizer(self.p["reference"], self.p.get("chat_template_kwargs"))
            self._eos = {self._tok.eos_token_id}
            try:
                e = GenerationConfig.from_pretrained(self.p["reference"]).eos_token_id
                self._eos.update([e] if isinstance(e, int) else list(e or []))
            except OSError:
                pass
        ended = [True] * len(texts) if completion_ids is None else \
            [bool(ids) and int(ids[-1]) in self._eos for ids in completion_ids]
        return score_sequences(self.proxy, [text_ids(self._tok, e.prompt, t, f) for e, t, f in zip(exs, texts, ended)],
                               self.device, batch=max(1, int(self.p.get("micro_batch_size") or 64)))


def grpo_steps(p: dict, n_prompts: int) -> int:
    """Optimizer steps of a GRPO round: ``max_steps`` when set, else ``epochs`` passes over the
    ``n_prompts`` training prompts at ``batch_size / num_generations`` prompts a step (at least 1)."""
    if p.get("max_steps"):
        return int(p["max_steps"])
    per_step = p["batch_size"] // p["num_generations"]
    return max(1, math.ceil(float(p["epochs"]) * n_prompts / per_step - 1e-9))


def longest_prompt(tok, examples) -> int:
    """Tokens of the longest training prompt as the trainer feeds it (the chat template's user turn
    and the assistant's opening)."""
    return max(len(tok.apply_chat_template(user(e.prompt), add_generation_prompt=True, tokenize=True,
                                           return_dict=False)) for e in examples)


def grpo_arguments(ctx, p: dict, examples, tok, cuda: bool, model=None):
    """TRL's GRPOConfig for the job (``examples``: its training prompts; ``tok``: its tokenizer;
    ``model``: its policy)."""
    from trl import GRPOConfig as TRLGRPOConfig

    from pita.tracking import tracker_settings

    extra = {}
    if p.get("chat_template_kwargs"):  # baked into tok too (load_policy); vLLM renders with its own
        extra["chat_template_kwargs"] = dict(p["chat_template_kwargs"])
    if p["use_vllm"]:
        # vLLM sizes its KV cache for the model's whole context unless told otherwise (131,072
        # tokens for Llama 3.1: ~16 GB, more than a colocated share holds); a sequence here is at
        # most the longest prompt and the completion
        extra.update(use_vllm=True, vllm_mode=p["vllm_mode"], vllm_gpu_memory_utilization=p["vllm_gpu_memory_utilization"],
                     vllm_max_model_length=longest_prompt(tok, examples) + int(p["max_completion_length"]))
    # TRL's GRPO defaults moved between releases (loss bnpo up to 0.23, dapo from 0.24; reward
    # scaling a bool before "group"): always named, from algos.<A>.loss_type / scale_rewards (the
    # paper's GRPO unless switched); jobs planned before these keys existed ran dapo
    return training_args(TRLGRPOConfig, p, str(ctx.paths.artifacts / "trainer"), cuda, tracker_settings(ctx),
                         model=model, max_steps=grpo_steps(p, len(examples)),
                         num_generations=p["num_generations"], max_completion_length=p["max_completion_length"],
                         temperature=p["temperature"], loss_type=p.get("loss_type", "dapo"),
                         scale_rewards=p.get("scale_rewards", "group"),
                         importance_sampling_level="token", mask_truncated_completions=False, num_iterations=1,
                         **extra)


def grpo_trainer(ctx, p: dict):
    """TRL's GRPOTrainer for a training job's params (the policy of the round, the rewards, and the
    KL reference: the original model unless ``ref_policy=previous``)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from pita.datasets.config import DatasetConfig
    from pita.datasets.loading import load_examples
    from pita.models.lm import default_device

    cuda = on_cuda()
    path, model, tok = load_policy(ctx, p, cuda)
    examples = load_examples(DatasetConfig(**p["dataset"]), "train")
    if not examples:
        raise JobError(f"GRPO: the training split of {p['dataset']['name']} is empty")
    proxy = ctx.dep_result(p["proxy"])["checkpoint"] if p.get("proxy") else None
    reward = Rewards(p, proxy, default_device())
    ds = Dataset.from_list([{"prompt": user(e.prompt), "example_id": e.id} for e in examples])
    args = grpo_arguments(ctx, p, examples, tok, cuda, model)
    steps = args.max_steps
    # TRL builds its KL reference from the path the policy was loaded from, which after round 0 is
    # the previous round's checkpoint; point it at the original model (what every row's KL, and
    # DPO's reference, are measured against) unless the user asked for the previous policy
    kl_ref = p["reference"] if p.get("ref_policy", "original") == "original" else path
    model.config._name_or_path = kl_ref
    ctx.log.info("GRPO from %s: %d steps (%s), %d completions per step (%d prompts x %d), beta %s, loss %s, "
                 "reward scaling %s, KL reference %s, reward %s", path, steps,
                 "max_steps" if p.get("max_steps") else f"{p['epochs']:g} passes over {len(examples)} prompts",
                 p["batch_size"], p["batch_size"] // p["num_generations"],
                 p["num_generations"], p["beta"], args.loss_type, args.scale_rewards, kl_ref,
                 "proxy " + proxy if proxy else ("reward model" if reward.rm else "verifier"))
    trainer = job_trainer(GRPOTrainer)(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                          peft_config=peft_config(p, ctx.log))
    trainer.rows_per_generate = p.get("rows_per_generate")
    trainer.rows_per_generate_micro = int(p.get("rows_per_generate_micro") or 0)
    if not p.get("use_vllm"):
        from pita.core.memory import generate_calls

        batch = args.per_device_train_batch_size * args.steps_per_generation
        ctx.log.info("GRPO samples %d rows a device per generation batch in %d generate call(s) of at most %d rows",
                     batch, generate_calls(batch, trainer.generate_rows()), trainer.generate_rows())
    model.config._name_or_path = path
    return trainer, tok


@job_kind("algo.grpo_train")
def grpo_train(ctx):
    p = ctx.params
    if p.get("devices", 1) > 1 and world_size() == 1:
        return run_distributed(ctx, "algo.grpo_train", p["devices"])
    trainer, tok = grpo_trainer(ctx, p)
    res, steps = train_and_save(ctx, trainer, tok, p, "reward")
    # every optimizer step draws batch_size completions online, each scored by the reward
    # (TRL logs every step: its mean completion length gives the tokens sampled)
    n = int(res["steps"]) * int(p["batch_size"])
    return {**res, "sequences": n, "scored": n,
            "tokens": round(sum(float(h.get("completions/mean_length") or 0.0) for h in steps) * int(p["batch_size"])),
            "reward_first": steps[0]["reward"] if steps else None,
            "reward_last": steps[-1]["reward"] if steps else None, "kl_last": steps[-1].get("kl") if steps else None}
