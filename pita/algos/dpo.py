"""DPO: direct preference optimisation of the policy with TRL's ``DPOTrainer``.

Round r: preference pairs sampled from the round's policy (2 x ``data_collection.pairs_per_prompt``
samples per prompt, scored by the reward model and/or correctness + bonus, paired 1-2, 3-4, ...,
each pair labelled once by a Bradley-Terry draw) -> DPO from that policy. Its reference policy is the original model
(``ref_policy=original``) or the round's starting policy (``previous``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pita.algos.base import register_algorithm, supervision
from pita.algos.distributed import run_distributed, world_size
from pita.algos.post_training import PostTrainingAlgorithm, PostTrainingConfig, assistant, user
from pita.training.arguments import on_cuda, training_args
from pita.training.checkpoints import train_and_save
from pita.training.models import load_policy, load_reference, peft_config
from pita.training.sharding import job_trainer
from pita.core.errors import JobError
from pita.core.job import Job, add_kind_module, job_kind

add_kind_module("pita.algos.dpo")



@dataclass
class DPOConfig(PostTrainingConfig):
    batch_size: int = 16  # preference pairs per optimizer step
    beta: float = 0.1
    epochs: int = 2  # passes over the round's pairs
    # prompt + completion tokens kept; null: no truncation (a pair is at most the prompt plus
    # data_collection.max_new_tokens, so the answers that decided each preference are never cut)
    max_length: Optional[int] = None


@register_algorithm
class DPO(PostTrainingAlgorithm):
    name = "DPO"
    Config = DPOConfig
    uses_preference_pairs = True
    train_kind = "algo.dpo_train"

    def check(self, cfg, n_devices: int) -> list[str]:
        c, k = self.c, self.key
        p = super().check(cfg, n_devices)
        if c.epochs < 1:
            p.append(f"{k}.epochs={c.epochs} must be >= 1")
        if c.max_length is not None and c.max_length < 1:
            p.append(f"{k}.max_length={c.max_length} must be >= 1, or null for no truncation")
        return p

    def train_params(self, p) -> dict:
        c = self.c
        return {**super().train_params(p), "epochs": c.epochs, "max_length": c.max_length,
                "ties": str(p.cfg.data_collection.ties)}

    def plan_round(self, p, r: int, prev: str | None, merges: list[str], base: dict) -> list[Job]:
        gen, merge = self.collect_pairs(p, r, prev)
        merges.append(merge)
        train = self.train_job(p, r, ([prev] if prev else []) + [merges[-1]],
                               {**base, "policy_from": prev, "data": merges[-1], "seed": p.seed(r)})
        return gen + [train]


def strip_turn_end(ids: list[int], eos_id: int) -> list[int]:
    """A completion's tokens without the end of turn the chat template wrote after it (the last EOS
    and anything the template put after it): what a completion cut off by the length limit is."""
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == eos_id:
            return ids[:i]
    return ids


def cut_aware_dpo_trainer():
    """TRL's ``DPOTrainer``, except that a chosen or rejected completion cut off by the length
    limit (its ``*_finish`` column is ``length``) is trained without the end of turn the chat
    template appends: DPO must not raise, or lower, the probability of ending where the sampler
    was stopped."""
    from trl import DPOTrainer

    class CutAwareDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            dataset = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            tok = getattr(processing_class, "tokenizer", processing_class)
            cols = dataset.column_names
            if "chosen_finish" not in cols:
                return dataset
            key = "{}_ids" if "chosen_ids" in cols else "{}_input_ids"  # the column names of TRL < 1

            def strip(ex):
                for side in ("chosen", "rejected"):
                    if ex[f"{side}_finish"] == "length":
                        ex[key.format(side)] = strip_turn_end(ex[key.format(side)], tok.eos_token_id)
                return ex

            return dataset.map(strip, desc=f"Leaving the end of turn off cut-off completions ({dataset_name})")

    return CutAwareDPOTrainer


@job_kind("algo.dpo_train")
def dpo_train(ctx):
    from datasets import Dataset, load_from_disk
    from trl import DPOConfig as TRLDPOConfig

    from pita.tracking import tracker_settings

    p = ctx.params
    if p.get("devices", 1) > 1 and world_size() == 1:
        return run_distributed(ctx, "algo.dpo_train", p["devices"])
    records = load_from_disk(ctx.dep_result(p["data"])["path"]).to_list()
    # a tie (equal rewards) follows data_collection.ties: dropped, or kept in the order its
    # Bradley-Terry draw (a coin flip) gave it; two identical completions teach nothing either way
    ties = p.get("ties", "drop")
    n_ties = sum(r["chosen_reward"] == r["rejected_reward"] for r in records)
    pairs = [r for r in records if (ties == "draw" or r["chosen_reward"] != r["rejected_reward"])
             and r["chosen"] != r["rejected"]]
    if not pairs:
        raise JobError(f"DPO: none of the {len(records)} preference pairs has different rewards, so there is "
                       f"nothing to learn; raise data_collection.pairs_per_prompt or the data size")
    cuda = on_cuda()
    path, model, tok = load_policy(ctx, p, cuda)
    # round 0's reference is the policy's starting point, which TRL builds; after it, the original
    # model when that is the reference asked for
    ref_model = load_reference(p, model, cuda) if p["policy_from"] and p["ref_policy"] == "original" else None
    ds = Dataset.from_list([{"prompt": user(r["prompt"]), "chosen": assistant(r["chosen"]),
                             "rejected": assistant(r["rejected"]), "chosen_finish": r.get("chosen_finish", "eos"),
                             "rejected_finish": r.get("rejected_finish", "eos")} for r in pairs])
    cut = sum((r.get("chosen_finish") == "length") + (r.get("rejected_finish") == "length") for r in pairs)
    args = training_args(TRLDPOConfig, p, str(ctx.paths.artifacts / "trainer"), cuda, tracker_settings(ctx),
                         model=model, num_train_epochs=p["epochs"],
                         max_length=p["max_length"],
                         # named, not left to TRL's defaults (which move between releases)
                         loss_type=["sigmoid"], label_smoothing=0.0, truncation_mode="keep_start")
    ctx.log.info("DPO from %s on %d pairs (of %d; %d ties %s; %d completion(s) cut off by the length limit, "
                 "trained without an end of turn), reference policy %s, beta %s", path, len(pairs), len(records), n_ties,
                 "kept as drawn" if ties == "draw" else "dropped", cut,
                 "original" if ref_model is not None or not p["policy_from"] else "previous", p["beta"])
    trainer = job_trainer(cut_aware_dpo_trainer())(model=model, ref_model=ref_model, args=args, train_dataset=ds, processing_class=tok,
                         peft_config=peft_config(p, ctx.log))
    res, steps = train_and_save(ctx, trainer, tok, p, "loss")
    return {**res, "pairs": len(pairs), "supervision": supervision(len(records), n_ties, ties),
            "loss_first": steps[0]["loss"] if steps else None,
            "loss_last": steps[-1]["loss"] if steps else None,
            "reward_accuracy_last": steps[-1].get("rewards/accuracies") if steps else None}
