"""Plans: turn a configuration into the whole job graph before anything runs."""

from __future__ import annotations

from pita.core.job import Job

WORKLOADS = ("synthetic", "generate", "experiment")


def build_plan(cfg, device_totals: list[int] | None = None, cuda: bool = False, plan_only: bool = False,
               durations=None, card=None, choices: dict | None = None) -> list[Job]:
    """All jobs of the experiment described by ``cfg`` (validated by the caller). ``plan_only``:
    for ``pita plan``, which never asks the hub (see experiment_plan). ``durations``: the
    :class:`~pita.plans.durations.DurationLearner` whose corrections apply (default: the one
    ``system.cache_dir`` keeps for this family and device class). ``card``: the GPU
    (pita.core.gpu_manager.Card) the durations are computed for (None: an H100). ``choices``
    (a dict, filled): what gpu=auto weighed (pita/plans/choose.py) and the devices it raised."""
    if cfg.experiment.workload == "synthetic":
        from pita.plans.synthetic import demo_grid

        s = cfg.synthetic
        if device_totals:
            from pita.core.errors import ConfigError

            margin = cfg.executor.memory_margin
            usable = max(device_totals) * (1 - margin)
            if s.memory_gb * 1e9 > usable:
                raise ConfigError(f"synthetic.memory_gb={s.memory_gb:g}: every stand-in job would need more memory than "
                                  f"the largest device has ({usable / 1e9:.2f} GB usable of {max(device_totals) / 1e9:.2f} "
                                  f"GB after executor.memory_margin={margin:g}); lower synthetic.memory_gb")
        return demo_grid(list(s.algos), list(s.families), list(s.datasets), s.rounds, s.gen_shards,
                         s.eval_shards, s.job_seconds, s.memory_gb, fail=list(s.fail), peak_gb=s.get("peak_gb"))
    if cfg.experiment.workload == "generate":
        from pita.plans.generation import generation_plan

        return _with_durations(cfg, _with_host(cfg, generation_plan(cfg, list(device_totals or [1]), cuda, plan_only), cuda),
                               cuda, durations, card)
    if cfg.experiment.workload == "experiment":
        from pita.plans.experiment import experiment_plan

        totals = list(device_totals or [1])
        options = choices if choices is not None else {}

        def build(c, opts=None):
            return _with_durations(c, _with_host(c, experiment_plan(c, totals, cuda, plan_only, options=opts), cuda),
                                   cuda, durations, card)

        jobs = build(cfg, options)
        if cuda and len(totals) > 1:  # gpu=auto's alternatives, weighed by the simulated makespan
            from pita.plans.choose import for_makespan

            jobs = for_makespan(cfg, build, jobs, totals, options)
        return jobs
    raise AssertionError(f"unvalidated workload {cfg.experiment.workload!r}")


def _with_durations(cfg, jobs: list[Job], cuda: bool, learner=None, card=None) -> list[Job]:
    """Every job's expected seconds as its ``duration_hint``: the roofline's
    (pita/plans/durations.py, kept as ``planned_s``) times what measured runs taught about its
    kind. The one figure ``pita plan``'s simulation and a run's scheduler both order jobs by
    (longest remaining path first) and make reservations with."""
    from pita.models.families import resolve_family
    from pita.models.shapes import model_shape
    from pita.plans.durations import DurationLearner, Durations
    from pita.plans.memory import PROMPT_TOKENS

    paths = resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed, defer="plan")
    shapes: dict = {}

    def shape(part: str):  # the family's "reference" or "guidance", or a reward model's path
        if part not in shapes:
            shapes[part] = (model_shape(paths[part], f"model.{part}") if part in ("reference", "guidance")
                            else model_shape(part, "model.reward_models"))
        return shapes[part]

    durations = Durations(jobs, shape, cfg.model.dtype, PROMPT_TOKENS, card=card)
    if learner is None:
        learner = (DurationLearner.load(cfg.system.cache_dir, cfg.model.name, cuda)
                   if cfg.executor.get("learn_durations", True) else DurationLearner())
    for j in jobs:
        j.planned_s = j.duration_hint = durations.seconds(j)
        j.duration_hint = learner.expected(j)  # the roofline's, corrected where its kind was measured
    return jobs


def _with_host(cfg, jobs: list[Job], cuda: bool) -> list[Job]:
    """A GPU plan's jobs with their host-memory estimates (pita/plans/host.py); on CPU devices the
    device memory is host memory already."""
    if cuda:
        from pita.models.families import resolve_family
        from pita.plans.host import apply_host_estimates

        apply_host_estimates(jobs, cfg, resolve_family(cfg.model, cfg.system.cache_dir, cfg.system.seed, defer="plan"))
    return jobs
