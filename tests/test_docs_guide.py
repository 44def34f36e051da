"""Every command docs/guide.md shows in a bash block, checked the way tests/test_docs_commands.py
checks the README's: runs are composed, validated and planned (`pita plan` with the same
arguments; a sweep: each of its points), `pita status` / `pita report` / `pita plan` and the
machine check run. What the check changes, and why:

- `.venv/bin/python run_parallel.py`, `.venv/bin/python -m pita` and `pita` are one command;
- a run folder named in an example (`outputs/my_experiment/<time>`) is a finished run of the
  check's own (a resume of it runs), and `/data/gsm8k.jsonl` a GSM8K-format file it writes;
- a command for a GPU node (a `gpu=` preset, or a model family other than the tiny one) is
  planned for one (`system.inventory=8xH100`) unless it names its own inventory: this machine
  has no GPU; `CUDA_VISIBLE_DEVICES=...` and `system.devices=[...]` select GPUs, so those
  commands are planned for the inventory too;
- `system.cache_dir=/tmp/democache` is the tests' built family; the real_* presets read their
  data relative to the checkout, so they are planned from there, for this machine idle: CPU
  devices share the host's *available* memory, so a run going beside the check (a seed of
  real_arith holds about 8 GB) would otherwise refuse the plan the guide promises.

The Ray recipe is run command by command by tests/test_ray_backend.py, the Slurm recipe (its
`sbatch` and `squeue` lines, and the `pita run` they wrap) by tests/test_slurm.py on a real
one-node cluster; environment steps (`make`, `pip`, `python -m venv`, `source`) are what CI
itself runs."""

from __future__ import annotations

import itertools
import re
import shlex
import sys
from pathlib import Path

import pytest

from helpers import ROOT, as_user, pita_here, user_folder

pytestmark = pytest.mark.integration
ENV_STEPS = ("make ", "python -m venv", "source ", "ray ", "pip ", "sbatch ", "squeue ")


def guide_commands() -> list[str]:
    out, inside, lang, buf = [], False, "", ""
    for line in (ROOT / "docs" / "guide.md").read_text().splitlines():
        if line.startswith("```"):
            inside, lang = (False, "") if inside else (True, line[3:].strip())
            continue
        if not inside or lang != "bash":
            continue
        line = (buf + " " + line.strip()) if buf else line.rstrip()
        buf = ""
        if line.endswith("\\"):
            buf = line[:-1].strip()
            continue
        c = line.split("  #")[0].strip()
        if c and not c.startswith("#"):
            out.append(c)
    return out


def _points(args: list[str]) -> list[list[str]]:
    """A sweep's points: every comma list outside brackets is one axis."""
    axes = []
    for a in args:
        k, eq, v = a.partition("=")
        if eq and "," in v and not v.startswith("["):
            axes.append([f"{k}={x}" for x in v.split(",")])
        else:
            axes.append([a])
    return [list(p) for p in itertools.product(*axes)]


def translate(command: str, run_dir: Path, data: Path, cache: str) -> tuple[list[list[str]], bool]:
    """The argv(s) that check ``command``, and whether they run from the checkout."""
    gpu_env = command.startswith("CUDA_VISIBLE_DEVICES=")
    command = re.sub(r"^CUDA_VISIBLE_DEVICES=\S+\s+", "", command)
    argv = shlex.split(command)
    for prefix, repl in ((["python", "run_parallel.py"], ["pita", "run"]),
                         ([".venv/bin/python", "run_parallel.py"], ["pita", "run"]),
                         ([".venv/bin/python", "-m", "pita"], ["pita"]), (["python", "-m", "pita"], ["pita"]),
                         ([".venv/bin/python", "test_parallel_setup.py"], [sys.executable, str(ROOT / "test_parallel_setup.py")])):
        if argv[:len(prefix)] == prefix:
            argv = repl + argv[len(prefix):]
    if argv[:2] == ["pita", "seeds"]:  # K runs of one experiment: its plan is checked once
        rest = argv[3:]
        argv = ["pita", "run", *(rest[2:] if rest[:1] == ["--first"] else rest)]
    if argv[:2] == ["pita", "run"] and "--plan" in argv:
        argv = ["pita", "plan"] + [a for a in argv[2:] if a != "--plan"]
    argv = [re.sub(r"outputs/my_experiment/[\w-]+", str(run_dir), a).replace("/data/gsm8k.jsonl", str(data))
            .replace("/tmp/democache", cache) for a in argv]
    if argv[:2] not in (["pita", "run"], ["pita", "plan"]):
        return [argv], False
    args = [a for a in argv[2:] if a not in ("-m", "--multirun")]
    if not any(a.startswith("resume_from=") for a in args) and not any(a.startswith("system.inventory=") for a in args):
        on_gpu = gpu_env or any(re.match(r"(gpu=(?!none)|model=(?!tiny)|system\.devices=\[)", a) for a in args)
        if on_gpu:
            args.append("system.inventory=8xH100")
    if any(a.startswith("resume_from=") for a in args):
        return [["pita", "run", *args, "executor.progress=off"]], False  # resumes the check's finished run
    from_root = any(a.startswith("experiment=real_") for a in args)
    return [["pita", "plan", *p] for p in _points(args)], from_root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return user_folder(tmp_path_factory.mktemp("user"), "gsm8k.jsonl", "my_experiment")


def test_the_guide_shows_only_commands_this_check_knows():
    for c in guide_commands():
        assert c.startswith(ENV_STEPS) or re.match(
            r"(CUDA_VISIBLE_DEVICES=\S+ )?(\.venv/bin/python (run_parallel\.py|-m pita|test_parallel_setup\.py)|"
            r"pita (run|plan|status|report))\b", c), c


def test_each_guide_command_runs_or_plans_as_written(folder, tiny_cache, monkeypatch, capsys):
    """Plans, status and report in this process (each would pay an interpreter's start-up
    otherwise); runs (a resume) and the machine check as processes."""
    [run_dir] = list((folder / "outputs" / "my_experiment").iterdir())
    import psutil

    real_memory = psutil.virtual_memory

    def idle_memory():  # this machine with nothing else running: all but 2 GiB of it available
        m = real_memory()
        return m._replace(available=max(m.available, m.total - 2 * 2**30))

    failed = []
    for command in [c for c in guide_commands() if not c.startswith(ENV_STEPS)]:
        argvs, from_root = translate(command, run_dir, folder / "gsm8k.jsonl", str(tiny_cache))
        for argv in argvs:
            where = ROOT if from_root else folder
            capsys.readouterr()
            if argv[0] == "pita" and argv[1] != "run":
                with monkeypatch.context() as m:
                    if from_root:
                        m.setattr(psutil, "virtual_memory", idle_memory)
                    rc = pita_here(argv[1:], where, m)
                err = capsys.readouterr().err
            else:
                r = as_user(argv, where)
                rc, err = r.returncode, r.stderr
            if rc != 0:
                failed.append((command, argv, rc, err[-1500:]))
    assert not failed, "\n\n".join(map(str, failed))


def test_the_testing_notes_name_benchmarks_and_targets_that_exist():
    """docs/testing.md's commands take minutes to an hour each: the check is that each names a
    make target, a bench module with a command line, or a preset that exists."""
    import importlib

    text = (ROOT / "docs" / "testing.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    seen = 0
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            c = line.split("  #")[0].split(" #")[0].strip()
            c = re.sub(r"^(\w+=\S+\s+)+", "", c)  # leading VAR=value settings
            if not c or c.startswith("#"):
                continue
            seen += 1
            if c.startswith("make "):
                assert re.search(rf"^{re.escape(c.split()[1])}:", makefile, re.M), c
            elif m := re.match(r"\.venv/bin/python -m (bench\.\w+)", c):
                mod = importlib.import_module(m.group(1))
                assert callable(getattr(mod, "main", None)), c
            elif m := re.match(r"\.venv/bin/python run_parallel\.py experiment=(\w+)", c):
                assert (ROOT / "pita" / "conf" / "experiment" / f"{m.group(1)}.yaml").exists(), c
            else:
                assert c.startswith(".venv/bin/python -m pytest"), c
    assert seen >= 10


def test_the_architecture_map_and_its_decisions_link_to_what_exists():
    """docs/architecture.md is a map a newcomer reads in one sitting (at most about 400 lines); every
    decision in docs/decisions/ is listed in its index, names the modules it explains on a `Where:`
    line, and every relative link of the map and the decisions resolves."""
    docs = ROOT / "docs"
    arch = (docs / "architecture.md").read_text()
    assert len(arch.splitlines()) <= 400
    decisions = sorted(p for p in (docs / "decisions").glob("*.md") if p.name != "README.md")
    assert len(decisions) >= 50
    index = (docs / "decisions" / "README.md").read_text()
    for p in decisions:
        assert f"]({p.name})" in index, f"{p.name} is not listed in docs/decisions/README.md"
        text = p.read_text()
        where = re.search(r"^Where: (.*)$", text, re.M)
        assert where, f"{p.name} has no Where: line"
        for path in re.findall(r"`([^`]+)`", where.group(1)):
            assert (ROOT / path).exists(), f"{p.name} names {path}, which does not exist"
    for page in [docs / "architecture.md", docs / "decisions" / "README.md", *decisions]:
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"
