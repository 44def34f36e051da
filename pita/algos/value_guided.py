"""``ValueGuidedAlgorithms``: the base of PITA, Q# and Q#-HF (value-guided decoding of a frozen
reference model). Each of them is a subclass in its own module that says which targets its
value model learns (``value_examples``) and what else a round needs (``round_inputs``).

Per (algorithm, family, dataset) and round r:

    gen[r]    value roll-outs (round 0 from the reference, round r > 0 from the reference guided
              by round r-1's value model at eta = algos.<A>.eta) -> merge
    [extra]   e.g. Q#-HF's proxy reward model on the pairs of rounds 0..r
    train[r]  the value model on the data of rounds 0..r, warm-started from train[r-1]
              (job kind ``algo.value_train``; the targets come from the algorithm's class)
    eval[r]   the reference guided by train[r] at every eta of algos.<A>.etas on the test split
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from pita.algos.base import ALGORITHMS, AlgoConfig, Algorithm, PlanContext, check_common, training_settings
from pita.core.errors import ConfigError, JobError
from pita.core.job import TRAINING_RETRY, Job, Resources, add_kind_module, job_kind

add_kind_module("pita.algos.value_guided")


@dataclass
class ValueGuidedConfig(AlgoConfig):
    """Keys of every value-guided algorithm (PITA, QSharp, QSharp-HF)."""

    loss: Optional[str] = None  # value-model loss: bce | mse | mle; null: the algorithm's own (PITA bce, QSharp bce on math and mle on reward tasks as the PITA reference's Q#, QSharp-HF mle)
    mode: Optional[str] = None  # guidance offset from the value head: null = bernoulli for bce/mse, mle for mle
    eta: float = 2.0  # guidance strength when round r+1 collects data with round r's model
    # evaluation sweep; eta 0 is the reference itself (its row is the base model's evaluation)
    etas: List[float] = field(default_factory=lambda: [0.0, 0.5, 1.0, 2.0, 4.0])
    # tokens the value model scores per step (the reference's top k; -1 = the whole vocabulary);
    # every other token keeps its reference probability and stays sampleable
    top_k: int = 20
    # mle: min (each state's offsets shifted so its lowest-scored candidate's is 0, as the Q#
    # reference code does: a token outside top_k then counts as the worst candidate, not as an
    # outcome of 0 in reward units) | none (as computed, the earlier behaviour)
    offset_shift: str = "min"
    # before (δ added to the logits before the temperature, i.e. δ/T on the tempered log-probs, as
    # both reference implementations do) | after (δ added after the temperature, the earlier behaviour)
    offset_temperature: str = "before"
    # reward targets mapped to [0, 1] by (r - min) / (max - min) over the round's training data,
    # the bounds stored with the value model, as the PITA reference code does for Q#, so that eta
    # means the same tilt for every value-guided method: minmax | none (raw rewards, the earlier
    # behaviour); null = the algorithm's own (QSharp, QSharp-HF minmax; PITA none: its targets are
    # preference labels, already in [0, 1])
    normalize_targets: Optional[str] = None
    num_atoms: int = 11  # mle: atoms over [v_min, v_max]
    v_min: Optional[float] = None  # mle: null = from the data (min over round-0 returns)
    v_max: Optional[float] = None  # mle: null = from the data (max over round-0 returns)
    continuations: int = 4  # sampled continuations per cut (PITA: an even number, paired 1-2, 3-4, ...)
    # how each prompt's roll-in (the path the cuts are taken from) is drawn from the round's policy:
    # greedy | sampled; null: the algorithm's own (PITA greedy, as the PITA reference code;
    # QSharp, QSharp-HF sampled, so that the cuts cover the states the policy visits)
    rollin: Optional[str] = None
    # which model continues from each cut: policy (the round's policy, guided by the previous
    # round's value model from round 1 on, as the PITA reference code) | reference (the frozen
    # reference: the returns are the reference's, Q#'s target); null: PITA policy, QSharp and
    # QSharp-HF reference
    continue_from: Optional[str] = None
    cut_points: int = 2  # roll-in cut positions (the prompt itself is cut 0)
    token_budget: int = 8192  # padded tokens per training step at most (batch_size: sequences at most)
    # passes over the data per round, the same for the three value-guided methods (as both reference
    # implementations train them); PITA's value was chosen on validation prompts
    # (bench/results/pita_defaults_2026-11-26.txt)
    epochs: int = 10
    # the value model's head (pita/guidance/value_model.py): reference (what the PITA and Q#
    # reference code builds: each candidate runs through the backbone, its last hidden state into
    # a linear layer) | q (Q#'s Q classifier: one vocabulary-wide linear head on the state before
    # the candidate, no backbone pass per candidate; vocabulary x hidden more parameters) |
    # embedding (pita's variant: the state before the candidate and the candidate's embedding,
    # plus the backbone's LM log-prob of it, weighted by lm_prior)
    head: str = "reference"
    head_dim: int = 128  # embedding head: its hidden width
    lm_prior: float = 1.0  # embedding head: initial weight of the backbone's LM log-prob; 0 = none
    # AdamW's weight decay of the value model (both reference implementations: 0.01; pita's
    # value models were tuned without it, bench/results/pita_defaults_2026-11-26.txt)
    weight_decay: float = 0.0
    # the new head's learning rate as a multiple of lr (the backbone's): the head starts from
    # nothing while the backbone is pre-trained; both references train one rate for all (1)
    head_lr_scale: float = 10.0
    # how a batch's per-position losses are averaged: token (every scored position alike: a long
    # continuation weighs more) | sequence (each roll-out's mean, then the mean over roll-outs, as
    # both reference implementations do)
    loss_weighting: str = "token"
    # batch each prompt's rows together and run the prefix they share (prompt and roll-in) once
    # per batch: the same loss and gradients per batch, fewer tokens (pita/guidance/train.py);
    # off by default so the batches, and so the trained values, stay those of earlier runs
    share_prefixes: bool = False


@dataclass
class ReturnsFilterKey:
    """The key of the value-guided methods that learn returns (Q#, Q#-HF)."""

    # leave out every prompt whose roll-outs all have the same return (every continuation right, or
    # every one wrong), as the Q# reference trains its classifier (math_reasoning/train_classifier.py,
    # --drop_no_variation 1, its default and its README's command): such a prompt says how hard the
    # prompt is, never which continuation is better, and a value model fed them learns the former.
    # Exact equality: real-valued returns (a reward model's, a proxy's) rarely tie, so on reward tasks
    # and for Q#-HF's proxy scores it seldom drops anything. The count is in the job's result
    drop_no_variation: bool = True


NORMALIZATIONS = ("minmax", "none")
ROLLINS = ("greedy", "sampled")
CONTINUE_FROM = ("policy", "reference")


class ValueGuidedAlgorithm(Algorithm):
    Config = ValueGuidedConfig
    tunes_eta = True
    has_reward_targets = True  # its value model regresses rewards (not preference labels)

    def normalization(self) -> str:
        """How its reward targets are scaled: the configured ``normalize_targets`` or its own."""
        return self.c.normalize_targets or ("minmax" if self.has_reward_targets else "none")

    def default_loss(self, task: str) -> str:
        return "bce"

    def rollin(self) -> str:
        """How the roll-in is drawn: the configured ``rollin`` or the algorithm's own."""
        return self.c.rollin or "sampled"

    def continue_from(self) -> str:
        """Which model continues from the cuts: the configured ``continue_from`` or the algorithm's own."""
        return self.c.continue_from or "reference"

    def losses(self, task: str) -> tuple[str, str]:
        """(value-model loss, guidance mode) on a task: the configured ones, or the algorithm's."""
        loss = self.c.loss or self.default_loss(task)
        mode = self.c.mode or ("mle" if loss == "mle" else "bernoulli")
        return loss, mode

    def check(self, cfg, n_devices: int) -> list[str]:
        from pita.core.names import unknown_name
        from pita.guidance.offsets import MODES
        from pita.losses.value import LOSSES

        c, k = self.c, self.key
        p = check_common(k, c)
        if c.loss is not None and c.loss not in LOSSES:
            p.append(unknown_name(f"{k}.loss", c.loss, LOSSES))
        if c.mode is not None and c.mode not in MODES:
            p.append(unknown_name(f"{k}.mode", c.mode, MODES))
        from pita.guidance.decode import OFFSET_SHIFTS, OFFSET_TEMPERATURES

        if c.offset_shift not in OFFSET_SHIFTS:
            p.append(unknown_name(f"{k}.offset_shift", c.offset_shift, OFFSET_SHIFTS))
        if c.offset_temperature not in OFFSET_TEMPERATURES:
            p.append(unknown_name(f"{k}.offset_temperature", c.offset_temperature, OFFSET_TEMPERATURES))
        if c.loss == "bradley_terry":
            p.append(f"{k}.loss=bradley_terry trains the Q#-HF proxy, not a value model; use bce, mse or mle")
        if c.mode in MODES and c.loss in LOSSES and c.loss != "bradley_terry":
            p += self.guidance_problems(c.loss, c.mode, "")
        if c.normalize_targets is not None and c.normalize_targets not in NORMALIZATIONS:
            p.append(unknown_name(f"{k}.normalize_targets", c.normalize_targets, NORMALIZATIONS))
        elif c.normalize_targets == "minmax" and not self.has_reward_targets:
            p.append(f"{k}.normalize_targets=minmax: {self.name} has no reward targets to normalise (its value model "
                     f"learns preference labels, already in [0, 1]); leave {k}.normalize_targets unset or none")
        if c.rollin is not None and c.rollin not in ROLLINS:
            p.append(unknown_name(f"{k}.rollin", c.rollin, ROLLINS))
        if c.continue_from is not None and c.continue_from not in CONTINUE_FROM:
            p.append(unknown_name(f"{k}.continue_from", c.continue_from, CONTINUE_FROM))
        if c.num_atoms < 2:
            p.append(f"{k}.num_atoms={c.num_atoms} must be >= 2")
        if c.v_min is not None and c.v_max is not None and c.v_min >= c.v_max:
            p.append(f"{k}.v_min={c.v_min} must be < {k}.v_max={c.v_max}")
        if c.eta < 0:
            p.append(f"{k}.eta={c.eta} must be >= 0")
        bad = [e for e in c.etas if e < 0]
        if bad:
            p.append(f"{k}.etas={list(c.etas)} must all be >= 0 ({', '.join(map(str, bad))} is not)")
        if not c.etas:
            p.append(f"{k}.etas must list at least one value")
        if c.top_k == 0 or c.top_k < -1:
            p.append(f"{k}.top_k={c.top_k} must be -1 (all tokens) or >= 1")
        for key in ("continuations", "cut_points", "token_budget", "epochs", "head_dim"):
            if getattr(c, key) < 1:
                p.append(f"{k}.{key}={getattr(c, key)} must be >= 1")
        if self.uses_preference_pairs:
            budget = cfg.data_collection.pairs_per_prompt
            per_cut = self.pairs_per_cut()
            have = c.cut_points * per_cut
            how = (f"{k}.cut_points x {k}.continuations/2 = {c.cut_points} x {per_cut}"
                   if self.rollout_mode() == "sampled" else
                   f"{k}.cut_points x 1 (a greedy and a sampled continuation per cut) = {c.cut_points} x 1")
            if c.cut_points >= 1 and have < budget:
                p.append(f"{k}: its roll-outs give {how} = {have} preference pairs per prompt, fewer than "
                         f"data_collection.pairs_per_prompt={budget}, the budget every preference-learning method "
                         f"gets; raise {k}.cut_points or {k}.continuations, or lower the budget")
        if not c.lm_prior >= 0:
            p.append(f"{k}.lm_prior={c.lm_prior} must be >= 0 (0 starts the head without the LM prior)")
        from pita.guidance.value_model import HEADS

        if c.head not in HEADS:
            p.append(unknown_name(f"{k}.head", c.head, HEADS))
        from pita.guidance.train import LOSS_WEIGHTINGS

        if c.loss_weighting not in LOSS_WEIGHTINGS:
            p.append(unknown_name(f"{k}.loss_weighting", c.loss_weighting, LOSS_WEIGHTINGS))
        if not c.weight_decay >= 0:
            p.append(f"{k}.weight_decay={c.weight_decay} must be >= 0 (the references: 0.01)")
        if not c.head_lr_scale > 0:
            p.append(f"{k}.head_lr_scale={c.head_lr_scale} must be > 0 (1: the head learns at lr, as the backbone)")
        return p

    def guidance_problems(self, loss: str, mode: str, where: str) -> list[str]:
        """mle guidance reads a distribution over atoms, which only loss=mle trains (and a loss=mle
        head has nothing else to offer): a mismatch would fail every evaluation after training."""
        if (mode == "mle") == (loss == "mle"):
            return []
        k = self.key
        return [f"{k}.mode={mode} does not fit {k}.loss={loss}{where}: mle guidance needs a value model trained "
                f"with loss=mle, and a loss=mle model guides only in mode mle; set {k}.mode="
                f"{'mle' if loss == 'mle' else 'bernoulli (or expectation)'} or {k}.loss={'mle' if mode == 'mle' else 'bce'}"]

    def check_models(self, paths: dict) -> list[str]:
        if self.c.top_k == -1:
            return []
        from pita.models.shapes import model_config, text_config

        vocab = text_config(model_config(paths["guidance"], "model.guidance")).vocab_size
        if self.c.top_k > vocab:
            return [f"{self.key}.top_k={self.c.top_k} is larger than the vocabulary ({vocab}); use -1 for all"]
        return []

    def rollout_mode(self) -> str:
        """How each cut's continuations are drawn (the ``value_rollouts`` recipe's mode)."""
        return "sampled"

    def pairs_per_cut(self) -> int:
        """Preference pairs one cut's continuations make."""
        return self.c.continuations // 2

    def offset_settings(self) -> dict:
        """How the guided decoder applies the value head's offsets (planned into every guided job)."""
        return {"offset_shift": self.c.offset_shift, "offset_temperature": self.c.offset_temperature,
                "head": self.c.head}

    # ---------------------------------------------------------------- planning
    def round_inputs(self, p: PlanContext, r: int, merges: list[str]) -> tuple[list[Job], dict]:
        """Jobs round r's value training also waits for, and params it adds (none here)."""
        return [], {}

    def train_extras(self) -> dict:
        """Params of the value-training job that only some methods have (their keys' values)."""
        if hasattr(self.c, "drop_no_variation"):
            return {"drop_no_variation": bool(self.c.drop_no_variation)}
        return {}

    def plan(self, p: PlanContext) -> list[Job]:
        c, algo = self.c, self.name
        loss, mode = self.losses(p.task)
        bad = self.guidance_problems(loss, mode, f" (its default on {p.ds.name}, a {p.task} task)")
        if bad:
            raise ConfigError(bad)
        prefix = p.prefix(algo)
        jobs: list[Job] = []
        prev_train, merges = None, []
        for r in range(p.cfg.experiment.rounds):
            req = p.data_request()
            req["recipe"] = "value_rollouts"
            # round 0's policy is the reference: continuing from either is the same, and the
            # collection stays shareable between methods
            req["rollouts"] = {"cut_points": c.cut_points, "continuations": c.continuations, "mode": self.rollout_mode(),
                               "rollin": self.rollin(), "continue_from": self.continue_from() if prev_train else "reference"}
            req["seed"] = p.seed(r)
            if prev_train:
                req["policy"]["guidance"] = {"from_job": prev_train, "mode": mode, "eta": c.eta, "top_k": c.top_k,
                                             **self.offset_settings()}
            gen_jobs, merge = p.collect(req, f"{prefix}.r{r}.gen", [prev_train] if prev_train else [], r)
            jobs += gen_jobs
            merges.append(merge)
            extra_jobs, extra_params = self.round_inputs(p, r, merges)
            jobs += extra_jobs
            train = f"{prefix}.r{r}.train"
            deps = list(merges) + ([prev_train] if prev_train else []) + [j.id for j in extra_jobs]
            jobs.append(Job(id=train, kind="algo.value_train", deps=deps, group=f"round {r}",
                            params={"algo": algo, "task": p.task, "data": list(merges),
                                    "backbone": p.paths["guidance"], "warm_start": prev_train, "loss": loss,
                                    "num_atoms": c.num_atoms, "v_min": c.v_min, "v_max": c.v_max,
                                    "head_dim": c.head_dim, "epochs": c.epochs, "lr": c.lr,
                                    "batch_size": c.batch_size, "token_budget": c.token_budget,
                                    "lm_prior": c.lm_prior, "head": c.head, "seed": p.cfg.system.seed + r,
                                    "share_prefixes": c.share_prefixes,
                                    "normalize_targets": self.normalization(), **self.train_extras(),
                                    "weight_decay": c.weight_decay, "head_lr_scale": c.head_lr_scale,
                                    "loss_weighting": c.loss_weighting,
                                    **training_settings(p.cfg, c, whole=c.batch_size), **extra_params},
                            resources=Resources(1, p.mem[f"train.{algo}"]), retry=TRAINING_RETRY,
                            duration_hint=3.0))
            jobs += p.evaluations(algo, r, train, policy={"guidance": {"from_job": train, "mode": mode, "top_k": c.top_k,
                                                                       **self.offset_settings()}},
                                  etas=[float(e) for e in c.etas])
            prev_train = train
        return jobs

    # ---------------------------------------------------------------- the value_train job
    @classmethod
    def value_examples(cls, ctx, records: list[dict], device: str) -> list:
        """The value model's training examples (``SeqExample``) from the roll-outs of rounds 0..r."""
        raise NotImplementedError(f"{cls.__name__}.value_examples")


def returns_examples(records: list[dict], targets: list[float] | None = None, task: str = "math") -> list:
    """One example per roll-out with a continuation: its whole sequence, where the continuation
    starts, and its return (0/1 correctness on math, the reward on reward tasks) or ``targets``."""
    from pita.guidance.rollouts import sequence_ids
    from pita.guidance.train import SeqExample, prompt_group

    recs = [r for r in records if r["continuation_ids"]]
    if targets is None:
        targets = [float(bool(r["correct"])) if task == "math" else float(r["reward"]) for r in recs]
    return [SeqExample(sequence_ids(r), len(sequence_ids(r)) - len(r["continuation_ids"]), t, prompt_group(r))
            for r, t in zip(recs, targets)]


def drop_no_variation(examples: list) -> tuple[list, dict]:
    """The examples of the prompts whose returns vary (a prompt: its rows' ``group``, the prompt
    and round), and the count: ``{"prompts", "prompts_dropped", "rollouts_dropped"}``. As the Q#
    reference's ``create_classifier_data(drop_no_variation=True)``: a prompt goes when the set of
    its returns has one element."""
    groups: dict = {}
    for e in examples:
        groups.setdefault(e.group, []).append(e)
    flat = {g for g, es in groups.items() if len({float(x.target) for x in es}) == 1}
    kept = [e for e in examples if e.group not in flat]
    return kept, {"prompts": len(groups), "prompts_dropped": len(flat), "rollouts_dropped": len(examples) - len(kept),
                  "rule": "drop_no_variation"}


def minmax_targets(examples: list) -> tuple[list, tuple[float, float]]:
    """The examples with targets mapped to [0, 1] by (t - min) / (max - min), and (min, max).
    All-equal targets carry no information about which continuation is better: they map to 0.5,
    the middle of the range, so that the head learns no preference (mapped to 0 they would read as
    "every continuation is the worst")."""
    import dataclasses

    lo, hi = min(e.target for e in examples), max(e.target for e in examples)
    scale = hi - lo
    return ([dataclasses.replace(e, target=(e.target - lo) / scale if scale > 0 else 0.5) for e in examples],
            (float(lo), float(hi)))


def training_examples(ctx, dev: str) -> tuple[list, dict | None]:
    """The examples a value-training job (its ``ctx.params``) trains on, as it builds them: its
    algorithm's examples from the roll-outs of its rounds, the prompts whose returns do not vary
    left out where ``drop_no_variation`` is set; and that filter's count (None when off)."""
    from pita.guidance.rollouts import read_rounds

    p = ctx.params
    algo = p["algo"]
    cls = ALGORITHMS.get(algo, field="the job's algo")
    examples = cls.value_examples(ctx, read_rounds(ctx, p["data"]), dev)
    returns = None
    if examples and p.get("drop_no_variation"):
        examples, returns = drop_no_variation(examples)
        ctx.log.info("%s: %d of %d prompts left out (every roll-out the same return: algos.%s.drop_no_variation), "
                     "%d roll-outs", algo, returns["prompts_dropped"], returns["prompts"], algo,
                     returns["rollouts_dropped"])
        if not examples:
            raise JobError(f"{algo}: every one of the {returns['prompts']} prompts has roll-outs that all score the "
                           f"same return, so algos.{algo}.drop_no_variation left nothing to learn from; collect "
                           f"more continuations per cut (algos.{algo}.continuations) or cuts (cut_points), use "
                           f"prompts the model sometimes solves, or set algos.{algo}.drop_no_variation=false")
    if not examples:
        raise JobError(f"{algo}: the data collection produced no usable training examples")
    return examples, returns


@job_kind("algo.value_train")
def value_train(ctx):
    import torch

    from pita.guidance.train import TrainSettings, calibrate, train
    from pita.guidance.proxy import optimizer_settings, shared_settings
    from pita.guidance.value_model import HeadSpec, ValueModel
    from pita.models.lm import default_device
    from pita.tracking import tracker_settings

    p = ctx.params
    dev = default_device()
    algo = p["algo"]
    examples, returns = training_examples(ctx, dev)
    # a plan written before the key existed trained the embedding head
    spec = HeadSpec(p["loss"], p["num_atoms"], 0.0, 1.0, p["head_dim"], lm_prior=p.get("lm_prior", 1.0),
                    head=p.get("head", "embedding"))
    if p.get("normalize_targets", "none") == "minmax":
        examples, (spec.target_min, spec.target_max) = minmax_targets(examples)
        ctx.log.info("targets min-max normalised to [0, 1] (min %.4g, max %.4g; stored with the model)",
                     spec.target_min, spec.target_max)
    if p["loss"] == "mle":
        lo, hi = min(e.target for e in examples), max(e.target for e in examples)
        pad = 0.05 * (hi - lo) if hi > lo else 1.0
        spec.v_min = float(p["v_min"]) if p["v_min"] is not None else lo - pad
        spec.v_max = float(p["v_max"]) if p["v_max"] is not None else hi + pad
    if p["warm_start"]:
        prev = ctx.dep_result(p["warm_start"])["checkpoint"]
        if p["loss"] == "mle" and (p["v_min"] is None or p["v_max"] is None):
            old = ValueModel.read_spec(prev)  # keep the atoms of the run's first round
            spec.v_min, spec.v_max = old.v_min, old.v_max
        vm = ValueModel.load(prev, expect=spec, device=dev)
        ctx.log.info("warm start from %s", prev)
    else:
        torch.manual_seed(p["seed"])  # the new head's initial weights: same seed, same model
        vm = ValueModel.create(p["backbone"], loss=p["loss"], num_atoms=p["num_atoms"], v_min=spec.v_min,
                               v_max=spec.v_max, head_dim=p["head_dim"], lm_prior=spec.lm_prior, head=spec.head)
        ctx.log.info("head calibrated to the targets: %s", calibrate(vm, examples, device=dev, seed=p["seed"]))
    settings = TrainSettings(epochs=p["epochs"], lr=p["lr"], token_budget=p["token_budget"],
                             batch_size=p["batch_size"], **shared_settings(p), seed=p["seed"],
                             **optimizer_settings(p),
                             share_prefixes=bool(p.get("share_prefixes", False)),
                             checkpoint=str(ctx.paths.checkpoints / "train-state.pt"))
    ctx.log.info("%s: %d examples (%s loss), targets mean %.3f", algo, len(examples), p["loss"],
                 sum(e.target for e in examples) / len(examples))
    curve = train(vm, examples, settings, ctx.log, pad_id=0, device=dev, tracker=tracker_settings(ctx))
    out = ctx.paths.artifacts / "model"
    vm.save(out)
    ctx.paths.write_metrics(curve)
    # training compute: tokens through the model per epoch (prompt, roll-in and continuation), and
    # 6 x trainable parameters x tokens FLOPs (forward and backward), the usual estimate
    tokens = sum(len(e.ids) for e in examples) * int(p["epochs"])
    trainable = sum(w.numel() for w in vm.parameters() if w.requires_grad)
    return {"checkpoint": str(out), "examples": len(examples), "steps": len(curve), "train_tokens": tokens,
            "train_flops": 6.0 * trainable * tokens, "loss": p["loss"], "loss_first": curve[0]["loss"],
            "loss_last": curve[-1]["loss"], "v_min": vm.spec.v_min, "v_max": vm.spec.v_max,
            "target_min": vm.spec.target_min, "target_max": vm.spec.target_max,
            **({"returns_filter": returns} if returns else {}),  # Q#, Q#-HF: the prompts left out
            **getattr(ctx, "label_counts", {})}  # PITA: its labelled pairs and ties
