"""pita as an installed command: the help pages, `pita run` from any folder, and a wheel that
carries its configs (pita/conf) and runs without the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.integration

FAST = ["experiment.workload=synthetic", "synthetic.job_seconds=0", "synthetic.algos=[PITA]",
        "synthetic.datasets=[arith]", "synthetic.rounds=1", "executor.progress=plain"]


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120")
    env.update(extra)
    return env


def _py(args, cwd, env=None, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env or _env(), capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------- help
@pytest.mark.parametrize("args", [["-m", "pita", "--help"], ["-m", "pita", "-h"], ["-m", "pita", "run", "--help"],
                                  [str(ROOT / "run_parallel.py"), "--help"],
                                  [str(ROOT / "run_parallel.py"), "experiment.name=x", "-h"]])
def test_every_help_flag_prints_our_page_not_hydras(tmp_path, args):
    r = _py(args, tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Powered by Hydra" not in out and "== Config ==" not in out  # Hydra's generic page
    for needle in ("usage:", "pita run", "status", "report", "exit codes:", "130", "--hydra-help",
                   "outputs/<experiment.name>/<YYYY-MM-DD_HH-MM-SS>/", "run.log", "results/", "jobs/<job-id>/",
                   "experiment.name=default", "experiment.algos=", "experiment.datasets=", "system.output_dir=outputs",
                   "executor.oom_retries=2", "model=", "experiment=", "tiny (default)", "smoke", "--multirun",
                   "sweep-<YYYY-MM-DD_HH-MM-SS>/", "summary.csv"):
        assert needle in out, needle
    assert not any(tmp_path.iterdir())  # help runs nothing and writes nothing


def test_the_help_page_follows_the_schema_and_the_code():
    """Every key the page lists exists in the schema with the default it shows; every exit code
    it lists is one the code returns."""
    from pita.cli import HELP_KEYS, help_text
    from pita.config.reference import rows
    from pita.core.executor import EXIT_INTERRUPTED, RunSummary

    page = help_text()
    schema = {k: d for k, d, _ in rows()}
    listed = [line.split()[0] for line in page.split("main keys", 1)[1].split("outputs (", 1)[0].splitlines()[1:]
              if line.startswith("  ") and "=" in line.split()[0]]
    assert len(listed) >= 20
    for pair in listed:
        key, _, default = pair.partition("=")
        assert key in schema, key
        assert schema[key].startswith(default), (key, default, schema[key])
    wanted = [k for k in schema if k.startswith(HELP_KEYS) and not k.startswith("executor.ray.")]
    assert sorted(k.partition("=")[0] for k in listed) == sorted(wanted)
    codes = page.split("exit codes:", 1)[1]
    assert RunSummary({"FAILED": 1}).exit_code == 1 and RunSummary({}).exit_code == 0
    assert RunSummary({}, interrupted=True).exit_code == EXIT_INTERRUPTED == 130
    for code in ("0 ", "1 ", "2 ", "130 "):
        assert f"\n  {code}" in codes


def test_bad_overrides_through_pita_run_exit_2_naming_the_key(tmp_path):
    r = _py(["-m", "pita", "run", "executor.oom_retries=abc", f"system.output_dir={tmp_path}"], tmp_path)
    assert r.returncode == 2 and "executor.oom_retries" in r.stderr
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- pita run from any folder
def test_pita_run_from_another_folder_writes_below_it(tmp_path):
    """`python -m pita run` in a folder that is not the repository: the run lands in ./outputs
    there, through the same code as run_parallel.py."""
    r = _py(["-m", "pita", "run", "experiment.name=elsewhere", *FAST], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    [run] = list((tmp_path / "outputs" / "elsewhere").iterdir())
    assert (run / "config.yaml").exists() and (run / "run.log").exists()
    assert "run folder: outputs/elsewhere/" in r.stdout
    r = _py(["-m", "pita", "run", "--cfg", "job", "experiment.name=shown"], tmp_path)
    assert r.returncode == 0 and "name: shown" in r.stdout


# ---------------------------------------------------------------- the wheel
@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """pita built as a wheel (no build isolation: no index needed) and installed with --target
    into a folder of its own."""
    pytest.importorskip("setuptools")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"  # a copy, so the build's egg-info and build/ stay out of the worktree
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "outputs", ".cache", "build", "dist",
                                                              "*.egg-info", "__pycache__", ".pytest_cache"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                        "-w", str(base / "dist")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    [wheel] = list((base / "dist").glob("pita-*.whl"))
    target = base / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return wheel, target


def test_the_wheel_carries_every_config(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"pita/conf/{p.relative_to(ROOT / 'pita' / 'conf')}" for p in (ROOT / "pita" / "conf").rglob("*.yaml")}
    assert "pita/conf/config.yaml" in want and len(want) > 20
    for group in ("model", "dataset", "gpu", "experiment"):
        assert any(n.startswith(f"pita/conf/{group}/") for n in want), group
    assert want <= names, sorted(want - names)


def test_the_installed_package_runs_from_an_unrelated_folder_with_its_own_configs(installed, tmp_path):
    _, target = installed
    # a mark only the installed copy has: proves its pita/conf is the one read
    conf = target / "pita" / "conf" / "config.yaml"
    conf.write_text(conf.read_text().replace("name: default", "name: from_the_wheel"))
    env = _env(PYTHONPATH=str(target))
    where = _py(["-c", "import pita.cli; print(pita.cli.CONF_DIR)"], tmp_path, env)
    assert where.stdout.strip() == str(target / "pita" / "conf"), where.stdout + where.stderr
    r = _py(["-m", "pita", "run", "--cfg", "job"], tmp_path, env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "name: from_the_wheel" in r.stdout
    script = target / "bin" / "pita"  # the console script pip wrote
    r = subprocess.run([str(script), "run", *FAST], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    [run] = list((tmp_path / "outputs" / "from_the_wheel").iterdir())
    assert (run / "state.json").exists()
    h = subprocess.run([str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and str(target / "pita" / "conf") in h.stdout
