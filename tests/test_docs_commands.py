"""Every command the README shows, checked from a folder outside the checkout: `pita plan` and
`pita --version` run as written; each `pita run` is composed, validated and planned as written
(`pita plan` with the same arguments: everything a run checks before its first job; the runs
themselves are the integration tests'); `pita status` / `pita report` run on a run of the smoke
experiment's name. Environment steps (make, source) are what CI itself runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from helpers import ROOT, pita_here, user_folder

pytestmark = pytest.mark.integration


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_the_readme_shows_only_commands_this_check_knows():
    kinds = {c.split()[0] if c.split()[0] != "pita" else " ".join(c.split()[:2]) for c in readme_commands()}
    assert kinds <= {"make", "source", "pita --version", "pita run", "pita plan", "pita status", "pita report"}, kinds


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A user's folder: the files the README's examples name, and a finished run named smoke."""
    d = user_folder(tmp_path_factory.mktemp("user"), "mymath.jsonl", "smoke")
    (d / "conf" / "dataset").mkdir(parents=True)
    (d / "conf" / "dataset" / "mymath.yaml").write_text("name: mymath\nbase: gsm8k\npath: mymath.jsonl\n")
    (d / "myreward.py").write_text("def score(prompts, completions):\n    return [len(c) / 100 for c in completions]\n")
    return d


def test_each_readme_command_runs_or_plans_as_written(folder, monkeypatch, capsys):
    """In this process (each command would pay an interpreter's start-up otherwise)."""
    failed = []
    for command in [c for c in readme_commands() if c.startswith("pita")]:
        argv = shlex.split(command)
        if argv[:2] == ["pita", "run"]:
            argv = ["pita", "plan", *argv[2:]]  # everything a run checks before its first job
        [run_dir] = list((folder / "outputs" / "smoke").iterdir())
        argv = [a.replace("outputs/smoke/<time>", str(run_dir.relative_to(folder))) for a in argv]
        capsys.readouterr()
        rc = pita_here(argv[1:], folder, monkeypatch)
        if rc != 0:
            failed.append((command, rc, capsys.readouterr().err[-1500:]))
    assert not failed, failed
