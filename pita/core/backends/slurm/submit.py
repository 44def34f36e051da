"""The Slurm backend, submitting an attempt: its request (sbatch options, and the sizing its earlier
attempts taught), its batch script, the run's limits of jobs and GPUs in flight, sbatch and its
refusals."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import time

from pathlib import Path

from pita.core.backends.base import Launch
from pita.core.paths import atomic_write_json
from pita.core.backends.slurm.commands import (
    slurm_seconds, submit_env, limit_seconds, slurm_time, warning_margin, _FINAL_REFUSALS, HOLD_WARNING, _try,
    _user, SlurmRefused, gres_count, _flag, pack_key, attempt_log)
from pita.core.backends.slurm.records import _Sub, _Held, _Task
from pita.core.backends.slurm.limits import submit_limits


class Submitting:
    """Mixed into SlurmBackend (pita.core.backends.slurm.backend)."""

    # ------------------------------------------------------------------ submitting
    def request(self, launch: Launch) -> list[str]:
        """The sbatch options of one attempt: what the plan gives its job."""
        self._load_sizing(launch)
        job = launch.job
        res = job.get("resources") or {}
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        devices = max(1, len(launch.devices))
        mem_gb = float(res.get("host_gb") or 0.0)
        if not mem_gb:  # CPU devices: the job's reservation is host memory
            mem_gb = float(res.get("memory_gb") or 0.0) * devices if not gpus else self.s.mem_gb
        mem_gb = (mem_gb or self.s.mem_gb) * self.mem_factor.get(launch.job_id, 1.0)
        if self.s.max_node_mem_mb:
            mem_gb = min(mem_gb, self.s.max_node_mem_mb / 1024)
        expected = float(job.get("duration_hint") or 60.0)
        limit = limit_seconds(expected, self.s.time_margin, self.s.min_minutes, self.s.max_time_s,
                              self.time_factor.get(launch.job_id, 1.0))
        args = ["-J", f"pita:{launch.job_id}", "-o", str(attempt_log(launch)), "--open-mode=append", "-N", "1",
                "-n", "1", "-c", str(self.s.cpus_per_job * devices if launch.devices else 1),
                "--time=" + slurm_time(limit)]
        margin = self.signal_margin(job, limit)
        if margin:
            args.append(f"--signal=B:USR1@{margin}")
        args.append(f"--mem={max(1, math.ceil(mem_gb))}G")
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        for flag, value in (("-p", self.s.partition), ("-A", self.s.account), ("-q", self.s.qos),
                            ("-C", self.s.constraint)):
            if value:
                args += [flag, str(value)]
        return args + list(self.s.sbatch_args)

    SIZING = "slurm-sizing.json"  # in the job's folder: what its earlier attempts taught its request

    def _load_sizing(self, launch) -> None:
        """A job's time and memory factors from its earlier attempts, read once per job: a resumed
        driver asks what the last one would have asked (a TIMEOUT's doubling is never forgotten)."""
        where = str(launch.paths.dir)  # by folder: a plan's look at the request (representative) reads none
        if where in self._sized:
            return
        self._sized.add(where)
        try:
            saved = json.loads((Path(launch.paths.dir) / self.SIZING).read_text())
        except (OSError, ValueError, TypeError):
            return
        for name, into in (("time_factor", self.time_factor), ("mem_factor", self.mem_factor),
                           ("host_ooms", self.host_ooms)):
            value = saved.get(name)
            if isinstance(value, (int, float)) and launch.job_id not in into:
                into[launch.job_id] = value

    def _save_sizing(self, launch) -> None:
        job_id = launch.job_id
        data = {name: into[job_id] for name, into in (("time_factor", self.time_factor),
                                                      ("mem_factor", self.mem_factor),
                                                      ("host_ooms", self.host_ooms)) if job_id in into}
        try:
            atomic_write_json(Path(launch.paths.dir) / self.SIZING, data)
        except OSError:  # a full disk: this driver still remembers it
            pass

    def signal_margin(self, job: dict | None, limit_s: float) -> int | None:
        """Seconds before its ``limit_s`` time limit that an attempt is told (USR1) to save and ask
        to run again: executor.slurm.signal_margin_s, or twice the job's planned checkpoint write,
        within a share of the limit (:func:`warning_margin`); None: the limit is too short to warn."""
        wanted = max(self.s.signal_margin_s, 2 * float(((job or {}).get("params") or {}).get("checkpoint_s") or 0))
        return warning_margin(limit_s, wanted)

    @staticmethod
    def attempt_env(launch: Launch, gpus: int, args: list[str] | None) -> dict[str, str]:
        """The environment an attempt runs in on its node (in a Slurm job of its own or a pack)."""
        env = dict(launch.env)
        if gpus:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's GRES plugin sets it to the allocation
        env["PYTHONUNBUFFERED"] = "1"
        env["PITA_SLURM_SIGNALS"] = "1"  # the worker saves on USR1/TERM and asks to run again
        cpus = _flag(args or [], "-c")
        if cpus:  # the job's own CPUs, not the driver's machine's
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(cpus)
        return env

    def script(self, launch: Launch, gpus: int, args: list[str] | None = None) -> str:
        env = self.attempt_env(launch, gpus, args)
        exports = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in sorted(env.items()))
        return ("#!/bin/bash\n" + HOLD_WARNING +
                f"# pita job {launch.job_id}, attempt {launch.attempt}\n"
                + (f"# submitted as: sbatch {shlex.join(args)}\n" if args else "") +
                f"cd {shlex.quote(os.getcwd())}\n"
                f"{exports}"
                f"exec {shlex.quote(self.python)} -m pita.core.worker {shlex.quote(str(launch.paths.launch))}\n")

    def start(self, launch: Launch) -> None:
        if not launch.devices:  # a merge: on the driver
            self.local.start(launch)
            return
        p = launch.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p.launch, launch.to_json())
        try:
            p.attempt(launch.attempt).unlink()
        except FileNotFoundError:
            pass
        if self.packable(launch):
            args = self.request(launch)
            limit = slurm_seconds((_flag(args, "--time") or "").split("=", 1)[-1]) or 0.0
            warn = _flag(args, "--signal")
            self.tasks[launch.job_id] = _Task(launch, pack_key(args), time.time(),
                                              mem_gb=float((_flag(args, "--mem") or "0G").rstrip("G")),
                                              limit_s=limit, warn_s=int(warn.rsplit("@", 1)[1]) if warn else 0)
            self.stats["packed"] += 1
            self._dispatch(time.time())
            return
        gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
        script = p.dir / f"slurm-{launch.attempt}.sh"
        args = self.request(launch)
        script.write_text(self.script(launch, gpus, args))
        held = _Held(launch, args, str(script), time.time())
        if self._at_cap(gpus):
            held.why = self._cap_text(gpus)
            self.held[launch.job_id] = held
            return
        if not self._submit(held):
            self.held[launch.job_id] = held

    def _in_flight(self) -> int:
        return len(self.subs) + sum(1 for pk in self.packs.values() if pk.end is None)

    def _gpus_in_flight(self) -> int:
        return (sum(s.gpus for s in self.subs.values()) +
                sum(gres_count(_flag(pk.args, "--gres")) for pk in self.packs.values() if pk.end is None))

    def _at_cap(self, gpus: int = 0) -> bool:
        """Whether one more job (of ``gpus`` GPUs) would pass the run's limit of jobs in flight, or
        of GPUs held at once (GrpTRES, MaxTRESPU: a job past it would only pend)."""
        if self.cap is not None and self._in_flight() >= self.cap:
            return True
        return bool(self.gpu_cap is not None and gpus and self._gpus_in_flight()
                    and self._gpus_in_flight() + gpus > self.gpu_cap)

    def _cap_text(self, gpus: int = 0) -> str:
        if self.cap is not None and self._in_flight() >= self.cap:
            return (f"held by pita: {self._in_flight()} of your jobs are in flight, the limit ({self.cap_why}: "
                    f"{self.cap})")
        return (f"held by pita: {self._gpus_in_flight()} GPUs of yours are in flight and it needs {gpus} more, past "
                f"the limit ({self.gpu_cap_why}: {self.gpu_cap})")

    def _submit(self, held: _Held) -> bool:
        """sbatch one held attempt: True when Slurm took it; False when it refused for now (tried
        again with backoff); RuntimeError when the refusal is final (the job fails)."""
        launch = held.launch
        self.stats["sbatch"] += 1
        try:
            out = subprocess.run(["sbatch", "--parsable", *held.args, held.script], capture_output=True,
                                 text=True, timeout=60, env=submit_env())
            msg, ok = (out.stderr.strip() or out.stdout.strip()), out.returncode == 0
        except (subprocess.TimeoutExpired, OSError) as e:
            # a timed-out sbatch may still have queued the job: it would run twice if submitted again
            msg, ok = f"{type(e).__name__}: {e}", False
            if isinstance(e, subprocess.TimeoutExpired) and self._find_submitted(launch):
                return True
        if ok:
            sid = out.stdout.strip().split(";")[0]
            gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
            self.subs[launch.job_id] = _Sub(launch, sid, time.time(), gpus, grace_s=self.kill_grace_s,
                                            time_limit=_flag(held.args, "--time") or "",
                                            mem_gb=float((_flag(held.args, "--mem") or "0G").rstrip("G")))
            self._changed()
            return True
        self.stats["refused"] += 1
        if any(w in msg.lower() for w in _FINAL_REFUSALS):
            raise RuntimeError(f"sbatch refused {launch.job_id}: {msg}")
        final = self._policy_final(msg)
        if final:
            asked = " ".join([a for a in held.args if a.startswith(("--time=", "--gres=", "--mem="))] +
                             ([f"-c {_flag(held.args, '-c')}"] if _flag(held.args, "-c") else []))
            raise SlurmRefused(f"sbatch refused {launch.job_id}: {' '.join(msg.split())} -- {final}. It asked for "
                               f"{asked}: lower it "
                               f"(executor.slurm.time_margin, executor.slurm.min_minutes, the job's size) or run "
                               f"under another executor.slurm.qos, executor.slurm.account or executor.slurm.partition "
                               f"(sacctmgr show qos; sacctmgr show assoc user={_user()})")
        held.tries += 1
        backoff = min(300.0, 10.0 * 2 ** (held.tries - 1))
        held.next_try = time.time() + backoff
        held.why = f"sbatch refused it ({msg}); trying again in {backoff:.0f}s (attempt {held.tries})"
        import logging

        logging.getLogger("pita.executor").warning("%s: %s", launch.job_id, held.why)
        return False

    def _policy_final(self, msg: str) -> str:
        """Why an sbatch refusal by the accounting policy cannot clear by waiting ("" when it may:
        a submit limit that frees as jobs end). Slurm names the limit where it can (QOSMaxWall...,
        AssocMaxSubmitJobLimit); its generic "violates accounting/QOS policy (job submit limit,
        user's size and/or time limits)" covers both: it is final when none of this run's jobs is in
        flight and no submit limit of yours is full (sacctmgr)."""
        import re

        named = sorted(set(re.findall(r"\b(?:QOS|Assoc)\w*(?:Limit|PerJob|PerUser|PerAccount)\w*", msg)))
        if named:
            if any("Submit" in n for n in named):
                return ""
            return f"{', '.join(named)} is a per-job limit of your account or QoS, which waiting does not change"
        if "accounting/qos policy" not in msg.lower() and "job violates" not in msg.lower():
            return ""
        if self._in_flight():
            return ""  # a submit limit your queued jobs fill clears as they end
        limit, why, mine = submit_limits(self.s)
        if limit is not None and mine >= limit:
            return ""
        return (f"no job of this run is in flight and no submit limit of yours is full ({why or 'sacctmgr sets none'}, "
                f"{mine} of your jobs queued or running): the request itself breaks a size or time limit")

    def _find_submitted(self, launch: Launch) -> bool:
        """After an sbatch that timed out: the job it may have queued, found by its script."""
        out = _try(["squeue", "-h", "-u", _user(), "-o", "%i|%j|%o"])
        if out is None:
            return False
        script = str(launch.paths.dir / f"slurm-{launch.attempt}.sh")
        for line in out.stdout.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3 and parts[2] == script:
                gpus = sum(1 for d in launch.devices if d.get("kind") == "cuda")
                self.subs[launch.job_id] = _Sub(launch, parts[0], time.time(), gpus, grace_s=self.kill_grace_s)
                self._changed()
                return True
        return False

    def _submit_held(self) -> None:
        now = time.time()
        for job_id, held in list(self.held.items()):
            gpus = gres_count(_flag(held.args, "--gres"))
            if self._at_cap(gpus):
                if self.cap is not None and self._in_flight() >= self.cap:
                    for h in self.held.values():
                        if h.next_try <= now:
                            h.why = self._cap_text()
                    return
                held.why = self._cap_text(gpus)  # a smaller one may still fit the GPUs left
                continue
            if held.next_try > now:
                continue
            try:
                taken = self._submit(held)
            except RuntimeError as e:
                del self.held[job_id]
                from pita.core.backends.local import finished_from

                self._ended.append(finished_from(held.launch, None, held.since, getattr(e, "status", "died"), str(e)))
                continue
            if taken:
                del self.held[job_id]

    def set_limits(self, cap: int | None, why: str) -> None:
        """The most jobs this run keeps in flight (queued or running), and what sets it."""
        if cap is not None and (self.cap is None or cap < self.cap):
            self.cap, self.cap_why = cap, why

    def set_gpu_limit(self, gpus: int | None, why: str) -> None:
        """The most GPUs this run's jobs hold at once (queued or running), and what sets it."""
        if gpus is not None and (self.gpu_cap is None or gpus < self.gpu_cap):
            self.gpu_cap, self.gpu_cap_why = gpus, why
