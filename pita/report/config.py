"""A run's saved ``config.yaml``, parsed once per report: every section of the report reads it
(the label source per dataset, the budgets, the roster's order), and parsing it for each one
took about 3 of the demo report's 6 seconds."""

from __future__ import annotations

from pathlib import Path

_PARSED: dict[tuple, object] = {}


def run_config(run):
    """The run's config (an OmegaConf DictConfig; callers only read it). Raises what
    ``OmegaConf.load`` raises for a missing or damaged file; a rewritten file is parsed again."""
    from omegaconf import OmegaConf

    path = Path(run.config)
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _PARSED:
        if len(_PARSED) > 64:  # a long-lived process (pooled reports over many seeds) keeps a few
            _PARSED.clear()
        _PARSED[key] = OmegaConf.load(path)
    return _PARSED[key]
