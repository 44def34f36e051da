"""The Slurm backend: each job attempt is one Slurm job, submitted with ``sbatch``.

The orchestrator (the driver) runs where the user starts it, on a login node or inside a small
Slurm job of its own, and keeps everything it keeps with the other backends: the job graph, the
scheduler's order and placement, retries, OOM halving, fail-fast, resume. What it hands Slurm is
one attempt at a time, asking for what the plan gives the job:

    sbatch --parsable -J pita:<job id> -o <job dir>/job.log --open-mode=append -N 1 -n 1
           -c <cpus> --mem=<host GB>G --time=<expected x margin> [--gres=gpu:<k>]
           [-p partition] [-A account] [-q qos] [-C constraint] <extra sbatch args>
           <job dir>/slurm-<attempt>.sh     (exec python -m pita.core.worker <job dir>/launch.json)

The worker writes its outcome next to its launch file, as under the local backend, so the run
folder must be on a filesystem the cluster's nodes share. Slurm's own end states are read with
``squeue`` while a job is known there and ``scontrol show job`` after (``sacct`` where
accounting is kept); how each maps:

    COMPLETED, FAILED, OUT_OF_MEMORY   the worker's outcome and exit code (ok, error, oom, died)
    PREEMPTED, NODE_FAIL, BOOT_FAIL, DEADLINE
                                       "lost": run again, not counted as the job's crash
                                       (executor.lost_retries), like a Ray node that left
    CANCELLED (not by pita)            a person's word: final ("cancelled", the job FAILED with
                                       who cancelled it and the command that runs it again)
    TIMEOUT                            "lost" once: the next attempt asks twice the time limit
                                       (never past MaxTime or the QoS's MaxWall; the factor is
                                       kept in the job's folder, so a resume keeps it); a second
                                       TIMEOUT, or one at the longest limit, fails the job

Jobs that hold no device (merges) run on the driver, as local workers. Killing an attempt is
``scancel --signal=TERM`` then ``scancel`` after the grace period; a driver that stops cancels
every job it submitted; a driver that is killed leaves them running, and a resumed one takes
them over (``handle``/``adopt``/``end_strays``). Attempts kept waiting in the queue are reported
with squeue's reason (``queued``). GPU jobs leave ``CUDA_VISIBLE_DEVICES`` to
Slurm (its GRES plugin sets it to the allocation); CPU jobs keep the driver's empty one.

The backend in rooms, each read in one sitting: ``commands`` (Slurm's commands, their parsing, the
states and reasons pita reads), ``records`` (settings, what is kept per attempt and pack),
``cluster`` (the partition checked before the run), ``limits`` (the association's and QoS's
limits), and the backend's parts, mixed into ``backend.SlurmBackend``: ``submit`` (requests,
scripts, sbatch, the run's limits in flight), ``nodes`` (the partition followed), ``packs``,
``polling`` (squeue), ``ends`` (end states and what they mean) and ``adoption`` (kill, stop, detach,
a later driver). Every name is importable from this package.
"""

from __future__ import annotations

# tunables the rooms read here at call time (tests set them on this package)
OUTCOME_LOOK_S = 2.0  # running attempts' outcome files are looked for this often (a stat each)
NEVER_CLEARS_AFTER_S = 60.0  # seen this long first (a reason can be transient while the scheduler looks)
QUERY_TIMEOUT_S = 30.0  # a Slurm query slower than this counts as no answer

from pita.core.backends.slurm.commands import (  # noqa: F401
    LOST_STATES, ACTIVE_STATES, _run, PENDING_REASONS, pending_reason, slurm_seconds, submit_env,
    limit_seconds, slurm_time, time_limit, warning_margin, SUBMIT_LIMIT_REASONS, NEVER_CLEARS,
    _FINAL_REFUSALS, DEFAULT_IN_FLIGHT, HOLD_WARNING, WARNING_EARLY_S, WARNING_SHARE, _try, _wait_status,
    _user, SlurmRefused, gres_count, gres_gpus, _flag, _PER_ATTEMPT, _without, pack_key, pack_mem_gb,
    SimpleLaunch, _outcome_status, attempt_log)
from pita.core.backends.slurm.records import SlurmSettings, settings_from, _Sub, _Held, _Task, _Pack  # noqa: F401
from pita.core.backends.slurm.packs import PACK_LOOK_S, PACK_SURPLUS_S, PACK_KILL_GRACE_S  # noqa: F401
from pita.core.backends.slurm.cluster import (  # noqa: F401
    cluster, UNUSABLE_NODE_STATES, node_usable, slurm_inventory, partition_fields, _listed, access_problems,
    associations, representative, request_problem, submission_problems)
from pita.core.backends.slurm.limits import (  # noqa: F401
    AccountLimits, _tres, account_limits, submit_limits, submit_limit, in_flight_limits)
from pita.core.backends.slurm.backend import SlurmBackend  # noqa: F401
