"""Score (prompt, completion) pairs with a Hugging Face sequence-classification reward model.

    scorer = RewardModelScorer("/models/my-rm", device="cuda:0", batch_size=32)
    scores = scorer.score(["What is 2+2?"], ["4"])   # -> [1.73]

The checkpoint must be a trained sequence classifier (``*ForSequenceClassification``): a causal
LM loads as one too, with a freshly initialised score head whose outputs are noise, so it is
refused instead. ``inputs="completion"`` scores the completion's text alone (as the PITA and Q#
reference code scores IMDB); ``"prompt_completion"`` renders each pair with the reward model's own
chat template when its tokenizer has one (user = prompt, assistant = completion), else as
``prompt + completion``. The score of a two-label classifier is its positive logit
(``score="positive_logit"``) or ``logit[1] - logit[0]`` (``"margin"``); a one-label model's is its logit.

Batches are formed after sorting by token length (less padding), and results come back in the
input order. Padding is on the right, with the id written into the model's ``config.pad_token_id``: HF's
sequence classifiers read the score at the rightmost token that is not that id, and right padding
keeps every real token at the position it has when scored alone (left padding would shift the
positions of models with absolute position embeddings), so a pair's score does not depend on its
batch. Inputs over ``max_length`` are
truncated (the tokenizer's ``truncation_side``, by default the end), never silently: each call
logs a warning and ``self.truncated`` counts them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from pita.core.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_LENGTH_CAP = 4096  # default max_length: tokenizer.model_max_length, capped here


def _check_batch_size(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ConfigError(
            f"data_collection.reward_batch_size={batch_size!r} must be a positive integer; "
            "set it to e.g. 32 (lower it if the reward model runs out of memory)"
        )


class RewardModelScorer:
    """A reward model loaded once, scoring many (prompt, completion) pairs in batches."""

    def __init__(
        self,
        path: str | os.PathLike,
        device: str = "cpu",
        batch_size: int = 32,
        dtype: str | torch.dtype = "float32",
        max_length: int | None = None,
        inputs: str = "prompt_completion",
        score: str = "margin",
    ):
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        _check_batch_size(batch_size)
        if inputs not in ("completion", "prompt_completion") or score not in ("positive_logit", "margin"):
            raise ConfigError(f"reward model inputs={inputs!r} / score={score!r}: inputs is completion or "
                              f"prompt_completion, score positive_logit or margin (model.reward_inputs / "
                              f"model.reward_scores)")
        self.inputs, self.score_kind = inputs, score
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ConfigError(
                    f"reward model dtype={dtype!r} is not known; choose one of: {', '.join(DTYPES)}"
                )
            dtype = DTYPES[dtype]
        bad_len = isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= 0
        if max_length is not None and bad_len:
            raise ConfigError(f"reward model max_length={max_length!r} must be a positive integer or None")
        self.path = str(path)
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.truncated = 0  # inputs cut to max_length, over the scorer's lifetime

        try:
            config = AutoConfig.from_pretrained(self.path)
        except (OSError, ValueError) as e:
            raise ConfigError(self._unloadable(e)) from e
        archs = list(getattr(config, "architectures", None) or [])
        if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
            raise ConfigError(
                f"reward model path {self.path!r} holds a {', '.join(archs)} (model_type "
                f"{config.model_type!r}), not a sequence classifier: its score head would be random. "
                "Point it at a trained *ForSequenceClassification reward model checkpoint"
            )
        if config.num_labels not in (1, 2):
            raise ConfigError(
                f"reward model path {self.path!r} has num_labels={config.num_labels}; a reward model "
                "needs 1 (score = the logit) or 2 (score = logit[1], or logit[1] - logit[0] with margin)"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            model, info = AutoModelForSequenceClassification.from_pretrained(
                self.path, dtype=dtype, output_loading_info=True
            )
        except (OSError, ValueError) as e:
            raise ConfigError(self._unloadable(e)) from e
        missing = [k for k in info.get("missing_keys", []) if k.split(".")[0] in ("score", "classifier")]
        if missing:
            raise ConfigError(
                f"reward model path {self.path!r} ({type(model).__name__}) has no trained score head "
                f"(missing {', '.join(sorted(missing))}): it would score at random. "
                "Point it at a trained reward model checkpoint"
            )
        self.model = model.to(self.device).eval()
        self.num_labels = model.config.num_labels

        tok = self.tokenizer
        if tok.pad_token_id is None:
            # The pad id only has to be consistent between padding and the model's pad search;
            # its embedding never matters (attention masks it).
            fallback = tok.eos_token if tok.eos_token is not None else tok.unk_token
            if fallback is None:
                raise ConfigError(
                    f"reward model tokenizer at {self.path!r} has no pad, eos or unk token to pad with; "
                    "save the tokenizer with a pad_token"
                )
            tok.pad_token = fallback
            log.info("reward model tokenizer has no pad token; padding with %r", fallback)
        tok.padding_side = "right"
        # The classifier finds the last real token through config.pad_token_id: it must be the id
        # we pad with, or the score is read at a pad position.
        self.model.config.pad_token_id = tok.pad_token_id
        self.pad_id = tok.pad_token_id

        tok_max = getattr(tok, "model_max_length", None) or MAX_LENGTH_CAP
        self.max_length = max_length if max_length is not None else int(min(tok_max, MAX_LENGTH_CAP))
        self.use_chat_template = bool(getattr(tok, "chat_template", None))

    def _unloadable(self, e: Exception) -> str:
        where = (
            "the local folder exists but could not be read as a Hugging Face checkpoint "
            "(needs config.json, the weights and the tokenizer files)"
            if Path(self.path).exists()
            else "no local folder of that name; as a hub id it needs network access or a local "
            "cache (HF_HUB_OFFLINE is "
            + repr(os.environ.get("HF_HUB_OFFLINE", "unset"))
            + "): download it beforehand and pass the local path"
        )
        return f"reward model path {self.path!r} could not be loaded: {where}. ({type(e).__name__}: {e})"

    # ------------------------------------------------------------------ encoding

    def _encode(self, prompt: str, completion: str) -> list[int]:
        tok = self.tokenizer
        if self.inputs == "completion":
            return tok(completion)["input_ids"]
        if self.use_chat_template:
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}],
                tokenize=False,
            )
            return tok(text, add_special_tokens=False)["input_ids"]
        return tok(prompt + completion)["input_ids"]

    def _truncate(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.max_length:
            return ids
        if getattr(self.tokenizer, "truncation_side", "right") == "left":
            return ids[-self.max_length :]
        return ids[: self.max_length]

    # ------------------------------------------------------------------ scoring

    @torch.inference_mode()
    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        """One float per pair, in the input order."""
        if len(prompts) != len(completions):
            raise ValueError(f"score: {len(prompts)} prompts but {len(completions)} completions")
        # An empty encoding (no BOS, empty texts) becomes one pad token so the batch has a width.
        encoded = [self._encode(p, c) or [self.pad_id] for p, c in zip(prompts, completions)]
        over = [i for i, ids in enumerate(encoded) if len(ids) > self.max_length]
        if over:
            self.truncated += len(over)
            longest = max(len(encoded[i]) for i in over)
            log.warning(
                "reward model: truncated %d of %d inputs to max_length=%d tokens (longest %d); "
                "their scores are read at the cut, not at the end of the completion",
                len(over), len(encoded), self.max_length, longest,
            )
            encoded = [self._truncate(ids) for ids in encoded]

        # Longest first: similar lengths share a batch, and an out-of-memory shows up at once.
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        scores: list[float] = [0.0] * len(encoded)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            width = max(len(encoded[i]) for i in idx)
            input_ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                ids = encoded[i]
                input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, : len(ids)] = 1
            logits = self.model(
                input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)
            ).logits.float()
            if self.num_labels == 1:
                batch_scores = logits[:, 0]
            else:
                batch_scores = logits[:, 1] if self.score_kind == "positive_logit" else logits[:, 1] - logits[:, 0]
            for row, i in enumerate(idx):
                scores[i] = float(batch_scores[row])
        return scores
