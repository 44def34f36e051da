import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # the default tier runs on several pytest workers (pytest-xdist, -n in pyproject.toml): torch in a
    # worker gets one thread, since two processes with default threads on 2 cores thrash (a test that
    # needs another count sets it itself; a run's jobs get their budget from the run)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A folder every pytest worker of this session sees (pytest-xdist gives each worker a base
    folder of its own below one session folder), for what the session computes once."""
    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    d.mkdir(exist_ok=True)
    return d


def once(shared: Path, name: str, make):
    """``make(folder)`` run once per session for ``name``, whichever worker asks first; the others
    wait for it and get the same folder. A failed ``make`` fails every caller with its error."""
    from filelock import FileLock

    folder, done, failed = shared / name, shared / f"{name}.done", shared / f"{name}.failed"
    with FileLock(str(shared / f"{name}.lock")):
        if failed.exists():
            raise RuntimeError(f"{name}, computed once for the session, failed: {failed.read_text()}")
        if not done.exists():
            folder.mkdir(exist_ok=True)
            try:
                make(folder)
            except BaseException as e:
                failed.write_text(f"{type(e).__name__}: {e}"[:4000])
                raise
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_cache(shared_dir):
    """The tiny family, built once per test session (shared by the pytest workers), or reused from
    ``PITA_TEST_CACHE`` (a cache folder of an earlier build) when that is set. The parts are built
    in parallel processes (each at one thread, as every build is: the weights a run's build job gives)."""
    import subprocess

    from pita.models.tiny import PARTS, build_tiny_family, prepare_tiny_family

    def build(cache):
        prepare_tiny_family(cache, 0)
        code = "import sys; from pita.models.tiny import build_part; build_part(sys.argv[1], 0, sys.argv[2])"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        procs = [subprocess.Popen([sys.executable, "-c", code, str(cache), part], env=env) for part in PARTS]
        if any(p.wait() != 0 for p in procs):
            raise RuntimeError("building the tiny family failed (see the output above)")
        build_tiny_family(cache, 0)  # checks every part is there

    if os.environ.get("PITA_TEST_CACHE"):
        cache = Path(os.environ["PITA_TEST_CACHE"])
        cache.mkdir(parents=True, exist_ok=True)
        build(cache)
        return cache
    return once(shared_dir, "tiny-cache", build)


@pytest.fixture(scope="session")
def tiny(tiny_cache):
    from pita.models.tiny import family_dir

    root = family_dir(tiny_cache, 0)
    return {k: str(root / k) for k in ("tokenizer", "reference", "guidance", "reward_sentiment")}


SMOKE_ARGS = ("experiment=smoke", "algos.PITA.etas=[0,1]", "eval.eta_max=4")


@pytest.fixture(scope="session")
def smoke_run(shared_dir, tiny_cache):
    """``experiment=smoke`` run once per session through the command line (a subprocess, as a user
    runs it), for the tests that read what it wrote; PITA's grid is one η (0, 1) and the η search may
    go to 4, so the run also shows the search adding η. Returns (run folder, the command's output);
    tests read it and never change it."""
    from helpers import cli, only_run

    def make(out):
        r = cli([*SMOKE_ARGS, f"system.cache_dir={tiny_cache}"], out, timeout=600)
        (out / "stdout.txt").write_text(r.stdout)
        (out / "stderr.txt").write_text(r.stderr)
        assert r.returncode == 0, r.stderr[-3000:]

    out = once(shared_dir, "smoke-run", make)
    return only_run(out, "smoke"), (out / "stdout.txt").read_text()
