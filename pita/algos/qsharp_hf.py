"""Q#-HF: Q# on a learned reward. Each round a Bradley-Terry proxy reward model is trained on the
preference pairs of rounds 0..r (two continuations of a cut, labelled once by a draw on their
rewards, data_collection.pairs_per_prompt pairs per prompt and round;
pita/guidance/proxy.py), rescores every roll-out (batched, full sequences), and the value model
learns those scores, min-max normalised to [0, 1] as Q#'s (``normalize_targets``; mle loss, mle
guidance).
"""

from __future__ import annotations

from dataclasses import dataclass

from pita.algos.base import preference_labels, register_algorithm, training_settings
from pita.algos.value_guided import ReturnsFilterKey, ValueGuidedAlgorithm, ValueGuidedConfig, returns_examples
from pita.core.job import Job
from pita.guidance.proxy import ProxyKeys, check_proxy_keys, proxy_job


@dataclass
class QSharpHFConfig(ProxyKeys, ReturnsFilterKey, ValueGuidedConfig):
    pass


@register_algorithm
class QSharpHF(ValueGuidedAlgorithm):
    name = "QSharp-HF"
    Config = QSharpHFConfig
    uses_preference_pairs = True
    trains_proxy = True

    def default_loss(self, task: str) -> str:
        return "mle"

    def check(self, cfg, n_devices: int) -> list[str]:
        return super().check(cfg, n_devices) + check_proxy_keys(self.key, self.c)

    def round_inputs(self, p, r: int, merges: list[str]) -> tuple[list[Job], dict]:
        c = self.c
        job = proxy_job(f"{p.prefix(self.name)}.r{r}.proxy", merges, p.paths["guidance"], epochs=c.proxy_epochs,
                        lr=c.proxy_lr, labels=preference_labels(p.cfg), seed=p.cfg.system.seed + r, batch_size=c.batch_size,
                        token_budget=c.token_budget, head_dim=c.head_dim, memory_gb=p.mem[f"proxy.{self.name}"],
                        group=f"round {r}", training=training_settings(p.cfg, c, whole=c.batch_size),
                        heldout=c.proxy_heldout, head=c.head, weight_decay=c.proxy_weight_decay,
                        head_lr_scale=c.proxy_head_lr_scale)
        return [job], {"proxy": job.id}

    @classmethod
    def value_examples(cls, ctx, records: list[dict], device: str) -> list:
        from pita.guidance.proxy import score_sequences
        from pita.guidance.rollouts import sequence_ids
        from pita.guidance.value_model import ValueModel

        recs = [r for r in records if r["continuation_ids"]]
        if not recs:
            return []
        pvm = ValueModel.load(ctx.dep_result(ctx.params["proxy"])["checkpoint"], device=device).eval()
        # scored micro_batch_size rows at a time: an OOM retry, which halves it, reaches the scoring too
        targets = score_sequences(pvm, [sequence_ids(r) for r in recs], device,
                                  batch=max(1, int(ctx.params.get("micro_batch_size") or 64)))
        del pvm
        # a Bradley-Terry reward is defined up to a constant and each round's proxy is trained
        # afresh: centre its scores so that rounds share the atoms of round 0
        mean = sum(targets) / len(targets)
        ctx.log.info("proxy rewards centred (mean was %.3f)", mean)
        return returns_examples(recs, targets=[t - mean for t in targets])
