"""The Slurm backend, what Slurm says: one squeue for all of this user's jobs per poll, sooner after
a change and with backoff while nothing changes or the controller is away."""

from __future__ import annotations

import json
import time

from pita.core.backends.base import Finished
from pita.core.backends.slurm.commands import ACTIVE_STATES, pending_reason, NEVER_CLEARS, _try, _wait_status, _user
from pita.core.backends.slurm.records import _Sub
from pita.core.backends.slurm.packs import PACK_LOOK_S
import pita.core.backends.slurm as _pkg  # its tunables (tests set them there)


class Polling:
    """Mixed into SlurmBackend (pita.core.backends.slurm.backend)."""

    # ------------------------------------------------------------------ what Slurm says
    def _query(self) -> dict[str, tuple[str, str, int | None]] | None:
        """Slurm job id -> (state, reason, exit code) of this user's jobs squeue lists (one call
        for all of them); None when squeue did not answer."""
        self.stats["squeue"] += 1
        out = _try(["squeue", "-h", "-t", "all", "-u", _user(), "-O", "JobID:|,State:|,Reason:|,exit_code:"])
        if out is None:
            self.stats["failed_queries"] += 1
            return None
        states = {}
        for line in out.stdout.splitlines():
            parts = [x.strip() for x in line.split("|")]
            if len(parts) >= 4:
                states[parts[0]] = (parts[1], parts[2], _wait_status(parts[3]))
        return states

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        self._ended += self.local.poll(0.0)
        self._look_for_outcomes()
        if self.tasks or self.packs:
            self._dispatch(time.time())
        if time.time() < self._next_query:
            if timeout > 0 and not self._ended:
                short = 0.2 if self.local.running() else (PACK_LOOK_S if self.tasks or self.packs else timeout)
                time.sleep(max(0.0, min(timeout, self._next_query - time.time(), short)))
            self._ended += self.local.poll(0.0)
            if self.tasks or self.packs:
                self._dispatch(time.time())
            if time.time() < self._next_query:
                return self._take()
        self._poll_slurm()
        return self._take()

    def _look_for_outcomes(self) -> None:
        """A worker writes its outcome file as it ends: one stat per running attempt every few
        seconds (no Slurm call) tells the driver to ask Slurm now rather than at its next poll."""
        now = time.time()
        if now - self._last_look < _pkg.OUTCOME_LOOK_S:
            return
        self._last_look = now
        for sub in self.subs.values():
            if sub.end is None and not sub.outcome_seen and sub.launch.paths.attempt(sub.launch.attempt).exists():
                sub.outcome_seen = now
                self._next_query = min(self._next_query, now + 0.5)  # COMPLETING lasts a moment

    def _changed(self) -> None:
        """Something moved (a submission, an end, a kill): look again soon."""
        self._interval = self.s.poll_interval_s
        self._next_query = min(self._next_query, time.time() + self._interval)

    def _poll_slurm(self) -> None:
        now = time.time()
        self._submit_held()
        for sub in self.subs.values():  # KILL after the grace period
            if sub.term_sent is not None and now - sub.term_sent > sub.grace_s and sub.state != "KILLED":
                if _try(["scancel", sub.slurm_id]) is not None:
                    sub.state = "KILLED"
        if not self.subs and not any(pk.end is None and pk.slurm_id for pk in self.packs.values()):
            self._schedule(now, changed=False)
            return
        listed = self._query()
        if listed is None:
            self._query_failed(now)
            return
        self._pack_states(listed, now)
        if self._outage is not None:
            import logging

            logging.getLogger("pita.executor").warning("squeue answers again after %.0fs; every job kept its state",
                                                       now - self._outage)
            self._outage = None
        changed = False
        missing = []
        for job_id, sub in self.subs.items():
            row = listed.get(sub.slurm_id)
            if row is None:
                if sub.end is None:
                    missing.append(sub.slurm_id)
                continue
            state, reason, rc = row
            sub.unknown_since = None
            if state in ACTIVE_STATES:
                if state != sub.state:
                    changed = True
                    if state in ("PENDING", "REQUEUED") and sub.started is not None:
                        sub.requeues += 1  # Slurm put it back (preemption with requeue): it starts again
                        sub.started = sub.outcome_seen = None
                if state == "RUNNING" and sub.started is None:
                    sub.started = now
                sub.state, sub.state_reason = state, (reason if state == "PENDING" else "")
                self._check_reason(job_id, sub, now)
                continue
            sub.end = (state, rc)
        if missing:
            known = self._forgotten(missing)
            for sub in self.subs.values():
                if sub.slurm_id in known:
                    sub.end, sub.unknown_since = known[sub.slurm_id], None
                elif sub.slurm_id in missing:
                    sub.unknown_since = sub.unknown_since or now
        for job_id, sub in list(self.subs.items()):
            done = self._is_over(sub, now)
            if done is None:
                continue
            del self.subs[job_id]
            changed = True
            self._ended.append(self._ended_sub(job_id, sub, *done))
        self._submit_held()
        self._schedule(now, changed)

    def _is_over(self, sub: _Sub, now: float) -> tuple[str, int | None] | None:
        """(state, exit code) once an attempt is over and its outcome can be read; None while it
        runs, or while its outcome file is still on its way."""
        outcome = sub.launch.paths.attempt(sub.launch.attempt)
        if sub.end is None:
            if sub.unknown_since is None:
                return None
            if outcome.exists():  # no Slurm command knows it any more; the worker said how it ended
                try:
                    status = json.loads(outcome.read_text()).get("status")
                except (OSError, ValueError):
                    status = None
                if status:
                    return ("COMPLETED" if status == "ok" else "FAILED",
                            {"ok": 0, "oom": 3, "requeue": 5}.get(status, 1))
            if now - sub.unknown_since < self.s.unknown_s:
                return None
            return "UNKNOWN", None
        state, rc = sub.end
        if sub.forced or state not in ("COMPLETED", "FAILED") or outcome.exists():
            return state, rc
        sub.ended_seen = sub.ended_seen or now
        if now - sub.ended_seen < self.s.outcome_wait_s:  # a shared file system may show it late
            return None
        return state, rc

    def _check_reason(self, job_id: str, sub: _Sub, now: float) -> None:
        r = sub.state_reason
        if sub.state != "PENDING" or not any(r == k or r.startswith(k + ",") for k in NEVER_CLEARS):
            sub.never_since = None
            return
        sub.never_since = sub.never_since or now
        if now - sub.never_since >= _pkg.NEVER_CLEARS_AFTER_S and sub.forced is None:
            sub.forced = "error"
            sub.reason = (f"Slurm job {sub.slurm_id} pends for a reason that never clears by waiting: "
                          f"{pending_reason(r)}")
            _try(["scancel", sub.slurm_id])

    def _query_failed(self, now: float) -> None:
        """squeue did not answer: every job keeps its state; ask again later, less often."""
        import logging

        if self._outage is None:
            self._outage = now
        if now - self._outage_note >= 300:
            self._outage_note = now
            logging.getLogger("pita.executor").warning(
                "squeue does not answer (for %.0fs): the %d Slurm job(s) in flight keep their state; asking again "
                "with backoff", now - self._outage, len(self.subs))
        self._interval = min(self.s.max_poll_interval_s, max(self._interval * 2, self.s.poll_interval_s))
        self._next_query = now + self._interval

    def _schedule(self, now: float, changed: bool) -> None:
        """The next query: soon after a change, twice as late each time nothing changed (up to
        max_poll_interval_s), and not before the earliest expected end of a running attempt; soon
        while an ended attempt's outcome file is awaited or an attempt is being killed."""
        if changed:
            self._interval = self.s.poll_interval_s
        else:
            self._interval = min(self.s.max_poll_interval_s, self._interval * 2)
        wait = self._interval
        running = [s for s in self.subs.values() if s.started is not None and s.end is None]
        if running and len(running) == len(self.subs):
            soonest = min(s.started + float(s.launch.job.get("duration_hint") or 0) for s in running)
            wait = max(wait, min(soonest - now, self.s.max_poll_interval_s))
        if any(s.ended_seen is not None or (s.term_sent is not None and s.state != "KILLED")
               or s.unknown_since is not None or s.outcome_seen is not None for s in self.subs.values()):
            wait = min(wait, self.s.poll_interval_s)
        if self.held:
            wait = min(wait, max(1.0, min(h.next_try for h in self.held.values()) - now))
        self._next_query = now + wait

    def _take(self) -> list[Finished]:
        out, self._ended = self._ended, []
        return out

    def queued(self) -> dict[str, tuple[str, float]]:
        """pita job id -> (Slurm's reason and what it means, seconds queued) of the attempts still
        waiting to run, pita's own held ones included."""
        now = time.time()
        out = {j: (f"Slurm job {s.slurm_id} pending, reason {pending_reason(s.state_reason)}", now - s.submitted)
               for j, s in self.subs.items() if s.state == "PENDING" and s.started is None}
        out.update({j: (h.why or "held by pita", now - h.since) for j, h in self.held.items()})
        for j, t in self.tasks.items():
            if t.taken is not None:
                continue
            queued = [pk for pk in self.packs.values() if pk.key == t.key and pk.started is None and pk.end is None]
            why = (f"waiting for a pack: Slurm job {queued[0].slurm_id} pending" if queued
                   else self._cap_text() if self._at_cap() else "waiting for a pack")
            out[j] = (why, now - t.since)
        return out
