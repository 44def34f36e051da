"""A run's files are as readable as the umask allows: a labmate on a shared node reads results."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from helpers import ROOT, only_run

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("umask, readable", [(0o022, True), (0o077, False)])
def test_atomic_writes_follow_the_umask(tmp_path, umask, readable):
    from pita.core.paths import atomic_write_json

    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "x.json").stat().st_mode)
    assert mode == 0o666 & ~umask
    assert bool(mode & stat.S_IROTH) == readable


def test_every_file_of_a_run_is_readable_by_others_under_umask_022(tmp_path):
    """A synthetic run (config.yaml, state.json, each job's launch/result/attempt files, the
    results) started under umask 022: no file of its folder is private to its owner."""
    r = subprocess.run(f"umask 022 && {sys.executable} {ROOT / 'run_parallel.py'} experiment.name=perm "
                       f"experiment.workload=synthetic synthetic.algos=[PITA] synthetic.datasets=[arith] "
                       f"synthetic.rounds=1 synthetic.job_seconds=0 system.output_dir={tmp_path} executor.progress=off",
                       shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    run = only_run(tmp_path, "perm")
    private = [str(p.relative_to(run)) for p in run.rglob("*")
               if p.is_file() and not p.name.endswith(".lock") and not stat.S_IMODE(p.stat().st_mode) & stat.S_IROTH]
    assert not private, private
    for name in ("config.yaml", "state.json"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o644
