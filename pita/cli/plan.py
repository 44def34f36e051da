"""``pita plan`` / ``python run_parallel.py --plan``: the plan a run would make, without running it.

    pita plan experiment=paper_math gpu=auto model=qwen3 system.inventory=8x80GB
    pita plan experiment=paper_math gpu=auto model=llama system.inventory=8xH100 --json
    pita plan experiment=smoke --calibrate outputs/smoke/<time> --json

Composes, validates and plans exactly as ``pita run`` does, then prints per job kind the count,
devices per job, the reservation per device and the largest job, and the makespan the production
scheduler gives in simulated time on the inventory (durations: pita/plans/durations.py). Creates
no run folder and never asks the Hugging Face hub: models are sized from their config.json
(shipped with pita for every preset model, pita/models/architectures/), hub datasets that are not
cached from their known sizes. ``system.inventory`` plans for a machine you are not on (8x80GB,
8xH100, [80GB,80GB,40GB]); without it, the devices this machine has.

Durations: the roofline of pita/plans/durations.py, times the measured / planned seconds of each
job kind that earlier runs of the same cache recorded (``<system.cache_dir>/durations.json``,
per family and device class). ``--calibrate RUN ...`` takes those corrections from the given
finished runs instead. The plan then names its critical path, the job kinds that take the most
device-hours, how idle the devices are, and the lever it sees.

Exit 0 when every job fits its devices; 2 with every problem (one line per job kind that fits no
device, naming the fix).
"""

from __future__ import annotations

import json
import os
import sys
from collections import OrderedDict
from pathlib import Path

from pita.core.errors import ConfigError, PitaError


def _offline() -> None:
    """A plan never asks the hub: transformers and datasets read local files and caches only."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = True
    except ImportError:
        pass


def compose(overrides: list[str]):
    """The run's config, composed by Hydra from pita/conf as ``pita run`` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pita.cli.overrides import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)


def make_plan(cfg, durations=None) -> dict:
    """The plan of ``cfg`` as a dict (what --json prints); raises ConfigError with every problem.
    ``durations``: the measured corrections to apply (``--calibrate``; default: the cache's)."""
    from pita.config.validate import validate_config
    from pita.core.gpu_manager import GPUManager, parse_inventory, usable_cores
    from pita.core.graph import JobGraph
    from pita.core.simulation import simulate
    from pita.plans import build_plan
    from pita.plans.durations import sources
    from pita.plans.fit import fit_problems, job_algorithm, job_kind

    validate_config(cfg, models=False)
    from pita.models.shapes import config_problems

    if problems := config_problems(cfg):
        raise ConfigError(problems)
    sy, ex = cfg.system, cfg.executor
    inventory = sy.get("inventory")
    if inventory is not None:
        specs = parse_inventory(inventory)
        gpus = GPUManager.from_inventory(specs)
    else:
        cpu_n = min(usable_cores(), 2) if sy.cpu_devices == "auto" else int(sy.cpu_devices)
        devices = sy.devices if isinstance(sy.devices, str) else list(sy.devices)
        gpus = GPUManager.detect(devices, cpu_devices=cpu_n)
    totals = [d.total_bytes for d in gpus.devices]
    cuda = not gpus.is_cpu
    server = _vllm_server_devices(cfg) if cuda else 0
    if server:  # vLLM's server holds GPUs of the node: the plan's jobs get the others
        if server >= len(totals):
            raise ConfigError(f"vllm_mode=server sets aside {server} GPU(s) for the vLLM server (algos.<A>."
                              f"vllm_server_devices) and this inventory has {len(totals)}: nothing is left to train on; "
                              f"use vllm_mode=colocate, or plan a larger node (system.inventory)")
        gpus.devices = gpus.devices[:len(totals) - server]
        totals = totals[:len(totals) - server]
    from pita.core.gpu_manager import known_card, plan_card
    from pita.plans.durations import device_class

    card, card_note = plan_card([d.name for d in gpus.devices]) if cuda else (None, "")
    if durations is None and cfg.experiment.workload != "synthetic" and ex.learn_durations:
        from pita.plans.durations import DurationLearner

        # a named card's own measurements (runs on it record them); sizes alone name no card
        durations = DurationLearner.load(sy.cache_dir, cfg.model.name, cuda,
                                         known_card([d.name for d in gpus.devices]) if cuda else None)

    ran_on = (durations.device_classes if durations is not None else set()) - {device_class(cuda)}
    if ran_on:
        raise ConfigError(f"--calibrate: the runs given ran on {' and '.join(sorted(ran_on))} devices and this plan is "
                          f"for {'cuda' if cuda else 'cpu'} devices, whose speed they do not tell; calibrate with "
                          f"runs on the same kind of device (or plan for theirs: "
                          f"{'system.inventory=... for GPUs' if 'cuda' in ran_on else 'without system.inventory'})")
    choices: dict = {}
    jobs = build_plan(cfg, totals, cuda=cuda, plan_only=True, durations=durations, card=card, choices=choices)
    problems = fit_problems(jobs, totals, ex.memory_margin, cpu=not cuda)
    host = None
    if cuda and (inventory is None or sy.get("host_ram") is not None):
        # a described inventory is another machine: its RAM is what system.host_ram says, not this one's
        from pita.plans.host import host_problems, host_ram_bytes

        host = host_ram_bytes(cfg)
        problems += host_problems(jobs, host)
    if problems:
        raise ConfigError(problems)
    graph = JobGraph(jobs).validate(totals, ex.memory_margin)
    if cfg.experiment.workload != "synthetic":  # build_plan gave every job its expected seconds
        from pita.plans.durations import assumed as assumed_for

        assumed = assumed_for(card, card_note) if cuda else \
            "durations assumed: a GPU's (pita/plans/durations.py), though this plan is for CPU devices"
        if durations is not None and durations.ratios:
            src = f"{durations.path}" if durations.path else "the runs given to --calibrate"
            for run, matched, n in durations.replanned:
                src += (f"; {run} recorded no planned seconds, so its config.yaml was planned again: "
                        f"{matched} of its {n} jobs matched")
            assumed += (f"; corrected by measured / planned seconds per job kind ({src}: "
                        + ", ".join(f"{k} x{v['measured_over_planned']:g}" for k, v in durations.summary().items()) + ")")
    else:
        assumed = f"durations assumed: synthetic.job_seconds={cfg.synthetic.job_seconds:g} per stand-in job"
    slurm = ex.backend == "slurm"  # Slurm gives each job whole GPUs: one job per device
    sim = simulate(graph.jobs, totals, ex.memory_margin,
                   max_jobs_per_device=1 if slurm else ex.max_jobs_per_device if ex.max_jobs_per_device is not None
                   else (1 if not cuda else None), starvation_passes=ex.starvation_passes, host_bytes=host)
    from pita.plans.explain import explain

    rows = [{"id": j.id, "kind": job_kind(j), "algorithm": job_algorithm(j), "devices": j.resources.devices,
             "reserved_gb_per_device": round(j.resources.memory_gb, 3), "host_gb": round(j.resources.host_gb, 1),
             "seconds": round(j.duration_hint, 1),
             "batch_size": j.params.get("batch_size"), "deps": list(j.deps), **_generate_fields(j)}
            for j in graph.jobs]
    return {"experiment": cfg.experiment.name, "model": cfg.model.name,
            "inventory": [{"name": d.name, "total_gb": round(d.total_bytes / 1e9, 2)} for d in gpus.devices],
            "card": ({"name": card.name, "memory_mib": card.memory_mib, "tflops_bf16": card.tflops,
                      "hbm_tb_s": card.hbm_tbs, "note": card_note} if card else None),
            "device_kind": "cuda" if cuda else "cpu", "memory_margin": ex.memory_margin,
            "host_ram_gb": round(host / 1e9, 1) if host else None,
            "training": {a: {"micro_batch_size": m, "gradient_checkpointing": g,
                             "devices": int(cfg.algos[a].get("devices", 1) or 1),
                             "sharding": str(cfg.algos[a].get("sharding", "none"))}
                         for a, (m, g) in _training_choices(cfg).items()},
            "makespan_s": round(sim.makespan, 1), "critical_path_s": round(sim.critical_path, 1),
            **explain(graph, sim, totals, ex.memory_margin),
            "durations": assumed,
            "duration_corrections": durations.summary() if durations is not None else {},
            "duration_sources": sources(graph.jobs, durations, known_card([d.name for d in gpus.devices]) if cuda else None, cuda) if cfg.experiment.workload != "synthetic" else {},
            "devices_weighed": choices.get("weighed", {}),
            "slurm_requests": _slurm_requests(cfg, graph.jobs, cuda) if slurm else {},
            "notes": _notes(cfg) + _choice_notes(choices) + ([
                f"vllm_mode=server: {server} GPU(s) set aside for the vLLM server (trl vllm-serve, started by you); the "
                f"plan's jobs run on the other {len(totals)}: give a run those (system.devices)"] if server else []) + ([
                "host memory not checked: system.inventory describes another machine; set system.host_ram=<its RAM> "
                "(e.g. 1TB) to plan it"] if cuda and host is None else []), "jobs": rows}


def _replan(run) -> dict:
    """{job id: job} of a finished run's config.yaml planned by this pita (its keys over this
    pita's defaults, so a run made before a key existed still plans), on the run's devices."""
    from omegaconf import OmegaConf

    from pita.config.validate import validate_config
    from pita.plans import build_plan
    from pita.plans.durations import DurationLearner

    try:
        saved = OmegaConf.load(Path(run) / "config.yaml")
        state = json.loads((Path(run) / "state.json").read_text())
    except Exception as e:  # noqa: BLE001 - what the error says is enough: which file, why
        raise ConfigError(f"--calibrate {run}: its attempts record no planned seconds and its config.yaml or "
                          f"state.json cannot be read to plan it again ({type(e).__name__}: {e})") from None
    base = compose([])
    OmegaConf.set_struct(base, False)
    cfg = OmegaConf.merge(base, saved)
    validate_config(cfg, models=False)
    totals = [int(d["total_bytes"]) for d in state.get("devices") or []] or [int(80e9)]
    cuda = any(d.get("kind") != "cpu" for d in state.get("devices") or [])
    jobs = build_plan(cfg, totals, cuda=cuda, plan_only=True, durations=DurationLearner(apply=False))
    return {j.id: j for j in jobs}


def _generate_fields(job) -> dict:
    """A GRPO job's sampling as its trainer runs it: rows per generate call and calls per step on
    each device (what the plan's seconds and memory assume); nothing for other jobs."""
    p = job.params if isinstance(job.params, dict) else {}
    if not p.get("rows_per_generate"):
        return {}
    from pita.core.memory import generate_calls

    per_device = max(1, int(p["batch_size"]) // max(1, int(p.get("devices", 1))))
    return {"rows_per_generate": int(p["rows_per_generate"]),
            "generate_calls_per_step": generate_calls(per_device, int(p["rows_per_generate"]))}


def _slurm_requests(cfg, jobs, cuda: bool) -> dict:
    """Per job kind, the sbatch options its largest job is submitted with (executor.backend=slurm)."""
    from pita.core.backends.slurm import SlurmBackend, representative, settings_from
    from pita.plans.fit import job_label

    be = SlurmBackend(settings_from(cfg.executor.slurm))
    below = float(cfg.executor.slurm.pack_below_s)
    return {k: " ".join(args) + (" (in packs)" if below > 0 and float(j.duration_hint or 60.0) <= below else "")
            for k, (j, args) in representative(be, jobs, cuda, job_label).items()}


def _vllm_server_devices(cfg) -> int:
    """GPUs the vLLM servers of the selected GRPO algorithms hold (vllm_mode=server), the most any asks."""
    n = 0
    for a in cfg.experiment.algos:
        c = cfg.algos.get(a) if a in cfg.algos else None
        if c is not None and c.get("use_vllm") and c.get("vllm_mode") == "server":
            n = max(n, int(c.get("vllm_server_devices", 1) or 1))
    return n


def _choice_notes(choices: dict) -> list[str]:
    """What gpu=auto changed about the devices of training jobs, and what it weighed."""
    out = [f"algos.{a}.devices={was} raised to {now}: its training does not fit {was} device{'s' if was > 1 else ''} "
           f"at any micro-batch, even with gradient checkpointing (gpu=auto); give it {now}, or train with LoRA "
           f"(algos.{a}.lora_r=16) on fewer"
           for a, (was, now) in (choices.get("raised") or {}).items()]
    for a, tried in (choices.get("weighed") or {}).items():
        alts = ", ".join(f"{t['devices']} devices {_hms(t['makespan_s'])}{' (chosen)' if t['chosen'] else ''}"
                         for t in tried)
        out.append(f"gpu=auto weighed {a}'s training by the simulated makespan: {alts}; set algos.{a}.devices to "
                   f"keep a count of your own")
    return out


def _training_choices(cfg) -> dict:
    """(micro-batch, gradient checkpointing) of every selected algorithm's training jobs."""
    from pita.algos.base import effective_training

    return {a: effective_training(cfg, cfg.algos[a]) for a in cfg.experiment.algos if a in cfg.algos}


def _notes(cfg) -> list[str]:
    """What the plan assumed rather than read: dataset sizes, unchecked tokenizers."""
    from pita.datasets.loading import count_examples
    from pita.plans.common import dataset_cfg

    out = []
    if cfg.experiment.workload == "synthetic":
        return out
    names = list(cfg.experiment.datasets)
    for d in list(names):
        names += [x for x in (cfg.eval.get("datasets_by_train") or {}).get(d, []) if x not in names]
    for name in names:
        try:
            ds = dataset_cfg(cfg, name)
            for split in ("train", "test"):
                try:
                    n, _, assumed = count_examples(ds, split, True)
                except ConfigError:
                    continue
                if assumed:
                    out.append(f"datasets.{name}: {split} split not cached here; sized at its hub size ({n} examples)")
        except ConfigError:
            continue
    return out


def render(plan: dict) -> str:
    """The plan as text: the inventory, a table per job kind, the makespan."""
    inv = plan["inventory"]
    kinds: dict = OrderedDict()
    for j in plan["jobs"]:
        k = kinds.setdefault(j["kind"], {"n": 0, "devices": set(), "gb": [], "largest": j, "batch": set(), "host": 0.0,
                                         "dev_h": 0.0})
        k["dev_h"] += j["seconds"] * max(0, j["devices"]) / 3600
        k["n"] += 1
        k["host"] = max(k["host"], j.get("host_gb") or 0.0)
        if j.get("batch_size") is not None:
            k["batch"].add(j["batch_size"])
        k["devices"].add(j["devices"])
        k["gb"].append(j["reserved_gb_per_device"])
        if j["reserved_gb_per_device"] * max(1, j["devices"]) > \
                k["largest"]["reserved_gb_per_device"] * max(1, k["largest"]["devices"]):
            k["largest"] = j
    names: dict = OrderedDict()
    for d in inv:
        names[(d["name"], d["total_gb"])] = names.get((d["name"], d["total_gb"]), 0) + 1
    inv_text = ", ".join(f"{n} x {name} ({gb:g} GB)" for (name, gb), n in names.items())
    train = ", ".join(f"{a} {t['micro_batch_size']}{' +ckpt' if t['gradient_checkpointing'] else ''}"
                      f"{' fsdp x' + str(t['devices']) if t.get('sharding') == 'fsdp' else ''}"
                      for a, t in plan["training"].items())
    card = plan.get("card")
    card_text = (f"; durations for {card['name']} ({card['tflops_bf16']:g} TFLOP/s bf16, {card['hbm_tb_s']:g} TB/s)"
                 + (f": {card['note']}" if card["note"] != card["name"] else "") if card else "")
    lines = [f"plan: {plan['experiment']} (model={plan['model']}) on {inv_text}{card_text}",
             f"training micro-batches (+ckpt: gradient checkpointing; fsdp xK: sharded over K devices): "
             f"{train or 'none'}", ""]
    host = plan.get("host_ram_gb")
    show_host = any(j.get("host_gb") for j in plan["jobs"])  # a GPU plan: every job's host estimate
    sources = plan.get("duration_sources") or {}
    head = (f"{'job kind':<40} {'jobs':>5} {'devices':>7} {'batch':>6} {'GB/device':>11}"
            f"{' host GB' if show_host else ''} {'dev-h':>7}  {'seconds from':<18}  largest job")
    lines += [head, "-" * len(head)]
    for kind, k in kinds.items():
        lo, hi = min(k["gb"]), max(k["gb"])
        gb = f"{hi:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}"
        devs = ",".join(str(d) for d in sorted(k["devices"]))
        batch = ",".join(str(b) for b in sorted(k["batch"])) or "-"
        hgb = f" {k['host']:>7.0f}" if show_host else ""
        lines.append(f"{kind:<40} {k['n']:>5} {devs:>7} {batch:>6} {gb:>11}{hgb} {k['dev_h']:>7.1f}  "
                     f"{sources.get(kind, '-'):<18}  {k['largest']['id']}")
    total = len(plan["jobs"])
    ms = plan["makespan_s"]
    guess = (plan.get("device_kind") == "cpu" and not plan.get("duration_corrections")
             and plan["durations"].startswith("durations assumed: a GPU's"))
    lines += ["", f"{total} jobs; makespan {_hms(ms)} simulated by the scheduler on this inventory "
                  f"(critical path {_hms(plan['critical_path_s'])})"
              + ("; these are a GPU's seconds, not this CPU's: a finished run of this cache corrects them, or "
                 "--calibrate RUN" if guess else "")]
    if plan.get("critical_path"):
        from pita.plans.explain import render as render_explain

        lines += render_explain(plan, ms)
    if plan.get("slurm_requests"):
        lines.append("Slurm requests (executor.backend=slurm; per kind, its largest job; one job per GPU; "
                     "(in packs): planned under executor.slurm.pack_below_s, run several to a Slurm job):")
        lines += [f"  {k}: sbatch {v}" for k, v in plan["slurm_requests"].items()]
    lines.append(plan["durations"])
    if host:
        lines.append(f"host memory: {host:g} GB (system.host_ram); host GB: the most one job of the kind holds on "
                     f"the CPU side, all its processes (loading, saving); running jobs share it")
    lines += [f"note: {n}" for n in plan["notes"]]
    return "\n".join(lines)


def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def plan_main(argv: list[str] | None = None, prog: str = "pita plan") -> int:
    """``pita plan [--json] key=value ...``: print the plan; 0, or 2 with every problem."""
    import logging

    from pita.cli.overrides import check_overrides

    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    argv = [a for a in argv if a not in ("--json", "--plan")]
    calibrate = []
    if "--calibrate" in argv:  # --calibrate RUN [RUN ...]: the folders up to the next key=value or flag
        i = argv.index("--calibrate")
        j = i + 1
        while j < len(argv) and "=" not in argv[j] and not argv[j].startswith("-"):
            j += 1
        calibrate, argv = argv[i + 1:j], argv[:i] + argv[j:]
        if not calibrate:
            print(f"error: {prog} --calibrate needs one or more run folders (outputs/<name>/<time>) after it",
                  file=sys.stderr)
            return 2
    if any(a in ("-h", "--help") for a in argv):
        print((__doc__ or "").strip().replace("``", ""))  # the module's reST quoting, not for a terminal
        return 0
    if any(a.startswith("resume_from=") for a in argv):
        print(f"error: {prog} plans a configuration, not a run folder: resume_from= is for pita run; a run's jobs "
              f"and their states: pita status <run folder>; its plan again: {prog} with the overrides it was "
              f"started with (its config.yaml holds them resolved)", file=sys.stderr)
        return 2
    if any(a in ("-m", "--multirun") for a in argv):
        print(f"error: {prog} plans one configuration; drop --multirun and plan each point (e.g. model=qwen3, "
              f"then model=llama)", file=sys.stderr)
        return 2
    _offline()
    quiet = logging.getLogger("pita")
    level, _ = quiet.level, quiet.setLevel(logging.WARNING)  # back as it was when the plan is printed
    try:
        check_overrides(argv)
        cfg = compose(argv)
        learner = None
        if calibrate:
            from pita.plans.durations import DurationLearner

            learner = DurationLearner.from_runs(calibrate, replan=_replan)
        plan = make_plan(cfg, durations=learner)
    except PitaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - Hydra's composition errors (a missing group option)
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        if isinstance(e, (HydraException, OmegaConfBaseException)):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    finally:
        quiet.setLevel(level)
    print(json.dumps(plan, indent=1) if as_json else render(plan))
    return 0
