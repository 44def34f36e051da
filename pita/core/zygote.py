"""The local backend's warm process (``executor.worker_start=forkserver``): imports once, forks a
worker per job attempt.

A fresh interpreter that imports torch, transformers, datasets and TRL spends 4-6 s of CPU before
a job does anything; on a small machine that is most of a short job. This process imports them
once (the modules named on its command line, normally :mod:`pita.core.preload`) and forks; each
child runs :func:`pita.core.worker.forked_main` and is, from then on, the same worker that
``python -m pita.core.worker`` would be (own session, job log, environment, exit codes).

Protocol, one JSON object per line:

    orchestrator -> here    {"id": job, "launch": path, "env": {...}, "cwd": dir, "log": path}
    here -> orchestrator    {"id": job, "pid": n}    the child exists
                            {"id": job, "rc": code}  it ended (negative: killed by that signal)

The requests arrive on stdin, the answers leave on the file descriptor that was stdout; stdout
itself is pointed at stderr so that nothing a library prints can garble an answer. This process
dies with the orchestrator (PR_SET_PDEATHSIG) and exits when its stdin closes; its children die
with it the same way, so nothing outlives a killed orchestrator.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import traceback


def _send(fd: int, msg: dict) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _child(req: dict) -> int:
    """Run the attempt; its exit code."""
    code = 1
    try:
        from pita.core.worker import forked_main

        code = forked_main(req["launch"], req["env"], req["cwd"], req["log"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a bug in the worker itself: on the job's log
        traceback.print_exc()
    return code


def serve(preload: list[str]) -> int:
    from pita.core.worker import _die_with_parent

    _die_with_parent(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the orchestrator's to handle
    requests, answers = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    # What every worker imports before its job, whatever the job: once here, not once per attempt.
    for module in ("omegaconf", "psutil", "pita.core.context", "pita.core.job", "pita.core.paths",
                   "pita.core.proctree", "pita.core.synthetic_kinds", *preload):
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - the jobs import it again and report the error
            print(f"pita warm process: could not preload {module}: {type(e).__name__}: {e}", file=sys.stderr)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    running: dict[int, str] = {}
    pending = b""
    while True:
        try:
            ready, _, _ = select.select([requests, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
            while running:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                job = running.pop(pid, None)
                if job is not None:
                    _send(answers, {"id": job, "rc": os.waitstatus_to_exitcode(status)})
        if requests in ready:
            data = os.read(requests, 1 << 16)
            if not data:  # the orchestrator closed the pipe or is gone
                return 0
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:  # the worker: leave the server's loop for good
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    for fd in (requests, answers, wake_r, wake_w):
                        os.close(fd)
                    from pita.core.worker import exit_now

                    exit_now(_child(req))
                running[pid] = req["id"]
                _send(answers, {"id": req["id"], "pid": pid})


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
