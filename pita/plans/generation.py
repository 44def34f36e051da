"""The ``generate`` workload: data generation for each selected dataset with the family's reference.

    python run_parallel.py experiment.workload=generate experiment.datasets=[arith] \
        data_collection.recipe=preference_pairs data_collection.samples_per_prompt=4

One ParallelDataGenerator request per dataset: shard jobs over every device, then a merge into
``jobs/gen.<family>.<dataset>.merge/artifacts/data`` (Arrow) and ``preview.csv``.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from pita.core.errors import ConfigError
from pita.core.job import Job
from pita.core.names import unknown_name


def dataset_cfg(cfg, name: str):
    from pita.datasets.config import DatasetConfig, validate_dataset_config

    if name not in cfg.datasets:
        raise ConfigError(unknown_name("experiment.datasets", name, list(cfg.datasets)))
    ds = DatasetConfig(**OmegaConf.to_container(cfg.datasets[name], resolve=True))
    validate_dataset_config(ds)
    return ds


def estimate_memory_gb(model_path: str, dtype: str, batch: int, seq_len: int, cuda: bool) -> float:
    """Inference estimate (weights + KV cache + logits) from the model's config; 0 if unreadable."""
    from transformers import AutoConfig

    from pita.core.memory import ModelShape, inference_bytes

    try:
        shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_path))
    except Exception:  # a hub id offline: the loading job reports it properly
        return 0.0
    return inference_bytes(shape, dtype, batch, seq_len, cuda=cuda) / 1e9


def request_for(cfg, ds, policy_model: str, reward_model: str | None) -> dict:
    dc = cfg.data_collection
    return {
        "recipe": dc.recipe, "dataset": OmegaConf.to_container(OmegaConf.structured(ds)), "split": dc.split,
        "policy": {"model": policy_model, "dtype": cfg.model.dtype, "guidance": None},
        "n": dc.samples_per_prompt, "chunk_size": dc.chunk_size, "seed": cfg.system.seed,
        "attn_impl": cfg.system.attn_impl, "tf32": cfg.system.tf32, "compile": cfg.system.compile,
        "sampling": {"max_new_tokens": dc.max_new_tokens, "temperature": dc.temperature, "top_p": dc.top_p,
                     "top_k": dc.top_k, "batch_size": dc.batch_size},
        "scoring": {"reward_model": reward_model, "reward_batch_size": dc.reward_batch_size,
                    "correctness_bonus": dc.correctness_bonus},
        "preferences": {"beta": dc.bt_beta, "sampling": dc.bradley_terry_sampling},
        "rollouts": {"cut_points": dc.cut_points, "continuations": dc.continuations, "mode": dc.continuation_mode},
    }


def generation_plan(cfg, device_totals: list[int], cuda: bool) -> list[Job]:
    from pita.datasets.loading import load_examples
    from pita.generation.parallel import ParallelDataGenerator, check_request
    from pita.models.families import check_tokenizers, resolve_family

    problems = []
    datasets = []
    for name in cfg.experiment.datasets:
        try:
            datasets.append(dataset_cfg(cfg, name))
        except ConfigError as e:
            problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    paths = resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed)
    check_tokenizers(paths["reference"], paths["guidance"])
    gen = ParallelDataGenerator(device_totals)
    jobs: list[Job] = []
    dc = cfg.data_collection
    for ds in datasets:
        examples = load_examples(ds, dc.split)
        rm = paths["reward_models"].get(ds.name)
        req = request_for(cfg, ds, paths["reference"], rm)
        req_problems = check_request(req)
        if examples and examples[0].task == "reward" and not rm and dc.recipe != "prompts":
            req_problems.append(f"dataset {ds.name} is scored by a reward model but model.reward_models.{ds.name} is "
                                f"not set for model={cfg.model.name}; add one (a local folder or hub id)")
        if req_problems:
            raise ConfigError(req_problems)
        mem = dc.memory_gb if dc.memory_gb is not None else estimate_memory_gb(
            paths["reference"], cfg.model.dtype, dc.batch_size, 256 + dc.max_new_tokens, cuda)
        jobs += gen.plan(req, f"gen.{cfg.model.name}.{ds.name}", len(examples), memory_gb=mem, group=ds.name)
    return jobs
