"""Job kinds of the ParallelDataGenerator: ``generation.shard`` and ``generation.merge``."""

from __future__ import annotations

import json

from pita.core.errors import JobError
from pita.core.job import job_kind
from pita.core.paths import atomic_write


def _chunk_file(paths, k: int):
    return paths.checkpoints / f"chunk-{k:05d}.jsonl"


def prepare(ctx, req: dict, examples: list, ds) -> tuple:
    """(the policy as an LM, the scorer) a ``req`` samples and scores ``examples`` with: the
    policy's model (or a trained job's checkpoint), the reference that measures a trained
    policy's KL, an earlier job's value model guiding it, and the reward model. Fills ``req``'s
    private keys (``_ref_lm``, ``_vm``, ``_guide``) the recipes read. (None, None) for prompts."""
    from pita.generation.recipes import Scorer

    lm = scorer = None
    if req["recipe"] != "prompts":
        from pita.models.lm import LM

        pol = req["policy"]
        from pita.models.lm import default_device

        dev = default_device()
        model = pol["model"]
        if pol.get("model_from_job"):  # a policy trained by an earlier job (DPO / GRPO rounds, their evaluation)
            res = ctx.dep_result(pol["model_from_job"])
            model = res["snapshots"][pol["snapshot"]]["checkpoint"] if pol.get("snapshot") else res["checkpoint"]
            ctx.log.info("policy: %s (trained by %s)", model, pol["model_from_job"])
        lm = LM.load(model, device=dev, dtype=pol.get("dtype", "float32"), attn_impl=req.get("attn_impl", "sdpa"),
                     tf32=req.get("tf32", True), compile=req.get("compile", False),
                     chat_template_kwargs=req.get("chat_template_kwargs"))
        if pol.get("reference") and req["recipe"] == "eval" and pol.get("model_from_job"):
            # KL to the reference: its log-probs of the policy's samples, processed identically
            req["_ref_lm"] = LM.load(pol["reference"], device=dev, dtype=pol.get("dtype", "float32"),
                                     attn_impl=req.get("attn_impl", "sdpa"), tf32=req.get("tf32", True),
                                     chat_template_kwargs=req.get("chat_template_kwargs"))
        if pol.get("guidance"):
            # the reference guided by an earlier job's value model; a failure here fails the job
            from pita.guidance.decode import GuidedDecoder
            from pita.guidance.value_model import ValueModel

            gd = pol["guidance"]
            ckpt = ctx.dep_result(gd["from_job"])["checkpoint"]
            vm = ValueModel.load(ckpt, device=dev).eval()
            req["_vm"] = vm
            if "eta" in gd:  # one eta for data collection; evaluation sweeps req["etas"]
                req["_guide"] = GuidedDecoder(vm, gd["mode"], gd["eta"], gd.get("top_k", 20),
                                               gd.get("offset_shift", "none"), gd.get("offset_temperature", "after"))
            ctx.log.info("policy: %s guided by %s (mode %s, eta %s, top_k %s)", pol["model"], ckpt, gd["mode"],
                         gd.get("eta", req.get("etas")), gd.get("top_k", 20))
        sc = req["scoring"]
        rm = None
        if sc.get("reward_model"):
            from pita.rewards.function import reward_scorer

            rm = reward_scorer(sc["reward_model"], device=dev, batch_size=sc["reward_batch_size"],
                                   inputs=sc.get("reward_input", "prompt_completion"),
                                   score=sc.get("reward_score", "margin"))
        extractor = examples[0].meta.get("extractor", "auto") if examples else "auto"
        task = examples[0].task if examples else "math"
        if task == "reward" and rm is None:
            raise JobError(f"dataset {ds.name} is a reward task but no reward model is configured "
                           f"(model.reward_models.{ds.name})")
        scorer = Scorer(task=task, extractor=extractor, bonus=float(sc.get("correctness_bonus", 1.0)), rm=rm)
    return lm, scorer


@job_kind("generation.shard")
def shard(ctx):
    from pita.datasets.config import DatasetConfig
    from pita.datasets.loading import load_examples
    from pita.generation.recipes import RUNNERS

    req = dict(ctx.params["request"])
    if req.get("etas_from"):  # etas an earlier job chose (the eta search): none chosen, nothing to sample
        req["etas"] = [float(e) for e in ctx.dep_result(req["etas_from"]).get("etas", [])]
    # an OOM retry halves the job's batch_size param: the generation batch follows it
    req["sampling"] = dict(req["sampling"], batch_size=int(ctx.params.get("batch_size", req["sampling"]["batch_size"])))
    ds = DatasetConfig(**req["dataset"])
    examples = load_examples(ds, req["split"])
    if len(examples) != ctx.params["n_examples"]:
        raise JobError(f"dataset {ds.name} {req['split']} has {len(examples)} examples now but {ctx.params['n_examples']} "
                       f"when the run was planned; the source changed under the run")
    a, b = ctx.params["chunks"]
    size = req["chunk_size"]
    ctx.paths.checkpoints.mkdir(parents=True, exist_ok=True)
    todo = [k for k in range(a, b) if not _chunk_file(ctx.paths, k).exists()]
    if len(todo) < b - a:
        ctx.log.info("chunks %d..%d: %d already done earlier, %d to do", a, b - 1, b - a - len(todo), len(todo))
    if not todo:
        return {"chunks": [a, b], "records": _count(ctx.paths, a, b)}
    snap = (req.get("policy") or {}).get("snapshot")
    if snap is not None:  # the policy at a fraction of its training: the snapshot its job saved
        got = ctx.dep_result(req["policy"]["model_from_job"]).get("snapshots", {}).get(snap)
        if got is None:
            ctx.log.info("the training job saved no snapshot at %s of its steps (too few steps): nothing to "
                         "evaluate", snap)
            for k in todo:
                atomic_write(_chunk_file(ctx.paths, k), "")
            return {"chunks": [a, b], "records": 0}
    if req.get("etas_from") and not req["etas"]:
        for k in todo:
            atomic_write(_chunk_file(ctx.paths, k), "")
        return {"chunks": [a, b], "records": 0}
    lm, scorer = prepare(ctx, req, examples, ds)
    run = RUNNERS[req["recipe"]]
    for k in todo:
        chunk = examples[k * size:(k + 1) * size]
        records = run(lm, chunk, req, scorer)
        atomic_write(_chunk_file(ctx.paths, k), "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        ctx.log.info("chunk %d: %d examples -> %d records", k, len(chunk), len(records))
    # tokens sampled by this attempt (chunks finished by an earlier attempt are not counted again)
    return {"chunks": [a, b], "records": _count(ctx.paths, a, b), "tokens": getattr(lm, "tokens_generated", 0),
            "sequences": getattr(lm, "sequences_generated", 0), "scored": getattr(scorer, "calls", 0)}


def _count(paths, a: int, b: int) -> int:
    return sum(sum(1 for _ in open(_chunk_file(paths, k))) for k in range(a, b))


def gather(ctx) -> list[dict]:
    """Every record of the shards named in params["shards"], in chunk order."""
    records = []
    for sid in ctx.params["shards"]:
        sp = ctx.run.job(sid)
        a, b = ctx.dep_result(sid)["chunks"]
        for k in range(a, b):
            with open(_chunk_file(sp, k)) as f:
                records.extend(json.loads(line) for line in f)
    return records


def save_records(ctx, records: list[dict]) -> str:
    """``artifacts/data`` (Arrow) and ``artifacts/preview.csv``; returns the data path."""
    import csv

    from datasets import Dataset

    out = ctx.paths.artifacts / "data"
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(records).save_to_disk(str(out))
    with open(ctx.paths.artifacts / "preview.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(records[0].keys()), extrasaction="ignore")
        w.writeheader()
        for r in records[:100]:
            w.writerow(r)
    return str(out)


@job_kind("generation.merge")
def merge(ctx):
    records = gather(ctx)
    if not records:
        raise JobError(f"generation produced no records (recipe {ctx.params['recipe']}); nothing to merge")
    out = save_records(ctx, records)
    cols = list(records[0].keys())
    summary = {"path": out, "records": len(records), "recipe": ctx.params["recipe"], "columns": cols}
    rewards = [r["reward"] for r in records if isinstance(r.get("reward"), (int, float))]
    if rewards:
        summary["mean_reward"] = sum(rewards) / len(rewards)
    correct = [r["correct"] for r in records if isinstance(r.get("correct"), bool)]
    if correct:
        summary["accuracy"] = sum(correct) / len(correct)
    return summary
