import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """The tiny family, built once per test session, or reused from ``PITA_TEST_CACHE`` (a cache
    folder of an earlier build) when that is set. The parts are built in parallel processes (each
    at one thread, as every build is: the weights a run's build job gives)."""
    import subprocess

    from pita.models.tiny import PARTS, build_tiny_family, prepare_tiny_family

    cache = os.environ.get("PITA_TEST_CACHE") or tmp_path_factory.mktemp("cache")
    prepare_tiny_family(cache, 0)
    code = "import sys; from pita.models.tiny import build_part; build_part(sys.argv[1], 0, sys.argv[2])"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(cache), part], env=env) for part in PARTS]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError("building the tiny family failed (see the output above)")
    build_tiny_family(cache, 0)  # checks every part is there
    return cache


@pytest.fixture(scope="session")
def tiny(tiny_cache):
    from pita.models.tiny import family_dir

    root = family_dir(tiny_cache, 0)
    return {k: str(root / k) for k in ("tokenizer", "reference", "guidance", "reward_sentiment")}
