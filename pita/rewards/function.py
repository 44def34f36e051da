"""A reward of your own: a Python function scores a reward task's completions, in place of a
reward model.

    datasets.NAME.reward=mymodule:score        # mymodule.py in the folder pita runs from

    def score(prompts: list[str], completions: list[str]) -> list[float]: ...

The function is imported and called on one sample when the run is planned (a name that does not
import, or an answer that is not one finite number per completion, is exit 2 naming the key), and
again in each job that scores (data collection, evaluation, GRPO's reward), from the folder the
run was started in (``datasets.NAME.reward_dir``, set then). Inside the plan it takes the place
of ``model.reward_models.NAME`` as a spec ``python:<module>:<function>:<folder>``, so every job
that would load a reward model builds a :class:`FunctionScorer` instead (:func:`reward_scorer`).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from typing import Callable

from pita.core.errors import ConfigError, JobError

PREFIX = "python:"
SAMPLE = (["Write a short, kind review of a film you liked.\n"], [" It was a warm and funny film."])


def spec(target: str, folder: str) -> str:
    return f"{PREFIX}{target}:{folder}"


def is_function(value) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def _parts(value: str) -> tuple[str, str, str]:
    module, function, folder = value[len(PREFIX):].split(":", 2)
    return module, function, folder


def target_problem(target, where: str) -> str | None:
    """The form of ``module:function`` (no import)."""
    if not isinstance(target, str) or target.count(":") != 1 or not all(
            p and all(q.isidentifier() for q in p.split(".")) for p in target.split(":")):
        return (f"{where}={target!r} must be module:function (a Python function scoring completions, e.g. "
                f"myrewards:score for score() in myrewards.py in the folder pita runs from)")
    return None


def load(target: str, folder: str, where: str = "reward") -> Callable:
    """The function ``module:function``, imported with ``folder`` first on the path."""
    module, function = target.split(":")
    if folder and folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module's
        raise ConfigError(f"{where}={target!r}: cannot import {module!r} from {folder or os.getcwd()} "
                          f"({type(e).__name__}: {e}); put {module.replace('.', '/')}.py there, or install it") from e
    fn = getattr(mod, function, None)
    if not callable(fn):
        raise ConfigError(f"{where}={target!r}: {module} has no function {function!r}"
                          + (f" ({function} is a {type(fn).__name__})" if fn is not None else ""))
    return fn


def checked(fn: Callable, prompts: list[str], completions: list[str], where: str, error=ConfigError) -> list[float]:
    """``fn``'s scores for the pairs: one finite number per completion, or ``error`` saying what came back."""
    try:
        out = fn(list(prompts), list(completions))
    except Exception as e:  # noqa: BLE001 - the user's function failed
        raise error(f"{where}: the reward function raised {type(e).__name__}: {e}") from e
    try:
        scores = [float(x) for x in out]
    except (TypeError, ValueError) as e:
        raise error(f"{where}: the reward function must return one number per completion (a list of floats); it "
                    f"returned {type(out).__name__} {str(out)[:80]!r}") from e
    if len(scores) != len(completions):
        raise error(f"{where}: the reward function returned {len(scores)} scores for {len(completions)} completions")
    bad = [s for s in scores if not math.isfinite(s)]
    if bad:
        raise error(f"{where}: the reward function returned {bad[0]} (scores must be finite numbers)")
    return scores


def check(target: str, folder: str, where: str) -> None:
    """Import the function and score one sample: ConfigError (exit 2) naming ``where`` otherwise."""
    problem = target_problem(target, where)
    if problem:
        raise ConfigError(problem)
    checked(load(target, folder, where), *SAMPLE, where)


class FunctionScorer:
    """A reward function with a reward model's interface (``score(prompts, completions)``)."""

    def __init__(self, value: str, batch_size: int = 256):
        module, function, folder = _parts(value)
        self.target, self.where = f"{module}:{function}", f"reward function {module}:{function}"
        self.fn = load(self.target, folder, self.where)
        self.batch_size = batch_size
        self.truncated = 0

    def score(self, prompts: list[str], completions: list[str]) -> list[float]:
        out: list[float] = []
        for k in range(0, len(completions), self.batch_size):
            out += checked(self.fn, prompts[k:k + self.batch_size], completions[k:k + self.batch_size], self.where,
                           error=JobError)
        return out


def reward_scorer(value: str, **kw):
    """A scorer for ``model.reward_models.<dataset>``'s value: a reward function's spec, or a reward
    model (pita.rewards.reward_model.RewardModelScorer, with ``kw``)."""
    if is_function(value):
        return FunctionScorer(value, batch_size=max(1, int(kw.get("batch_size") or 256)))
    from pita.rewards.reward_model import RewardModelScorer

    return RewardModelScorer(value, **kw)
