"""Data-collection recipes: what one chunk of examples becomes. Each documents its record schema.

samples           n samples per prompt, scored.
    {id, prompt, sample, completion, finish, n_tokens, reward, correct, extracted, reason}
preference_pairs  n >= 2 samples per prompt from the policy, scored (reward model and/or
                  correctness + bonus), one Bradley-Terry sampled pair per prompt (DPO).
    {id, prompt, chosen, rejected, chosen_reward, rejected_reward, p_chosen, chosen_finish, rejected_finish}
prompts           the prompt set itself, no model (GRPO generates online).
    {id, prompt, answer, task}
value_rollouts    value-guided collection: a roll-in from the policy (``rollin``: greedy or
                  sampled), ``cut_points`` cut positions in it (distinct token offsets drawn
                  uniformly, seeded per example), and continuations from each cut by the policy
                  or the frozen reference (``continue_from``): either ``continuations`` sampled
                  roll-outs (reward labels, Q#) or a greedy-vs-sampled pair (preference, PITA);
                  every continuation is scored on the full text prefix + continuation.
    {id, prompt, cut, prefix, continuation, kind, reward, correct,
     prompt_ids, prefix_ids, continuation_ids}  (kind: sampled | greedy; ids are the exact tokens,
     the chat-formatted prompt, and the continuation ends with EOS when it finished)

eval              evaluation: for each η in ``etas``, n samples per test prompt from the policy
                  (the reference guided by the value model when one is given; η = 0 is the
                  reference itself; or a trained policy, DPO / GRPO), scored, with each sample's
                  log-prob under the sampling distribution and under the identically processed
                  reference (the same temperature, top_p = 1), and ``kl_path``: the exact KL of the
                  policy's next-token distribution to the reference's at each step, summed along it.
    {id, eta, sample, completion, finish, n_tokens, reward, correct, extracted, reason, logp, logp_ref,
    kl_path}

Scores: math tasks use the correctness verifier (``reward = rm_score + bonus * correct``, the RM
term only when a reward model is configured); reward tasks use the reward model. A malformed
answer is incorrect with a recorded reason, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pita.datasets.base import Example

RECIPES = ("samples", "preference_pairs", "prompts", "value_rollouts", "eval")


def continuation_kinds(ro: dict) -> list[str]:
    """The continuations one cut of a ``value_rollouts`` collection samples: a greedy and a sampled
    one (greedy_vs_sampled, PITA's) or ``continuations`` sampled ones (Q#'s). What the recipe runs
    and what ``pita plan`` times."""
    return ["greedy", "sampled"] if ro.get("mode") == "greedy_vs_sampled" else ["sampled"] * int(ro.get("continuations", 1))


@dataclass
class Scorer:
    task: str
    extractor: str = "auto"
    bonus: float = 1.0
    rm: Any = None  # RewardModelScorer or None

    calls: int = 0  # completions scored so far (the labels a data collection paid for)

    def __call__(self, examples: list[Example], completions: list[str]) -> list[dict]:
        from pita.rewards.verifier import verify

        self.calls += len(completions)
        rm_scores = self.rm.score([e.prompt for e in examples], completions) if self.rm is not None else None
        out = []
        for i, (e, c) in enumerate(zip(examples, completions)):
            base = float(rm_scores[i]) if rm_scores is not None else 0.0
            if self.task == "math":
                v = verify(c, e.answer or "", self.extractor)
                out.append({"reward": base + self.bonus * float(v.correct), "correct": bool(v.correct),
                            "extracted": v.extracted, "reason": v.reason})
            else:
                out.append({"reward": base, "correct": None, "extracted": None, "reason": ""})
        return out


def run_samples(lm, examples, req, scorer) -> list[dict]:
    g = req["sampling"]
    outs = lm.generate([e.prompt for e in examples], n=req["n"], max_new_tokens=g["max_new_tokens"],
                       seed=req["seed"], keys=[e.id for e in examples], temperature=g["temperature"],
                       top_p=g["top_p"], top_k=g["top_k"], batch_size=g["batch_size"])
    flat_ex = [e for e, samples in zip(examples, outs) for _ in samples]
    flat = [s for samples in outs for s in samples]
    scores = scorer(flat_ex, [s.text for s in flat])
    recs = []
    k = 0
    for e, samples in zip(examples, outs):
        for j, s in enumerate(samples):
            recs.append({"id": e.id, "prompt": e.prompt, "sample": j, "completion": s.text, "finish": s.finish,
                         "n_tokens": len(s.token_ids), **scores[k]})
            k += 1
    return recs


def run_preference_pairs(lm, examples, req, scorer) -> list[dict]:
    from pita.rewards.preferences import make_pairs

    samples = run_samples(lm, examples, req, scorer)
    groups: dict[str, dict] = {}
    for r in samples:
        g = groups.setdefault(r["id"], {"id": r["id"], "prompt": r["prompt"], "completions": [], "rewards": [],
                                        "finishes": []})
        g["completions"].append(r["completion"])
        g["rewards"].append(r["reward"])
        g["finishes"].append(r["finish"])
    p = req["preferences"]
    return make_pairs(groups.values(), p.get("label_seed", req["seed"]), p["beta"], p["sampling"],
                      per_group=p.get("pairs_per_prompt"), round=p.get("round"))


def run_prompts(lm, examples, req, scorer) -> list[dict]:
    return [{"id": e.id, "prompt": e.prompt, "answer": e.answer, "task": e.task} for e in examples]


def cut_offsets(length: int, cut_points: int, seed: int, key: str) -> list[int]:
    """``cut_points`` distinct token offsets drawn uniformly from a roll-in of ``length`` tokens
    (0, the prompt itself, is one of the positions), as the Q# reference cuts; fixed by
    (seed, key), so a roll-in's cuts are the same on every worker. A roll-in shorter than
    ``cut_points`` is cut everywhere."""
    import random

    from pita.models.lm import row_seed

    positions = range(length) if length > 0 else range(1)
    if cut_points >= len(positions):
        return list(positions)
    return sorted(random.Random(row_seed(seed, key, 0)).sample(positions, cut_points))


def run_value_rollouts(lm, examples, req, scorer) -> list[dict]:
    g, ro = req["sampling"], req["rollouts"]
    prompts = [e.prompt for e in examples]
    guide = req.get("_guide")
    greedy_rollin = ro.get("rollin", "sampled") == "greedy"
    rollin = lm.generate(prompts, n=1, max_new_tokens=g["max_new_tokens"], seed=req["seed"],
                         keys=[f"{e.id}/rollin" for e in examples], temperature=0.0 if greedy_rollin else g["temperature"],
                         top_p=g["top_p"], top_k=g["top_k"], batch_size=g["batch_size"], guide=guide)
    # continuations from the round's policy (guided from round 1 on) or from the frozen reference
    cont_guide = guide if ro.get("continue_from", "reference") == "policy" else None
    # (example, cut offset, prefix ids) for every cut of every roll-in
    cuts = []
    for e, [s] in zip(examples, rollin):
        for c in cut_offsets(len(s.token_ids), ro["cut_points"], req["seed"], f"{e.id}/cuts"):
            cuts.append((e, c, s.token_ids[:c]))
    enc = lm.encode([lm.chat_prompt(e.prompt) for e in examples])
    prompt_ids = {e.id: ids for e, ids in zip(examples, enc)}
    rows, meta = [], []
    for e, c, prefix in cuts:
        for j, kind in enumerate(continuation_kinds(ro)):
            rows.append((prompt_ids[e.id] + prefix, max(1, g["max_new_tokens"] - c), f"{e.id}/cut{c}/{j}", kind))
            meta.append((e, c, prefix, kind))
    from pita.models.lm import row_seed

    texts, recs_ex = [], []
    bs = g["batch_size"]
    for s in range(0, len(rows), bs):
        chunk = rows[s:s + bs]
        for kind in ("greedy", "sampled"):
            idx = [i for i, r in enumerate(chunk) if r[3] == kind]
            if not idx:
                continue
            got = lm.generate_ids([chunk[i][0] for i in idx], [chunk[i][1] for i in idx],
                                  [row_seed(req["seed"], chunk[i][2], 0) for i in idx],
                                  0.0 if kind == "greedy" else g["temperature"], g["top_p"], g["top_k"],
                                  guide=cont_guide, return_stop=True)
            for i, (ids, _fin, _lp, _lr, eos_id) in zip(idx, got):
                # the EOS the continuation actually ended on (a model may have several); none at the limit
                texts.append((s + i, ids + ([eos_id] if eos_id is not None else [])))
    texts.sort()
    recs = []
    full = []
    for (k, ids), (e, c, prefix, kind) in zip(texts, meta):
        prefix_text = lm.tok.decode(prefix, skip_special_tokens=True)
        cont = lm.tok.decode(ids, skip_special_tokens=True)
        full.append(prefix_text + cont)
        recs.append({"id": e.id, "prompt": e.prompt, "cut": c, "prefix": prefix_text, "continuation": cont,
                     "kind": kind, "prompt_ids": prompt_ids[e.id], "prefix_ids": list(prefix),
                     "continuation_ids": list(ids)})
        recs_ex.append(e)
    for r, sc in zip(recs, scorer(recs_ex, full)):
        r.update(reward=sc["reward"], correct=sc["correct"])
    return recs


def run_eval(lm, examples, req, scorer) -> list[dict]:
    from pita.guidance.decode import GuidedDecoder

    g, vm, gd = req["sampling"], req.get("_vm"), req["policy"].get("guidance") or {}
    recs = []
    # a temperature sweep (the temperature control): each "eta" is a sampling temperature of the
    # unguided policy, its KL measured against the policy at the evaluation's temperature
    by_temperature = req.get("sweep") == "temperature"
    for eta in req.get("etas", [0.0]):
        temp, ref_temp = (float(eta), g["temperature"]) if by_temperature else (g["temperature"], None)
        guide = GuidedDecoder(vm, gd["mode"], eta, gd.get("top_k", 20), gd.get("offset_shift", "none"),
                              gd.get("offset_temperature", "after")) if vm is not None else None
        outs = lm.generate([e.prompt for e in examples], n=req["n"], max_new_tokens=g["max_new_tokens"],
                           seed=req["seed"], keys=[e.id for e in examples], temperature=temp,
                           top_p=g["top_p"], top_k=g["top_k"], batch_size=g["batch_size"], guide=guide,
                           reference_temperature=ref_temp)
        flat_ex = [e for e, samples in zip(examples, outs) for _ in samples]
        flat = [smp for samples in outs for smp in samples]
        scores = scorer(flat_ex, [smp.text for smp in flat])
        ref = req.get("_ref_lm")
        if ref is not None and g["temperature"] > 0:
            enc = dict(zip([e.id for e in examples], ref.encode([ref.chat_prompt(e.prompt) for e in examples])))
            prompts, paths = [enc[e.id] for e in flat_ex], [smp.token_ids for smp in flat]
            ends = [smp.meta.get("eos_id") for smp in flat]
            # the exact per-step KL along each sampled path, both models on the same tokens, and the
            # reference's log-prob of the path from the same forward (top_p = 1, as the sample's own
            # logp in LM.generate_ids)
            lrs: list[float] = []
            kls = lm.path_kl(ref, prompts, paths, ends, temperature=g["temperature"], batch_size=g["batch_size"],
                             logp_ref_out=lrs, top_p=g["top_p"])
            for smp, kl, lr in zip(flat, kls, lrs, strict=True):
                smp.meta["kl_path"], smp.meta["logp_ref"] = kl, lr
        for e, smp, sc, j in zip(flat_ex, flat, scores, [j for samples in outs for j in range(len(samples))]):
            recs.append({"id": e.id, "eta": float(eta), "sample": j, "completion": smp.text, "finish": smp.finish,
                         "n_tokens": len(smp.token_ids), **sc, "logp": smp.meta["logp"],
                         "logp_ref": smp.meta["logp_ref"], "kl_path": smp.meta.get("kl_path"),
                         **({"prompt": e.prompt} if req.get("with_prompt") else {})})
    return recs


RUNNERS = {"samples": run_samples, "preference_pairs": run_preference_pairs, "prompts": run_prompts,
           "value_rollouts": run_value_rollouts, "eval": run_eval}
