"""What the backend keeps per attempt and per pack, and its settings (executor.slurm)."""

from __future__ import annotations

import os

from dataclasses import dataclass, field

from pita.core.backends.base import Launch


@dataclass
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    sbatch_args: list[str] = field(default_factory=list)
    cpus_per_job: int = 1  # per device job (merges: 1)
    time_margin: float = 2.0  # time limit = expected seconds x this
    min_minutes: int = 10
    poll_interval_s: float = 5.0  # squeue at most this often after a change; doubles while nothing does
    max_poll_interval_s: float = 60.0
    # --mem when the plan gives a GPU job no host estimate (CPU devices: their reservation); never
    # left out: without --mem a cluster with no DefMemPerNode gives a job the whole node's memory
    mem_gb: float = 4.0
    pending_report_s: float = 300.0  # a job queued longer than this is reported with Slurm's reason
    max_time_s: float | None = None  # the partition's MaxTime (read at start): no --time beyond it
    max_jobs: int | None = None  # jobs in flight at most (None: max_share, and the association's and QoS's limits)
    max_share: float = 0.25  # max_jobs None: at most this share of the partition's usable devices in flight (>= 4)
    oom_mem_factor: float = 1.5
    oom_mem_retries: int = 2
    signal_margin_s: int = 120
    outcome_wait_s: float = 60.0
    max_node_mem_mb: int | None = None  # the partition's largest node (read at start): --mem stops there
    unknown_s: float = 900.0  # a job no Slurm command knows, with no outcome file, for this long: lost
    # attempts planned shorter than this run in packs (pita.core.backends.pack: one allocation, one
    # warm interpreter, several attempts one after another); 0: every attempt is a Slurm job of its own
    pack_below_s: float = 0.0
    pack_time_s: float = 3600.0  # a pack's --time (at most the partition's MaxTime)
    pack_idle_s: float = 60.0  # a pack with nothing to run leaves after this long
    partition_refresh_s: float = 300.0  # the partition's nodes read again this often (drained, returned)


# ---------------------------------------------------------------- the cluster, read before anything runs
def settings_from(cfg_slurm) -> SlurmSettings:
    """:class:`SlurmSettings` from ``executor.slurm``."""
    c = cfg_slurm
    return SlurmSettings(partition=c.partition, account=c.account, qos=c.qos, constraint=c.constraint,
                         sbatch_args=[str(a) for a in (c.sbatch_args or [])], cpus_per_job=int(c.cpus_per_job),
                         time_margin=float(c.time_margin), min_minutes=int(c.min_minutes),
                         poll_interval_s=float(c.poll_interval_s), pending_report_s=float(c.pending_report_s),
                         mem_gb=float(c.mem_gb), max_poll_interval_s=float(c.max_poll_interval_s),
                         max_jobs=None if c.max_jobs is None else int(c.max_jobs),
                         max_share=float(c.max_share), oom_mem_factor=float(c.oom_mem_factor),
                         oom_mem_retries=int(c.oom_mem_retries), signal_margin_s=int(c.signal_margin_s),
                         outcome_wait_s=float(c.outcome_wait_s), pack_below_s=float(c.pack_below_s),
                         pack_time_s=float(c.pack_time_s), pack_idle_s=float(c.pack_idle_s),
                         partition_refresh_s=float(c.partition_refresh_s))


@dataclass
class _Sub:
    launch: Launch
    slurm_id: str
    submitted: float
    gpus: int
    forced: str | None = None
    reason: str = ""
    term_sent: float | None = None
    grace_s: float = 10.0
    state: str = "PENDING"
    state_reason: str = ""
    started: float | None = None  # when squeue first showed it running
    time_limit: str = ""  # the --time it was submitted with
    mem_gb: float = 0.0  # the --mem it was submitted with
    end: tuple[str, int | None] | None = None  # Slurm's end state, once read
    ended_seen: float | None = None  # when Slurm first said it ended (its outcome file may lag: NFS)
    unknown_since: float | None = None  # since when no Slurm command knows it
    never_since: float | None = None  # since when it pends for a reason that cannot clear
    requeues: int = 0  # times Slurm put it back in the queue after it ran (preemption)
    outcome_seen: float | None = None  # when its outcome file was first seen (it is ending)


@dataclass
class _Held:
    """An attempt pita has not submitted yet: the run's limit of jobs in flight is reached, or
    sbatch refused it for now (a submit limit, a timeout); tried again with backoff."""
    launch: Launch
    args: list[str]
    script: str
    since: float
    next_try: float = 0.0
    tries: int = 0
    why: str = ""


@dataclass
class _Task:
    """An attempt that runs in a pack: waiting for one (``pack`` None), handed to one
    (its task.json written), or running in it (the pack renamed task.json)."""
    launch: Launch
    key: tuple
    since: float
    mem_gb: float = 0.0
    pack: "_Pack | None" = None
    assigned: float | None = None
    taken: float | None = None
    forced: str | None = None
    reason: str = ""
    lost_since: float | None = None  # its pack ended without a done file: its outcome is waited for
    limit_s: float = 0.0  # its own time limit inside the pack (the --time a job of its own would ask)
    warn_s: int = 0  # USR1 this long before that limit (--signal=B:USR1@ of a job of its own)
    done_seen: float | None = None  # its done file first read (its outcome, or its pack's end, may lag)


@dataclass
class _Pack:
    """A Slurm job running ``pita.core.backends.pack``: one allocation of ``args``'s size."""
    name: str
    key: tuple
    args: list[str]
    dir: "os.PathLike"
    submitted: float
    limit_s: float
    mem_gb: float = 0.0
    slurm_id: str = ""
    started: float | None = None  # its started file seen
    state: str = "PENDING"
    end: tuple[str, int | None] | None = None
    unknown_since: float | None = None
    task: _Task | None = None
    closed: bool = False
    surplus_since: float | None = None
    stopped: bool = False  # told to stop (the run is over)

    def remaining(self, now: float) -> float:
        return self.limit_s - (now - self.started if self.started is not None else 0.0)
