"""What the planning modules share: dataset configs from the run config, generation requests. Memory
estimates: pita/plans/memory.py. One planning module per workload (generation.py, experiment.py,
synthetic.py) uses these; none uses another.
"""

from __future__ import annotations

import dataclasses

from omegaconf import OmegaConf

from pita.core.errors import ConfigError
from pita.core.names import unknown_name


def dataset_cfg(cfg, name: str):
    from pita.datasets.config import DatasetConfig, validate_dataset_config

    if name not in cfg.datasets:
        raise ConfigError(unknown_name("experiment.datasets", name, list(cfg.datasets)) + f"; a dataset of your own: "
                          f"+dataset@datasets.{name}=<the one whose format it has> datasets.{name}.path=<file>")
    d = OmegaConf.to_container(cfg.datasets[name], resolve=True)
    if d.get("name") != name:  # datasets.NAME composed from another's config: NAME in that one's format
        d["base"], d["name"] = d.get("base") or d.get("name"), name
    ds = DatasetConfig(**d)
    validate_dataset_config(ds)
    if ds.reward:  # imported and tried on a sample now: a bad one is exit 2 before anything runs
        import os

        from pita.rewards.function import check

        ds.reward_dir = ds.reward_dir or os.getcwd()
        check(ds.reward, ds.reward_dir, f"datasets.{name}.reward")
    return ds


def with_reward_functions(paths: dict, configs) -> dict:
    """The family's paths with each dataset's reward function (``datasets.NAME.reward``) in place
    of ``model.reward_models.NAME``: every job that scores that dataset calls the function. A
    dataset built on another (``base``) without a reward model of its own gets its base's."""
    from pita.rewards.function import spec

    configs = list(configs)
    rms = dict(paths["reward_models"])
    for ds in configs:  # a dataset of your own built on a reward task: that task's reward model by default
        if getattr(ds, "base", None) and ds.name not in rms and rms.get(ds.base):
            rms[ds.name] = rms[ds.base]
    rms.update({ds.name: spec(ds.reward, ds.reward_dir or "") for ds in configs if getattr(ds, "reward", None)})
    return dict(paths, reward_models=rms) if rms != paths["reward_models"] else paths


def reward_scoring(model_cfg, dataset: str) -> dict:
    from pita.models.families import reward_scoring as of

    return of(model_cfg, dataset)


def request_for(cfg, ds, policy_model: str, reward_model: str | None) -> dict:
    from pita.models.families import chat_template_kwargs

    dc = cfg.data_collection
    return {
        "recipe": dc.recipe, "dataset": dataclasses.asdict(ds), "split": dc.split,
        "policy": {"model": policy_model, "dtype": cfg.model.dtype, "guidance": None},
        "n": dc.samples_per_prompt, "chunk_size": dc.chunk_size, "seed": cfg.system.seed,
        "attn_impl": cfg.system.attn_impl, "tf32": cfg.system.tf32, "compile": cfg.system.compile,
        **chat_template_kwargs(cfg.model),
        "sampling": {"max_new_tokens": dc.max_new_tokens, "temperature": dc.temperature, "top_p": dc.top_p,
                     "top_k": dc.top_k, "batch_size": dc.batch_size},
        "scoring": {"reward_model": reward_model, "reward_batch_size": dc.reward_batch_size,
                    "correctness_bonus": dc.correctness_bonus, **reward_scoring(cfg.model, ds.name)},
        "preferences": {"beta": dc.bt_beta, "sampling": dc.bradley_terry_sampling},
        "rollouts": {"cut_points": dc.cut_points, "continuations": dc.continuations, "mode": dc.continuation_mode},
    }
