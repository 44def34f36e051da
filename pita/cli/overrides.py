"""Command-line overrides checked before Hydra composes anything: unknown keys and groups with
"did you mean", values of the wrong type, lists the shell split, sweeps written without
--multirun, and every point of a sweep. Bad overrides exit 2 and say what to type instead.

    check_cli_overrides(argv)     # run_main's first step; exits 2 with every problem at once
    check_overrides(overrides)    # the same, raising ConfigError (tests, the sweep)
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pita.config import schema as _schema_registration  # noqa: F401  (Hydra needs pita_schema)
from pita.core.errors import ConfigError
from pita.core.names import suggest, unknown_name

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # shipped in the package (pyproject: package-data)
GROUPS = ("model", "dataset", "gpu", "experiment")  # Hydra config groups under pita/conf/


def _schema():
    from pita.config.schema import PitaConfig

    return OmegaConf.structured(PitaConfig)


def _check_key(key: str, base: DictConfig) -> str | None:
    node = base
    walked = []
    for part in key.split("."):
        if not isinstance(node, DictConfig):
            return None  # below a leaf of type Any: nothing more to check
        if walked == ["algos"] and part not in node:
            from pita.algos import ALGORITHMS

            return unknown_name("algos", part, ALGORITHMS.names()) + f" (in the override of {key})"
        if len(walked) == 2 and walked[0] == "algos" and part not in node:
            return algo_key_problem(walked[1], part, list(node.keys()))
        if part not in node:
            if node._metadata.object_type is dict and walked:
                return None  # a map with open keys (e.g. +eval.datasets_by_train.<name>): Hydra checks the value
            where = ".".join(walked) or "top level"
            return (f"unknown key {'.'.join(walked + [part])!r}{suggest(part, list(node.keys()))}; "
                    f"keys at {where}: {', '.join(node.keys())}")
        walked.append(part)
        node = node._get_node(part)
    return None


def algo_key_problem(algo: str, key: str, keys: list[str]) -> str:
    """An ``algos.<algo>.<key>`` that the algorithm's config does not have."""
    return (f"algos.{algo}.{key}: {algo} has no key {key!r}{suggest(key, keys)}; the keys of {algo} are: "
            f"{', '.join(keys)} (each algorithm accepts only the keys it reads: pita/algos/)")


def _explain(e: BaseException) -> str | None:
    """A clear sentence for a composition error caused by an algorithm key the algorithm lacks."""
    while e.__cause__ is not None:
        e = e.__cause__
    full = getattr(e, "full_key", None) or ""
    parts = full.split(".")
    if len(parts) == 3 and parts[0] == "algos" and "not in" in str(e):
        from pita.algos import ALGORITHMS

        if parts[1] in ALGORITHMS:
            import dataclasses

            keys = [f.name for f in dataclasses.fields(ALGORITHMS.get(parts[1]).Config)]
            return algo_key_problem(parts[1], parts[2], keys)
    return None


def _search_dirs(parsed) -> list[str]:
    """The folders a ``hydra.searchpath=[file://conf,...]`` override adds (config groups of your own:
    conf/dataset/NAME.yaml), relative to the current folder."""
    out = []
    for o in parsed:
        if o.key_or_group == "hydra.searchpath":
            v = o.value()
            for entry in (v if isinstance(v, list) else [v]):
                if isinstance(entry, str) and entry.startswith("file://"):
                    out.append(entry[len("file://"):])
    return out


def check_overrides(overrides: list[str]) -> None:
    """Raise ConfigError (every problem at once) for overrides that name unknown keys or bad values."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from pita.config import schema  # noqa: F401  (registers the schema)

    split = _split_by_shell(overrides)
    if split:
        raise ConfigError(split)
    problems = []
    plain = [o for o in overrides if not o.startswith("-")]
    multirun = any(o in ("--multirun", "-m") for o in overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        try:
            base = compose(config_name="config")  # the defaults, group choices included
        except Exception as e:  # pita/conf/ itself is wrong (e.g. an edited config.yaml)
            raise ConfigError(f"{CONF_DIR / 'config.yaml'}: {_explain(e) or str(e).splitlines()[0]}") from e
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception as e:
        raise ConfigError(_parse_problems(plain) or [f"cannot parse the overrides {plain}: {str(e).splitlines()[0]}"])
    sweep = any(o.is_sweep_override() for o in parsed)
    # datasets this command line adds (+dataset@datasets.NAME=<config>): their keys may follow
    added = {o.package.split(".", 1)[1] for o in parsed
             if o.key_or_group == "dataset" and (o.package or "").startswith("datasets.")}
    for o in parsed:
        key = o.key_or_group
        if key.startswith("hydra.run.dir") or key.startswith("hydra.sweep.dir"):
            problems.append(f"{key}: pita makes its own run folder, <system.output_dir>/<experiment.name>/<time> "
                            f"(a sweep: <system.output_dir>/<experiment.name>/sweep-<time>/<point>); "
                            f"set system.output_dir=... and experiment.name=... instead")
            continue
        if key.startswith("hydra") or o.is_delete():
            continue
        if o.is_sweep_override() and not multirun:
            text = next((x for x in plain if x.lstrip("+~").startswith(key + "=")), key)
            value = text.split("=", 1)[1] if "=" in text else ""
            problems.append(f"{text}: a comma list without brackets is a sweep (one run per value); for one run "
                            f"with a list write '{key}=[{value}]', to sweep add --multirun")
            continue
        if key in GROUPS:
            choices = sorted({p.stem for d in [CONF_DIR, *_search_dirs(parsed)] for p in (Path(d) / key).glob("*.yaml")})
            value = o.value()
            if isinstance(value, str) and value not in choices:
                problems.append(unknown_name(key, value, choices))
            continue
        parts = key.split(".")
        if parts[0] == "datasets" and len(parts) > 1 and parts[1] not in base.datasets and parts[1] not in added:
            problems.append(f"{key}: datasets.{parts[1]} is not a dataset yet; add yours built on one pita knows, "
                            f"in that one's format: +dataset@datasets.{parts[1]}=<{'|'.join(base.datasets)}> "
                            f"(then {key}=...), or a config file of your own (docs/guide.md, \"Models, datasets\")")
            continue
        msg = _check_key(key, base)
        if msg:
            problems.append(msg)
    if problems:
        raise ConfigError(problems)
    def first_line(e: Exception) -> str:
        explained = _explain(e)
        if explained:
            return explained
        while e.__cause__ is not None:
            e = e.__cause__
        text = str(e).strip()
        return text.splitlines()[0] if text else type(e).__name__

    if sweep:
        _check_sweep(plain, parsed, first_line)
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        try:
            compose(config_name="config", overrides=plain)
            return
        except Exception as e:
            whole = first_line(e)
        for o in plain:  # name each override that fails on its own
            try:
                compose(config_name="config", overrides=[o])
            except Exception as e:
                line = first_line(e)
                if "is not a ListConfig, list or tuple" in line and "=" in o:
                    key, value = o.lstrip("+~").split("=", 1)
                    line = f"{key} takes a list: write '{key}=[{value}]' (quoted, for the shell)"
                problems.append(f"{o}: {line}")
    raise ConfigError(problems or [f"{' '.join(plain)}: {whole}"])


def _check_sweep(plain: list[str], parsed, first_line) -> None:
    """A sweep's points, each composed as Hydra will (and the sweep itself, whose experiment.name
    and system.output_dir name the sweep folder): every problem at once, before any folder exists."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    from pita.core.paths import RunPaths

    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    try:
        points = [p for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]
    except Exception as e:  # noqa: BLE001 - a sweep Hydra's basic sweeper cannot expand (e.g. interval())
        odd = [o for o, p in zip(plain, parsed) if p.is_sweep_override() and not p.is_discrete_sweep()]
        raise ConfigError(f"{' '.join(odd or plain)}: {first_line(e)}; sweep over a comma list, range() or "
                          f"choice()") from e
    base = [o for o, p in zip(plain, parsed) if not p.is_sweep_override()]
    problems: list[str] = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for point in [base, *points]:
            mine = [o for o in point if o.partition("=")[0].lstrip("+~") in swept]
            try:
                cfg = compose(config_name="config", overrides=point)
            except Exception as e:  # noqa: BLE001 - Hydra's and OmegaConf's composition errors
                whole, blamed = first_line(e), []
                for o in mine:  # name each swept value that fails on its own
                    try:
                        compose(config_name="config", overrides=[*base, o])
                    except Exception as e1:  # noqa: BLE001
                        blamed.append(f"{o}: {first_line(e1)}")
                problems += blamed or [f"{' '.join(mine) or ' '.join(base)}: {whole}"]
                continue
            try:
                RunPaths.check_name(cfg.experiment.name)
            except ConfigError as e:
                problems += e.problems
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))


def _split_by_shell(argv: list[str]) -> list[str]:
    """An unquoted list with spaces (``experiment.datasets=[arith, sentiment]``) reaches us as
    several arguments, the first with an unclosed bracket: say to quote it."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if "=" in a and not a.startswith("-") and a.count("[") + a.count("{") > a.count("]") + a.count("}"):
            j, parts = i + 1, [a]
            while j < len(argv) and "=" not in argv[j] and not argv[j].startswith("-"):
                parts.append(argv[j])
                j += 1
                if sum(x.count("[") + x.count("{") for x in parts) <= sum(x.count("]") + x.count("}") for x in parts):
                    break
            whole = " ".join(parts)
            out.append(f"{whole}: the shell split this list at its spaces; quote it ('{whole}') or drop the "
                       f"spaces ({whole.replace(' ', '')})")
            i = j
            continue
        i += 1
    return out


def normalize_argv(argv: list[str]) -> list[str]:
    """``--multirun`` / ``-m`` anywhere (Hydra wants its flags before the overrides)."""
    flags = [a for a in argv if a in ("--multirun", "-m")]
    return flags + [a for a in argv if a not in ("--multirun", "-m")]


def _parse_problems(overrides: list[str]) -> list[str]:
    """Each override that does not parse on its own, with the fix (quoting, usually)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out = []
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except Exception as e:  # noqa: BLE001 - Hydra's lexer and parser errors
            key, _, value = o.partition("=")
            odd = sorted({c for c in value if not c.isascii()})
            if odd:
                out.append(f"{o}: the value holds {', '.join(repr(c) for c in odd)}, which an unquoted value cannot; "
                           f"quote it, e.g. '{key}=\"{value}\"' (the single quotes are for the shell)")
            else:
                out.append(f"{o}: cannot be parsed ({str(e).splitlines()[0]}); quote the value, e.g. "
                           f"'{key}=\"{value}\"'")
    return out


def check_cli_overrides(argv: list[str] | None = None) -> None:
    """Run before Hydra: bad overrides exit with code 2 and say what to type instead."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "--hydra-help", "--info", "-i") or a.startswith("--cfg") or a == "-c" for a in argv):
        return
    try:
        check_overrides(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

