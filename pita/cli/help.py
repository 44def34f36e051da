"""The help page (``pita --help``, ``pita run --help``, ``python run_parallel.py --help``) and the
exit codes: keys, defaults and meanings come from the schema and the groups from pita/conf/, so
the page follows the code."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from pita.cli.overrides import CONF_DIR

EXIT_CODES = (  # what run_main returns; help_text and docs/guide.md list these
    (0, "every job completed"),
    (1, "a job failed, or was skipped because a dependency failed; or the disk filled (free space, then "
        "resume); or pita itself failed (a traceback is printed)"),
    (2, "bad configuration or input: the message names the key, the value and the fix; nothing ran"),
    (130, "interrupted (Ctrl-C, SIGTERM): the state is saved; resume with resume_from=<run folder>"),
)

# The keys the help page lists (with their defaults and meanings, read from the schema).
HELP_KEYS = ("experiment.", "system.output_dir", "system.devices", "system.cache_dir", "system.seed",
             "executor.", "resume_from", "resume_force", "training.micro_batch_size")
# keys whose one-line note would hide what a new user needs to know: the whole note, on more lines
LONG_NOTES = {
    "training.micro_batch_size": "rows per forward/backward; 0: the whole batch; auto (the gpu auto preset "
                                 "sets it): chosen per algorithm from the memory estimate when a run starts and "
                                 "written to its config.yaml (algos.<A>.micro_batch_size); pita plan shows the "
                                 "choice without running",
}

def help_text(prog: str = "pita run") -> str:
    """The page ``pita --help``, ``pita run --help`` and ``python run_parallel.py --help`` print:
    the keys, defaults and meanings come from the schema and the groups from pita/conf/, so the
    page follows the code."""
    import textwrap

    from pita.config.reference import rows

    width = 100
    out = [
        f"usage: {prog} [key=value ...] [-m|--multirun] [--cfg job]",
        "       pita run ... | python -m pita run ... | python run_parallel.py ...   (one and the same)",
        "       pita plan [--json] [key=value ...] [system.inventory=8x80GB]   (python run_parallel.py --plan ...)",
        "       pita status RUN_FOLDER [--all]",
        "       pita report RUN_FOLDER [RUN_FOLDER ...] [--out NAME] [--kl-budgets B1,B2,...]",
        "       pita seeds K [--first S] [key=value ...]",
        "",
        textwrap.fill("pita plans a post-training experiment (PITA, Q#, Q#-HF, DPO, GRPO, GRPO-HF x datasets x rounds, "
              "plus the base model's evaluation) as one job graph, checks the configuration before anything "
              "runs, and starts every job as soon as its dependencies are done and a device has memory for "
              "it: on every GPU of this machine, on CPU without one, on a Slurm cluster (executor.backend=slurm) "
              "or on a Ray cluster (executor.backend=ray). It runs from any "
              "folder; outputs go below the current one.", width=width),
        "",
        "commands:",
        "  run      run an experiment (or a sweep with -m); key=value overrides, checked first",
        "  plan     the plan a run would make: jobs, devices, memory per job kind, the simulated makespan; "
        "no run folder, no hub; system.inventory=8x80GB plans for another machine",
        "  status   a run's jobs by state, its devices, failures and their logs (safe on a live run)",
        "  report   re-render a run's results/report.md and plots from its saved results; several runs (one "
        "per seed): also the methods at equal KL pooled over them",
        "  seeds    one experiment run with seeds S..S+K-1, one after another, then pooled (pita report); "
        "the same command again resumes the seeds that did not finish",
        "",
        f"config groups (GROUP=NAME; the files: {CONF_DIR}/<group>/<NAME>.yaml):",
    ]
    defaults = {}
    try:
        for d in OmegaConf.load(CONF_DIR / "config.yaml").get("defaults", []):
            if isinstance(d, DictConfig) or isinstance(d, dict):
                for k, v in d.items():
                    defaults[str(k)] = v
    except Exception:  # noqa: BLE001 - the help page is still useful without the defaults
        pass
    for group, note in (("model", "model family"), ("experiment", "preset"), ("gpu", "GPU preset")):
        names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        d = defaults.get(group)
        shown = ", ".join(f"{n} (default)" if n == d else n for n in names)
        out.append(f"  {group + '=':<12} {note}: {shown}" + ("" if d else "; none by default"))
    datasets = sorted(p.stem for p in (CONF_DIR / "dataset").glob("*.yaml"))
    out += [f"  {'datasets.<name>.KEY=VALUE':<12} per dataset: {', '.join(datasets)}", "",
            "main keys (key=default: meaning; every key: docs/configuration.md, or --cfg job for the "
            "resolved config):"]
    for key, default, note in rows():
        if not key.startswith(HELP_KEYS) or key.startswith("executor.ray."):
            continue
        note = " ".join(note.split())
        if key in LONG_NOTES:
            lines = textwrap.wrap(LONG_NOTES[key], 56)
            out.append(f"  {f'{key}={default}':<40} {lines[0]}")
            out += [f"  {'':<40} {line}" for line in lines[1:]]
            continue
        if len(note) > 64:
            note = note[:61].rsplit(" ", 1)[0] + " ..."
        pair = f"{key}={default}"
        out.append(f"  {pair:<40} {note}" if len(pair) < 40 else f"  {pair}\n  {'':<40} {note}")
    out += [            "  executor.ray.*, model.*, datasets.*, algos.<name>.*, eval.*, data_collection.*, training.*: "
            "see docs/configuration.md", ""]
    out += [
        "outputs (relative to the current folder unless system.output_dir is absolute):",
        "  outputs/<experiment.name>/<YYYY-MM-DD_HH-MM-SS>/",
        "    run.log          every line of every job, prefixed [job-id device]; follow it with tail -f",
        "    config.yaml      the resolved config that ran (resume_from= reloads it)",
        "    state.db, state.json   job states, devices, attempts, timings",
        "    jobs/<job-id>/   job.log, result.json, artifacts/, .done",
        "    results/         final_results.json, results.csv, report.md, plots/",
        "",
        "sweeps (-m / --multirun, anywhere; comma lists, range(), choice()): one run per combination, in turn",
        f"  {prog} -m model=qwen3-sm,llama experiment.rounds=1,2",
        "  outputs/<experiment.name>/sweep-<YYYY-MM-DD_HH-MM-SS>/",
        "    <key>-<value>__<key>-<value>/   a point's run folder (as above), named by the overrides it varies",
        "    summary.csv      one row per point: overrides, exit code, run folder, headline metrics",
        "    multirun.yaml    the sweep's config and command line",
        "  A line per point as it starts and ends, a table at the end; the exit code is the worst point's;",
        "  after an interrupted point the others are not run.",
        "",
        "exit codes:",
    ]
    out += [textwrap.fill(f"{code:<4} {text}", width=width, initial_indent="  ", subsequent_indent=" " * 7)
            for code, text in EXIT_CODES]
    out += ["", "Hydra's own help: --hydra-help. More: README.md, docs/guide.md, docs/configuration.md and docs/architecture.md."]
    return "\n".join(out)

