"""PITA: preference-guided inference-time alignment.

The value model learns which of two continuations of the same cut is preferred. The sampled
continuations of each cut are paired (1-2, 3-4, ...), at most ``data_collection.pairs_per_prompt``
pairs per prompt and round; a Bradley-Terry draw on their rewards (``data_collection.bt_beta``,
correctness bonus included on math, added to the reward model's score where the dataset has one,
as the PITA reference scores math), made once per pair, picks the preferred one: target 1 for it,
0 for the other, bce loss, bernoulli guidance. A tied pair (equal rewards) follows the one tie
rule of every preference learner, ``data_collection.ties``: dropped by default (a tie states no
preference; on 0/1 rewards without a reward model ties are most pairs, and kept as coin flips
they are noise labels), or ``draw``: labelled by the same draw, a coin flip, and kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from pita.algos.base import preference_labels, register_algorithm, supervision
from pita.algos.value_guided import ValueGuidedAlgorithm, ValueGuidedConfig
from pita.core.errors import JobError
from pita.core.job import Job


PAIR_MODES = ("greedy_vs_sampled", "sampled")


@dataclass
class PITAConfig(ValueGuidedConfig):
    # greedy_vs_sampled: each cut's pair is its greedy continuation against a sampled one, as the
    # PITA reference code pairs them (one pair per cut); sampled: continuations paired 1-2, 3-4, ...
    pair_mode: str = "greedy_vs_sampled"
    cut_points: int = 4  # one pair per cut (greedy_vs_sampled): 4 cuts give the 4 pairs of the label budget


@register_algorithm
class PITA(ValueGuidedAlgorithm):
    name = "PITA"
    Config = PITAConfig
    uses_preference_pairs = True
    has_reward_targets = False  # preference labels, 0 or 1

    def check(self, cfg, n_devices: int) -> list[str]:
        c, k = self.c, self.key
        p = super().check(cfg, n_devices)
        if c.pair_mode not in PAIR_MODES:
            from pita.core.names import unknown_name

            p.append(unknown_name(f"{k}.pair_mode", c.pair_mode, PAIR_MODES))
        if c.pair_mode == "sampled" and c.continuations % 2:
            p.append(f"{k}.continuations={c.continuations} must be even: PITA pairs the continuations of each cut "
                     f"(1-2, 3-4, ...); set e.g. {k}.continuations={max(2, c.continuations + 1)}")
        return p

    def rollout_mode(self) -> str:
        return self.c.pair_mode

    def rollin(self) -> str:
        return self.c.rollin or "greedy"

    def continue_from(self) -> str:
        return self.c.continue_from or "policy"

    def pairs_per_cut(self) -> int:
        return 1 if self.c.pair_mode == "greedy_vs_sampled" else self.c.continuations // 2

    def round_inputs(self, p, r: int, merges: list[str]) -> tuple[list[Job], dict]:
        return [], preference_labels(p.cfg)

    @classmethod
    def value_examples(cls, ctx, records: list[dict], device: str) -> list:
        from pita.guidance.rollouts import continuation_pairs, sequence_ids
        from pita.guidance.train import SeqExample, prompt_group

        p = ctx.params
        ties = p.get("ties", "drop")
        pairs = continuation_pairs(records, p["label_seed"], p["beta"], p["bt_sampling"], p["pairs_per_prompt"],
                                   ties=ties)
        if pairs and all(tie for _c, _r, tie in pairs):
            raise JobError(f"PITA: all {len(pairs)} preference pairs are ties (equal rewards), so there is no "
                           f"preference to learn; collect more continuations (algos.PITA.cut_points) or data "
                           f"(datasets.<name>.toy_train_size / a larger split)")
        n_ties = sum(tie for _c, _r, tie in pairs)
        kept = [(c, r) for c, r, tie in pairs if ties == "draw" or not tie]
        ctx.log.info("PITA: %d preference pairs, %d of them ties (%s)", len(pairs), n_ties,
                     "labelled by a coin flip and kept" if ties == "draw" else "left out")
        ctx.label_counts = {"pairs": len(pairs), "ties": n_ties, "ties_kept": ties == "draw",  # for the job's result
                            "supervision": supervision(len(pairs), n_ties, ties)}
        examples = []
        for c, r in kept:
            examples.append(SeqExample(sequence_ids(c), len(sequence_ids(c)) - len(c["continuation_ids"]), 1.0,
                                       prompt_group(c)))
            examples.append(SeqExample(sequence_ids(r), len(sequence_ids(r)) - len(r["continuation_ids"]), 0.0,
                                       prompt_group(r)))
        return examples
