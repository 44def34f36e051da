"""The algorithms' house: a registry by name, the keys every algorithm has, and the base class.

    @register_algorithm
    class MyAlgo(Algorithm):
        name = "MyAlgo"                    # experiment.algos=[MyAlgo], settings under algos.MyAlgo
        Config = MyAlgoConfig              # a dataclass extending AlgoConfig: only the keys it reads
        def plan(self, p: PlanContext) -> list[Job]: ...

An algorithm is one module: its config dataclass, its job plan and its job kinds. The experiment
planner, the schema and the report know algorithms only through :data:`ALGORITHMS`, so adding one
is a new file imported once (``pita/algos/__init__.py`` imports the built-in ones; anything else
may register itself the same way) and touches nothing in ``pita/core``, the planner or the report.

The two families share a base module each: :mod:`pita.algos.value_guided` (PITA, Q#, Q#-HF: collect
roll-outs -> train a value model -> guided evaluation) and :mod:`pita.algos.post_training` (DPO,
GRPO, GRPO-HF: a TRL trainer on the policy -> evaluation). What every algorithm's plan shares
lives here: the planning context, the evaluation jobs and the training settings of ``training.*``.

Nothing here imports torch or transformers: the orchestrator plans without them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from pita.core.job import Job, Resources, add_kind_module
from pita.core.names import Registry
from pita.rewards.preferences import TIE_RULES, supervision  # noqa: F401 - the algorithms' import point

add_kind_module("pita.eval.jobs")  # eval.merge, the last job of every evaluation
add_kind_module("pita.eval.eta_search")  # eval.eta_search, after a guided round's validation


@dataclass
class AlgoConfig:
    """Keys every algorithm has (each algorithm's dataclass adds its own)."""

    enabled: bool = True  # false leaves the algorithm out of experiment.algos (the user guide's switch)
    batch_size: int = 32  # sequences per optimizer step (the effective batch, whatever the devices)
    lr: float = 1e-4  # learning rate
    gradient_checkpointing: Optional[bool] = None  # null: training.gradient_checkpointing
    # rows per forward/backward of this algorithm's training jobs; null: training.micro_batch_size
    # (gpu=auto writes each algorithm's own: the largest that fits its jobs)
    micro_batch_size: Optional[int] = None
    # data-loader worker processes of the TRL trainers; value-model training batches in-process
    # and does not use them (the key is accepted there for the user guide's configs)
    num_workers: int = 0


class Algorithm:
    """One algorithm: its checks and its job plan; ``self.c`` is its ``algos.<name>`` node."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = AlgoConfig
    tunes_eta: ClassVar[bool] = False  # its rows sweep eta, chosen on validation prompts
    # it learns from labelled preference pairs (budget: data_collection.pairs_per_prompt)
    uses_preference_pairs: ClassVar[bool] = False
    # it trains a Bradley-Terry proxy reward model each round (algo.proxy_train); its batch
    trains_proxy: ClassVar[bool] = False
    proxy_batch_size: ClassVar[Optional[int]] = None  # None: algos.<name>.batch_size

    def __init__(self, config: Any):
        self.c = config

    @property
    def key(self) -> str:
        return f"algos.{self.name}"

    def run_problems(self) -> list[str]:
        """Problems of the machine the run is on (packages), not of the config: a plan for another
        node leaves them out."""
        return []

    def check(self, cfg, n_devices: int) -> list[str]:
        """Every problem with ``algos.<name>`` (and the keys it depends on), each naming its key."""
        return check_common(self.key, self.c)

    def check_models(self, paths: dict) -> list[str]:
        """Problems that need the family's model files (read without loading weights)."""
        return []

    def per_device_batch(self) -> int:
        """Sequences per device and optimizer step (what ``training.micro_batch_size=auto`` divides)."""
        return int(self.c.batch_size)

    def plan(self, p: "PlanContext") -> list[Job]:
        raise NotImplementedError(f"{type(self).__name__}.plan")


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
_listeners: list[Callable[[], None]] = []


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` selectable as ``experiment.algos=[<cls.name>]``."""
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError(f"{cls.__name__} needs a name (the key under algos.*)")
    if not (dataclasses.is_dataclass(cls.Config) and issubclass(cls.Config, AlgoConfig)):
        raise TypeError(f"{cls.__name__}.Config must be a dataclass extending AlgoConfig")
    ALGORITHMS.register(cls.name)(cls)
    for fn in list(_listeners):
        fn()
    return cls


def unregister_algorithm(name: str) -> None:
    """Forget ``name`` (tests that register an algorithm of their own clean up with this)."""
    ALGORITHMS.unregister(name)
    for fn in list(_listeners):
        fn()


def on_register(fn: Callable[[], None]) -> None:
    """Call ``fn`` after each later registration (the schema re-registers itself with Hydra)."""
    _listeners.append(fn)


def algorithm(name: str, config: Any) -> Algorithm:
    """The algorithm ``name`` (ConfigError with "did you mean" when unknown) with its settings."""
    return ALGORITHMS.get(name, field="experiment.algos")(config)


def default_configs() -> dict[str, Any]:
    """``algos.<name>``: each registered algorithm's config with its defaults, in registration order."""
    return {name: ALGORITHMS.get(name).Config() for name in ALGORITHMS.names(ordered=True)}


def check_common(k: str, c) -> list[str]:
    p = []
    if c.lr is not None and not c.lr > 0:
        p.append(f"{k}.lr={c.lr} must be > 0")
    if c.batch_size < 1:
        p.append(f"{k}.batch_size={c.batch_size} must be >= 1")
    if c.num_workers < 0:
        p.append(f"{k}.num_workers={c.num_workers} must be >= 0")
    return p


def preference_labels(cfg) -> dict:
    """How every preference-learning method labels its pairs (job params): the Bradley-Terry draw
    of ``data_collection.bt_beta`` / ``bradley_terry_sampling``, drawn once per pair with the run's
    seed, the labelled-pair budget ``data_collection.pairs_per_prompt`` per prompt and round, and
    the one tie rule ``data_collection.ties``."""
    dc = cfg.data_collection
    return {"beta": float(dc.bt_beta), "bt_sampling": bool(dc.bradley_terry_sampling),
            "label_seed": int(cfg.system.seed), "pairs_per_prompt": int(dc.pairs_per_prompt),
            "ties": str(dc.ties)}


def effective_training(cfg, c) -> tuple:
    """(micro-batch, gradient checkpointing) of algorithm settings ``c``: its own
    ``micro_batch_size`` / ``gradient_checkpointing`` where set, else ``training.*`` (the micro-batch
    may still be "auto" before the plan resolves it)."""
    micro = c.micro_batch_size if getattr(c, "micro_batch_size", None) is not None else cfg.training.micro_batch_size
    gc = c.gradient_checkpointing if c.gradient_checkpointing is not None else cfg.training.gradient_checkpointing
    micro = int(micro) if isinstance(micro, int) and not isinstance(micro, bool) else micro
    return micro, (bool(gc) if isinstance(gc, bool) else gc)


def training_settings(cfg, c, whole: int | None = None) -> dict:
    """The shared training settings a training job reads (training.*, system.clear_cache_interval).
    ``whole``: the rows one device holds when the micro-batch is 0 ("the whole batch at once"),
    written out so that an OOM retry can halve it (TRAINING_RETRY)."""
    micro, gc = effective_training(cfg, c)
    if micro == 0 and whole:
        micro = int(whole)
    from pita.models.families import chat_template_kwargs

    return {"gradient_checkpointing": gc, "micro_batch_size": micro,
            "clear_cache_interval": int(cfg.system.clear_cache_interval), **chat_template_kwargs(cfg.model)}



# ---------------------------------------------------------------- planning
@dataclass
class PlanContext:
    """What the experiment planner hands an algorithm for one (family, training dataset)."""

    cfg: Any  # the whole run config
    ds: Any  # the training dataset's DatasetConfig
    paths: dict  # the family: reference, guidance, reward_models
    gen: Any  # ParallelDataGenerator: a request -> shard jobs + a merge job
    n_train: int  # training prompts
    evals: list  # (dataset config, test prompts, task) of every dataset the models are evaluated on
    task: str  # the training dataset's task: math | reward
    mem: dict  # memory estimates in GB per job kind (pita/plans/experiment.py: plan_memory)
    policy_params: Optional[int]  # parameters of the reference policy (None if its config is unreadable)
    data_request: Callable[[], dict]  # a data-collection request on the training split (data_collection.*)
    n_validation: int  # validation prompts (the training dataset's held_out split); 0 = none
    eval_request: Callable[[Any], dict]  # an evaluation request for a dataset config (eval.*)
    shared: dict = dataclasses.field(default_factory=dict)  # request -> merge id of data shared by algorithms
    # an arm of a grid (e.g. a learning rate): its label on the rows (variant "lr=1e-05") and its
    # segment in the job ids ("lr1e-05"); empty for an algorithm without arms
    variant: str = ""
    variant_id: str = ""

    @property
    def family(self) -> str:
        return self.cfg.model.name

    def prefix(self, algo: str) -> str:
        """Job ids of one (algorithm, family, dataset) start with this (and of one arm of a grid:
        ``<algo>.<family>.<dataset>.<arm>``)."""
        return f"{algo}.{self.family}.{self.ds.name}" + (f".{self.variant_id}" if self.variant_id else "")

    def seed(self, r: int) -> int:
        """Round r's seed of data collection and policy training."""
        return self.cfg.system.seed * 1000 + r

    def collect(self, req: dict, job_prefix: str, deps: list[str], r: int) -> tuple[list[Job], str]:
        """(new jobs, merge job id) collecting ``req`` on the training prompts: shard jobs and a
        merge. Data from the reference itself (no deps: round 0) is shared by every algorithm that
        asks for the same request, so round 0 is collected once per (family, dataset) and request,
        under ``data.<family>.<dataset>.r0.<recipe>-<hash of the request>``; the second asker
        gets no new job."""
        if deps:
            jobs = self.gen.plan(req, job_prefix, self.n_train, deps=deps, memory_gb=self.gen_memory(req),
                                 group=f"round {r}")
            return jobs, jobs[-1].id
        key = json.dumps(req, sort_keys=True)
        if key in self.shared:
            return [], self.shared[key]
        # named by the request's content, so one algorithm's settings never rename another's data
        digest = hashlib.sha256(key.encode()).hexdigest()[:6]
        name = f"data.{self.family}.{self.ds.name}.r{r}.{req['recipe']}-{digest}"
        jobs = self.gen.plan(req, name, self.n_train, deps=[], memory_gb=self.gen_memory(req), group=f"round {r}")
        self.shared[key] = jobs[-1].id
        return jobs, jobs[-1].id

    def gen_memory(self, req: dict) -> float:
        """A data-generation shard's estimate: the sampling policy, and the value model beside it
        when the round's policy is guided."""
        return self.mem["gen_guided" if req["policy"].get("guidance") else "gen"]

    def eval_memory(self, policy: dict) -> float:
        """An evaluation shard's estimate: the policy at the evaluation's batch and length, the
        value model beside it when the policy is guided, the reference beside a trained policy
        (it scores the samples for the KL)."""
        if policy.get("guidance"):
            return self.mem["eval_guided"]
        return self.mem["eval_trained" if policy.get("model_from_job") else "eval"]

    def evaluations(self, algo: str, r: int, train: str, policy: dict, etas: list[float] | None = None) -> list[Job]:
        """Round r's evaluation jobs of the model trained by job ``train`` on every dataset of
        ``evals``; ``policy`` says how the evaluated policy is made from it (guidance, or a
        trained checkpoint). The training dataset's jobs are ``<prefix>.r<r>.eval.*``, another
        dataset's ``<prefix>.r<r>.eval-<name>.*``; each ends in an ``eval.merge`` with the labels
        of its results-table rows.

        ``etas`` (guided policies): the η of each row. η = 0 is π_ref itself, so its row is the
        base model's evaluation of that dataset, reused (same prompts, samples and metrics, KL 0),
        not sampled again."""
        jobs: list[Job] = []
        prefix = f"{self.prefix(algo)}.r{r}.eval"
        for eds, n_test, etask in self.evals:
            name = prefix + ("" if eds.name == self.ds.name else f"-{eds.name}")
            sampled, base = etas, None
            if etas is not None and 0.0 in etas:
                sampled = [e for e in etas if e != 0.0]
                base = base_evaluation(self.family, eds.name) + ".merge"
            if sampled is None or sampled:
                ereq = self.eval_request(eds)
                ereq["policy"].update(policy)
                if sampled is not None:
                    ereq["etas"] = sampled
                ev = self.gen.plan(ereq, name, n_test, deps=[train], memory_gb=self.eval_memory(policy),
                                   group=f"round {r}")
            else:  # only eta 0: nothing to sample
                ev = [Job(id=f"{name}.merge", kind="eval.merge", deps=[train], params={"shards": []},
                          resources=Resources(0, 0.0), duration_hint=0.1, group=f"round {r}")]
            merge = ev[-1]
            merge.kind = "eval.merge"
            merge.params["labels"] = {"algorithm": algo, "family": self.family, "train_dataset": self.ds.name,
                                      "round": r, "eval_dataset": eds.name, "task": etask,
                                      **({"variant": self.variant} if self.variant else {})}
            if base:
                merge.deps.append(base)
                merge.params["base_eval"] = base
            jobs += ev
        if self.n_validation:
            val = self.validation(algo, r, train, policy, etas)
            jobs += val
            if etas is not None and int(getattr(self.cfg.eval, "eta_search_steps", 0) or 0) > 0:
                jobs += self.eta_search(algo, r, train, policy, val[-1], jobs)
        return jobs

    def eta_search(self, algo: str, r: int, train: str, policy: dict, val_merge: Job, evals: list[Job]) -> list[Job]:
        """The eta search after round r's validation (pita/eval/eta_search.py): one job on the
        validation prompts, then every evaluation dataset's test rows at the etas it added."""
        ev = self.cfg.eval
        search = f"{self.prefix(algo)}.r{r}.eta_search"
        req = self.eval_request(self.ds, "held_out")
        req["policy"].update(policy)
        labels = dict(val_merge.params["labels"])
        jobs = [Job(id=search, kind="eval.eta_search", deps=[train, val_merge.id], group=f"round {r}",
                    params={"request": req, "labels": labels, "validation": val_merge.id,
                            "budgets": [float(b) for b in ev.kl_budgets], "steps": int(ev.eta_search_steps),
                            "eta_min": float(ev.eta_min), "eta_max": float(ev.eta_max),
                            "kl_fraction": float(ev.kl_fraction), "n_examples": self.n_validation,
                            "wide_ratio": float(ev.get("wide_ratio", 4.0)),
                            "batch_size": req["sampling"]["batch_size"]},
                    resources=Resources(1, self.eval_memory(policy)),
                    duration_hint=2.0 * self.n_validation * max(1, int(ev.eta_search_steps)))]
        for eds, n_test, etask in self.evals:
            name = f"{self.prefix(algo)}.r{r}.eval-search" + ("" if eds.name == self.ds.name else f"-{eds.name}")
            ereq = self.eval_request(eds)
            ereq["policy"].update(policy)
            ereq["etas_from"] = search
            sub = self.gen.plan(ereq, name, n_test, deps=[train, search], memory_gb=self.eval_memory(policy),
                                group=f"round {r}")
            merge = sub[-1]
            merge.kind = "eval.merge"
            merge.params["labels"] = {"algorithm": algo, "family": self.family, "train_dataset": self.ds.name,
                                      "round": r, "eval_dataset": eds.name, "task": etask,
                                      **({"variant": self.variant} if self.variant else {})}
            merge.params["may_be_empty"] = True  # the search added no eta: no rows
            jobs += sub
        return jobs

    def validation(self, algo: str, r: int, train: str, policy: dict, etas: list[float] | None) -> list[Job]:
        """The same policy (at every eta, for a guided one) on the training dataset's validation
        prompts (its held_out split, carved from the training data): the rows each round's eta and
        every method's frontier are chosen on."""
        name = f"{self.prefix(algo)}.r{r}.val"
        sampled = [e for e in etas if e != 0.0] if etas is not None else None
        ereq = self.eval_request(self.ds, "held_out")
        ereq["policy"].update(policy)
        if sampled is not None:
            ereq["etas"] = sampled
        if sampled is None or sampled:
            ev = self.gen.plan(ereq, name, self.n_validation, deps=[train], memory_gb=self.eval_memory(policy),
                               group=f"round {r}")
        else:
            ev = [Job(id=f"{name}.merge", kind="eval.merge", deps=[train], params={"shards": []},
                      resources=Resources(0, 0.0), duration_hint=0.1, group=f"round {r}")]
        merge = ev[-1]
        merge.kind = "eval.merge"
        merge.params["labels"] = {"algorithm": algo, "family": self.family, "train_dataset": self.ds.name,
                                  "round": r, "eval_dataset": self.ds.name, "task": self.task, "split": "validation",
                                  **({"variant": self.variant} if self.variant else {})}
        if etas is not None and 0.0 in etas:
            base = base_validation(self.family, self.ds.name) + ".merge"
            merge.deps.append(base)
            merge.params["base_eval"] = base
        return ev


def base_evaluation(family: str, dataset: str) -> str:
    """Id prefix of the base model's evaluation jobs on ``dataset`` (its merge: ``<prefix>.merge``)."""
    return f"base.{family}.{dataset}.eval"


def base_validation(family: str, dataset: str) -> str:
    """Id prefix of the base model's jobs on ``dataset``'s validation prompts (eta 0 of every guided row)."""
    return f"base.{family}.{dataset}.val"
