"""The Slurm backend, how an attempt ended: Slurm's end state read (squeue, then sacct or scontrol)
and mapped to the outcome the executor acts on (lost, cancelled, error, ...), its log gathered
into job.log."""

from __future__ import annotations

from pita.core.backends.base import Finished, Launch
from pita.core.backends.slurm.commands import (
    LOST_STATES, slurm_seconds, slurm_time, _try, _wait_status, SimpleLaunch, attempt_log)
from pita.core.backends.slurm.records import _Sub, _Pack


class Ending:
    """Mixed into SlurmBackend (pita.core.backends.slurm.backend)."""

    def _forgotten(self, ids: list[str]) -> dict[str, tuple[str, int | None]]:
        """End states of jobs squeue no longer lists: one sacct for all of them where accounting
        runs, else scontrol (while the controller remembers them); missing: unknown now."""
        out = {}
        self.stats["sacct"] += 1
        acct = _try(["sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State,ExitCode"])
        if acct is not None:
            for line in acct.stdout.splitlines():
                parts = line.split("|")
                if len(parts) >= 3 and parts[0] in ids:
                    out[parts[0]] = (parts[1].split()[0], _wait_status(parts[2]))
        for sid in ids:
            if sid not in out:
                self.stats["scontrol"] += 1
                sc = _try(["scontrol", "-o", "show", "job", sid])
                if sc is not None:
                    fields = dict(kv.split("=", 1) for kv in sc.stdout.split() if "=" in kv)
                    if fields.get("JobState"):
                        out[sid] = (fields["JobState"], _wait_status(fields.get("ExitCode", "")))
        return out

    def _cancelled_by(self, slurm_id: str) -> str:
        """Who cancelled a job, as sacct says it ("CANCELLED by <uid>"): "by uid 1000 (ana)"; where
        accounting does not say (no slurmdbd, or it has not heard yet), "by a person"."""
        self.stats["sacct"] += 1
        out = _try(["sacct", "-n", "-X", "-P", "-j", slurm_id, "-o", "State"])
        words = (out.stdout.split("\n")[0].split() if out else [])
        if len(words) >= 3 and words[0] == "CANCELLED" and words[1] == "by" and words[2].isdigit():
            uid = int(words[2])
            try:
                import pwd

                return f"by uid {uid} ({pwd.getpwuid(uid).pw_name})"
            except (KeyError, ImportError):
                return f"by uid {uid}"
        return "by a person (sacct does not say who)"

    @staticmethod
    def end_state(slurm_id: str) -> tuple[str, int | None]:
        """(state, exit code) of a job that left squeue: scontrol while it remembers the job
        (MinJobAge), then sacct; ("UNKNOWN", None) when neither does."""
        out = _try(["scontrol", "-o", "show", "job", slurm_id])
        fields = dict(kv.split("=", 1) for kv in (out.stdout if out else "").split() if "=" in kv)
        state, code = fields.get("JobState"), fields.get("ExitCode")
        if not state:
            acct = _try(["sacct", "-n", "-X", "-P", "-j", slurm_id, "-o", "State,ExitCode"])
            line = acct.stdout.strip().splitlines()[:1] if acct else []
            if line and "|" in line[0]:
                state, code = line[0].split("|")[:2]
                state = state.split()[0]
        if not state:
            return "UNKNOWN", None
        return state, _wait_status(code or "")

    def log_path(self, launch: Launch):
        return attempt_log(launch)

    def ended_unwatched(self, job_paths, attempt: int, handle: dict) -> dict:
        if handle.get("slurm_pack"):
            launch = SimpleLaunch(job_paths, attempt)
            self._gather_log(_Sub(launch, str(handle.get("slurm_job") or ""), 0.0, 0), f"in {handle['slurm_pack']}")
            return {**handle, "slurm_state": "COMPLETED", "log": str(attempt_log(launch))}
        sid = str(handle.get("slurm_job") or "")
        state = self._forgotten([sid]).get(sid, ("COMPLETED", 0))[0] if sid else "COMPLETED"
        launch = SimpleLaunch(job_paths, attempt)
        self._gather_log(_Sub(launch, sid, 0.0, 0), state)
        return {"slurm_job": sid, "slurm_state": state, "log": str(attempt_log(launch))}

    @staticmethod
    def _gather_log(sub: _Sub, state: str) -> None:
        """The attempt's own log, appended to ``job.log`` with a header once it is over: the job's
        whole history in one file, each attempt's output in its own."""
        src = attempt_log(sub.launch)
        try:
            data = src.read_bytes() if src.exists() else b""
            with open(sub.launch.paths.log, "ab") as f:
                f.write(f"=== attempt {sub.launch.attempt}: Slurm job {sub.slurm_id}, {state} ({src.name}) ===\n"
                        .encode() + data + (b"" if not data or data.endswith(b"\n") else b"\n"))
        except OSError:  # a full disk: the attempt's own log keeps it
            pass

    def _ended_sub(self, job_id: str, sub: _Sub, state: str, rc: int | None, pack: _Pack | None = None,
                   extra_more: dict | None = None, note: str = "") -> Finished:
        """How an attempt ended, from Slurm's end state of its job (or, for a packed attempt, the
        state its pack's done file and Slurm's word on the pack give it: ``pack``)."""
        from pita.core.backends.local import finished_from

        self._gather_log(sub, note or state)
        where = f"its pack ({pack.name}, Slurm job {sub.slurm_id})" if pack is not None else f"Slurm job {sub.slurm_id}"
        if pack is not None and state not in ("COMPLETED", "FAILED") and not sub.forced:
            self.no_pack.add(job_id)  # its next attempt is a Slurm job of its own, where Slurm tells its end

        extra = {"slurm_job": sub.slurm_id, "slurm_state": state, "log": str(attempt_log(sub.launch)),
                 **(extra_more or {})}
        if sub.time_limit:
            extra["slurm_time"] = sub.time_limit
        if sub.mem_gb:
            extra["slurm_mem_gb"] = sub.mem_gb
        if sub.started is not None:
            extra["queued_s"] = round(sub.started - sub.submitted, 1)
        if sub.requeues:
            extra["slurm_requeues"] = sub.requeues
        if sub.forced:
            return finished_from(sub.launch, rc, sub.submitted, sub.forced, sub.reason, extra)
        if state == "OUT_OF_MEMORY":
            n = self.host_ooms[job_id] = self.host_ooms.get(job_id, 0) + 1
            top = (self.s.max_node_mem_mb or 0) / 1024
            self._save_sizing(sub.launch)
            if n <= self.s.oom_mem_retries and not (top and sub.mem_gb >= top - 1):
                self.mem_factor[job_id] = self.mem_factor.get(job_id, 1.0) * self.s.oom_mem_factor
                self._save_sizing(sub.launch)
                return finished_from(sub.launch, rc, sub.submitted, "lost",
                                     f"{where} ran out of host memory at --mem={sub.mem_gb:g}G "
                                     f"(OUT_OF_MEMORY): the next attempt asks for {self.s.oom_mem_factor:g}x "
                                     f"({n} of executor.slurm.oom_mem_retries={self.s.oom_mem_retries})", extra)
            return finished_from(sub.launch, rc, sub.submitted, "error",
                                 f"{where} ran out of host memory at --mem={sub.mem_gb:g}G "
                                 f"(OUT_OF_MEMORY, {n} time(s){', the largest node' if top and sub.mem_gb >= top - 1 else ''}): "
                                 f"raise executor.slurm.oom_mem_retries or executor.slurm.mem_gb, or lower the job's "
                                 f"batch", extra)
        if state == "CANCELLED" and not (pack is not None and pack.stopped):
            # pita's own cancels are forced (kill, a reason that never clears) or of packs it stopped:
            # this one is a person's, whose word is final
            who = self._cancelled_by(sub.slurm_id)
            what = f"in its pack ({pack.name}, Slurm job {sub.slurm_id})" if pack is not None else where
            return finished_from(sub.launch, rc, sub.submitted, "cancelled",
                                 f"{what} was cancelled {who} (scancel), not by pita: final, pita does not submit "
                                 f"again what a person cancelled", {**extra, "cancelled_by": who})
        if state == "TIMEOUT":
            limit_s = slurm_seconds(sub.time_limit) or 0.0
            top = self.s.max_time_s
            grown = self.time_factor.get(job_id, 1.0) > 1.0
            if grown or (top and limit_s >= top):
                return finished_from(
                    sub.launch, rc, sub.submitted, "error",
                    f"{where} hit its time limit ({sub.time_limit or 'unknown'}) "
                    + ("again, after its limit was doubled once" if grown else
                       f"at the longest limit Slurm gives it ({slurm_time(int(top))}, the partition's MaxTime or the "
                       f"QoS's MaxWall)")
                    + ": pita grows a limit once (a hung job would cost ever more); if it is slow rather than hung, "
                      "raise executor.slurm.time_margin or executor.slurm.min_minutes, or make it save on the warning "
                      "(executor.slurm.signal_margin_s) so it runs on from a checkpoint", extra)
            self.time_factor[job_id] = 2.0
            self._save_sizing(sub.launch)
        if state in LOST_STATES or state in ("SPECIAL_EXIT", "REVOKED"):
            why = {"TIMEOUT": "it hit its Slurm time limit (the next submission asks for twice as long, once)",
                   "PREEMPTED": "preempted", "NODE_FAIL": "its node failed",
                   "BOOT_FAIL": "its node failed to boot", "DEADLINE": "it reached its deadline before it could run",
                   "SPECIAL_EXIT": "Slurm held it after a special exit", "REVOKED": "a sibling cluster ran it"}
            if pack is not None:
                why["TIMEOUT"] = ("it hit its own time limit in the pack (the next attempt has twice as long, once)"
                                  if state == "TIMEOUT" else why["TIMEOUT"])
            if state in ("SPECIAL_EXIT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL") and pack is None:
                # Slurm may hold or requeue it itself: pita submits it again instead, so it never runs twice
                _try(["scancel", sub.slurm_id])
            said = (f"in its pack ({pack.name}, Slurm job {sub.slurm_id}), {state}" if pack is not None
                    else f"{where} ended {state}")
            return finished_from(sub.launch, rc, sub.submitted, "lost", f"{said}: {why.get(state, state.lower())}",
                                 extra)
        return finished_from(sub.launch, rc, sub.submitted, extra=extra)
