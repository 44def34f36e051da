"""Value roll-out records (the ``value_rollouts`` recipe) as training data: reading, pairing, ids.

A record is one sampled continuation of one cut of one prompt: ``id``, ``cut``, ``prompt_ids``,
``prefix_ids`` (the roll-in up to the cut), ``continuation_ids``, ``reward`` and, for math,
``correct``. Value-guided jobs read the merged data of every round so far; each record is tagged
with its round (``_round``) so that a cut of round 0 and the same cut of round 1 stay apart.
"""

from __future__ import annotations


def read_rounds(ctx, merges: list[str]) -> list[dict]:
    """The records of the merge jobs ``merges`` (one per round, in order), tagged with their round."""
    from datasets import load_from_disk

    recs = []
    for i, m in enumerate(merges):
        for r in load_from_disk(ctx.dep_result(m)["path"]).to_list():
            r["_round"] = i
            recs.append(r)
    return recs


def sequence_ids(r: dict) -> list[int]:
    """Prompt, roll-in and continuation: the whole sequence a value model reads."""
    return list(r["prompt_ids"]) + list(r["prefix_ids"]) + list(r["continuation_ids"])


def _by_cut(records) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["id"], r["cut"], r.get("_round", 0)), []).append(r)
    return groups


def continuation_pairs(records, seed: int, beta: float, sampling: bool = True,
                       per_prompt: int | None = None, ties: str = "drop") -> list[tuple[dict, dict, bool]]:
    """(chosen, rejected, tie) for each disjoint pair of continuations of a cut (1-2, 3-4, ...),
    by a Bradley-Terry draw on their rewards (``sampling=False``: the higher reward is chosen); a
    pair with equal rewards is a tie (no preference). ``ties="draw"``: a tie is labelled by the
    same draw as any pair (a coin flip at equal rewards, as the PITA reference labels every
    pair); ``"drop"``: its order is left as sampled, for the caller to leave out.

    ``per_prompt``: the labelled-pair budget, at most this many pairs per prompt and round (the
    first ones in cut order), the same budget every preference-learning method gets
    (``data_collection.pairs_per_prompt``). Each pair's label is drawn once, keyed by the pair
    and ``seed`` (the run's seed), so later rounds see the same labels for earlier rounds' pairs."""
    from pita.rewards.preferences import sample_preference

    out = []
    used: dict[tuple, int] = {}
    for key, grp in sorted(_by_cut(records).items(), key=lambda kv: (str(kv[0][0]), kv[0][2], kv[0][1])):
        grp = [g for g in grp if g["continuation_ids"]]
        prompt = (key[0], key[2])
        for i in range(0, len(grp) - 1, 2):
            if per_prompt is not None and used.get(prompt, 0) >= per_prompt:
                break
            used[prompt] = used.get(prompt, 0) + 1
            a, b = grp[i], grp[i + 1]
            tie = a["reward"] == b["reward"]
            if tie and ties != "draw":
                out.append((a, b, True))
                continue
            tag = "/".join(map(str, key)) + ("" if i == 0 else f"/{i // 2}")
            c, rj, _p = sample_preference([a["reward"], b["reward"]], seed, tag, beta, sampling)
            out.append(((a, b)[c], (a, b)[rj], tie))
    return out
