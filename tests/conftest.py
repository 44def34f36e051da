import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """The tiny family, built once per test session (about a minute on 2 cores), or reused from
    ``PITA_TEST_CACHE`` (a cache folder of an earlier build) when that is set."""
    from pita.models.tiny import build_tiny_family

    cache = os.environ.get("PITA_TEST_CACHE") or tmp_path_factory.mktemp("cache")
    build_tiny_family(cache, 0)
    return cache


@pytest.fixture(scope="session")
def tiny(tiny_cache):
    from pita.models.tiny import family_dir

    root = family_dir(tiny_cache, 0)
    return {k: str(root / k) for k in ("tokenizer", "reference", "guidance", "reward_sentiment")}
