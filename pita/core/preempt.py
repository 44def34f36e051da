"""Warning before death: an attempt under Slurm is told to stop before its time limit (USR1, asked
with ``--signal=B:USR1@<margin>``) or when it is preempted (TERM, then KILL after the partition's
GraceTime). A job that can save (a training job, inside :func:`saving`) hears either signal as
"save and stop": it finishes its step, writes a checkpoint and raises :class:`Requeue`; the worker
reports the attempt as "requeue" and the driver submits it again, resuming from that save. A job
that cannot save ignores USR1 (it runs on; a TIMEOUT runs it again with twice the time) and dies
of TERM as before.

Only attempts the Slurm backend starts (``PITA_SLURM_SIGNALS=1`` in their batch script) install
the handlers; local and Ray workers keep TERM's usual meaning."""

from __future__ import annotations

import contextlib
import os
import signal

ENV = "PITA_SLURM_SIGNALS"
_state = {"requested": None, "savers": 0, "forward": None}


class Requeue(Exception):
    """The attempt saved and stops early, to run again from its save (not a failure)."""


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def requested() -> str | None:
    """The signal's name once one asked this attempt to save and stop; else None."""
    return _state["requested"]


def install(on_term) -> None:
    """Handlers of a Slurm attempt's worker: USR1 and TERM ask a saver to save; without one, TERM
    runs ``on_term`` (the worker's usual end) and USR1 is ignored."""

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if _state["forward"] is not None:  # a k-device job: its ranks train, and save
            pids = _state["forward"]()
            for pid in pids:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
            if _state["requested"] is None:
                print(f"pita worker: {name} received: forwarded to the job's {len(pids)} rank(s)", flush=True)
            _state["requested"] = name
            return
        if _state["savers"] > 0:
            if _state["requested"] is None:
                print(f"pita worker: {name} received: saving a checkpoint at the end of this step, then stopping "
                      f"to run again from it", flush=True)
            _state["requested"] = name
            return
        if signum == signal.SIGTERM:
            on_term(signum, frame)
        else:
            print(f"pita worker: {name} received (the time limit is near); this job cannot save midway, it runs on",
                  flush=True)

    signal.signal(signal.SIGUSR1, handler)
    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def forwarding(pids):
    """While inside, USR1 and TERM to this process (the worker of a k-device job) go to the
    processes ``pids()`` names (the job's ranks, each of which saves as a one-device job does)."""
    _state["forward"] = pids
    try:
        yield
    finally:
        _state["forward"] = None


def rank_pids(root_pid: int) -> list[int]:
    """The rank processes below ``root_pid`` (torchrun's workers: ``-m pita.core.ranks``), not the
    agent itself (torchrun has no handler for USR1: it would die of it)."""
    import psutil

    out = []
    try:
        for p in psutil.Process(root_pid).children(recursive=True):
            try:
                if "pita.core.ranks" in p.cmdline():
                    out.append(p.pid)
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return out


@contextlib.contextmanager
def saving():
    """While inside, a signal asks this process to save and stop rather than dying."""
    _state["savers"] += 1
    try:
        yield
    finally:
        _state["savers"] -= 1


def save_on_signal_callback():
    """A TrainerCallback: once a signal asked, the step that ends saves a checkpoint and training
    stops. All ranks of a k-device job stop at the same step (the flag is broadcast from rank 0)."""
    from transformers import TrainerCallback

    class SaveOnSignal(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if _agreed():
                control.should_save = True
                control.should_training_stop = True
            return control

    return SaveOnSignal()


def _agreed() -> bool:
    flag = requested() is not None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            box = [flag]
            dist.broadcast_object_list(box, src=0)
            flag = bool(box[0])
    except ImportError:
        pass
    return flag
