"""A training job's own trainer on fake tensors: one rank's peak memory, without a GPU or peers.

    row = measure_job(job, cfg, paths)                 # a DPO / GRPO / GRPO-HF job of a plan
    python -m bench.trainer_memory SPEC.json           # the same in this process (what measure_job runs)

What runs is the job's own function, ``pita.algos.dpo.dpo_train`` or ``pita.algos.grpo.grpo_train``,
with the job's planned params, in a fresh process (each measurement patches libraries for the
process's life): TRL's trainer as the job builds it (``pita.training``), accelerate's FSDP2 plugin
from the job's arguments with the mixed precision accelerate's state sets on a GPU group, fused
AdamW, the planned micro-batch and gradient accumulation with the trainer's own no_sync / sync
rule, TRL's fused log-prob head, on a fake process group of the planned world size (this process is
rank 0), through ``Trainer.train`` for ``steps`` optimizer steps. Every tensor is a fake one
(``FakeTensorMode``: shapes and dtypes, no storage); a dispatch mode counts the bytes of the
storages alive at each op, a storage resized (FSDP frees an all-gathered unit that way) counted
at its new size. The peak is taken over the optimizer steps (loading, when rank 0 holds the whole
model on the CPU, is not device memory).

The job's CUDA branch is driven on this CPU (``bench.cuda_branch``): ``on_cuda()`` is true for the
job, transformers' hardware checks (bf16, tf32) pass, and accelerate runs its CPU process group
with the FSDP2 plugin the job's code hands it (``pita.training.sharding.job_trainer`` turns the
group into FSDP exactly as on GPUs). What cannot run on fake tensors is replaced, and every row names the replacements:

    weights         built from each model's config.json (pita/models/architectures), none read
    tokenizer       a word-level stand-in: one token per word, so the prompts and completions have
                    the planned lengths (PROMPT_TOKENS, max_new_tokens)
    data            DPO's pairs / GRPO's prompts at those lengths
    sampling        HF generate's token loop (it reads token values): the prefill, the KV cache
                    grown to its full length, one decode step; TRL's calls of it are the job's own
    fused head      TRL's log-prob kernels as on CUDA: only labelled positions scored, each tile
                    folded in place as their Triton kernels fold it (the CPU fallback's fp32 copies
                    of every tile are not what a GPU holds)
    values          an op whose result depends on values (.item(), a boolean mask) answers a
                    constant / its largest shape
    collectives     the fake process group moves no bytes; object collectives return this rank's
    checkpoints     not written (their host memory is planned in pita/plans/host.py)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAND_INS = ["weights: built from config.json, none read", "tokenizer: one token per word",
             "data: prompts and completions of the planned lengths",
             "sampling: prefill, KV cache at full length, one decode step (HF generate's loop reads token values)",
             "TRL's fused log-prob head: its CUDA path (compact positions, tiles folded in place as by its "
             "Triton kernels)",
             "values: .item() a constant, boolean masks at their largest shape",
             "collectives: a fake process group", "checkpoints: not written"]
WORDS = ["a", "b", "c", "d", "user", "assistant", ":"]
TRACE = bool(os.environ.get("PITA_PEAK_TRACE"))  # record where the peak was set (the op and its stack)
TRACE_FROM = float(os.environ.get("PITA_PEAK_TRACE", "0") or 0) * 1e9
# with PITA_PEAK_TRACE: the trace also sums what is live at the peak by the op that made it, and
# PITA_TRACE_OPS=where,clone prints where each named op first made a large tensor
TRACE_OPS = set(filter(None, os.environ.get("PITA_TRACE_OPS", "").split(",")))


def measure_job(job, cfg, paths: dict, steps: int = 2, timeout: float = 3600.0) -> dict:
    """The peak bytes of ``job``'s rank 0 (a plan's DPO / GRPO / GRPO-HF training job) measured by
    running its job function on fake tensors in a fresh process. Returns the row: ``peak_bytes``,
    ``accumulation`` (micro-steps per optimizer step as run), ``world_size``, ``built_by``,
    ``as_the_job_runs`` and ``stand_ins``; a measurement that failed raises RuntimeError with the
    process's last lines."""
    from pita.plans.memory import PROMPT_TOKENS

    spec = {"job": job.to_dict(), "paths": paths, "steps": steps, "prompt_tokens": PROMPT_TOKENS,
            "max_new_tokens": int(cfg.data_collection.max_new_tokens)}
    with tempfile.TemporaryDirectory(prefix="pita-trainer-memory-") as tmp:
        f = Path(tmp) / "spec.json"
        f.write_text(json.dumps(spec))
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                   HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        r = subprocess.run([sys.executable, "-m", "bench.trainer_memory", str(f)], capture_output=True, text=True,
                           cwd=tmp, env=env, timeout=timeout)
        rows = [line for line in r.stdout.splitlines() if line.startswith("{")]
        if r.returncode != 0 or not rows:
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-12:])
            raise RuntimeError(f"measuring {job.id} exited {r.returncode}: {tail}")
        return json.loads(rows[-1])


# ---------------------------------------------------------------- what the measuring process builds
def stand_in_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of a few ids (valid in every vocabulary) with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: 4 + i for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
                         "{% if add_generation_prompt %}assistant : {% endif %}")
    tok.save_pretrained(str(folder))


def shape_folder(ref: str, root: Path) -> str:
    """A folder with ``ref``'s config.json (as pita.models.shapes reads it) and the stand-in tokenizer."""
    from pita.models.shapes import model_config

    d = root / ref.strip("/").replace("/", "--").replace(":", "-")
    if not (d / "config.json").exists():
        d.mkdir(parents=True, exist_ok=True)
        model_config(ref, "model").to_json_file(str(d / "config.json"))
        stand_in_tokenizer(d)
    return str(d)


def proxy_folder(guidance: str, root: Path) -> str:
    """A Bradley-Terry proxy checkpoint (pita.guidance.value_model's layout) around ``guidance``'s shape."""
    from dataclasses import asdict

    from pita.guidance.value_model import HEAD_FILE, META_FILE, HeadSpec
    from pita.models.shapes import model_config

    d = root / "proxy"
    (d / "backbone").mkdir(parents=True, exist_ok=True)
    src = Path(shape_folder(guidance, root))
    for f in src.iterdir():
        (d / "backbone" / f.name).write_bytes(f.read_bytes())
    cfg = model_config(guidance, "model")
    tc = cfg.get_text_config()
    spec = HeadSpec(loss="bradley_terry", head_dim=128, vocab_size=tc.vocab_size, hidden_size=tc.hidden_size)
    (d / META_FILE).write_text(json.dumps(asdict(spec)))
    import torch
    from torch import nn

    from pita.guidance.value_model import ValueModel

    class Shape(nn.Module):  # what the head reads of its backbone: the config and the embedding width
        def __init__(self):
            super().__init__()
            self.config = cfg

        def get_input_embeddings(self):
            return nn.Embedding(1, tc.hidden_size, device="meta")

    # the head keeps its initial (fake) weights, in the layout the job's loader checks
    head = {k: v for k, v in ValueModel(Shape(), spec).state_dict().items() if not k.startswith("backbone.")}
    torch.save(head, d / HEAD_FILE)
    return str(d)


def words(n: int, w: str = "a") -> str:
    return " ".join([w] * max(1, n))


def prepare(spec: dict, root: Path) -> tuple[dict, dict]:
    """(params, dependency results) of the job with every path replaced by a stand-in of the same shape."""
    p = dict(spec["job"]["params"])
    paths = spec["paths"]
    prompt = int(spec["prompt_tokens"]) - 5  # the stand-in template's user turn and assistant opening: 5 tokens
    new = int(p.get("max_completion_length") or spec["max_new_tokens"])
    ref = shape_folder(p["reference"], root)
    deps: dict = {}
    p["reference"] = ref
    p["save_steps"] = 0
    if p.get("policy_from"):
        deps[p["policy_from"]] = {"checkpoint": ref}
    if p.get("proxy"):
        deps[p["proxy"]] = {"checkpoint": proxy_folder(paths["guidance"], root)}
    if p.get("reward_model"):
        p["reward_model"] = shape_folder(p["reward_model"], root)
    if spec["job"]["kind"] == "algo.dpo_train":
        from datasets import Dataset

        n = int(p["batch_size"]) * (int(spec["steps"]) + 1)
        # chosen and rejected one token short of the limit: the template's end of turn completes them
        rows = [{"prompt": words(prompt), "chosen": words(new - 1, "b"), "rejected": words(new - 1, "c"),
                 "chosen_reward": 1.0, "rejected_reward": 0.0, "chosen_finish": "eos", "rejected_finish": "eos"}
                for _ in range(n)]
        Dataset.from_list(rows).save_to_disk(str(root / "pairs"))
        deps[p["data"]] = {"path": str(root / "pairs")}
    else:  # GRPO: the prompts of its dataset, at the planned length, in that dataset's own fields
        d = dict(p["dataset"])
        q, a = d.get("question_field") or "question", d.get("answer_field")
        n = (int(p["batch_size"]) // int(p["num_generations"])) * (int(spec["steps"]) + 1)
        with open(root / "prompts.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({q: words(prompt), "split": "train", **({a: "#### 4"} if a else {})}) + "\n")
        d.update(path=str(root / "prompts.jsonl"), prompt_template="{question}", prefix_words=10 ** 6,
                 train_cap=None, held_out=0, hub_id=None, train_split="train")
        p["dataset"] = d
    return p, deps


def _patch_for_fake_tensors(fake, counter) -> None:
    """What the libraries do that fake tensors cannot, made to work (module doc, 'stand-ins')."""
    import types
    import weakref

    import torch
    import torch.distributed as dist
    import transformers
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    from bench.cuda_branch import drive_cuda_branch

    drive_cuda_branch()

    # weights: every model is built from its config
    real_from_pretrained = transformers.PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls, path, *a, **kw):
        if not (Path(str(path)) / "config.json").exists():
            return real_from_pretrained(cls, path, *a, **kw)
        config = transformers.AutoConfig.from_pretrained(path)
        if "num_labels" in kw:
            config.num_labels = kw["num_labels"]
        dtype = kw.get("dtype") or kw.get("torch_dtype") or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        attn = {"attn_implementation": kw["attn_implementation"]} if kw.get("attn_implementation") else {}
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = cls._from_config(config, dtype=dtype, **attn)
        finally:
            torch.set_default_dtype(old)
        model.config._name_or_path = str(path)
        if kw.get("output_loading_info"):  # every weight "loaded": what a trained checkpoint reports
            return model, {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
        return model

    transformers.PreTrainedModel.from_pretrained = classmethod(from_pretrained)

    # a fake parameter cannot be swapped in place (FakeTensorMode holds weak references to it), which
    # is how Module.to converts one: a fake module moved to the CPU it is on, or to the meta device
    # (accelerate shards rank 0's model there before it loads the weights into the shards), stays
    # where it is; a dtype change (peft casts new adapters to their base layer's dtype) gives each
    # parameter a new one, tied parameters staying tied
    real_to = torch.nn.Module.to

    def to(self, *a, **kw):
        if not any(isinstance(w, FakeTensor) for w in self.parameters()):
            return real_to(self, *a, **kw)
        dev = kw.get("device", next((x for x in a if not isinstance(x, torch.dtype)), None))
        dtype = kw.get("dtype", next((x for x in a if isinstance(x, torch.dtype)), None))
        if str(dev) not in ("cpu", "meta", "None"):
            raise RuntimeError(f"a fake module moved to {dev}: the measurement runs on the CPU")
        if dtype is None:
            return self
        new: dict = {}
        for m in self.modules():
            for name, w in list(m._parameters.items()):
                if w is not None and w.is_floating_point() and w.dtype != dtype:
                    if id(w) not in new:
                        new[id(w)] = torch.nn.Parameter(w.detach().to(dtype), requires_grad=w.requires_grad)
                    m._parameters[name] = new[id(w)]
            for name, b in list(m._buffers.items()):
                if b is not None and b.is_floating_point():
                    m._buffers[name] = b.to(dtype)
        return self

    torch.nn.Module.to = to
    transformers.PreTrainedModel.to = to
    # accelerate maps the optimizer's parameters to their shards by data pointer (every fake one's is 0);
    # a deep copy then takes the storage-copy path, which fake storages refuse: it clones instead
    FakeTensor.data_ptr = lambda self: self._cdata

    def deepcopy(self, memo):
        if id(self) not in memo:
            memo[id(self)] = self.clone()
        return memo[id(self)]

    FakeTensor.__deepcopy__ = deepcopy

    # a device mesh reads its ranks' values: made outside the fake mode
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp._fully_shard._fsdp_init as fsdp_init

    real_mesh = device_mesh.init_device_mesh

    def init_device_mesh(*a, **kw):
        with _disable_current_modes():
            return real_mesh(*a, **kw)

    fsdp_init.init_device_mesh = init_device_mesh

    # object collectives pickle into tensors: every rank sends what this one does
    def all_gather_object(object_list, obj, group=None):
        object_list[:] = [obj] * len(object_list)

    dist.all_gather_object = all_gather_object
    dist.broadcast_object_list = lambda object_list, *a, **k: None

    # TRL's fused log-prob head as it runs on CUDA: only the positions with a label scored
    # (compact), each tile folded in place by its Triton kernels. The torch fallbacks this CPU
    # would run allocate fp32 copies of every [4096 x 32768] tile (about 2.8 GB a tile) that a GPU
    # never holds
    import trl.kernels.chunked_logprob as chunked_logprob
    import trl.trainer.utils as trl_utils

    trl_utils._use_triton = lambda device: True
    chunked_logprob._forward_tile = lambda tile, *a, **k: None
    chunked_logprob._backward_tile = lambda tile, *a, **k: None

    # sampling: HF generate's loop reads token values
    from transformers.generation.utils import GenerationMixin

    GenerationMixin.generate = _generate

    # a storage resized in place (FSDP2 frees and refills an all-gathered unit so) is counted at its size
    real_resize = torch.UntypedStorage.resize_

    def resize_(st, n):
        out = real_resize(st, n)
        counter.resized(st)
        return out

    torch.UntypedStorage.resize_ = resize_

    # DTensor's sharding propagation: the op at global shapes, for metadata only, not counted
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    real_propagate = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self, *a, **kw):
        counter.paused += 1
        try:
            return real_propagate(self, *a, **kw)
        finally:
            counter.paused -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    del types, weakref


def _generate(self, input_ids=None, attention_mask=None, generation_config=None, **kw):
    """HF generate's memory without its loop: the prefill (last position's logits), the sampler's
    fp32 distribution, the KV cache grown to prompt + max_new_tokens, one decode step at that length."""
    import torch

    from bench.memory_truth import grow
    from pita.models.lm import cache_of

    new = int(generation_config.max_new_tokens)
    rows = input_ids.shape[0]
    with torch.no_grad():
        out = self(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1)
        past, logits = cache_of(out), out.logits[:, -1, :]
        del out
        probs = torch.softmax(logits.float() / max(1e-6, float(generation_config.temperature or 1.0)), -1)
        tok = torch.multinomial(probs, 1)
        del probs, logits
        grow(torch, past, new - 1)
        mask = torch.cat([attention_mask, attention_mask.new_ones(rows, new)], 1)
        out = self(input_ids=tok, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=1)
        torch.softmax(out.logits[:, -1, :].float(), -1)
        del out, past
    return torch.cat([input_ids, tok.expand(rows, new)], 1)


def _modes():
    """The dispatch modes of a measurement: (live-bytes counter, value stand-ins)."""
    import weakref

    import torch
    from torch._guards import active_fake_mode
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_flatten

    aten = torch.ops.aten

    def dtensor_op(types) -> bool:
        from torch.distributed.tensor import DTensor

        return any(t is DTensor for t in types)

    class LiveBytes(TorchDispatchMode):
        """The bytes of the storages alive, counted per storage (views share one) when an op makes
        a tensor and dropped when the last tensor that counted it is collected; and their peak.
        DTensor ops are let through first, so their local ops are what is counted."""

        def __init__(self):
            super().__init__()
            self.live: dict = {}  # storage -> [bytes, tensors alive]
            self.made: dict = {}  # storage -> (op, dtype, shape) that made it (PITA_PEAK_TRACE)
            self.op = None
            self.shown: set = set()
            self.now = self.peak = 0
            self.fake = None  # the measurement's FakeTensorMode (set when it is entered)
            self.paused = 0  # > 0 while DTensor propagates sharding (not the job's memory)

        def __enter__(self):
            self.fake = active_fake_mode()
            return super().__enter__()

        def _add(self, t) -> None:
            if not isinstance(t, torch.Tensor):
                return
            if is_traceable_wrapper_subclass(t):
                for attr in t.__tensor_flatten__()[0]:
                    self._add(getattr(t, attr))
                return
            key = t.untyped_storage()._cdata
            entry = self.live.get(key)
            if entry is None:
                entry = self.live[key] = [t.untyped_storage().nbytes(), 0]
                if TRACE:
                    self.made[key] = (self.op, str(t.dtype).replace("torch.", ""), tuple(t.shape))
                    if self.op in TRACE_OPS and self.op not in self.shown and t.numel() > 1e6:
                        import traceback

                        self.shown.add(self.op)  # where the first large tensor of this op was made
                        print(json.dumps({"op_stack": [self.op, list(t.shape), str(t.dtype), [
                            f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
                            for f in traceback.extract_stack()[-14:-3]]]}), file=sys.stderr)
                self.now += entry[0]
                self.peak = max(self.peak, self.now)
            entry[1] += 1
            weakref.finalize(t, self._drop, key)

        def _drop(self, key) -> None:
            entry = self.live.get(key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    self.now -= entry[0]
                    del self.live[key]

        def resized(self, st) -> None:
            entry = self.live.get(st._cdata)
            if entry is not None:
                self.now += st.nbytes() - entry[0]
                entry[0] = st.nbytes()
                self.peak = max(self.peak, self.now)

        def restart(self) -> None:
            self.peak = self.now

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if dtensor_op(types):
                return NotImplemented
            if func is torch.ops._c10d_functional.wait_tensor.default:
                return args[0]  # waits in place, as it does eagerly
            out = func(*args, **(kwargs or {}))
            if self.paused or active_fake_mode() is not self.fake:
                # DTensor's sharding propagation runs the op at its global shapes on fake tensors to
                # learn the output's metadata (in this fake mode, where one is active): no memory
                return out
            before, self.op = self.peak, str(func).split(".")[-2] if TRACE else None
            for t in tree_flatten(out)[0]:
                self._add(t)
            if TRACE and self.peak > before and self.peak > TRACE_FROM:
                import traceback

                held: dict = {}  # what is live at the peak, by the op that made it and its dtype
                for key, (nbytes, _) in self.live.items():
                    op, dtype, shape = self.made.get(key, ("before", "?", ()))
                    k = f"{op} {dtype}"
                    held[k] = held.get(k, 0) + nbytes
                self.trace = (str(func), [str(getattr(t, "shape", "")) for t in tree_flatten(out)[0]][:3],
                              [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
                               for f in traceback.extract_stack()[-40:-2]],
                              {k: round(v / 1e9, 4) for k, v in sorted(held.items(), key=lambda kv: -kv[1])[:25]})
            return out

    class ValueFree(TorchDispatchMode):
        """Ops whose result depends on the values, answered without them: a scalar read as a
        constant (0.0, 1, False: no NaN, no early stop), a boolean mask as if every element were
        selected (the largest shape the op can have)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if dtensor_op(types):
                return NotImplemented
            if func in (aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default):
                x = args[0]
                return False if x.dtype == torch.bool else (0.0 if x.is_floating_point() else 1)
            if func is aten.equal.default:
                return False
            if func is aten.nonzero.default:
                x = args[0]
                return torch.zeros((x.numel(), x.dim()), dtype=torch.long, device=x.device)
            if func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
                idx = []
                for i in args[1]:
                    if i is not None and i.dtype == torch.bool:
                        idx += [torch.zeros((i.numel(),), dtype=torch.long, device=i.device)] * i.dim()
                    else:
                        idx.append(i)
                return func(args[0], idx)
            if func in (aten.index_put_.default, aten.index_put.default) and \
                    any(i is not None and i.dtype == torch.bool for i in args[1]):
                return args[0] if func is aten.index_put_.default else args[0].clone()
            if func is aten.masked_select.default:
                n = torch.Size(torch.broadcast_shapes(args[0].shape, args[1].shape)).numel()
                return torch.zeros((n,), dtype=args[0].dtype, device=args[0].device)
            return func(*args, **kwargs)

    return LiveBytes(), ValueFree()


class _Stop(Exception):
    pass


def run(spec: dict) -> dict:
    """Measure in this process (it patches libraries for good: ``measure_job`` gives it a process)."""
    import contextlib
    import gc
    import logging
    from types import SimpleNamespace

    import time

    import torch

    t0 = time.time()
    torch.set_num_threads(1)
    job = spec["job"]
    p0 = job["params"]
    k = max(1, int(p0.get("devices", 1) or 1))
    kind = job["kind"]
    module = {"algo.dpo_train": "pita.algos.dpo", "algo.grpo_train": "pita.algos.grpo"}[kind]
    fn = {"algo.dpo_train": "dpo_train", "algo.grpo_train": "grpo_train"}[kind]
    root = Path(tempfile.mkdtemp(prefix="pita-fake-job-"))
    params, deps = prepare(spec, root)
    sharded = p0.get("sharding") == "fsdp"
    if k > 1 or sharded:  # rank 0 of k, as torchrun starts it (a one-device job runs in the worker, without these)
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(k), LOCAL_WORLD_SIZE=str(k), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT="29599")
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if k > 1 or sharded:
        dist.init_process_group("fake", rank=0, world_size=k, store=FakeStore())
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    counter, values = _modes()
    _patch_for_fake_tensors(fake, counter)
    mod = __import__(module, fromlist=[fn])
    seen: dict = {}

    def measured_train_and_save(ctx, trainer, tok, p, key):  # the job's tail: train `steps` steps, save nothing
        from transformers import TrainerCallback

        class Measure(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                from pita.training.sharding import fsdp_units

                counter.restart()  # loading is over: what follows is what the device holds
                seen["at_start_gb"] = round(counter.now / 1e9, 3)
                seen["built_s"] = round(time.time() - t0, 1)
                seen["fsdp_units"] = fsdp_units(kw.get("model"))

            def on_step_end(self, args, state, control, **kw):
                seen.setdefault("step_peaks_gb", []).append(round(counter.peak / 1e9, 3))
                seen["fsdp2_while_training"] = bool(trainer.accelerator.is_fsdp2)  # what no_sync, clipping, saving ask
                if state.global_step >= int(spec["steps"]):
                    raise _Stop()

        trainer.add_callback(Measure())
        acc = trainer.accelerator
        seen.update(accumulation=int(trainer.args.gradient_accumulation_steps),
                    micro_batch=int(trainer.args.per_device_train_batch_size),
                    sync_each_batch=bool(acc.gradient_state.plugin_kwargs.get("sync_each_batch", False)),
                    mixed_precision=str(acc.state.mixed_precision), trainer=type(trainer).__name__,
                    optimizer=str(getattr(trainer.args.optim, "value", trainer.args.optim)))
        try:
            trainer.train()
        except _Stop:
            pass
        return {}, []

    mod.train_and_save = measured_train_and_save
    ctx = SimpleNamespace(params=params, dep_result=lambda j: deps[j], log=logging.getLogger("pita.job"))
    from pita.core.paths import JobPaths

    ctx.paths = JobPaths(root / "job")
    ctx.paths.dir.mkdir(parents=True)
    logging.basicConfig(level=logging.WARNING)
    # the cyclic collector, run while accelerate swaps the optimizer's parameters for their shards,
    # frees fake tensors still in use (a crash in torch's storage release): reference counting alone
    gc.disable()
    with contextlib.ExitStack() as stack:
        for m in (fake, counter, values):
            stack.enter_context(m)
        try:
            getattr(mod, fn)(ctx)
        except KeyError as e:  # the job's own result needs what the measurement does not return
            if "steps" not in str(e):
                raise
    peaks = seen.get("step_peaks_gb") or []
    if TRACE and getattr(counter, "trace", None):
        print(json.dumps({"peak_trace": counter.trace}), file=sys.stderr)
    if len(peaks) < int(spec["steps"]):
        raise RuntimeError(f"{len(peaks)} optimizer step(s) ran, {spec['steps']} were asked for")
    return {"peak_bytes": int(counter.peak), "accumulation": seen["accumulation"], "micro_batch": seen["micro_batch"],
            "world_size": k, "sync_each_batch": seen["sync_each_batch"], "fsdp_units": seen.get("fsdp_units"),
            "fsdp2_while_training": seen.get("fsdp2_while_training"),
            "mixed_precision": seen["mixed_precision"], "step_peaks_gb": peaks, "at_start_gb": seen.get("at_start_gb"),
            "seconds": {"built": seen.get("built_s"), "total": round(time.time() - t0, 1)},
            "built_by": f"{module}.{fn}", "trainer": seen["trainer"], "optimizer": seen["optimizer"],
            "as_the_job_runs": ["the job function and its params", "TRL's trainer and Trainer.train",
                                "accelerate's FSDP2 plugin from the job's arguments" if params.get("sharding") == "fsdp"
                                else "accelerate's single-process path", "the optimizer the job names",
                                "micro-batch and accumulation with the trainer's sync rule", "TRL's fused head"],
            "stand_ins": STAND_INS}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    row = run(spec)
    print(json.dumps(row), flush=True)
    sys.stderr.flush()
    os._exit(0)  # the fake process group and the patched libraries are not torn down


if __name__ == "__main__":
    sys.exit(main())
