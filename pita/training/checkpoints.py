"""Checkpoints of a training job: paced while it trains, resumed by a re-run attempt, and the
policy saved whole by rank 0 when it ends (``train_and_save``)."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from pita.core.errors import JobError
from pita.core.ranks import is_rank0
from pita.training.sharding import fsdp_units, is_sharded, rank_parameters

CHECKPOINT_SHARE = 0.05  # training.save_steps=auto: checkpoints take at most this share of a job's time
CHECKPOINT_WRITE_BPS = 0.5e9  # bytes a second assumed for the first checkpoint, before one was timed


def checkpoint_args(p: dict) -> dict:
    """TrainingArguments' checkpoint keys: every ``save_steps`` steps, or (auto) when
    :class:`CheckpointPacer` says so; the last checkpoint kept. Weights and optimizer state go to
    ``<job>/artifacts/trainer/checkpoint-<step>``, where a re-run attempt finds them."""
    s = p.get("save_steps", "auto")
    if s == 0:
        return {"save_strategy": "no"}
    if s == "auto":  # the pacer sets should_save itself
        return {"save_strategy": "no", "save_total_limit": 1}
    return {"save_strategy": "steps", "save_steps": int(s), "save_total_limit": 1}


def checkpoint_pacer(p: dict, n_params: int):
    """training.save_steps=auto: a TrainerCallback that saves when the training time since the last
    checkpoint is at least 1/CHECKPOINT_SHARE times what a checkpoint costs (the last one's
    measured time; before the first, the fp32 weights and AdamW state at CHECKPOINT_WRITE_BPS). The
    ranks of a k-device job decide together: rank 0's interval, in steps, is broadcast at the steps
    where all of them stand (the first, and each checkpoint)."""
    import time

    from transformers import TrainerCallback

    if p.get("save_steps", "auto") != "auto":
        return None

    class CheckpointPacer(TrainerCallback):
        def __init__(self):
            self.cost = 12.0 * n_params / CHECKPOINT_WRITE_BPS
            self.interval = None  # steps between checkpoints, once agreed
            self.last_step, self.t_step, self.t_save = 0, None, None
            self.step_s = None

        def on_train_begin(self, args, state, control, **kw):
            self.last_step = state.global_step  # a resumed job starts at its checkpoint: no save there
            return control

        def on_step_begin(self, args, state, control, **kw):
            self.t_step = time.monotonic()

        def on_step_end(self, args, state, control, **kw):
            took = time.monotonic() - self.t_step if self.t_step is not None else 0.0
            self.step_s = took if self.step_s is None else 0.8 * self.step_s + 0.2 * took
            if self.interval is None:
                self.interval = self._agree(state)
            if state.global_step - self.last_step >= self.interval and state.global_step < state.max_steps:
                control.should_save = True
                self.t_save = time.monotonic()
            return control

        def on_save(self, args, state, control, **kw):
            if self.t_save is not None:
                self.cost = time.monotonic() - self.t_save
            self.last_step, self.t_save = state.global_step, None
            self.interval = self._agree(state)
            return control

        def _agree(self, state) -> int:
            mine = max(1, int(self.cost / (CHECKPOINT_SHARE * max(self.step_s or 1e-3, 1e-3)) + 0.999))
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                box = [mine]
                dist.broadcast_object_list(box, src=0)
                mine = int(box[0])
            return mine

    return CheckpointPacer()


def _remove_checkpoints(out: Path, which=None) -> None:
    """Delete ``out``'s checkpoint folders (those ``which`` accepts, or all)."""
    for c in out.glob("checkpoint-*"):
        if which is None or which(c):
            shutil.rmtree(c, ignore_errors=True)


def resume_point(ctx, p: dict, out) -> tuple[str, int] | None:
    """(checkpoint, its step) a re-run attempt continues from (the last one in ``out``), or None. A
    checkpoint written under other settings (not counting the micro-batch, which an OOM retry
    halves while the effective batch stays) is removed rather than resumed, and so is one an
    attempt died while writing (the Trainer writes trainer_state.json last)."""
    import torch.distributed as dist
    from transformers.trainer_utils import get_last_checkpoint

    out = Path(out)
    keep = json.loads(json.dumps({k: v for k, v in p.items() if k not in ("micro_batch_size",
                                                                           "gradient_accumulation_steps")},
                                 sort_keys=True))
    stamp = out / "pita-params.json"
    if is_rank0():  # rank 0 clears stale and half-written checkpoints before any rank looks
        def half_written(c: Path) -> bool:
            if (c / "trainer_state.json").exists():
                return False
            ctx.log.info("removing %s: an earlier attempt was stopped while writing it", c)
            return True

        _remove_checkpoints(out, half_written)
        last = get_last_checkpoint(str(out)) if out.is_dir() else None
        if last and (not stamp.exists() or json.loads(stamp.read_text()) != keep):
            ctx.log.info("removing checkpoints written under other settings: %s", last)
            _remove_checkpoints(out)
        out.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(keep, sort_keys=True))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    last = get_last_checkpoint(str(out)) if out.is_dir() else None
    if last is None:
        return None
    return last, int(json.loads((Path(last) / "trainer_state.json").read_text())["global_step"])



def _save_policy(ctx, trainer, tok, lora: bool, out=None, merge: bool = True) -> str:
    """The trained policy as a plain model in ``out`` (default ``artifacts/policy``), gathered to
    rank 0 when sharded. ``merge=False`` (a snapshot mid-training) leaves LoRA's adapters as they
    are and saves them alone: transformers loads them onto their base for the evaluation."""
    out = out or ctx.paths.artifacts / "policy"
    state = None
    if is_sharded(trainer.model):  # every rank takes part in gathering the shards to rank 0's CPU
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not trainer.is_world_process_zero():  # rank 0 writes the checkpoint
        return str(out)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if lora and not merge:  # the adapters (and their base's path) alone; training goes on unchanged
        model.save_pretrained(out)
        tok.save_pretrained(out)
        return str(out)
    if lora:
        model = model.merge_and_unload()  # the evaluation loads a plain model
    if state is not None:
        _plain_copy(model, state).save_pretrained(out)
    else:
        model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _plain_copy(model, state: dict):
    """The sharded ``model`` as a plain model holding the gathered ``state`` (rank 0's full state
    dict, on the CPU): saving the FSDP module itself would reach for other ranks' shards from
    rank 0 alone. Built on the meta device and given the gathered tensors, so nothing is copied."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    plain.load_state_dict(state, strict=False, assign=True)
    plain.tie_weights()
    for name, buf in list(plain.named_buffers()):  # not in a state dict (rotary frequencies): FSDP leaves them whole
        if buf.is_meta:
            owner, _, leaf = name.rpartition(".")
            plain.get_submodule(owner).register_buffer(leaf, model.get_buffer(name).detach().cpu(), persistent=False)
    missing = [n for n, w in list(plain.named_parameters()) + list(plain.named_buffers()) if w.is_meta]
    if missing:
        raise JobError(f"the gathered policy lacks {len(missing)} tensor(s), e.g. {missing[:3]}; nothing was saved")
    plain.generation_config = model.generation_config
    return plain


def snapshot_dir(ctx, fraction: str):
    return ctx.paths.artifacts / "snapshots" / f"at-{fraction}"


def snapshot_saver(ctx, trainer, tok, p: dict):
    """A TrainerCallback saving the policy at each of ``p["snapshots"]`` (fractions of the
    optimizer steps, eval.checkpoints) short of the last step, for the evaluations along training.
    Every rank calls it (a sharded policy is gathered); a snapshot an earlier attempt saved stays."""
    from transformers import TrainerCallback

    fractions = [float(f) for f in p.get("snapshots") or []]
    if not fractions:
        return None
    if p["lora_r"] > 0 and is_sharded(trainer.model):
        ctx.log.warning("eval.checkpoints: no snapshots of a sharded LoRA policy (its adapters are not gathered "
                        "mid-training); the final policy is evaluated")
        return None

    class SnapshotSaver(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            taken = set()
            for f in fractions:
                step = max(1, round(f * state.max_steps))
                out = snapshot_dir(ctx, f"{f:g}")
                if step in taken:  # two fractions of a short run on one step: one snapshot, the smaller fraction's
                    continue
                taken.add(step)
                if state.global_step == step < state.max_steps and not (out / ".done").exists():
                    _save_policy(ctx, trainer, tok, p["lora_r"] > 0, out=out, merge=False)
                    if trainer.is_world_process_zero():
                        (out / ".done").write_text(str(step))
                        ctx.log.info("snapshot at %.0f%% of training (step %d of %d): %s", 100 * f, step,
                                     state.max_steps, out)
            return control

    return SnapshotSaver()


def snapshots_saved(ctx, p: dict) -> dict:
    """{fraction: {"checkpoint", "step"}} of the snapshots on disk (result key ``snapshots``)."""
    out = {}
    for f in p.get("snapshots") or []:
        d = snapshot_dir(ctx, f"{float(f):g}")
        if (d / ".done").exists():
            out[f"{float(f):g}"] = {"checkpoint": str(d), "step": int((d / ".done").read_text())}
    return out


def train_and_save(ctx, trainer, tok, p: dict, key: str) -> tuple[dict, list[dict]]:
    """Train (from the job's last checkpoint when an earlier attempt left one), write the log
    history and the policy; the common result and the logged rows with ``key``."""
    import warnings

    pacer = checkpoint_pacer(p, sum(w.numel() for w in trainer.model.parameters()))  # before any sharding
    if pacer is not None:
        trainer.add_callback(pacer)
    saver = snapshot_saver(ctx, trainer, tok, p)
    if saver is not None:
        trainer.add_callback(saver)
    point = resume_point(ctx, p, trainer.args.output_dir) if p.get("save_steps", "auto") != 0 else None
    last, resumed = point if point else (None, None)
    if last:
        ctx.log.info("resuming from %s (step %d; an earlier attempt of this job wrote it)", last, resumed)
    from pita.core import preempt

    if preempt.enabled() and p.get("save_steps", "auto") != 0:  # under Slurm: save on USR1/TERM, then stop
        trainer.add_callback(preempt.save_on_signal_callback())
    with warnings.catch_warnings(), (preempt.saving() if preempt.enabled() else contextlib.nullcontext()):
        # TRL's own use of a transformers 5.x deprecated property, once per job: nothing the user can change
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        out = trainer.train(resume_from_checkpoint=last)
    if preempt.requested() is not None and trainer.state.global_step < trainer.state.max_steps:
        raise preempt.Requeue(f"{preempt.requested()} received: saved a checkpoint at step {trainer.state.global_step} "
                              f"of {trainer.state.max_steps}; the next attempt resumes from it")
    hist = trainer.state.log_history
    if is_rank0():
        ctx.paths.write_metrics(hist)
    held = rank_parameters(trainer.model)
    units = {}
    if len(held) > 1:
        ctx.log.info("parameters held per rank: %s (%s)", ", ".join(f"{n:,}" for n in held),
                     "sharded" if is_sharded(trainer.model) else "each rank a whole copy")
    if is_sharded(trainer.model):
        units = {"policy_units": fsdp_units(trainer.model), "reference_units": fsdp_units(getattr(trainer, "ref_model", None))}
        ctx.log.info("FSDP units: policy %d, reference %d (one per decoder layer and the root)", units["policy_units"],
                     units["reference_units"])
    ckpt = _save_policy(ctx, trainer, tok, p["lora_r"] > 0)
    if is_rank0():  # the job is done: its resume points (weights and optimizer state) would only fill the disk
        _remove_checkpoints(Path(trainer.args.output_dir))
    # total_flos: transformers' own estimate of the training FLOPs (6 x parameters x tokens)
    return ({"checkpoint": ckpt, "train_loss": out.training_loss, "steps": out.global_step, "rank_params": held,
             "train_flops": float(getattr(trainer.state, "total_flos", 0.0) or 0.0) or None,
             "train_tokens": next((int(h["num_tokens"]) for h in reversed(hist) if "num_tokens" in h), None),
             "resumed_from_step": resumed, "snapshots": snapshots_saved(ctx, p), **units}, [h for h in hist if key in h])


