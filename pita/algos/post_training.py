"""``PostTrainingAlgorithms``: the base of DPO, GRPO and GRPO-HF, which train the policy with TRL.

Per (algorithm, family, dataset) and round r the policy of round r is round r-1's trained model
(round 0 starts from the reference); each subclass plans what its round collects and trains
(``plan_round``), and every round ends in an evaluation of the trained policy (no guidance) on
the test split, with each sample's log-prob under the policy and under the reference processed
identically (KL).

Here: the keys every TRL-trained algorithm shares, their checks, the learning-rate and beta arms,
and the plan of a round. The runtime the jobs call (TRL's arguments, loading, FSDP2, checkpoints,
the saved policy) is ``pita/training``.

Batch sizes are effective (global) sizes: ``batch_size`` sequences per optimizer step whatever
the number of devices, split as ``batch_size / (devices * gradient_accumulation_steps)`` per
device per micro-step. The divisibility rules TRL imposes are checked when the plan is built.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from typing import List, Optional

from pita.algos.base import AlgoConfig, Algorithm, PlanContext, check_common, effective_training, training_settings
from pita.core.job import TRAINING_RETRY, Job, Resources
from pita.core.names import unknown_name
from pita.training.arguments import fsdp_unavailable

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
    # (docs/decisions/baselines-on-arith-tiny.md)
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

    def sync_problems(self, cfg) -> list[str]:
        """The installed transformers against a sharded job with gradient accumulation (a run's
        check, after gpu=auto chose devices and micro-batches; a plan for another node does not ask)."""
        from pita.training.arguments import accumulation_sync_problem

        if self.c.sharding != "fsdp":
            return []
        problem = accumulation_sync_problem(self.key, int(self.c.devices), int(self.accumulation_steps(cfg)))
        return [problem] if problem else []

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
            "snapshots": snapshot_fractions(cfg),
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
        import dataclasses

        base = {**self.train_params(p), "lr": lr, "beta": beta}
        jobs: list[Job] = []
        prev, merges = None, []
        for r in range(p.cfg.experiment.rounds):
            round_jobs = self.plan_round(p, r, prev, merges, base)
            train = round_jobs[-1].id
            jobs += round_jobs
            jobs += p.evaluations(self.name, r, train, policy={"model_from_job": train,
                                                                "reference": p.paths["reference"]})
            for f in snapshot_fractions(p.cfg):  # the policy along training: one pseudo-arm per snapshot
                at = dataclasses.replace(p, variant=" ".join(x for x in (p.variant, f"at {f:.0%}") if x),
                                         variant_id="-".join(x for x in (p.variant_id, f"ck{round(f * 100)}") if x))
                sub = at.evaluations(self.name, r, train, policy={"model_from_job": train, "snapshot": f"{f:g}",
                                                                  "reference": p.paths["reference"]})
                for j in sub:
                    if j.kind == "eval.merge":
                        j.params["may_be_empty"] = True  # a run too short to reach the snapshot: no rows
                jobs += sub
            prev = train
        return jobs


def snapshot_fractions(cfg) -> list[float]:
    """``eval.checkpoints``: the fractions of a policy's training it is also evaluated at."""
    return sorted({float(f) for f in (cfg.eval.get("checkpoints") or [])})


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]

