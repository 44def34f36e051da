"""GRPO-HF: GRPO on a learned reward. Round r: preference pairs sampled from the round's policy
-> a Bradley-Terry proxy reward model on the pairs of rounds 0..r (the same job kind and head as
Q#-HF's proxy, pita/guidance/proxy.py) -> GRPO rewarded by the proxy's score of the full sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from pita.algos.base import preference_labels, register_algorithm, training_settings
from pita.algos.grpo import GRPO, GRPOConfig
from pita.core.job import Job
from pita.guidance.proxy import ProxyKeys, check_proxy_keys, proxy_job


@dataclass
class GRPOHFConfig(ProxyKeys, GRPOConfig):
    """GRPO's keys with GRPO's defaults: the same sample budget (batch_size, epochs,
    num_generations), so GRPO and GRPO-HF differ in their reward only (a learned proxy here)."""


@register_algorithm
class GRPOHF(GRPO):
    name = "GRPO-HF"
    Config = GRPOHFConfig
    uses_preference_pairs = True
    trains_proxy = True
    proxy_batch_size = 32

    def check(self, cfg, n_devices: int) -> list[str]:
        return super().check(cfg, n_devices) + check_proxy_keys(self.key, self.c)

    def plan_round(self, p, r: int, prev: str | None, merges: list[str], base: dict) -> list[Job]:
        gen, merge = self.collect_pairs(p, r, prev)
        merges.append(merge)
        # round 0's proxy learns round 0's shared pairs alone: one job for every arm of a grid
        shared_id = f"{self.name}.{p.family}.{p.ds.name}.r0.proxy"
        proxy = proxy_job(shared_id if r == 0 else f"{p.prefix(self.name)}.r{r}.proxy", merges, p.paths["guidance"],
                          epochs=self.c.proxy_epochs,
                          lr=self.c.proxy_lr, labels=preference_labels(p.cfg), seed=p.cfg.system.seed + r,
                          batch_size=self.proxy_batch_size, token_budget=8192, head_dim=128, memory_gb=p.mem[f"proxy.{self.name}"],
                          group=f"round {r}", tokenizer=p.paths["reference"],
                          training=training_settings(p.cfg, self.c, whole=self.proxy_batch_size),
                          heldout=self.c.proxy_heldout, weight_decay=self.c.proxy_weight_decay,
                          head_lr_scale=self.c.proxy_head_lr_scale)
        train = self.train_job(p, r, ([prev] if prev else []) + [proxy.id],
                               {**base, "policy_from": prev, "proxy": proxy.id, "seed": p.seed(r)})
        if r == 0 and ("planned", shared_id) in p.shared:
            return gen + [train]
        if r == 0:
            p.shared[("planned", shared_id)] = True
        return gen + [proxy, train]
