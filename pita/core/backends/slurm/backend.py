"""The Slurm backend: each job attempt a Slurm job (or a pack's), its parts joined."""

from __future__ import annotations

import sys

from pita.core.backends.base import Backend, Finished
from pita.core.backends.slurm.records import SlurmSettings, _Sub, _Held, _Task, _Pack
from pita.core.backends.slurm.submit import Submitting
from pita.core.backends.slurm.nodes import FollowingNodes
from pita.core.backends.slurm.packs import Packing
from pita.core.backends.slurm.polling import Polling
from pita.core.backends.slurm.ends import Ending
from pita.core.backends.slurm.adoption import Adopting


class SlurmBackend(Submitting, FollowingNodes, Packing, Polling, Ending, Adopting, Backend):
    name = "slurm"
    outlives_driver = True

    def __init__(self, settings: SlurmSettings | None = None, kill_grace_s: float = 10.0,
                 python: str | None = None):
        self.s = settings or SlurmSettings()
        self.kill_grace_s = kill_grace_s
        self.python = python or sys.executable
        self.subs: dict[str, _Sub] = {}
        self.held: dict[str, _Held] = {}
        self.time_factor: dict[str, float] = {}  # a job that hit its limit: twice the limit next time
        self.mem_factor: dict[str, float] = {}  # a job that ran out of host memory: more --mem next time
        self.host_ooms: dict[str, int] = {}
        self.cap: int | None = self.s.max_jobs  # jobs in flight at most (set_limits: the user's limits)
        self.cap_why = "executor.slurm.max_jobs" if self.s.max_jobs else ""
        self.gpu_cap: int | None = None  # GPUs in flight at most (set_gpu_limit: GrpTRES, MaxTRESPU)
        self.gpu_cap_why = ""
        self._sized: set[str] = set()  # job folders whose saved sizing (slurm-sizing.json) was read
        self.devices_n = 0  # the partition's usable devices (follow_nodes): max_share counts them
        self._interval = self.s.poll_interval_s
        self._next_query = 0.0
        self._last_look = 0.0  # outcome files last looked for
        self._outage: float | None = None  # since when squeue has not answered
        self._outage_note = 0.0
        self._listing: list[list[str]] | None = None  # squeue, read once while a resume adopts
        self._ended: list[Finished] = []
        self.stats = {"squeue": 0, "sacct": 0, "scontrol": 0, "sbatch": 0, "refused": 0, "failed_queries": 0,
                      "packs": 0, "packed": 0, "pack_looks": 0}
        self.tasks: dict[str, _Task] = {}  # attempts in packs, by job id
        self.packs: dict[str, _Pack] = {}  # by name
        self.no_pack: set[str] = set()  # jobs whose pack ended under them: their own Slurm job next time
        self._pack_look = 0.0
        self._nodes: dict[str, list[int]] | None = None  # node -> the inventory's ordinals of its GPUs (follow_nodes)
        self._node_state: dict[str, str] = {}
        self._template = None  # a device of the inventory: what a returning node's GPUs look like
        self._next_ordinal = 0
        self._nodes_read = 0.0
        self._new_devices: dict[int, object] = {}
        from pita.core.backends.local import LocalBackend

        self.local = LocalBackend(python=self.python, kill_grace_s=kill_grace_s, worker_start="exec")  # merges
