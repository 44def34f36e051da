"""Warning before death: an attempt under Slurm is told to stop before its time limit (USR1, asked
with ``--signal=B:USR1@<margin>``) or when it is preempted (TERM, then KILL after the partition's
GraceTime). A job that can save (a training job, inside :func:`saving`) hears either signal as
"save and stop": it finishes its step, writes a checkpoint and raises :class:`Requeue`; the worker
reports the attempt as "requeue" and the driver submits it again, resuming from that save. A job
that cannot save runs on after USR1 (a TIMEOUT runs it again with twice the time) and dies of
TERM as before.

USR1's default action ends a process, so no process of a Slurm attempt may ever meet it
unprepared. It is *held* from the attempt's first instant to its last:

- the batch script ignores it before it ``exec``s Python (``trap '' USR1``: an ignored signal
  stays ignored through exec), which covers the interpreter's start-up;
- :func:`hold`, the first thing the worker, a pack and a rank do, blocks it. A blocked signal is
  kept pending by the kernel, never acted on, and the mask is inherited through fork and exec:
  every thread and every process the attempt starts (torchrun's agent, its ranks, a library's
  helpers, the attempt a pack forks) holds it too, and a process that never asks for it never
  sees it;
- one thread of the worker (and of each rank) takes it with ``sigwait`` (:func:`install`) and acts
  on it: a saver saves at the end of its step; a k-device job's worker forwards it to its ranks;
  a signal that came before the job could save is remembered, and training, when it starts,
  saves at its first step.

Only attempts the Slurm backend starts (``PITA_SLURM_SIGNALS=1`` in their batch script) do this;
local and Ray workers keep the signals' usual meanings."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

ENV = "PITA_SLURM_SIGNALS"
_state = {"requested": None, "savers": 0, "forward": None, "listener": None, "told": {}}


class Requeue(Exception):
    """The attempt saved and stops early, to run again from its save (not a failure)."""


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def requested() -> str | None:
    """The signal's name once one asked this attempt to save and stop; else None."""
    return _state["requested"]


WARNING = signal.SIGUSR1


def hold() -> None:
    """Block Slurm's warning in this thread (call it before any other thread exists) and so in
    every thread and process started from here. Ignored first where it was not blocked yet
    (nothing can be pending then), so a process that unblocks it later still does not die of it;
    where it arrives blocked (a pack's child, a rank) its disposition is left alone, since setting
    SIG_IGN would drop a warning already pending."""
    if WARNING not in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        signal.signal(WARNING, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {WARNING})


def install(on_term) -> None:
    """A Slurm attempt's signals (the worker's, or a rank's): USR1 held (:func:`hold`) and taken by
    a listener thread; TERM asks a saver to save, and otherwise runs ``on_term`` (the worker's
    usual end). TERM and INT are unblocked afterwards: a pack hands its child both blocked, and one
    that came meanwhile is acted on now, by these handlers."""

    hold()

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if _forwarded(signum, name):
            return
        if _state["savers"] > 0:
            if _state["requested"] is None:
                print(f"pita worker: {name} received: saving a checkpoint at the end of this step, then stopping "
                      f"to run again from it", flush=True)
            _state["requested"] = name
            return
        on_term(signum, frame)

    signal.signal(signal.SIGTERM, on_signal)
    if _state["listener"] is None:
        _state["listener"] = threading.Thread(target=_listen, name="pita-slurm-warning", daemon=True)
        _state["listener"].start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})


def _forwarded(signum: int, name: str) -> bool:
    """In a k-device job's worker: the signal sent on to its ranks (which save); False elsewhere."""
    if _state["forward"] is None:
        return False
    pids = _send(signum, _state["forward"]())
    _state["told"][signum] = set(pids)  # ranks that start later get it too (forwarding's watcher)
    if _state["requested"] is None:
        print(f"pita worker: {name} received: forwarded to the job's {len(pids)} rank(s)", flush=True)
    _state["requested"] = name
    return True


def _send(signum: int, pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, signum)
            out.append(pid)
        except ProcessLookupError:
            pass
    return out


def _listen() -> None:
    """The thread that takes USR1 (blocked in every thread, so it waits here for sigwait)."""
    while True:
        signal.sigwait({WARNING})
        name = WARNING.name
        if _forwarded(WARNING, name):
            continue
        first = _state["requested"] is None
        _state["requested"] = name  # a saver saves at its step's end; one that starts later, at its first
        if not first:
            continue
        if _state["savers"] > 0:
            print(f"pita worker: {name} received: saving a checkpoint at the end of this step, then stopping "
                  f"to run again from it", flush=True)
        else:
            print(f"pita worker: {name} received (the time limit is near): this job is not at a point where it "
                  f"can save; it runs on (a training step that starts later saves at its end)", flush=True)


@contextlib.contextmanager
def forwarding(pids, every_s: float = 0.5):
    """While inside, USR1 and TERM to this process (the worker of a k-device job) go to the
    processes ``pids()`` names (the job's ranks, each of which saves as a one-device job does).
    A rank that was not running yet when the signal came (torchrun starts them a second or two
    after itself) gets it once it is: a watcher looks every ``every_s``. A warning that came
    before the ranks were started at all is sent to them too."""
    _state["forward"] = pids
    _state["told"] = {WARNING: set()} if _state["requested"] == WARNING.name else {}
    done = threading.Event()

    def watch():
        while not done.wait(every_s):
            for signum, told in list(_state["told"].items()):
                told.update(_send(signum, [p for p in pids() if p not in told]))

    watcher = threading.Thread(target=watch, name="pita-forward-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        _state["forward"] = None
        _state["told"] = {}


def rank_pids(root_pid: int) -> list[int]:
    """The rank processes below ``root_pid`` (torchrun's workers: ``-m pita.core.ranks``), not the
    agent itself (it has no use for the signals: USR1 stays held there, and TERM is Slurm's or
    pita's to send, not the worker's)."""
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
