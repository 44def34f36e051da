"""The Slurm backend, ending attempts and handing over between drivers: kill, a driver's stop
(shutdown), one that leaves its jobs running (detach: requeued or preempted), and a later driver
that takes them over (handle, adopt, end_strays)."""

from __future__ import annotations

import os
import signal
import time

from pathlib import Path

from pita.core.backends.base import Finished, Launch
from pita.core.backends.slurm.commands import ACTIVE_STATES, _try, _user, _outcome_status
from pita.core.backends.slurm.records import _Sub


class Adopting:
    """Mixed into SlurmBackend (pita.core.backends.slurm.backend)."""

    # ------------------------------------------------------------------ a later driver of the run
    def handle(self, job_id: str) -> dict:
        """What the run state keeps of an attempt in flight, so a resumed driver finds it again."""
        t = self.tasks.get(job_id)
        if t is not None:  # a packed attempt: the next driver runs it again (its pack is cancelled)
            return {"slurm_job": t.pack.slurm_id, "slurm_pack": t.pack.name} if t.pack is not None else {}
        sub = self.subs.get(job_id)
        return {"slurm_job": sub.slurm_id, "submitted": round(sub.submitted, 3)} if sub else {}

    def _queued(self) -> list[list[str]]:
        """This user's Slurm jobs as [id, state, reason, name, command], read once per resume."""
        if self._listing is None:
            out = None
            for pause in (0, 2, 5, 10, 20):  # a resume needs the answer: wait for the controller a while
                time.sleep(pause)
                out = _try(["squeue", "-h", "-u", _user(), "-o", "%i|%T|%r|%j|%o"])
                if out is not None:
                    break
            if out is None:
                raise RuntimeError("squeue did not answer for 37 s: cannot tell which of the run's Slurm jobs are "
                                   "still queued; resume again once the controller answers")
            self._listing = [line.split("|", 4) for line in out.stdout.splitlines() if line.count("|") >= 4]
        return self._listing

    def adopt(self, launch: Launch, handle: dict) -> str:
        """Take over an attempt an earlier driver of this run submitted (``resume_from=``): "" when
        its Slurm job is still queued or running (it is followed from now on as if submitted here),
        else why not (the job runs again). The job is found by the id the state recorded, or, when
        that driver was stopped before it recorded one, by its batch script in this job's folder."""
        if handle.get("slurm_pack"):
            return f"it ran in {handle['slurm_pack']} (a pack's attempts are short: they run again)"
        sid = str(handle.get("slurm_job") or "")
        mine = str(launch.paths.dir / "slurm-")
        row = next((r for r in self._queued() if (r[0] == sid if sid else r[4].startswith(mine))), None)
        if row is None:
            return (f"Slurm job {sid} is no longer queued ({self.end_state(sid)[0]})" if sid
                    else "no Slurm job of it is queued")
        if row[3] != f"pita:{launch.job_id}" or not row[4].startswith(mine):
            return f"Slurm job {row[0]} is now {row[3]!r}, not this job's"
        if row[1] not in ACTIVE_STATES:
            return f"Slurm job {row[0]} ended {row[1]}"
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        self.subs[launch.job_id] = _Sub(launch, row[0], float(handle.get("submitted") or time.time()), gpus,
                                        grace_s=self.kill_grace_s, state=row[1],
                                        state_reason=row[2] if row[1] == "PENDING" else "",
                                        started=time.time() if row[1] != "PENDING" else None)
        return ""

    def end_strays(self, run_root: str) -> list[str]:
        """Cancel the Slurm jobs of this run folder an adoption did not take (an attempt whose job is
        done, or runs again from here): one line each, for the log."""
        root = str(run_root).rstrip("/") + "/"
        ours = {s.slurm_id for s in self.subs.values()}
        lines = []
        for sid, state, _, name, command in self._queued():
            if command.startswith(root) and sid not in ours and state in ACTIVE_STATES:
                _try(["scancel", sid])
                lines.append(f"cancelled Slurm job {sid} ({name}, {state}): an earlier driver's attempt not taken over")
        self._listing = None
        return lines

    # ------------------------------------------------------------------ ending attempts
    def kill(self, job_id: str, status: str = "cancelled", reason: str = "", grace_s: float | None = None) -> None:
        if job_id in self.local.running():
            self.local.kill(job_id, status, reason, grace_s)
            return
        task = self.tasks.get(job_id)
        if task is not None:
            self._kill_task(task, status, reason, grace_s)
            return
        if job_id in self.held:  # never submitted: ends at once
            from pita.core.backends.local import finished_from

            held = self.held.pop(job_id)
            self._ended.append(finished_from(held.launch, None, held.since, status, reason))
            return
        sub = self.subs.get(job_id)
        if sub is None or sub.term_sent is not None:
            return
        sub.forced, sub.reason = status, reason
        sub.term_sent = time.time()
        sub.grace_s = self.kill_grace_s if grace_s is None else grace_s
        _try(["scancel", "--signal=TERM", "--full", sub.slurm_id])
        if sub.state == "PENDING":  # nothing runs yet: gone at once
            _try(["scancel", sub.slurm_id])
        self._changed()

    def shutdown(self, grace_s: float = 10.0) -> list[Finished]:
        """The driver stops: one scancel for every job of the run (Slurm itself gives each its
        KillWait between TERM and KILL), nothing waited for, so a driver that is itself a Slurm job
        finishes within its own KillWait. An attempt whose outcome already says it succeeded counts."""
        from pita.core.backends.local import finished_from

        ended: list[Finished] = []
        ids = [s.slurm_id for s in self.subs.values()] + [pk.slurm_id for pk in self.packs.values()
                                                         if pk.slurm_id and pk.end is None]
        for i in range(0, len(ids), 200):
            _try(["scancel", *ids[i:i + 200]])
        for t in list(self.tasks.values()):
            ok = t.launch.paths.attempt(t.launch.attempt).exists() and _outcome_status(t.launch) == "ok"
            if t.pack is not None:
                self._gather_log(_Sub(t.launch, t.pack.slurm_id, t.since, 0), "cancelled: the driver stopped")
            f = finished_from(t.launch, None, t.since)
            ended.append(Finished(t.launch.job_id, t.launch.attempt, "ok", 0, extra=f.extra) if ok else
                         finished_from(t.launch, None, t.since, "cancelled", "the driver stopped"))
        self.tasks.clear()
        self.packs.clear()
        for job_id, sub in list(self.subs.items()):
            self._gather_log(sub, "cancelled: the driver stopped")
            f = finished_from(sub.launch, None, sub.submitted)
            ok = f.status == "ok" or (sub.launch.paths.attempt(sub.launch.attempt).exists() and
                                      _outcome_status(sub.launch) == "ok")
            ended.append(Finished(job_id, sub.launch.attempt, "ok", 0, extra=f.extra) if ok else
                         finished_from(sub.launch, None, sub.submitted, "cancelled", "the driver stopped"))
        for job_id, held in self.held.items():
            ended.append(finished_from(held.launch, None, held.since, "cancelled", "the driver stopped"))
        self.subs.clear()
        self.held.clear()
        return ended + (self.local.shutdown(grace_s) or []) + self._take()

    def detach(self) -> list[str]:
        """The driver goes away but its jobs go on (a requeued or preempted driver): nothing is
        cancelled; the run state keeps each attempt's handle for the next driver. Returns the
        jobs left running."""
        left = list(self.subs) + list(self.tasks)  # a pack runs its attempt to its end, then leaves idle
        self.local.shutdown(self.kill_grace_s)
        return left

    def driver_leaving(self, signum: int) -> str | None:
        """A driver that is itself a Slurm job leaves its jobs running when Slurm is about to end
        it without anyone asking to stop the run: USR1 (its time limit is near: it requeues itself),
        or TERM while Slurm requeues it (preemption, ``scontrol requeue``: the controller counts one
        more restart than this process started with) or while the controller does not answer.
        TERM of a preemption that cancels (PreemptMode=CANCEL: scontrol shows its PreemptTime) leaves
        them running too, for a resume to take over. ``scancel`` of the driver (TERM, no restart
        counted, no PreemptTime) and Ctrl-C end its jobs."""
        jid = os.environ.get("SLURM_JOB_ID")
        if not jid or signum not in (signal.SIGUSR1, signal.SIGTERM):
            return None
        if signum == signal.SIGUSR1:
            return f"Slurm job {jid} (this driver) nears its time limit; it requeues itself"
        out = _try(["scontrol", "-o", "show", "job", jid], timeout=3)
        if out is None:
            return f"TERM to Slurm job {jid} (this driver) while the controller does not answer"
        fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
        try:
            restarts, mine = int(fields.get("Restarts", 0)), int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        except ValueError:
            return None
        if restarts > mine or fields.get("JobState") in ("PREEMPTED", "REQUEUED", "REQUEUE_HOLD"):
            return f"Slurm requeues job {jid} (this driver; restart {restarts})"
        if fields.get("PreemptTime") not in (None, "", "None", "Unknown"):
            # PreemptMode=CANCEL: preempted, never requeued; a plain scancel sets no PreemptTime
            return (f"Slurm preempts job {jid} (this driver, at {fields['PreemptTime']}; PreemptMode=CANCEL: it is "
                    f"not requeued): resume the run (resume_from=<its folder>) under a QoS that is not preempted "
                    f"to take its jobs over")
        return None

    def after_detach(self, signum: int) -> None:
        import logging

        jid = os.environ.get("SLURM_JOB_ID")
        if signum != signal.SIGUSR1 or not jid:
            return
        out = _try(["scontrol", "requeue", jid], timeout=20)
        lg = logging.getLogger("pita.executor")
        if out is None:
            lg.error("could not requeue Slurm job %s (this driver): submit it with --requeue (docs/guide.md), or "
                     "resume the run with resume_from=<its folder>", jid)
        else:
            lg.warning("requeued Slurm job %s (this driver): it continues this run folder when it starts again", jid)

    def close(self) -> None:
        """The run is over: every pack is told to stop and cancelled (none runs an attempt now)."""
        ids = []
        for pk in self.packs.values():
            try:
                (Path(pk.dir) / "stop").write_text("the run is over\n")
            except OSError:
                pass
            if pk.slurm_id and pk.end is None:
                ids.append(pk.slurm_id)
        if ids:
            _try(["scancel", *ids])
        self.packs.clear()
        self.local.close()

    def pids(self, job_id: str) -> set[int]:
        return self.local.pids(job_id)

    def running(self) -> list[str]:
        return list(self.subs) + list(self.held) + list(self.tasks) + self.local.running()
