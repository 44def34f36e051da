"""The Slurm backend's packs: short attempts run one after another in one Slurm job
(pita.core.backends.pack), handed over through files in the pack's folder."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

from pathlib import Path

from pita.core.backends.base import Launch
from pita.core.paths import atomic_write_json
from pita.core.backends.slurm.commands import (
    ACTIVE_STATES, submit_env, limit_seconds, slurm_time, _FINAL_REFUSALS, HOLD_WARNING, _try, gres_count,
    _flag, pack_mem_gb, _outcome_status, attempt_log)
from pita.core.backends.slurm.records import _Sub, _Task, _Pack


PACK_LOOK_S = 1.0  # packs' files (started, running, done, closed) are looked at this often


PACK_SURPLUS_S = 15.0  # a queued pack no waiting attempt needs for this long is cancelled


PACK_KILL_GRACE_S = 30.0  # an attempt past its own limit in a pack: KILL this long after TERM (Slurm's KillWait)


class Packing:
    """Mixed into SlurmBackend (pita.core.backends.slurm.backend)."""

    # ------------------------------------------------------------------ packs
    def packable(self, launch: Launch) -> bool:
        """Whether ``launch`` runs in a pack: packing is on (executor.slurm.pack_below_s), the job is
        planned shorter than that, fits a pack's time with its margins, and no pack ended under an
        earlier attempt of it."""
        if self.s.pack_below_s <= 0 or launch.job_id in self.no_pack:
            return False
        expected = float(launch.job.get("duration_hint") or 60.0)
        limit = self._pack_limit()
        return (expected <= self.s.pack_below_s and
                expected * self.s.time_margin + (self.signal_margin(launch.job, limit) or 0) + 30 <= limit)

    def _pack_limit(self) -> float:
        return min(self.s.pack_time_s, self.s.max_time_s or self.s.pack_time_s)

    def _fits(self, pack: _Pack, task: _Task, now: float) -> bool:
        expected = float(task.launch.job.get("duration_hint") or 60.0)
        return (task.mem_gb <= pack.mem_gb and
                pack.remaining(now) >= expected * self.s.time_margin
                + (self.signal_margin(task.launch.job, pack.limit_s) or 0) + 10)

    def _dispatch(self, now: float) -> None:
        """Packs' files read (a stat each, no Slurm call); ended attempts reported; waiting ones
        handed to idle packs; new packs submitted for the attempts no pack can take."""
        from pita.core.backends.pack import done_name

        # the packs' files are looked at once every PACK_LOOK_S, mostly one file a pack: the one of
        # its next step (started, closed, its attempt's done file): about one stat a second a pack
        look = now - self._pack_look >= PACK_LOOK_S
        if look:
            self._pack_look = now
        for name, pk in list(self.packs.items()) if look else ():
            d = Path(pk.dir)
            t = pk.task
            self.stats["pack_looks"] += 1
            if pk.started is None:
                if (d / "started").exists():
                    pk.started = now
            elif not pk.closed and (t is None or t.taken is None) and (d / "closed").exists():
                pk.closed = True  # a pack closes only while it runs nothing
            if t is not None:
                done = d / done_name(t.launch.job_id, t.launch.attempt)
                ended = done.exists()
                if not ended and t.taken is None and (d / "running.json").exists():
                    t.taken = now
                if ended:
                    if t.taken is None:
                        t.taken = now
                    self._task_ended(t, pk, done)
                elif t.taken is None and (pk.closed or pk.end is not None):
                    try:  # the pack left without taking it: another pack runs it
                        (d / "task.json").unlink()
                        pk.task, t.pack, t.assigned = None, None, None
                    except FileNotFoundError:  # taken just now
                        t.taken = now
                elif pk.end is not None:
                    self._task_lost(t, pk, now)
            if pk.end is not None and pk.task is None:
                del self.packs[name]
        waiting = sorted((t for t in self.tasks.values() if t.pack is None), key=lambda t: t.since)
        for t in waiting:
            pk = next((p for p in self.packs.values() if p.key == t.key and p.task is None and p.started is not None
                       and not p.closed and p.end is None and not p.stopped and self._fits(p, t, now)), None)
            if pk is not None:
                self._hand(t, pk, now)
        waiting = [t for t in waiting if t.pack is None]
        if waiting:  # an idle pack of a shape no waiting attempt has holds what theirs may need: it leaves
            for pk in self.packs.values():
                if (pk.started is not None and pk.task is None and not pk.closed and not pk.stopped
                        and pk.end is None and not any(t.key == pk.key for t in waiting)):
                    (Path(pk.dir) / "stop").write_text("idle, and attempts of another shape wait\n")
                    pk.stopped = True
        for key in {t.key for t in waiting}:
            want = sum(1 for t in waiting if t.key == key)
            queued = [p for p in self.packs.values() if p.key == key and p.started is None and p.end is None
                      and not p.closed and not p.stopped]
            for _ in range(want - len(queued)):
                if self._at_cap(gres_count(_flag(list(key), "--gres"))):
                    break
                if not self._submit_pack(next(t for t in waiting if t.key == key),
                                         max(t.mem_gb for t in waiting if t.key == key), now):
                    break
        for pk in self.packs.values():  # queued packs no waiting attempt needs: cancelled after a while
            needed = any(t.key == pk.key for t in waiting)
            if pk.started is None and pk.end is None and not needed and pk.slurm_id:
                pk.surplus_since = pk.surplus_since or now
                if now - pk.surplus_since > PACK_SURPLUS_S:
                    (Path(pk.dir) / "stop").write_text("not needed\n")
                    _try(["scancel", pk.slurm_id])
                    pk.stopped = True
            else:
                pk.surplus_since = None

    def _hand(self, t: _Task, pk: _Pack, now: float) -> None:
        env = self.attempt_env(t.launch, sum(1 for d in t.launch.devices if d.get("kind") == "cuda"), pk.args)
        # its own limit, as a job of its own would have it, within what the pack has left
        limit = min(t.limit_s or pk.remaining(now) - 10, pk.remaining(now) - 10)
        atomic_write_json(Path(pk.dir) / "task.json",
                          {"job_id": t.launch.job_id, "attempt": t.launch.attempt, "launch": str(t.launch.paths.launch),
                           "log": str(attempt_log(t.launch)), "env": env, "cwd": os.getcwd(),
                           "limit_s": round(limit, 1), "warn_s": t.warn_s if t.warn_s < limit / 2 else 0,
                           "grace_s": PACK_KILL_GRACE_S})
        pk.task, t.pack, t.assigned = t, pk, now

    def _submit_pack(self, t: _Task, mem_gb: float, now: float) -> bool:
        """sbatch a new pack for attempts of ``t``'s size; False when Slurm refused it for now."""
        root = Path(t.launch.run_dir) / "slurm-packs"
        n = 1 + max([int(p.name.split("-")[1]) for p in root.glob("pack-*") if p.name.split("-")[1].isdigit()] or [0])
        name = f"pack-{n}"
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        limit = self._pack_limit()
        mem = pack_mem_gb(mem_gb, (self.s.max_node_mem_mb or 0) / 1024 or None)
        seconds = limit_seconds(limit, 1.0, 1, self.s.max_time_s)
        margin = self.signal_margin(None, seconds)
        args = ["-J", f"pita:{name}", "-o", str(d / "pack.log"), "--open-mode=append", "--no-requeue",
                f"--time={slurm_time(seconds)}", *([f"--signal=B:USR1@{margin}"] if margin else []),
                f"--mem={mem}G", *t.key]
        cpus = _flag(args, "-c")
        threads = f"export OMP_NUM_THREADS={cpus} MKL_NUM_THREADS={cpus}\n" if cpus else ""
        script = d / "pack.sh"
        script.write_text("#!/bin/bash\n" + HOLD_WARNING +
                          f"# pita pack {name}: short attempts of this run, one after another, in one interpreter\n"
                          f"# submitted as: sbatch {shlex.join(args)}\n"
                          f"cd {shlex.quote(os.getcwd())}\n"
                          f"export PYTHONUNBUFFERED=1 PITA_SLURM_SIGNALS=1\n{threads}"
                          f"exec {shlex.quote(self.python)} -m pita.core.backends.pack {shlex.quote(str(d))} "
                          f"{self.s.pack_idle_s:g}\n")
        atomic_write_json(d / "pack.json", {"name": name, "args": args, "submitted": now})
        self.stats["sbatch"] += 1
        try:
            out = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True, text=True,
                                 timeout=60, env=submit_env())
        except (subprocess.TimeoutExpired, OSError) as e:
            out = None
            msg = f"{type(e).__name__}: {e}"
        if out is None or out.returncode != 0:
            self.stats["refused"] += 1
            msg = (out.stderr.strip() or out.stdout.strip()) if out is not None else msg
            import logging

            logging.getLogger("pita.executor").warning("sbatch refused a pack for %s: %s; its attempts wait",
                                                       t.launch.job_id, msg)
            if out is not None and any(w in msg.lower() for w in _FINAL_REFUSALS):
                self.s.pack_below_s = 0.0  # a pack this cluster cannot run: each attempt its own job from now on
                for task in [x for x in self.tasks.values() if x.pack is None]:
                    del self.tasks[task.launch.job_id]
                    self.start(task.launch)
            return False
        self.stats["packs"] += 1
        self.packs[name] = _Pack(name, t.key, args, d, now, limit, mem_gb=float(mem),
                                 slurm_id=out.stdout.strip().split(";")[0])
        self._changed()
        return True

    def _task_ended(self, t: _Task, pk: _Pack, done, now: float | None = None) -> None:
        """A packed attempt's done file: its end read as a Slurm job of its own would have it. Its
        own limit (ended_by "timeout") reads as TIMEOUT, the OOM killer in the pack's cgroup as
        OUT_OF_MEMORY, and an attempt that did not finish after Slurm signalled its pack
        (preemption, scancel, the pack's limit, its node) as the pack's own end state, once
        Slurm tells it; a failed attempt's outcome file is waited for as for a job of its own."""
        from pita.core.backends.local import finished_from

        now = time.time() if now is None else now
        try:
            info = json.loads(done.read_text())
        except (OSError, ValueError):
            return  # being written
        rc = info.get("rc")
        status = _outcome_status(t.launch)
        t.done_seen = t.done_seen or now
        extra = {"slurm_pack": pk.name, "queued_s": round(float(info.get("started", t.since)) - t.since, 1)}
        state = "COMPLETED" if rc == 0 else "FAILED"
        if t.forced:
            pass
        elif info.get("ended_by") == "timeout" and status != "requeue":
            state = "TIMEOUT"
        elif info.get("ended_by") == "oom" and status not in ("ok", "requeue"):
            state = "OUT_OF_MEMORY"
        elif (set(info.get("signals") or ()) & {"SIGTERM", "SIGINT"}) and status not in ("ok", "requeue"):
            if pk.end is None and now - t.done_seen < self.s.unknown_s:
                self._changed()  # Slurm's word on the pack decides: ask soon
                return
            state = pk.end[0] if pk.end else "UNKNOWN"
            if state in ("COMPLETED", "FAILED", "UNKNOWN", "TIMEOUT"):
                # signalled, yet the pack ended on its own, or at the pack's limit (the attempt's own
                # is inside it): nothing the attempt did, so it runs again, as a Slurm job of its own
                pk.task = None
                del self.tasks[t.launch.job_id]
                self.no_pack.add(t.launch.job_id)
                self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"in {pk.name}, exit {rc}, pack {state}")
                self._ended.append(finished_from(
                    t.launch, rc, t.since, "lost",
                    f"its pack ({pk.name}, Slurm job {pk.slurm_id}) was sent {'+'.join(info['signals'])} while it ran "
                    f"and ended {state}; it runs again as a Slurm job of its own",
                    {"slurm_job": pk.slurm_id, "slurm_state": state, "log": str(attempt_log(t.launch)), **extra}))
                return
        elif rc != 0 and status is None and now - t.done_seen < self.s.outcome_wait_s:
            return  # a shared file system may show its outcome late
        pk.task = None
        del self.tasks[t.launch.job_id]
        sub = _Sub(t.launch, pk.slurm_id, t.since, 0, forced=t.forced, reason=t.reason,
                   time_limit=slurm_time(int(t.limit_s)) if t.limit_s else "", mem_gb=t.mem_gb)
        self._ended.append(self._ended_sub(t.launch.job_id, sub, state, rc, pack=pk, extra_more=extra,
                                           note=f"in {pk.name}, exit {rc}"))

    def _task_lost(self, t: _Task, pk: _Pack, now: float) -> None:
        """The pack ended under a running attempt without writing its done file: the worker's
        outcome, when it wrote one (waited for as for any attempt), else the pack's Slurm end state
        read as a job of its own's (OUT_OF_MEMORY: more memory next time; PREEMPTED, NODE_FAIL,
        CANCELLED: lost) or lost; its next attempt is a Slurm job of its own."""
        from pita.core.backends.local import finished_from

        outcome = t.launch.paths.attempt(t.launch.attempt)
        t.lost_since = t.lost_since or now
        if not outcome.exists() and now - t.lost_since < self.s.outcome_wait_s:
            return
        pk.task = None
        del self.tasks[t.launch.job_id]
        state = pk.end[0] if pk.end else "UNKNOWN"
        extra = {"slurm_job": pk.slurm_id, "slurm_state": state, "slurm_pack": pk.name,
                 "log": str(attempt_log(t.launch))}
        if t.forced:
            self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"{pk.name} ended {state}")
            self._ended.append(finished_from(t.launch, None, t.since, t.forced, t.reason, extra))
            return
        self.no_pack.add(t.launch.job_id)
        if outcome.exists() and _outcome_status(t.launch):
            self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"{pk.name} ended {state}")
            self._ended.append(finished_from(t.launch, None, t.since, extra=extra))
            return
        if state in ("OUT_OF_MEMORY", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "CANCELLED", "DEADLINE"):
            sub = _Sub(t.launch, pk.slurm_id, t.since, 0, mem_gb=t.mem_gb)
            self._ended.append(self._ended_sub(t.launch.job_id, sub, state, None, pack=pk,
                                               extra_more={"slurm_pack": pk.name}, note=f"{pk.name} ended {state}"))
            return
        self._gather_log(_Sub(t.launch, pk.slurm_id, t.since, 0), f"{pk.name} ended {state}")
        self._ended.append(finished_from(t.launch, None, t.since, "lost",
                                         f"its pack ({pk.name}, Slurm job {pk.slurm_id}) ended {state} while it ran; "
                                         f"it runs again as a Slurm job of its own", extra))

    def _pack_states(self, listed: dict, now: float) -> None:
        """The packs' Slurm states from this poll's squeue; a pack squeue forgot is read from sacct
        or scontrol, or counts as ended once it closed (its own word) or after unknown_s."""
        missing = []
        for pk in self.packs.values():
            if pk.end is not None or not pk.slurm_id:
                continue
            row = listed.get(pk.slurm_id)
            if row is None:
                missing.append(pk.slurm_id)
                continue
            state, _reason, rc = row
            pk.unknown_since = None
            if state in ACTIVE_STATES:
                pk.state = state
            else:
                pk.end = (state, rc)
        if missing:
            known = self._forgotten(missing)
            for pk in self.packs.values():
                if pk.slurm_id in known:
                    pk.end = known[pk.slurm_id]
                elif pk.slurm_id in missing:
                    pk.unknown_since = pk.unknown_since or now
                    if pk.closed or now - pk.unknown_since >= self.s.unknown_s:
                        pk.end = ("COMPLETED" if pk.closed else "UNKNOWN", None)

    def _kill_task(self, t: _Task, status: str, reason: str, grace_s: float | None) -> None:
        """A packed attempt: gone at once while no pack took it; else its pack TERMs it (KILL
        after the grace) and writes its done file as for any end."""
        from pita.core.backends.local import finished_from

        if t.forced is not None:
            return
        t.forced, t.reason = status, reason
        pk = t.pack
        if pk is not None and t.taken is None:
            try:
                (Path(pk.dir) / "task.json").unlink()
                pk.task, t.pack = None, None
            except FileNotFoundError:
                t.taken = time.time()
        if t.pack is None:
            del self.tasks[t.launch.job_id]
            self._ended.append(finished_from(t.launch, None, t.since, status, reason))
            return
        atomic_write_json(Path(pk.dir) / "kill.json", {"job_id": t.launch.job_id, "attempt": t.launch.attempt,
                                                       "grace_s": self.kill_grace_s if grace_s is None else grace_s})
