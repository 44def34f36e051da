"""Model ids checked before a run starts (pita.models.sources): a local folder that is not there, a
hub id the run cannot download. Each exits 2 within seconds, names the key, the value and the fix,
and leaves no run folder behind."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time

import pytest

from helpers import cli
from pita.cli import run_experiment
from pita.models import sources

FIXES = ("HF_HUB_OFFLINE=1", "a local folder", "model=tiny or model=smollm2")


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from pita.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=["experiment=smoke", *overrides])


def _cache_model(cache, repo_id: str) -> None:
    """A model as the Hugging Face cache holds it after a download (just its config)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An empty HF cache, offline mode unset, and a probe that counts its calls (unreachable unless
    told otherwise); the process's offline switch is restored afterwards."""
    from huggingface_hub import constants

    cache = tmp_path / "hf"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []
    state = {"reachable": False}

    def probe():
        calls.append(1)
        return (True, "") if state["reachable"] else (False, "[Errno -2] Name or service not known")

    return {"cache": cache, "calls": calls, "state": state, "probe": probe}


# ---------------------------------------------------------------- which ids are folders
def test_what_reads_as_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for ref in ("/nope/model", "./models/x", "../x", "~/x", ".cache/pita/x", "models/x", "a/b/c"):
        assert sources.looks_like_path(ref), ref
    for ref in ("Qwen/Qwen3-1.7B", "gpt2", "lvwerra/distilbert-imdb"):
        assert not sources.looks_like_path(ref), ref


def test_only_the_models_the_run_loads_are_checked():
    cfg = _compose("model=qwen3-sm")  # its family lists reward models for imdb and tldr; smoke runs arith
    assert sources.used_models(cfg) == [("model.reference", "Qwen/Qwen3-1.7B"), ("model.guidance", "Qwen/Qwen3-0.6B")]
    cfg = _compose("model=qwen3-sm", "experiment.datasets=[arith]", "+eval.datasets_by_train.arith=[arith,imdb]")
    assert ("model.reward_models.imdb", "lvwerra/distilbert-imdb") in sources.used_models(cfg)
    assert sources.used_models(_compose("experiment.workload=synthetic")) == []


# ---------------------------------------------------------------- local folders
@pytest.mark.parametrize("ref,needle", [("/nope/model", "no such folder (/nope/model)"),
                                        ("./models/x", "no such folder ("),
                                        ("FILE", "is a file, not a model folder"),
                                        ("EMPTY", "the folder has no config.json")])
def test_a_local_folder_that_holds_no_model_is_refused_without_asking_the_hub(ref, needle, hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "EMPTY").mkdir()
    if ref in ("FILE", "EMPTY"):
        ref = str(tmp_path / ref)
    [p] = sources.check_models(_compose(f"model.reference={ref}"), probe=hub["probe"])
    assert p.startswith(f"model.reference={ref!r}: ") and needle in p
    assert "config.json" in p and "model=tiny or model=smollm2" in p
    assert hub["calls"] == []


def test_a_saved_model_folder_passes(tmp_path, hub):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert sources.check_models(_compose(f"model.reference={tmp_path / 'm'}"), probe=hub["probe"]) == []


# ---------------------------------------------------------------- hub ids
def test_offline_mode_and_an_uncached_model_is_refused_without_a_probe(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_model(hub["cache"], "Qwen/Qwen3-0.6B")
    [p] = sources.check_models(_compose("model=qwen3-sm"), probe=hub["probe"])
    assert p.startswith("model.reference='Qwen/Qwen3-1.7B': not in the local Hugging Face cache")
    assert str(hub["cache"]) in p and "hf download Qwen/Qwen3-1.7B" in p and "model=tiny or model=smollm2" in p
    assert hub["calls"] == []


def test_an_unreachable_hub_is_asked_once_and_each_uncached_model_named(hub):
    problems = sources.check_models(_compose("model=qwen3-sm"), probe=hub["probe"])
    assert [p.split(":")[0] for p in problems] == ["model.reference='Qwen/Qwen3-1.7B'", "model.guidance='Qwen/Qwen3-0.6B'"]
    for p in problems:
        assert "cannot be reached ([Errno -2] Name or service not known)" in p
        assert all(fix in p for fix in FIXES), p
    assert hub["calls"] == [1]


def test_an_unreachable_hub_with_every_model_cached_runs_offline(hub, capsys):
    from huggingface_hub import constants

    for repo in ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-0.6B"):
        _cache_model(hub["cache"], repo)
    assert sources.check_models(_compose("model=qwen3-sm"), probe=hub["probe"]) == []
    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True
    assert "runs with HF_HUB_OFFLINE=1" in capsys.readouterr().err


def test_a_reachable_hub_needs_no_cache(hub):
    hub["state"]["reachable"] = True
    assert sources.check_models(_compose("model=qwen3-sm"), probe=hub["probe"]) == []
    assert "HF_HUB_OFFLINE" not in os.environ and hub["calls"] == [1]


def test_the_built_in_families_ask_nothing(hub):
    assert sources.check_models(_compose(), probe=hub["probe"]) == [] and hub["calls"] == []


# ---------------------------------------------------------------- the probe itself
@pytest.fixture
def fresh_probe(monkeypatch):
    monkeypatch.setattr(sources, "_probe_result", {})


def test_the_probe_sees_an_answering_server_once_per_process(fresh_probe, monkeypatch):
    hits = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            hits.append(self.path)
            self.send_response(401)  # any answer means reachable
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.server_port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        assert sources.hub_reachable() == (True, "") and sources.hub_reachable() == (True, "")
    finally:
        srv.shutdown()
    assert hits == ["/"]


def test_the_probe_fails_fast_on_a_closed_port_and_within_its_timeout_on_silence(fresh_probe, monkeypatch):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    ok, why = sources.hub_reachable()
    assert not ok and "refused" in why.lower()
    silent = socket.socket()  # accepts connections, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    t = time.monotonic()
    ok, why = sources.hub_reachable(timeout_s=0.5)
    silent.close()
    assert not ok and time.monotonic() - t < 1.5, why


# ---------------------------------------------------------------- whole commands
def test_run_experiment_refuses_a_missing_folder_at_once_and_makes_no_run_folder(tmp_path, hub, capsys):
    out = tmp_path / "out"
    cfg = _compose("model.reference=/nope/model", f"system.output_dir={out}")
    t = time.monotonic()
    assert run_experiment(cfg, overrides=[]) == 2
    assert time.monotonic() - t < 3
    err = capsys.readouterr().err
    assert "model.reference='/nope/model': no such folder" in err and "model=tiny or model=smollm2" in err
    assert not out.exists()


def test_run_experiment_refuses_an_unreachable_hub_model_within_seconds(tmp_path, hub, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr(sources, "hub_reachable", hub["probe"])
    cfg = _compose("model=qwen3-sm", f"system.output_dir={out}")
    t = time.monotonic()
    assert run_experiment(cfg, overrides=[]) == 2
    assert time.monotonic() - t < 3
    err = capsys.readouterr().err
    assert "model.reference='Qwen/Qwen3-1.7B': the Hugging Face hub (https://huggingface.co) cannot be reached" in err
    assert all(fix in err for fix in FIXES)
    assert hub["calls"] == [1] and not out.exists()


@pytest.mark.integration
def test_the_command_line_exits_2_for_missing_models(tmp_path, monkeypatch):
    """run_parallel.py itself, offline (HF_HUB_OFFLINE=1, an empty cache): no probe, no folder."""
    (tmp_path / "hf").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    for args, needle in ((["model.reference=./models/x"], "model.reference='./models/x': no such folder"),
                         (["model=qwen3-sm"], "model.guidance='Qwen/Qwen3-0.6B': not in the local Hugging Face cache")):
        r = cli(["experiment=smoke", *args], tmp_path)
        assert r.returncode == 2, r.stderr
        assert needle in r.stderr
        assert not (tmp_path / "smoke").exists()
