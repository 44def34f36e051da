"""PITA, Q# and Q#-HF: value-guided decoding of a frozen reference model.

Per (algorithm, family, dataset) and round r:

    gen[r] (value roll-outs; round 0 from the reference, round r > 0 from the reference guided by
            round r-1's value model at eta = algos.<A>.eta) -> merge
    [Q#-HF only] proxy[r]: Bradley-Terry proxy reward model on the preference pairs of rounds 0..r
    train[r]: the value model on the data of rounds 0..r, warm-started from train[r-1]
    eval[r]: the reference guided by train[r] at every eta of algos.<A>.etas on the test split

Targets (each sequence's continuation tokens all get its target; pita/guidance/train.py):
    PITA   the sampled continuations of each cut in disjoint pairs; a Bradley-Terry draw on their
           rewards (correctness bonus included for math) picks the preferred one: target 1 for it,
           0 for the other; tied pairs carry no preference and are left out; loss bce, mode bernoulli
    Q#     the return of each sampled continuation: 0/1 correctness for math (bce, bernoulli),
           the reward model's score for reward tasks (mle over atoms spanning the data, mle)
    Q#-HF  the proxy reward model rescores every roll-out (batched, full sequences), then Q# with
           mle on the proxy rewards
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import List, Optional

from pita.core.errors import ConfigError, JobError
from pita.core.job import Job, Resources, add_kind_module, job_kind
from pita.models.lm import default_device, pad_right

log = logging.getLogger(__name__)
add_kind_module("pita.algos.value_guided")

VALUE_GUIDED = ("PITA", "QSharp", "QSharp-HF")


@dataclass
class ValueGuidedConfig:
    enabled: bool = True  # kept for configs written for other tools; experiment.algos picks what runs
    loss: Optional[str] = None  # null: bce for PITA and math Q#, mle for reward-task Q# and Q#-HF
    mode: Optional[str] = None  # null: bernoulli for bce/mse, mle for mle
    eta: float = 2.0  # guidance strength when round r+1 collects data with round r's model
    # evaluation sweep; eta 0 is the reference restricted to the same top_k candidates, the baseline
    # the guided rows should be read against (the base row samples from the whole vocabulary)
    etas: List[float] = field(default_factory=lambda: [0.0, 0.5, 1.0, 2.0, 4.0])
    top_k: int = 20  # candidates scored per step (-1 = the whole vocabulary)
    num_atoms: int = 11  # mle: atoms over [v_min, v_max]
    v_min: Optional[float] = None  # mle: null = from the data (min over round-0 returns)
    v_max: Optional[float] = None  # mle: null = from the data (max over round-0 returns)
    continuations: int = 4  # sampled continuations per cut (PITA: an even number, paired 1-2, 3-4, ...)
    cut_points: int = 2  # roll-in cut positions (the prompt itself is cut 0)
    batch_size: int = 32  # sequences per training step at most
    token_budget: int = 8192  # padded tokens per training step at most
    epochs: int = 2  # value model: passes over the data per round; DPO: epochs per round
    lr: float = 1e-4  # backbone; the head learns 10x faster. 1e-3 washes out the LM prior (see lm_prior)
    head_dim: int = 128  # hidden width of the value head
    lm_prior: float = 1.0  # initial weight of the backbone's LM log-prob in the head; 0 = none
    gradient_checkpointing: Optional[bool] = None  # null: training.gradient_checkpointing
    num_workers: int = 0  # DPO / GRPO data-loader workers (value training batches in-process)
    bt_beta: float = 1.0  # PITA / Q#-HF preference draws
    proxy_epochs: int = 2  # Q#-HF / GRPO-HF proxy reward model
    proxy_lr: float = 5e-4  # learning rate of the proxy reward model
    # ---- DPO / GRPO / GRPO-HF (pita/algos/baselines.py); batch_size is the effective batch there

    beta: float = 0.1  # KL coefficient: DPO's beta, GRPO's beta (KL to the reference)
    max_steps: int = 100  # GRPO optimizer steps per round
    gradient_accumulation_steps: int = 1  # DPO / GRPO (ignored when training.micro_batch_size is set)
    devices: int = 1  # devices per training job (data-parallel through accelerate when > 1)
    max_length: int = 256  # DPO: prompt + completion tokens kept
    ref_policy: str = "original"  # DPO reference policy in later rounds: original | previous
    num_generations: int = 4  # GRPO completions per prompt (>= 2; divides batch_size)
    temperature: float = 1.0  # GRPO sampling temperature
    max_completion_length: Optional[int] = None  # GRPO; null = data_collection.max_new_tokens
    lora_r: int = 0  # LoRA rank through peft; 0 = full fine-tuning
    lora_alpha: int = 16  # LoRA scaling
    lora_target_modules: List[str] = field(default_factory=lambda: ["q_proj", "v_proj"])  # module names LoRA adapts
    use_vllm: bool = False  # GRPO generation through vLLM (GPU only, needs vllm installed)
    vllm_mode: str = "colocate"  # TRL vLLM mode: colocate | server
    vllm_gpu_memory_utilization: float = 0.3  # colocate: the GPU share vLLM may take


AlgoConfig = ValueGuidedConfig  # the settings of any algorithm under algos.<name>


def training_params(cfg, c) -> dict:
    """The shared training settings a training job reads (training.*, system.clear_cache_interval)."""
    gc = c.gradient_checkpointing if c.gradient_checkpointing is not None else cfg.training.gradient_checkpointing
    return {"gradient_checkpointing": bool(gc), "micro_batch_size": int(cfg.training.micro_batch_size),
            "clear_cache_interval": int(cfg.system.clear_cache_interval)}


def losses_for(algo: str, c, task: str) -> tuple[str, str]:
    loss = c.loss or ("mle" if algo == "QSharp-HF" or (algo == "QSharp" and task == "reward") else "bce")
    mode = c.mode or ("mle" if loss == "mle" else "bernoulli")
    return loss, mode


def check_config(algo: str, c) -> list[str]:
    from pita.core.names import unknown_name
    from pita.guidance.offsets import MODES
    from pita.losses.value import LOSSES

    k = f"algos.{algo}"
    p = []
    if c.loss is not None and c.loss not in LOSSES:
        p.append(unknown_name(f"{k}.loss", c.loss, LOSSES))
    if c.mode is not None and c.mode not in MODES:
        p.append(unknown_name(f"{k}.mode", c.mode, MODES))
    if c.loss == "bradley_terry":
        p.append(f"{k}.loss=bradley_terry trains the Q#-HF proxy, not a value model; use bce, mse or mle")
    if c.num_atoms < 2:
        p.append(f"{k}.num_atoms={c.num_atoms} must be >= 2")
    if c.v_min is not None and c.v_max is not None and c.v_min >= c.v_max:
        p.append(f"{k}.v_min={c.v_min} must be < {k}.v_max={c.v_max}")
    if c.eta < 0 or any(e < 0 for e in c.etas):
        p.append(f"{k}.eta={c.eta} / {k}.etas={list(c.etas)} must be >= 0")
    if not c.etas:
        p.append(f"{k}.etas must list at least one value")
    if c.top_k == 0 or c.top_k < -1:
        p.append(f"{k}.top_k={c.top_k} must be -1 (all tokens) or >= 1")
    for key in ("continuations", "cut_points", "batch_size", "token_budget", "epochs", "head_dim", "proxy_epochs"):
        if getattr(c, key) < 1:
            p.append(f"{k}.{key}={getattr(c, key)} must be >= 1")
    if not (c.lr > 0 and c.proxy_lr > 0):
        p.append(f"{k}.lr / proxy_lr must be > 0")
    if not c.lm_prior >= 0:
        p.append(f"{k}.lm_prior={c.lm_prior} must be >= 0 (0 starts the head without the LM prior)")
    if c.bt_beta < 0:
        p.append(f"{k}.bt_beta={c.bt_beta} must be >= 0")
    if algo == "PITA" and c.continuations % 2:
        p.append(f"{k}.continuations={c.continuations} must be even: PITA pairs the continuations of each cut "
                 f"(1-2, 3-4, ...); set e.g. {k}.continuations={max(2, c.continuations + 1)}")
    return p


# ---------------------------------------------------------------- planning
def plan(cfg, algo: str, ds, paths: dict, gen, n_train: int, evals: list, task: str, mem: dict,
         eval_request) -> list[Job]:
    """Jobs for one (algorithm, family, dataset): ``rounds`` rounds of collect -> train -> evaluate.

    ``evals``: (dataset config, number of test prompts, task) of every dataset the trained value
    model is evaluated on (the training dataset itself unless ``eval.datasets_by_train`` says
    otherwise); the training dataset's evaluation jobs are ``<prefix>.r<r>.eval.*``, another
    dataset's ``<prefix>.r<r>.eval-<name>.*``.
    """
    from pita.plans.generation import request_for

    c = cfg.algos[algo]
    loss, mode = losses_for(algo, c, task)
    vocab = None
    if c.top_k != -1:
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(paths["guidance"]).vocab_size
        if c.top_k > vocab:
            raise ConfigError(f"algos.{algo}.top_k={c.top_k} is larger than the vocabulary ({vocab}); use -1 for all")
    fam = cfg.model.name
    prefix = f"{algo}.{fam}.{ds.name}"
    jobs: list[Job] = []
    prev_train, merges = None, []
    for r in range(cfg.experiment.rounds):
        g = f"round {r}"
        req = request_for(cfg, ds, paths["reference"], paths["reward_models"].get(ds.name))
        req["recipe"] = "value_rollouts"
        req["rollouts"] = {"cut_points": c.cut_points, "continuations": c.continuations,
                           "mode": "sampled"}
        req["seed"] = cfg.system.seed * 1000 + r
        if prev_train:
            req["policy"]["guidance"] = {"from_job": prev_train, "mode": mode, "eta": c.eta, "top_k": c.top_k}
        gen_jobs = gen.plan(req, f"{prefix}.r{r}.gen", n_train, deps=[prev_train] if prev_train else [],
                            memory_gb=mem["gen"], group=g)
        jobs += gen_jobs
        merges.append(gen_jobs[-1].id)
        train_deps = list(merges) + ([prev_train] if prev_train else [])
        proxy = None
        if algo == "QSharp-HF":
            proxy = f"{prefix}.r{r}.proxy"
            jobs.append(Job(id=proxy, kind="algo.proxy_train", deps=list(merges), group=g,
                            params={"data": list(merges), "backbone": paths["guidance"], "epochs": c.proxy_epochs,
                                    "lr": c.proxy_lr, "beta": c.bt_beta, "seed": cfg.system.seed + r,
                                    "batch_size": c.batch_size, "token_budget": c.token_budget,
                                    "head_dim": c.head_dim, **training_params(cfg, c)},
                            resources=Resources(1, mem["train"]), duration_hint=2.0))
            train_deps.append(proxy)
        train = f"{prefix}.r{r}.train"
        jobs.append(Job(id=train, kind="algo.value_train", deps=train_deps, group=g,
                        params={"algo": algo, "task": task, "data": list(merges), "backbone": paths["guidance"],
                                "warm_start": prev_train, "proxy": proxy, "loss": loss, "num_atoms": c.num_atoms,
                                "v_min": c.v_min, "v_max": c.v_max, "head_dim": c.head_dim, "epochs": c.epochs,
                                "lr": c.lr, "batch_size": c.batch_size, "token_budget": c.token_budget,
                                "beta": c.bt_beta, "lm_prior": c.lm_prior, "seed": cfg.system.seed + r,
                                **training_params(cfg, c)},
                        resources=Resources(1, mem["train"]), duration_hint=3.0))
        jobs += plan_evals(gen, eval_request, evals, algo, fam, ds.name, r, train, mem["gen"],
                           policy={"guidance": {"from_job": train, "mode": mode, "top_k": c.top_k}},
                           etas=[float(e) for e in c.etas])
        prev_train = train
    return jobs


def plan_evals(gen, eval_request, evals: list, algo: str, fam: str, train_ds: str, r: int, train: str,
               memory_gb: float, policy: dict, etas: list[float] | None = None) -> list[Job]:
    """Round r's evaluation jobs of the model trained by job ``train``, on every dataset of ``evals``;
    ``policy`` says how the evaluated policy is made from it (guidance, or a trained checkpoint)."""
    jobs: list[Job] = []
    prefix = f"{algo}.{fam}.{train_ds}.r{r}.eval"
    for eds, n_test, etask in evals:
        ereq = eval_request(eds)
        ereq["policy"].update(policy)
        if etas is not None:
            ereq["etas"] = etas
        name = prefix + ("" if eds.name == train_ds else f"-{eds.name}")
        ev = gen.plan(ereq, name, n_test, deps=[train], memory_gb=memory_gb, group=f"round {r}")
        ev[-1].kind = "eval.merge"
        ev[-1].params.update(labels={"algorithm": algo, "family": fam, "train_dataset": train_ds, "round": r,
                                     "eval_dataset": eds.name, "task": etask})
        jobs += ev
    return jobs


# ---------------------------------------------------------------- job kinds
def _records(ctx, merges: list[str]) -> list[dict]:
    from datasets import load_from_disk

    out = []
    for m in merges:
        out += load_from_disk(ctx.dep_result(m)["path"]).to_list()
    return out


def _groups(records):
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["id"], r["cut"], r.get("_round", 0)), []).append(r)
    return groups


def _tag_rounds(ctx, merges):
    recs = []
    for i, m in enumerate(merges):
        for r in _records(ctx, [m]):
            r["_round"] = i
            recs.append(r)
    return recs


def _pairs(records, seed: int, beta: float):
    """(chosen, rejected, tie) for each disjoint pair of continuations of a cut (1-2, 3-4, ...),
    by a Bradley-Terry draw on the rewards."""
    from pita.rewards.preferences import sample_preference

    out = []
    for key, grp in sorted(_groups(records).items(), key=lambda kv: str(kv[0])):
        grp = [g for g in grp if g["continuation_ids"]]
        for i in range(0, len(grp) - 1, 2):
            a, b = grp[i], grp[i + 1]
            if a["reward"] == b["reward"]:
                out.append((a, b, True))
                continue
            tag = "/".join(map(str, key)) + ("" if i == 0 else f"/{i // 2}")
            c, rj, _p = sample_preference([a["reward"], b["reward"]], seed, tag, beta)
            out.append(((a, b)[c], (a, b)[rj], False))
    return out


def _ids(r) -> list[int]:
    return list(r["prompt_ids"]) + list(r["prefix_ids"]) + list(r["continuation_ids"])


def text_ids(tok, prompt: str, completion: str) -> list[int]:
    """The chat-formatted prompt, the completion and EOS, as token ids: how the proxy reward model
    sees a text pair at training and a GRPO-HF completion at scoring."""
    chat = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True) \
        if getattr(tok, "chat_template", None) else prompt
    return (tok(chat, add_special_tokens=False)["input_ids"] + tok(completion, add_special_tokens=False)["input_ids"]
            + [tok.eos_token_id])


def _shared(p: dict) -> dict:
    return {"gradient_checkpointing": bool(p.get("gradient_checkpointing", False)),
            "micro_batch_size": int(p.get("micro_batch_size", 0)),
            "clear_cache_interval": int(p.get("clear_cache_interval", 0))}


@job_kind("algo.proxy_train")
def proxy_train(ctx):
    import torch

    from pita.guidance.train import PairExample, TrainSettings, train
    from pita.guidance.value_model import ValueModel

    p = ctx.params
    records = _tag_rounds(ctx, p["data"])
    if records and "chosen" in records[0]:  # preference_pairs records (GRPO-HF): text, tokenized here
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(p.get("tokenizer") or p["backbone"])
        examples = [PairExample(text_ids(tok, r["prompt"], r["chosen"]), text_ids(tok, r["prompt"], r["rejected"]))
                    for r in records if r["chosen_reward"] != r["rejected_reward"]]
    else:
        examples = [PairExample(_ids(c), _ids(r))
                    for c, r, tie in _pairs(records, p["seed"], p["beta"]) if not tie]
    if not examples:
        raise JobError(f"no preference pairs with different rewards among {len(records)} records to train the "
                       f"proxy reward model on; collect more data (a larger train split, more samples per prompt)")
    torch.manual_seed(p["seed"])  # the new head's initial weights: same seed, same model
    vm = ValueModel.create(p["backbone"], loss="bradley_terry", head_dim=p["head_dim"])
    dev = default_device()
    curve = train(vm, examples, TrainSettings(epochs=p["epochs"], lr=p["lr"], token_budget=p["token_budget"],
                                              batch_size=p["batch_size"], seed=p["seed"], **_shared(p)),
                  ctx.log, pad_id=0, device=dev)
    out = ctx.paths.artifacts / "model"
    vm.save(out)
    _write_curve(ctx, curve)
    acc = _pair_accuracy(vm, examples, dev)
    ctx.log.info("proxy reward model: %d pairs, training pair accuracy %.3f", len(examples), acc)
    return {"checkpoint": str(out), "pairs": len(examples), "pair_accuracy": acc,
            "loss_first": curve[0]["loss"], "loss_last": curve[-1]["loss"]}


def _pair_accuracy(vm, examples, dev) -> float:
    scores = _score_sequences(vm, [e.chosen for e in examples] + [e.rejected for e in examples], dev)
    n = len(examples)
    return sum(scores[i] > scores[n + i] for i in range(n)) / n


def _score_sequences(vm, seqs: list[list[int]], dev, batch: int = 64) -> list[float]:
    """Proxy rewards of full sequences, batched (sorted by length; the same head as in training)."""
    import torch

    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = [0.0] * len(seqs)
    with torch.no_grad():
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            ids, mask = pad_right([seqs[i] for i in idx], 0, dev)
            for i, v in zip(idx, vm.sequence_reward(ids, mask).float().tolist()):
                out[i] = v
    return out


def _write_curve(ctx, curve) -> None:
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    with open(ctx.paths.dir / "metrics.jsonl", "w") as f:
        for row in curve:
            f.write(json.dumps(row) + "\n")


@job_kind("algo.value_train")
def value_train(ctx):
    import torch

    from pita.guidance.train import SeqExample, TrainSettings, calibrate, train
    from pita.guidance.value_model import HeadSpec, ValueModel

    p = ctx.params
    dev = default_device()
    records = _tag_rounds(ctx, p["data"])
    algo = p["algo"]
    if algo == "PITA":
        examples = []
        pairs = _pairs(records, p["seed"], p["beta"])
        if pairs and all(tie for _c, _r, tie in pairs):
            raise JobError(f"PITA: all {len(pairs)} preference pairs are ties (equal rewards), so there is no "
                           f"preference to learn; collect more continuations (algos.PITA.cut_points) or data "
                           f"(datasets.<name>.toy_train_size / a larger split)")
        # a tied pair states no preference; labelled 0.5 (the old rule) they were most of the data on
        # 0/1 rewards and held the head at 0.5 everywhere (docs/architecture.md)
        decisive = [(c, r) for c, r, tie in pairs if not tie]
        ctx.log.info("PITA: %d preference pairs, %d ties left out", len(decisive), len(pairs) - len(decisive))
        for c, r in decisive:
            examples.append(SeqExample(_ids(c), len(_ids(c)) - len(c["continuation_ids"]), 1.0))
            examples.append(SeqExample(_ids(r), len(_ids(r)) - len(r["continuation_ids"]), 0.0))
    else:
        recs = [r for r in records if r["continuation_ids"]]
        if algo == "QSharp-HF":
            pvm = ValueModel.load(ctx.dep_result(p["proxy"])["checkpoint"], device=dev).eval()
            targets = _score_sequences(pvm, [_ids(r) for r in recs], dev)
            del pvm
            # a Bradley-Terry reward is defined up to a constant and each round's proxy is trained
            # afresh: centre its scores so that rounds share the atoms of round 0
            mean = sum(targets) / len(targets)
            targets = [t - mean for t in targets]
            ctx.log.info("proxy rewards centred (mean was %.3f)", mean)
        elif p["task"] == "math":
            targets = [float(bool(r["correct"])) for r in recs]
        else:
            targets = [float(r["reward"]) for r in recs]
        examples = [SeqExample(_ids(r), len(_ids(r)) - len(r["continuation_ids"]), t) for r, t in zip(recs, targets)]
    if not examples:
        raise JobError(f"{algo}: the data collection produced no usable training examples")
    spec = HeadSpec(p["loss"], p["num_atoms"], 0.0, 1.0, p["head_dim"], lm_prior=p.get("lm_prior", 1.0))
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
                               v_max=spec.v_max, head_dim=p["head_dim"], lm_prior=spec.lm_prior)
        ctx.log.info("head calibrated to the targets: %s", calibrate(vm, examples, device=dev, seed=p["seed"]))
    settings = TrainSettings(epochs=p["epochs"], lr=p["lr"], token_budget=p["token_budget"],
                             batch_size=p["batch_size"], **_shared(p),
                             seed=p["seed"])
    ctx.log.info("%s: %d examples (%s loss), targets mean %.3f", algo, len(examples), p["loss"],
                 sum(e.target for e in examples) / len(examples))
    curve = train(vm, examples, settings, ctx.log, pad_id=0, device=dev)
    out = ctx.paths.artifacts / "model"
    vm.save(out)
    _write_curve(ctx, curve)
    return {"checkpoint": str(out), "examples": len(examples), "loss": p["loss"], "loss_first": curve[0]["loss"],
            "loss_last": curve[-1]["loss"], "v_min": vm.spec.v_min, "v_max": vm.spec.v_max}


@job_kind("eval.merge")
def eval_merge(ctx):
    from pita.eval.metrics import summarize
    from pita.generation.jobs import gather, save_records

    records = gather(ctx)
    if not records:
        raise JobError("evaluation produced no samples")
    save_records(ctx, records)
    labels = ctx.params["labels"]
    by_eta: dict[float, dict[str, list]] = {}
    for r in records:
        by_eta.setdefault(r["eta"], {}).setdefault(r["id"], []).append(r)
    results = []
    for eta in sorted(by_eta):
        groups = [sorted(g, key=lambda x: x["sample"]) for _, g in sorted(by_eta[eta].items())]
        m = summarize(groups, labels["task"], kl_fraction=ctx.params.get("kl_fraction", 1.0))
        results.append({**labels, "eta": eta, **m})
    return {"labels": labels, "results": results}
