"""Backends run job attempts; they share one interface (:class:`pita.core.backends.base.Backend`).

    local   one spawned process per job attempt (default)
    inline  in this process, one at a time (debugging, fast tests)
    ray     a Ray task per job attempt, on any node of a Ray cluster (pip install -e '.[ray]')
    slurm   a Slurm job per job attempt (sbatch), on a cluster the run folder is shared with
"""

from __future__ import annotations

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.names import unknown_name
from pita.core.errors import ConfigError

BACKEND_NAMES = ("local", "inline", "ray", "slurm")


def make_backend(name: str, **kwargs) -> Backend:
    if name == "local":
        from pita.core.backends.local import LocalBackend

        return LocalBackend(**kwargs)
    if name == "inline":
        from pita.core.backends.inline import InlineBackend

        return InlineBackend()
    if name == "ray":
        from pita.core.backends.ray import RayBackend

        return RayBackend(**kwargs)
    if name == "slurm":
        from pita.core.backends.slurm import SlurmBackend

        return SlurmBackend(**kwargs)
    raise ConfigError(unknown_name("executor.backend", name, BACKEND_NAMES))


__all__ = ["Backend", "Finished", "Launch", "make_backend", "BACKEND_NAMES"]
