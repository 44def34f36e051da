"""Where the run's models come from, checked before anything runs (``check_models``).

A model id in ``model.reference``, ``model.guidance`` or ``model.reward_models.<dataset>`` is one of

    builtin:<family>/<part>   built or converted locally (model=tiny, model=smollm2)
    a local folder            /models/my-llama, ./models/x, ~/x, or models/x where models/ exists here
    a hub id                  Qwen/Qwen3-1.7B, gpt2: downloaded once into the Hugging Face cache

A folder that does not exist, or is not a saved model, is refused at once (loading it would fail
minutes later, or as a hub id, with transformers' "Repo id must be in the form ..."). For hub ids
the hub's reachability is decided once per process: with ``HF_HUB_OFFLINE`` set it is not asked,
otherwise one request with a short timeout is made (:func:`hub_reachable`). A hub id the run
cannot download and the local cache does not hold is refused with what to type instead; when the
hub is unreachable but every hub id is cached, the run goes on in offline mode (``HF_HUB_OFFLINE=1``
for it and its jobs), which spares each job its minute of connection retries.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from omegaconf import DictConfig

PROBE_TIMEOUT_S = 2.5
LOCAL_FAMILIES = "model=tiny or model=smollm2 (built locally)"
_probe_result: dict[str, tuple[bool, str]] = {}  # endpoint -> (reachable, why not): once per process


def _true(value: str | None) -> bool:
    return (value or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_offline() -> bool:
    """Whether offline mode is asked for (as huggingface_hub reads it)."""
    return _true(os.environ.get("HF_HUB_OFFLINE")) or _true(os.environ.get("TRANSFORMERS_OFFLINE"))


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _probe(endpoint: str, timeout_s: float) -> tuple[bool, str]:
    """One HEAD request to the hub (through the proxies the environment names). Any HTTP answer,
    even an error status, means the hub can be reached."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
        return True, ""
    except urllib.error.HTTPError:
        return True, ""
    except urllib.error.URLError as e:
        return False, str(e.reason)
    except Exception as e:  # noqa: BLE001 - timeouts, resets, TLS: all mean "not reachable now"
        return False, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def hub_reachable(timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(reachable, why not), asked once per process. Bounded by ``timeout_s`` in all, name
    resolution included (which the socket timeout does not cover)."""
    endpoint = hub_endpoint()
    if endpoint not in _probe_result:
        out: list = []
        t = threading.Thread(target=lambda: out.append(_probe(endpoint, timeout_s)), daemon=True)
        t.start()
        t.join(timeout_s + 0.5)
        _probe_result[endpoint] = out[0] if out else (False, f"no answer from {endpoint} within {timeout_s:g}s")
    return _probe_result[endpoint]


def looks_like_path(ref: str) -> bool:
    """Whether a model id names a local folder rather than a hub repository."""
    if ref.startswith(("/", ".", "~")) or os.path.isabs(ref):
        return True
    seps = [s for s in (os.sep, os.altsep) if s]
    if not any(s in ref for s in seps):
        return False
    p = Path(ref)
    if p.exists() or len(p.parts) > 2:  # a hub id is "org/name": three parts can only be a path
        return True
    return p.parent.is_dir()  # models/x where ./models exists


def used_models(cfg: DictConfig) -> list[tuple[str, str]]:
    """(key, id) of every model this run loads: the reference, the guidance model and the reward
    models of the datasets it trains or evaluates on (a family lists reward models for tasks the
    run may not use; those are not loaded)."""
    if cfg.experiment.workload == "synthetic":
        return []
    m = cfg.model
    out = [("model.reference", m.reference), ("model.guidance", m.guidance)]
    names = list(cfg.experiment.datasets)
    by_train = cfg.eval.get("datasets_by_train") or {}
    for d in list(names):
        names += [x for x in (by_train.get(d) or []) if x not in names]
    for d in names:
        rm = (m.reward_models or {}).get(d)
        if rm:
            out.append((f"model.reward_models.{d}", rm))
    return out


def _cached(repo_id: str, filename: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, filename), str)
    except Exception:  # noqa: BLE001 - an id the cache cannot hold
        return False


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _folder_problem(key: str, ref: str, needs: str) -> str | None:
    p = Path(ref).expanduser()
    fix = (f"set {key} to the folder of a saved model (save_pretrained: config.json and the weights), to a hub "
           f"id such as Qwen/Qwen3-0.6B, or use {LOCAL_FAMILIES}")
    if not p.exists():
        why = ""
        if not ref.startswith(("/", ".", "~")) and p.parent.is_dir():
            why = f" (read as a folder because {p.parent}/ exists here)"
        return f"{key}={ref!r}: no such folder ({p.resolve()}){why}; {fix}"
    if not p.is_dir():
        return f"{key}={ref!r}: is a file, not a model folder; {fix}"
    if not (p / needs).exists():
        return f"{key}={ref!r}: the folder has no {needs}, so it holds no saved model; {fix}"
    return None


def check_models(cfg: DictConfig, probe=None) -> list[str]:
    """Problems with the run's model ids (empty: every model can be loaded as far as can be told
    without loading it). ``probe``: () -> (reachable, why not); default :func:`hub_reachable`.
    May switch the process to offline mode (see the module's doc)."""
    problems: list[str] = []
    hub: list[tuple[str, str, str]] = []  # key, id, the file that says it is cached
    gguf = cfg.model.get("gguf_file")
    for key, ref in used_models(cfg):
        ref = str(ref)
        needs = gguf if key == "model.reference" and gguf else "config.json"
        if ref.startswith("builtin:"):
            continue
        if looks_like_path(ref):
            p = _folder_problem(key, ref, needs)
            if p:
                problems.append(p)
            continue
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(ref)
        except Exception as e:  # noqa: BLE001 - HFValidationError
            problems.append(f"{key}={ref!r}: neither a folder here nor a hub id ({str(e).splitlines()[0]}); give "
                            f"a local folder, a hub id such as Qwen/Qwen3-0.6B, or use {LOCAL_FAMILIES}")
            continue
        hub.append((key, ref, needs))
    if not hub:
        return problems
    missing = [(k, r) for k, r, f in hub if not _cached(r, f)]
    if hub_offline():
        for key, ref in missing:
            problems.append(f"{key}={ref!r}: not in the local Hugging Face cache ({_cache_dir()}), and HF_HUB_OFFLINE "
                            f"is set, so it cannot be downloaded. Download it once where the hub is reachable "
                            f"(hf download {ref}), set {key} to a local folder, or use {LOCAL_FAMILIES}")
        return problems
    reachable, why = (probe or hub_reachable)()
    if reachable:
        return problems
    for key, ref in missing:
        problems.append(f"{key}={ref!r}: the Hugging Face hub ({hub_endpoint()}) cannot be reached ({why}) and the "
                        f"model is not in the local cache ({_cache_dir()}). Download it where the hub is reachable "
                        f"(hf download {ref}) and run with HF_HUB_OFFLINE=1, set {key} to a local folder, or use "
                        f"{LOCAL_FAMILIES}")
    if not missing and not problems:
        use_offline_mode(why)
    return problems


def use_offline_mode(why: str) -> None:
    """The hub is out of reach but the cache holds every model: load from the cache only, here and
    in every job (they inherit the environment), instead of retrying connections per file."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = True  # read at import; transformers asks it per call
    except ImportError:
        pass
    print(f"note: the Hugging Face hub cannot be reached ({why}); every model of this run is in the local "
          f"cache, so it runs with HF_HUB_OFFLINE=1 (set it yourself to skip this check)", file=sys.stderr)
