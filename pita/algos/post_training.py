"""``PostTrainingAlgorithms``: the base of DPO, GRPO and GRPO-HF, which train the policy with TRL.

Per (algorithm, family, dataset) and round r the policy of round r is round r-1's trained model
(round 0 starts from the reference); each subclass plans what its round collects and trains
(``plan_round``), and every round ends in an evaluation of the trained policy (no guidance) on
the test split, with each sample's log-prob under the policy and under the reference processed
identically (KL).

What the trainers share lives here once: the TRL arguments (``training_args``), loading the
policy, LoRA through peft, and the train-and-save tail (``train_and_save``: log history to
``metrics.jsonl``, the policy written by rank 0, LoRA merged so evaluation loads a plain model).

Batch sizes are effective (global) sizes: ``batch_size`` sequences per optimizer step whatever
the number of devices, split as ``batch_size / (devices * gradient_accumulation_steps)`` per
device per micro-step. The divisibility rules TRL imposes are checked when the plan is built.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from pita.algos.base import AlgoConfig, Algorithm, PlanContext, check_common, effective_training, training_settings
from pita.algos.distributed import is_rank0
from pita.core.errors import JobError
from pita.core.job import TRAINING_RETRY, Job, Resources
from pita.core.names import unknown_name

log = logging.getLogger(__name__)

REF_POLICIES = ("original", "previous")
SHARDINGS = ("none", "fsdp")
TOY_PARAMS = 50_000_000  # below this a model is a toy (the tiny family), with toy learning rates
# (algorithm kind, scale) -> default learning rate. Sources: DPO full 5e-7 and LoRA 5e-6 are the
# alignment-handbook's Zephyr-7B-beta DPO recipes (recipes/zephyr-7b-beta/dpo/config_full.yaml,
# config_qlora.yaml; TRL's own DPOConfig default is 1e-6); GRPO full 1e-6 is TRL's GRPOConfig
# default; GRPO LoRA 1e-5 is this project's choice (10x the full rate, as for DPO); the toy rates
# were measured on the embedded default
LEARNING_RATES = {("dpo", "full"): 5e-7, ("dpo", "lora"): 5e-6, ("dpo", "toy"): 1e-5,
                  ("grpo", "full"): 1e-6, ("grpo", "lora"): 1e-5, ("grpo", "toy"): 5e-5}
# the learning-rate grid a null lr searches, as multiples of the scale's rate: the full
# fine-tuning rates come from 7B recipes and barely move a small model (DPO 5e-7 for 64 steps
# moved a 135M model 0.04 nats), so under 1B parameters the grid reaches 100x upwards; the LoRA
# rates are this project's choice, so they get a grid too; from 1B the recipes' own scale keeps
# its one rate (a grid there multiplies the costliest jobs of a paper grid: paper_math on qwen3
# 8xH100 plans 85.5 h with x1, 3, 10 against 35.9 h). Each rate is an arm of its own, chosen on
# the validation prompts like η; the toy rates were measured already
LR_GRIDS = {"toy": (1.0,), "lora": (1.0, 3.0, 10.0), "small": (1.0, 10.0, 100.0), "recipe": (1.0,)}
SMALL_PARAMS = 1_000_000_000  # full fine-tuning under 1B parameters: the 7B recipes' rates are too small


def arm_token(x: float) -> str:
    """A grid value as a job-id token without dots: ``1e-05``, ``5e-01``, ``2e00``, ``0``; a value
    one digit of mantissa does not hold keeps three (``1.5e-05`` -> ``1p5e-05``)."""
    if x == 0:
        return "0"
    one = f"{x:.0e}"
    if float(one) != x:
        mantissa, exponent = f"{x:.2e}".split("e")
        one = f"{mantissa.rstrip('0').rstrip('.').replace('.', 'p')}e{exponent}"
    return one.replace("e+", "e")  # job ids take letters, digits, '.', '_' and '-'


@dataclass
class PostTrainingConfig(AlgoConfig):
    """Keys of every TRL-trained algorithm (DPO, GRPO, GRPO-HF)."""

    # learning rate; null: by scale (sources in LEARNING_RATES): full fine-tuning of a real model
    # DPO 5e-7 (Zephyr-7B-beta's recipe) / GRPO 1e-6 (TRL's default), LoRA 5e-6 / 1e-5; a toy model (under 50M
    # parameters, the tiny family) DPO 1e-5 / GRPO 5e-5, as measured on the embedded default
    # (docs/architecture.md, "Why the baselines lose to the reference on arith")
    lr: Optional[float] = None
    # learning rates to try, each an arm of its own (job ids <algo>.<family>.<dataset>.lr<rate>.r<k>.*,
    # rows with variant lr=<rate>), the frontier and the reported arm chosen on the validation
    # prompts; null: the single lr when set, else a grid around the scale's rate (LR_GRIDS): x1,
    # 10, 100 for full fine-tuning under 1B parameters, x1, 3, 10 for LoRA; one rate from 1B (the
    # recipes' own scale) and for a toy model
    lr_grid: Optional[List[float]] = None
    beta: float = 0.1  # KL coefficient: DPO's beta, GRPO's beta (KL to the reference); 0 = no KL term
    # KL coefficients to try, each an arm of its own like lr_grid's rates (crossed with them: ids
    # <algo>.<family>.<dataset>.lr<rate>-beta<b>.r<k>.*, rows with variant "lr=<rate> beta=<b>"),
    # chosen on the validation prompts; null: beta alone. Set, it replaces beta
    beta_grid: Optional[List[float]] = None
    # the KL reference in rounds after the first: original (the family's reference model, the one
    # every row's KL is measured against) | previous (the round's starting policy)
    ref_policy: str = "original"
    gradient_accumulation_steps: int = 1  # ignored when training.micro_batch_size is set (then derived)
    devices: int = 1  # devices per training job (> 1: data-parallel through accelerate, or sharded with sharding=fsdp)
    # none: every device holds the whole model (data-parallel); fsdp: the weights, gradients and
    # AdamW state are split over the job's devices (FSDP2 through accelerate; devices >= 2, full
    # fine-tuning). gpu=auto switches to fsdp over the fewest devices that fit when one does not
    sharding: str = "none"
    lora_r: int = 0  # LoRA rank through peft; 0 = full fine-tuning
    lora_alpha: int = 16  # LoRA scaling
    lora_target_modules: List[str] = field(default_factory=lambda: ["q_proj", "v_proj"])  # module names LoRA adapts


class PostTrainingAlgorithm(Algorithm):
    Config = PostTrainingConfig
    train_kind = ""  # the job kind of the round's training job

    def check(self, cfg, n_devices: int) -> list[str]:
        c, k = self.c, self.key
        p = check_common(k, c)
        if c.ref_policy not in REF_POLICIES:
            p.append(unknown_name(f"{k}.ref_policy", c.ref_policy, REF_POLICIES))
        if c.lr_grid is not None:
            grid = list(c.lr_grid)
            if c.lr is not None:
                p.append(f"{k}.lr={c.lr} and {k}.lr_grid={grid} are both set; set one (lr: one rate, lr_grid: the "
                         f"rates to choose among on validation)")
            if not grid or any(not x > 0 for x in grid) or len(set(grid)) != len(grid):
                p.append(f"{k}.lr_grid={grid} must list distinct learning rates > 0, e.g. [1e-6,1e-5,1e-4]")
        if c.beta < 0:
            p.append(f"{k}.beta={c.beta} must be >= 0 (the KL coefficient; 0 = no KL term)")
        if c.beta_grid is not None:
            grid = list(c.beta_grid)
            if not grid or any(not x >= 0 for x in grid) or len(set(grid)) != len(grid):
                p.append(f"{k}.beta_grid={grid} must list distinct KL coefficients >= 0, e.g. [0.01,0.1,0.5] "
                         f"(or null for {k}.beta alone)")
        for name, grid in (("lr_grid", c.lr_grid), ("beta_grid", c.beta_grid)):
            tokens = [arm_token(float(x)) for x in grid or ()]
            if len(set(tokens)) < len(set(grid or ())):
                p.append(f"{k}.{name}={list(grid)}: two values share a job id ({', '.join(tokens)}); keep values "
                         f"that differ in their first three significant digits")
        for key in ("gradient_accumulation_steps", "devices"):
            if getattr(c, key) < 1:
                p.append(f"{k}.{key}={getattr(c, key)} must be >= 1")
        if c.devices > n_devices >= 1:
            p.append(f"{k}.devices={c.devices} but this machine has {n_devices} device(s); lower it")
        micro = effective_training(cfg, c)[0]
        where = f"{k}.micro_batch_size" if getattr(c, "micro_batch_size", None) is not None else "training.micro_batch_size"
        micro = micro if isinstance(micro, int) and not isinstance(micro, bool) else -1  # auto: chosen to divide
        if micro > 0:
            per = c.devices * micro
            if c.batch_size >= 1 and c.devices >= 1 and c.batch_size % per:
                p.append(f"{k}.batch_size={c.batch_size} must be divisible by {k}.devices x {where} "
                         f"= {c.devices} x {micro} = {per} (the effective batch is made of micro-batches of "
                         f"{micro} per device; accumulation steps are derived)")
        elif micro == 0:  # a negative value is reported once, by the plan
            step = c.devices * c.gradient_accumulation_steps
            if c.batch_size >= 1 and step >= 1 and c.batch_size % step:
                p.append(f"{k}.batch_size={c.batch_size} must be divisible by {k}.devices x "
                         f"{k}.gradient_accumulation_steps = {c.devices} x {c.gradient_accumulation_steps} = {step} "
                         f"(it is the effective batch; each device gets batch_size / {step} per micro-step)")
        auto = str(cfg.training.micro_batch_size) == "auto"  # gpu=auto chooses the devices (checked again after)
        p += self.sharding_problems(n_devices, devices_chosen=not auto)
        if c.lora_r < 0:
            p.append(f"{k}.lora_r={c.lora_r} must be >= 0 (0 = full fine-tuning)")
        if c.lora_r > 0 and not c.lora_target_modules:
            p.append(f"{k}.lora_target_modules is empty; name the modules LoRA adapts, e.g. [q_proj,v_proj]")
        if c.lora_r > 0 and importlib.util.find_spec("peft") is None:
            p.append(f"{k}.lora_r={c.lora_r} needs peft, which is not installed: pip install -e '.[lora]' "
                     f"(or set {k}.lora_r=0 for full fine-tuning)")
        return p

    def sharding_problems(self, n_devices: int, devices_chosen: bool = True) -> list[str]:
        """``sharding`` against the job's devices, LoRA and what this torch can do."""
        c, k = self.c, self.key
        if c.sharding not in SHARDINGS:
            return [unknown_name(f"{k}.sharding", c.sharding, SHARDINGS)]
        if c.sharding != "fsdp":
            return []
        p = []
        if devices_chosen and c.devices < 2:
            more = f"e.g. {k}.devices={min(n_devices, 2) if n_devices >= 2 else 2}"
            p.append(f"{k}.sharding=fsdp with {k}.devices={c.devices}: there is nothing to split the model over; "
                     f"set {more} (or gpu=auto to choose), or {k}.sharding=none")
        if c.lora_r > 0:
            p.append(f"{k}.sharding=fsdp with {k}.lora_r={c.lora_r}: LoRA jobs are not sharded here (the adapters are "
                     f"merged into a whole model when the job ends); set {k}.lora_r=0 for sharded full fine-tuning, "
                     f"or {k}.sharding=none (a LoRA job keeps only the frozen weights and the adapters per device)")
        why = fsdp_unavailable()
        if why:
            p.append(f"{k}.sharding=fsdp: {why}; set {k}.sharding=none")
        return p

    def check_models(self, paths: dict) -> list[str]:
        """LoRA target modules must exist in the model (checked on an empty-weight copy)."""
        c = self.c
        if c.lora_r <= 0:
            return []
        from pita.models.shapes import linear_modules, lora_targets

        model_path = paths["reference"]
        linear = linear_modules(model_path, "model.reference")
        missing = [t for t in lora_targets(model_path, c.lora_target_modules, "model.reference") if t not in linear]
        if missing:
            return [f"{self.key}.lora_target_modules: {', '.join(missing)} not found in {model_path}; "
                    f"its linear modules are: {', '.join(sorted(linear))}"]
        return []

    def per_device_batch(self) -> int:
        return self.c.batch_size // max(1, self.c.devices)

    def lora_targets(self, p: PlanContext) -> list[str]:
        """lora_target_modules as the reference names them (q_proj, v_proj -> qkv_proj where fused)."""
        if self.c.lora_r <= 0:
            return list(self.c.lora_target_modules)
        from pita.models.shapes import lora_targets

        return lora_targets(p.paths["reference"], self.c.lora_target_modules, "model.reference")

    lr_family = "dpo"  # which row of LEARNING_RATES a null lr takes

    def betas(self) -> list[float]:
        """The KL coefficients to train with, one arm each: ``beta_grid``, else ``beta``."""
        return [float(x) for x in self.c.beta_grid] if self.c.beta_grid is not None else [float(self.c.beta)]

    def learning_rates(self, p: PlanContext) -> list[float]:
        """The rates to train with, one arm each: ``lr_grid``; ``lr``; or when both are null the
        grid around the default for the policy's scale and the kind of fine-tuning."""
        if self.c.lr_grid is not None:
            return [float(x) for x in self.c.lr_grid]
        if self.c.lr is not None:
            return [float(self.c.lr)]
        n = p.policy_params
        scale = "lora" if self.c.lora_r > 0 else ("toy" if n is not None and n < TOY_PARAMS else "full")
        lr = LEARNING_RATES[(self.lr_family, scale)]
        size = ("toy" if n is not None and n < TOY_PARAMS else scale if scale != "full" else
                "small" if n is None or n < SMALL_PARAMS else "recipe")
        grid = [float(f"{lr * f:.3g}") for f in LR_GRIDS[size]]
        log.info("%s.lr=null: %s (%s; reference policy of %s parameters)", self.key, ", ".join(f"{x:g}" for x in grid),
                 {"lora": "LoRA", "toy": "a toy model", "full": "full fine-tuning"}[scale],
                 f"{n / 1e6:.0f}M" if n else "unknown")
        return grid

    # ---------------------------------------------------------------- planning
    def accumulation_steps(self, cfg) -> int:
        """Gradient accumulation per optimizer step: derived from training.micro_batch_size when that
        is set (batch_size / (devices x micro)), else algos.<A>.gradient_accumulation_steps."""
        c = self.c
        micro = int(effective_training(cfg, c)[0])
        if micro > 0:
            return max(1, c.batch_size // (c.devices * micro))
        return c.gradient_accumulation_steps

    def train_params(self, p: PlanContext) -> dict:
        """Params of every round's training job (the subclass adds its own keys)."""
        import dataclasses

        c, cfg = self.c, p.cfg
        return {
            "algo": self.name, "task": p.task, "dataset": dataclasses.asdict(p.ds),
            "reference": p.paths["reference"], "lr": self.learning_rates(p)[0], "beta": self.betas()[0],
            "batch_size": c.batch_size,
            "gradient_accumulation_steps": self.accumulation_steps(cfg), "devices": c.devices, "sharding": c.sharding,
            "lora_r": c.lora_r, "lora_alpha": c.lora_alpha, "lora_target_modules": self.lora_targets(p),
            **training_settings(cfg, c, whole=c.batch_size // (c.devices * self.accumulation_steps(cfg))),
            "num_workers": c.num_workers,
            "dtype": cfg.model.dtype, "attn_impl": cfg.system.attn_impl, "tf32": cfg.system.tf32,
            "compile": cfg.system.compile, "ref_policy": c.ref_policy, "save_steps": cfg.training.save_steps,
        }

    def collect_pairs(self, p: PlanContext, r: int, prev: str | None) -> tuple[list[Job], str]:
        """(new jobs, merge id): round r's preference pairs sampled from the round's policy (the
        reference at round 0, shared with every algorithm asking for the same pairs)."""
        from pita.algos.base import preference_labels

        req = p.data_request()
        req["recipe"] = "preference_pairs"
        req["seed"] = p.seed(r)
        labels = preference_labels(p.cfg)  # the same budget and labelling as the value-guided pairs
        req["n"] = 2 * labels["pairs_per_prompt"]
        req["preferences"] = {"beta": labels["beta"], "sampling": labels["bt_sampling"],
                              "label_seed": labels["label_seed"], "pairs_per_prompt": labels["pairs_per_prompt"],
                              "round": r}  # each round's pairs get draws of their own
        if prev:
            req["policy"]["model_from_job"] = prev
        return p.collect(req, f"{p.prefix(self.name)}.r{r}.gen", [prev] if prev else [], r)

    def train_job(self, p: PlanContext, r: int, deps: list[str], params: dict) -> Job:
        return Job(id=f"{p.prefix(self.name)}.r{r}.train", kind=self.train_kind, deps=deps, group=f"round {r}",
                   params=params, resources=Resources(self.c.devices, p.mem[f"policy_train.{self.name}"]),
                   retry=TRAINING_RETRY, duration_hint=4.0)

    def plan_round(self, p: PlanContext, r: int, prev: str | None, merges: list[str], base: dict) -> list[Job]:
        """Round r's collection and training jobs (the training job last)."""
        raise NotImplementedError(f"{type(self).__name__}.plan_round")

    def plan(self, p: PlanContext) -> list[Job]:
        import dataclasses

        rates, betas = self.learning_rates(p), self.betas()
        if len(rates) == 1 and len(betas) == 1:
            return self.plan_arm(p, rates[0], betas[0])
        jobs: list[Job] = []
        for lr in rates:  # one arm per setting: its own rounds and evaluations, rows with variant lr=<rate>
            for beta in betas:
                label = [f"lr={lr:g}"] * (len(rates) > 1) + [f"beta={beta:g}"] * (len(betas) > 1)
                ident = [f"lr{arm_token(lr)}"] * (len(rates) > 1) + [f"beta{arm_token(beta)}"] * (len(betas) > 1)
                arm = dataclasses.replace(p, variant=" ".join(label), variant_id="-".join(ident))
                jobs += self.plan_arm(arm, lr, beta)
        return jobs

    def plan_arm(self, p: PlanContext, lr: float, beta: float) -> list[Job]:
        base = {**self.train_params(p), "lr": lr, "beta": beta}
        jobs: list[Job] = []
        prev, merges = None, []
        for r in range(p.cfg.experiment.rounds):
            round_jobs = self.plan_round(p, r, prev, merges, base)
            train = round_jobs[-1].id
            jobs += round_jobs
            jobs += p.evaluations(self.name, r, train, policy={"model_from_job": train,
                                                                "reference": p.paths["reference"]})
            prev = train
        return jobs


# ---------------------------------------------------------------- training (in the job's worker)
def on_cuda() -> bool:
    from pita.models.lm import default_device

    return default_device().startswith("cuda")


def _checkpointing_key(cls) -> str:
    """transformers 5.x renamed TrainingArguments' ``gradient_checkpointing`` to
    ``activation_checkpointing`` (the old name still works, with a FutureWarning per job)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def device_steps(p: dict) -> tuple[int, int]:
    """(rows per device and micro-step, accumulation steps) of a training job: from its
    micro_batch_size when set (an OOM retry halves it; accumulation rises so the effective
    batch_size stays), else from gradient_accumulation_steps. A micro-batch that does not divide
    the per-device batch becomes the largest that does below it."""
    per_device_batch = max(1, p["batch_size"] // max(1, p["devices"]))
    micro = int(p.get("micro_batch_size") or 0)
    if micro <= 0:
        acc = max(1, int(p["gradient_accumulation_steps"]))
        return max(1, per_device_batch // acc), acc
    micro = next(m for m in range(min(micro, per_device_batch), 0, -1) if per_device_batch % m == 0)
    return micro, per_device_batch // micro


def fsdp_unavailable() -> str | None:
    """Why this torch / accelerate cannot shard a model with FSDP2, or None when they can."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "this torch has no torch.distributed"
    if not dist.is_available():
        return "this torch was built without torch.distributed (no process groups, so no sharding)"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return "this torch has no FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6): upgrade torch"
    try:
        from accelerate.utils import FullyShardedDataParallelPlugin
    except ImportError:
        return "accelerate is not installed"
    import dataclasses

    if "fsdp_version" not in {f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)}:
        return "this accelerate has no FSDP2 (fsdp_version): pip install -U 'accelerate>=1.6'"
    return None


def fsdp_settings(p: dict) -> dict:
    """TrainingArguments' FSDP2 keys for a ``sharding=fsdp`` job: every decoder layer its own unit
    (all-gathered for its forward and backward, resharded after), the full state dict gathered
    to rank 0 for the saved policy. FSDP's own activation checkpointing replaces the Trainer's
    (which would all-gather each layer a second time)."""
    import transformers

    config = {"version": 2, "reshard_after_forward": True, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
              # mid-training checkpoints: each rank writes its own shard of the weights and the AdamW
              # state (torch.distributed.checkpoint), read back on the same world size; the final
              # policy is gathered whole by _save_policy, whatever this says
              "state_dict_type": "SHARDED_STATE_DICT",
              # rank 0 alone reads the weights; the other ranks build the models empty
              # (load_model) and receive their shards from rank 0 as accelerate shards them
              "cpu_ram_efficient_loading": True,
              "activation_checkpointing": bool(p["gradient_checkpointing"])}
    # transformers 5 takes fsdp=True with the options in fsdp_config; 4.x the option string
    legacy = int(transformers.__version__.split(".")[0]) < 5
    return {"fsdp": "full_shard auto_wrap" if legacy else True, "fsdp_config": config}


def sharded_trainer(cls):
    """``cls`` (a TRL trainer) that also shards on CPU. accelerate turns FSDP on for GPU process
    groups only; with gloo it silently trains data-parallel. Where the job asked for FSDP and
    accelerate chose plain multi-CPU, this enables accelerate's own FSDP2 path on the gloo group
    (FSDP2's fully_shard runs there), so the job's code path is the one a GPU node runs."""

    class Sharded(cls):
        def __init__(self, *args, **kw):
            sharded = kw.get("args") is not None and kw["args"].fsdp_plugin_args is not None
            with layered_reference_sharding(cls, empty=sharded and empty_here({"sharding": "fsdp"})):
                super().__init__(*args, **kw)

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

            acc = self.accelerator
            if self.args.fsdp_plugin_args is None or acc.distributed_type != DistributedType.MULTI_CPU:
                return
            plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)

            def as_fsdp():  # accelerate's shared state is rebuilt from the environment during training:
                acc.state.fsdp_plugin = plugin  # asserted again before each model is prepared
                acc.state.distributed_type = DistributedType.FSDP

            for name in ("prepare", "prepare_model"):
                def prepare(*args, _inner=getattr(acc, name), **kw):
                    as_fsdp()
                    return _inner(*args, **kw)

                setattr(acc, name, prepare)
            as_fsdp()
            self._as_fsdp = as_fsdp
            self.is_fsdp_enabled = True

        def _generate_single_turn(self, *args, **kw):  # GRPO's sampling (DPO never calls it)
            with gathered_for_generation(self.model_wrapped, enabled=not getattr(self.args, "use_vllm", False)):
                return super()._generate_single_turn(*args, **kw)

        def _save_checkpoint(self, *args, **kw):  # a checkpoint of shards is written by every rank
            if getattr(self, "_as_fsdp", None):
                self._as_fsdp()
            return super()._save_checkpoint(*args, **kw)

        def _load_from_checkpoint(self, *args, **kw):
            if getattr(self, "_as_fsdp", None):
                self._as_fsdp()
            return super()._load_from_checkpoint(*args, **kw)

    Sharded.__name__ = Sharded.__qualname__ = f"Sharded{cls.__name__}"
    return Sharded


@contextlib.contextmanager
def layered_reference_sharding(cls, empty: bool = False):
    """While ``cls`` (a TRL trainer) is built, its frozen reference is sharded one decoder layer per
    FSDP unit, as accelerate shards the policy. TRL's ``prepare_fsdp`` calls ``fully_shard`` on the
    reference's root alone, so every reference forward all-gathers the whole model on every rank
    beside the policy's live activations (8B in bf16: 16 GB per rank, where the plan counts 16/k);
    per layer, one layer is gathered at a time. TRL resolves ``prepare_fsdp`` from its trainer
    modules, so it is replaced there for the duration of the constructor (TRL is bounded < 1.17)."""
    import sys

    mods = {sys.modules[k.__module__] for k in cls.__mro__ if hasattr(sys.modules.get(k.__module__), "prepare_fsdp")}
    saved = {m: (m.prepare_fsdp, getattr(m, "create_model_from_path", None)) for m in mods}
    try:
        for m, (prepare, create) in saved.items():
            m.prepare_fsdp = functools.partial(_shard_reference_layers, prepare)
            if create is not None:
                m.create_model_from_path = functools.partial(_reference_from_path, create, empty)
        yield
    finally:
        for m, (prepare, create) in saved.items():
            m.prepare_fsdp = prepare
            if create is not None:
                m.create_model_from_path = create


def _reference_from_path(create, empty: bool, model_id, *args, **kw):
    """TRL's reference as TRL builds it; ``empty`` (a sharded job's ranks other than 0): built
    without its weights, which come from rank 0 in :func:`_shard_reference_layers`."""
    if not empty:
        return create(model_id, *args, **kw)
    return load_model(model_id, kw.get("dtype") or "float32", kw.get("attn_implementation"), empty=True)


def _shard_reference_layers(prepare, model, accelerator):
    """Shard ``model`` into the units accelerate gives the policy (FSDP2, TRANSFORMER_BASED_WRAP):
    each decoder layer (the ``_no_split_modules`` classes), the input embeddings when they are not
    tied to the head, and the tail (final norm, head, and the tied embeddings) as one group; then
    TRL's ``prepare`` shards the root. The reference runs forward passes only, so every unit is
    resharded after its forward. A job's plugin reads the weights on rank 0 alone
    (``cpu_ram_efficient_loading``), so there accelerate's own ``fsdp2_prepare_model`` does this
    and sends the shards; the explicit units below serve a plugin without that setting
    (bench.memory_truth's fake-tensor rank, which has no peers to receive from)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    plugin = accelerator.state.fsdp_plugin
    if (plugin is not None and plugin.fsdp_version == 2 and not isinstance(model, FSDPModule)
            and getattr(plugin, "cpu_ram_efficient_loading", False)):
        # rank 0 alone holds the weights: accelerate's own preparation shards the reference into
        # the policy's units and sends each rank its shards. Frozen first, so it stays in its
        # dtype (accelerate upcasts trainable parameters to fp32 master weights)
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        model.requires_grad_(False)
        model = fsdp2_prepare_model(accelerator, model)
    elif plugin is not None and plugin.fsdp_version == 2 and not isinstance(model, FSDPModule):
        names = set(getattr(model, "_no_split_modules", None) or [])
        mesh = getattr(accelerator, "torch_device_mesh", None)
        if mesh is not None:
            mesh = mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)]
        kw = {"reshard_after_forward": True, "offload_policy": plugin.cpu_offload,
              "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(), "mesh": mesh}
        for layer in [m for m in model.modules() if type(m).__name__ in names]:
            fully_shard(layer, **kw)
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
        tied = embed is not None and head is not None and embed.weight is head.weight
        if embed is not None and not tied:
            fully_shard(embed, **kw)
        norm = getattr(getattr(model, "base_model", None), "norm", None)
        tail = [m for m in (norm, *((embed, head) if tied else (head,))) if m is not None]
        if tail:
            fully_shard(tail, **kw)
    return prepare(model, accelerator)


@contextlib.contextmanager
def gathered_for_generation(model, enabled: bool = True):
    """While GRPO samples with a sharded policy (transformers' generate, no vLLM), every FSDP unit
    stays gathered after its first forward instead of being resharded: otherwise each decoded
    token all-gathers the whole model again (an 8B policy: about 16 GB of traffic per token per
    rank). Afterwards every unit is resharded and keeps its own setting. The gathered policy in
    the compute dtype is counted in the job's memory estimate (pita/plans/memory.py)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)] if enabled else []
    before = []
    for u in units:
        group = getattr(u._get_fsdp_state(), "_fsdp_param_group", None)  # torch's own record of the setting
        before.append(getattr(group, "post_forward_mesh_info", True) is not None)
        u.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for u, flag in zip(units, before):
            u.set_reshard_after_forward(flag, recurse=False)
            u.reshard()


def fsdp_units(model) -> int:
    """How many FSDP units ``model`` is sharded into (0: not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in model.modules()) if model is not None else 0


CHECKPOINT_SHARE = 0.05  # training.save_steps=auto: checkpoints take at most this share of a job's time
CHECKPOINT_WRITE_BPS = 0.5e9  # bytes a second assumed for the first checkpoint, before one was timed


def checkpoint_args(p: dict) -> dict:
    """TrainingArguments' checkpoint keys: every ``save_steps`` steps, or (auto) when
    :class:`CheckpointPacer` says so; the last checkpoint kept. Weights and optimizer state go to
    ``<job>/artifacts/trainer/checkpoint-<step>``, where a re-run attempt finds them."""
    s = p.get("save_steps", "auto")
    if s == 0:
        return {"save_strategy": "no"}
    if s == "auto":  # the pacer sets should_save itself
        return {"save_strategy": "no", "save_total_limit": 1}
    return {"save_strategy": "steps", "save_steps": int(s), "save_total_limit": 1}


def checkpoint_pacer(p: dict, n_params: int):
    """training.save_steps=auto: a TrainerCallback that saves when the training time since the last
    checkpoint is at least 1/CHECKPOINT_SHARE times what a checkpoint costs (the last one's
    measured time; before the first, the fp32 weights and AdamW state at CHECKPOINT_WRITE_BPS). The
    ranks of a k-device job decide together: rank 0's interval, in steps, is broadcast at the steps
    where all of them stand (the first, and each checkpoint)."""
    import time

    from transformers import TrainerCallback

    if p.get("save_steps", "auto") != "auto":
        return None

    class CheckpointPacer(TrainerCallback):
        def __init__(self):
            self.cost = 12.0 * n_params / CHECKPOINT_WRITE_BPS
            self.interval = None  # steps between checkpoints, once agreed
            self.last_step, self.t_step, self.t_save = 0, None, None
            self.step_s = None

        def on_train_begin(self, args, state, control, **kw):
            self.last_step = state.global_step  # a resumed job starts at its checkpoint: no save there
            return control

        def on_step_begin(self, args, state, control, **kw):
            self.t_step = time.monotonic()

        def on_step_end(self, args, state, control, **kw):
            took = time.monotonic() - self.t_step if self.t_step is not None else 0.0
            self.step_s = took if self.step_s is None else 0.8 * self.step_s + 0.2 * took
            if self.interval is None:
                self.interval = self._agree(state)
            if state.global_step - self.last_step >= self.interval and state.global_step < state.max_steps:
                control.should_save = True
                self.t_save = time.monotonic()
            return control

        def on_save(self, args, state, control, **kw):
            if self.t_save is not None:
                self.cost = time.monotonic() - self.t_save
            self.last_step, self.t_save = state.global_step, None
            self.interval = self._agree(state)
            return control

        def _agree(self, state) -> int:
            mine = max(1, int(self.cost / (CHECKPOINT_SHARE * max(self.step_s or 1e-3, 1e-3)) + 0.999))
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                box = [mine]
                dist.broadcast_object_list(box, src=0)
                mine = int(box[0])
            return mine

    return CheckpointPacer()


def _remove_checkpoints(out: Path, which=None) -> None:
    """Delete ``out``'s checkpoint folders (those ``which`` accepts, or all)."""
    for c in out.glob("checkpoint-*"):
        if which is None or which(c):
            shutil.rmtree(c, ignore_errors=True)


def resume_point(ctx, p: dict, out) -> tuple[str, int] | None:
    """(checkpoint, its step) a re-run attempt continues from (the last one in ``out``), or None. A
    checkpoint written under other settings (not counting the micro-batch, which an OOM retry
    halves while the effective batch stays) is removed rather than resumed, and so is one an
    attempt died while writing (the Trainer writes trainer_state.json last)."""
    import torch.distributed as dist
    from transformers.trainer_utils import get_last_checkpoint

    out = Path(out)
    keep = json.loads(json.dumps({k: v for k, v in p.items() if k not in ("micro_batch_size",
                                                                           "gradient_accumulation_steps")},
                                 sort_keys=True))
    stamp = out / "pita-params.json"
    if is_rank0():  # rank 0 clears stale and half-written checkpoints before any rank looks
        def half_written(c: Path) -> bool:
            if (c / "trainer_state.json").exists():
                return False
            ctx.log.info("removing %s: an earlier attempt was stopped while writing it", c)
            return True

        _remove_checkpoints(out, half_written)
        last = get_last_checkpoint(str(out)) if out.is_dir() else None
        if last and (not stamp.exists() or json.loads(stamp.read_text()) != keep):
            ctx.log.info("removing checkpoints written under other settings: %s", last)
            _remove_checkpoints(out)
        out.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(keep, sort_keys=True))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    last = get_last_checkpoint(str(out)) if out.is_dir() else None
    if last is None:
        return None
    return last, int(json.loads((Path(last) / "trainer_state.json").read_text())["global_step"])


def training_args(cls, p: dict, out: str, cuda: bool, tracker=None, **extra):
    """TRL's ``cls`` (DPOConfig, GRPOConfig) from a training job's params; ``tracker``
    (``pita.tracking.tracker_settings(ctx)``) sets TRL's ``report_to``."""
    import torch

    from pita.tracking import prepare_trl

    # mixed precision on CUDA: autocast in bf16 (fp16 where bf16 is unsupported or asked for),
    # fp32 master weights (load_policy)
    bf16 = cuda and p["dtype"] in ("bfloat16", "float32") and torch.cuda.is_bf16_supported()
    per_device, accumulation = device_steps(p)
    checkpointing = bool(p["gradient_checkpointing"])
    if p.get("sharding") == "fsdp":
        extra.update(fsdp_settings(p))
        checkpointing = False  # FSDP's own (fsdp_config.activation_checkpointing)
    extra.setdefault("model_init_kwargs", reference_init_kwargs(p, cuda))
    args = cls(output_dir=out, use_cpu=not cuda, bf16=bf16, fp16=cuda and not bf16 and p["dtype"] == "float16",
               tf32=bool(p["tf32"]) if cuda else None, torch_compile=bool(p["compile"]),
               per_device_train_batch_size=per_device,
               gradient_accumulation_steps=accumulation, learning_rate=p["lr"], beta=p["beta"],
               **{_checkpointing_key(cls): checkpointing}, seed=p["seed"], data_seed=p["seed"],
               logging_steps=1, **prepare_trl(tracker), **checkpoint_args(p), disable_tqdm=True,
               dataloader_num_workers=int(p.get("num_workers", 0)),
               ddp_find_unused_parameters=False if p["devices"] > 1 else None,
               # how long a rank waits in a collective: the final policy is gathered and written by
               # rank 0 while the others wait at the barrier (a 15B fp32 policy is 60 GB); 2 h, named
               # rather than left to the default (30 min)
               ddp_timeout=7200,
               # fused AdamW (transformers 5.24's default, named: the default has moved between releases).
               # torch's foreach AdamW holds a copy of every second moment while it steps: 4 more bytes
               # per parameter at the peak, measured on an H100 (bench/gpu_check.py)
               optim="adamw_torch_fused", **extra)
    if args.fsdp_plugin_args is not None and (args.bf16 or args.fp16):
        # accelerate's FSDP2 policy for bf16 / fp16 reduces the gradients in that dtype too; reduced
        # in fp32 they match what sharding=none's DDP all-reduce gives (fp32 gradients of fp32
        # master weights). The forward and backward still run in the half dtype
        half = torch.bfloat16 if args.bf16 else torch.float16
        args.fsdp_plugin_args["mixed_precision_policy"] = {"param_dtype": half, "reduce_dtype": torch.float32,
                                                          "output_dtype": half}
    return args


def reference_init_kwargs(p: dict, cuda: bool) -> dict:
    """The ``from_pretrained`` keywords TRL builds its frozen reference with (``model_init_kwargs``).

    ``device_map=None``: the reference is loaded whole on the CPU and the trainer moves it to the
    rank's device (or shards it). TRL's own default on a GPU is ``"auto"``, which it overrides
    only for DDP and DeepSpeed: under FSDP, and on a GPU shared with other jobs, accelerate would
    spread the reference over every visible GPU (or offload it to the CPU) and attach hooks that
    send activations there after the trainer has moved it to ``cuda:<rank>``: a device mismatch
    at the first reference forward. ``dtype``: the reference only runs forward passes under
    autocast, so on CUDA it is held in ``model.dtype`` (TRL otherwise copies the policy's fp32)."""
    kw = {"device_map": None}
    if cuda and p["dtype"] in ("bfloat16", "float16"):
        kw["dtype"] = p["dtype"]
    return kw


def empty_here(p: dict) -> bool:
    """Whether this process builds the job's sharded models without their weights: a rank other
    than 0 of a sharded job, whose shards come from rank 0 when the model is sharded."""
    from pita.core.ranks import rank, world_size

    return p.get("sharding") == "fsdp" and world_size() > 1 and rank() != 0


def load_model(path: str, dtype, attn_impl: str | None = None, empty: bool = False):
    """``AutoModelForCausalLM.from_pretrained(path)``, or with ``empty`` the same model built with
    uninitialised parameters and its buffers real (rotary frequencies are computed, not stored),
    reading no weights: host memory does not grow with a sharded job's ranks (each
    would otherwise hold the whole fp32 policy). accelerate's ``cpu_ram_efficient_loading``
    sends every rank its shards from rank 0's copy when the model is sharded. (transformers
    5.24 reads the weights on every rank even under that setting, hence this.)"""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {"attn_implementation": attn_impl} if attn_impl else {}
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if not empty:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    from accelerate import init_empty_weights
    from transformers import GenerationConfig

    config = AutoConfig.from_pretrained(path)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kw)
    # uninitialised host storage rather than the meta device: accelerate tells the parameters
    # apart by their data pointers when it swaps them for their shards (every meta tensor's is 0).
    # Pages never written are never resident, so this costs address space, not memory
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.to_empty(device="cpu")
    for name, value in buffers.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        module._buffers[leaf] = value
    model.tie_weights()  # the empty parameters are made one by one: tied ones become one again
    model.config._name_or_path = str(path)  # TRL builds its reference from this name
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:  # a model without generation_config.json keeps the one from_config made
        pass
    return model


def load_policy(ctx, p: dict, cuda: bool):
    """(path, model, tokenizer) of the round's starting policy: the previous round's, or the reference.

    Always fp32 weights, whatever ``model.dtype``: the optimizer then updates fp32 master weights
    and TRL's ``bf16`` / ``fp16`` (set from ``model.dtype`` on CUDA) runs the forward and backward
    passes under autocast. AdamW on bf16 weights would lose updates smaller than bf16's
    resolution, which at fine-tuning learning rates is most of them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pita.models.lm import resolve_attn_impl

    path = ctx.dep_result(p["policy_from"])["checkpoint"] if p["policy_from"] else p["reference"]
    tok = AutoTokenizer.from_pretrained(path)
    model = load_model(path, torch.float32, resolve_attn_impl(p["attn_impl"]), empty=empty_here(p))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    ctx.log.info("policy %s: fp32 weights, attention %s", path, model.config._attn_implementation)
    return path, model, tok


def peft_config(p: dict, log):
    if p["lora_r"] <= 0:
        return None
    from peft import LoraConfig

    log.info("LoRA r=%d alpha=%d on %s (merged into the saved policy)", p["lora_r"], p["lora_alpha"],
             ",".join(p["lora_target_modules"]))
    return LoraConfig(r=p["lora_r"], lora_alpha=p["lora_alpha"], target_modules=list(p["lora_target_modules"]),
                      lora_dropout=0.0, task_type="CAUSAL_LM")


def _save_policy(ctx, trainer, tok, lora: bool) -> str:
    out = ctx.paths.artifacts / "policy"
    state = None
    if is_sharded(trainer.model):  # every rank takes part in gathering the shards to rank 0's CPU
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not trainer.is_world_process_zero():  # rank 0 writes the checkpoint
        return str(out)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if lora:
        model = model.merge_and_unload()  # the evaluation loads a plain model
    if state is not None:
        _plain_copy(model, state).save_pretrained(out)
    else:
        model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _plain_copy(model, state: dict):
    """The sharded ``model`` as a plain model holding the gathered ``state`` (rank 0's full state
    dict, on the CPU): saving the FSDP module itself would reach for other ranks' shards from
    rank 0 alone. Built on the meta device and given the gathered tensors, so nothing is copied."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    plain.load_state_dict(state, strict=False, assign=True)
    plain.tie_weights()
    for name, buf in list(plain.named_buffers()):  # not in a state dict (rotary frequencies): FSDP leaves them whole
        if buf.is_meta:
            owner, _, leaf = name.rpartition(".")
            plain.get_submodule(owner).register_buffer(leaf, model.get_buffer(name).detach().cpu(), persistent=False)
    missing = [n for n, w in list(plain.named_parameters()) + list(plain.named_buffers()) if w.is_meta]
    if missing:
        raise JobError(f"the gathered policy lacks {len(missing)} tensor(s), e.g. {missing[:3]}; nothing was saved")
    plain.generation_config = model.generation_config
    return plain


def is_sharded(model) -> bool:
    """Whether the model's parameters are FSDP2 shards (DTensors)."""
    return any(hasattr(w, "to_local") for w in model.parameters())


def rank_parameters(model) -> list[int]:
    """The parameters each rank holds (a sharded parameter counts its local shard): one entry per
    rank, gathered from every rank (a collective: every rank calls it)."""
    import torch.distributed as dist

    local = sum(int(w.to_local().numel()) if hasattr(w, "to_local") else int(w.numel()) for w in model.parameters())
    if not (dist.is_available() and dist.is_initialized()):
        return [local]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, local)
    return [int(x) for x in out]


def train_and_save(ctx, trainer, tok, p: dict, key: str) -> tuple[dict, list[dict]]:
    """Train (from the job's last checkpoint when an earlier attempt left one), write the log
    history and the policy; the common result and the logged rows with ``key``."""
    import warnings

    pacer = checkpoint_pacer(p, sum(w.numel() for w in trainer.model.parameters()))  # before any sharding
    if pacer is not None:
        trainer.add_callback(pacer)
    point = resume_point(ctx, p, trainer.args.output_dir) if p.get("save_steps", "auto") != 0 else None
    last, resumed = point if point else (None, None)
    if last:
        ctx.log.info("resuming from %s (step %d; an earlier attempt of this job wrote it)", last, resumed)
    with warnings.catch_warnings():
        # TRL's own use of a transformers 5.x deprecated property, once per job: nothing the user can change
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        out = trainer.train(resume_from_checkpoint=last)
    hist = trainer.state.log_history
    if is_rank0():
        ctx.paths.write_metrics(hist)
    held = rank_parameters(trainer.model)
    units = {}
    if len(held) > 1:
        ctx.log.info("parameters held per rank: %s (%s)", ", ".join(f"{n:,}" for n in held),
                     "sharded" if is_sharded(trainer.model) else "each rank a whole copy")
    if is_sharded(trainer.model):
        units = {"policy_units": fsdp_units(trainer.model), "reference_units": fsdp_units(getattr(trainer, "ref_model", None))}
        ctx.log.info("FSDP units: policy %d, reference %d (one per decoder layer and the root)", units["policy_units"],
                     units["reference_units"])
    ckpt = _save_policy(ctx, trainer, tok, p["lora_r"] > 0)
    if is_rank0():  # the job is done: its resume points (weights and optimizer state) would only fill the disk
        _remove_checkpoints(Path(trainer.args.output_dir))
    # total_flos: transformers' own estimate of the training FLOPs (6 x parameters x tokens)
    return ({"checkpoint": ckpt, "train_loss": out.training_loss, "steps": out.global_step, "rank_params": held,
             "train_flops": float(getattr(trainer.state, "total_flos", 0.0) or 0.0) or None,
             "train_tokens": next((int(h["num_tokens"]) for h in reversed(hist) if "num_tokens" in h), None),
             "resumed_from_step": resumed, **units}, [h for h in hist if key in h])


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]
