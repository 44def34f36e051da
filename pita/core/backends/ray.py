"""The Ray backend: job attempts run on the GPUs of a Ray cluster, through one actor per GPU.

    executor.backend=ray executor.ray.address=auto       an existing cluster (``ray start --head``)
    executor.backend=ray                                 a local Ray instance started for the run

Why actors and not fractional-GPU tasks: Ray counts GPUs, not bytes, and picks itself the GPU a
fractional task lands on, so the executor's memory-aware placement (which device has room for
this job's estimate) and Ray's packing would disagree, and the logs would name the wrong GPU (a
first version with tasks of ``num_gpus`` = memory share packed every small job onto GPU 0 while
the executor believed them spread over four). Instead the backend starts one actor per cluster
GPU (``num_gpus=1``: Ray pins it to one GPU of its node) plus one for host jobs, and the
executor's devices *are* those actors: its admission decides when and where a job runs, several
small jobs share a GPU by running concurrently on its (threaded) actor, and a k-device job runs
on k GPUs of one node.

Each attempt runs the same worker as the local backend (``python -m pita.core.worker
launch.json``) as a child of the actor with ``CUDA_VISIBLE_DEVICES`` = its GPU(s), output to the
job's ``job.log`` (which the driver copies into ``run.log``); the node IP, GPU ids and UUIDs are
recorded in ``state.json``. Run folders must be on a file system every node sees: an actor that
cannot see the run folder fails the job with that reason. Killing an attempt signals the worker's
process group (TERM, then KILL); a worker dies with its actor (PR_SET_PDEATHSIG), so stopping the
run leaves no process holding GPU memory; an attempt whose actor is lost (its process or node)
ends as a dead worker (``executor.crash_retries``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from pita.core.backends.base import Backend, Finished, Launch
from pita.core.backends.local import finished_from
from pita.core.errors import ConfigError
from pita.core.paths import atomic_write_json

INSTALL = "pip install -e '.[ray]' (or pip install 'ray[default]')"


def _gpu_uuids(ids: list[str]) -> list[str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        out = []
        for i in ids:
            h = pynvml.nvmlDeviceGetHandleByIndex(int(i))
            u = pynvml.nvmlDeviceGetUUID(h)
            out.append(u.decode() if isinstance(u, bytes) else str(u))
        return out
    except Exception:  # no NVML (CPU nodes, logical GPUs): ids only
        return []


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"executor.backend=ray needs Ray, which is not installed: {INSTALL}; "
                          f"or use executor.backend=local") from e
    return ray


def connect(address: str | None, num_gpus: int | None = None, num_cpus: int | None = None) -> bool:
    """Join the cluster at ``address`` (``auto``: the one ``ray start`` made on this node) or start
    a local instance (``address`` null); returns True when this process started Ray."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token written under the home directory
    kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_gpus=num_gpus, num_cpus=num_cpus, **kw)
    except ConnectionError as e:
        raise ConfigError(f"executor.ray.address={address!r}: no Ray cluster there ({e}); start one with "
                          f"'ray start --head' (then address=auto) or leave the address unset for a local "
                          f"instance") from e
    return True


def cluster_gpus() -> int:
    ray = import_ray()
    return int(ray.cluster_resources().get("GPU", 0))


class DeviceRunner:
    """A Ray actor, one per cluster GPU (and one for host jobs): runs attempts' workers on its node."""

    def __init__(self):
        self.procs: dict[str, subprocess.Popen] = {}

    def info(self) -> dict:
        import ray

        ids = [str(g) for g in ray.get_gpu_ids()]
        return {"node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(), "gpu_ids": ids,
                "gpu_uuids": _gpu_uuids(ids), "pid": os.getpid(),
                # Ray's own id of the node: nodes may share an address (several on one machine)
                "node_id": ray.get_runtime_context().get_node_id()}

    def run(self, job_id: str, launch_path: str, log_path: str, env: dict, gpu_ids: list[str]) -> dict:
        import ray

        where = {"node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(), "gpu_ids": gpu_ids}
        if not os.path.exists(launch_path):
            return dict(where, rc=None, missing=launch_path)
        uuids = _gpu_uuids(gpu_ids)
        full = dict(os.environ)
        full.update(env)
        full["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        full["PITA_PARENT_PID"] = str(os.getpid())
        full["PYTHONUNBUFFERED"] = "1"
        with open(log_path, "ab", buffering=0) as log:
            log.write(f"[ray] node {where['node_ip']} ({where['hostname']}), GPU ids {','.join(gpu_ids) or '-'}"
                      f"{' ' + ','.join(uuids) if uuids else ''}, pid {os.getpid()}\n".encode())
            proc = subprocess.Popen([sys.executable, "-m", "pita.core.worker", launch_path], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full, close_fds=True,
                                    start_new_session=True)
            self.procs[job_id] = proc
            try:
                rc = proc.wait()
            finally:
                self.procs.pop(job_id, None)
        return dict(where, rc=rc, gpu_uuids=uuids, worker_pid=proc.pid)

    def signal(self, job_id: str, sig: int) -> bool:
        proc = self.procs.get(job_id)
        if proc is None:
            return False
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def pids(self) -> dict[str, int]:
        return {j: p.pid for j, p in self.procs.items()}


@dataclass
class _Task:
    launch: Launch
    ref: object
    runner: object
    started: float
    forced_status: str | None = None
    forced_reason: str = ""
    term_sent: float | None = None
    grace_s: float | None = None


class RayBackend(Backend):
    name = "ray"

    def __init__(self, owns_ray: bool = False, kill_grace_s: float = 10.0, max_jobs_per_gpu: int = 64):
        ray = import_ray()
        self.ray = ray
        self.owns_ray = owns_ray
        self.kill_grace_s = kill_grace_s
        cls = ray.remote(DeviceRunner)
        n = cluster_gpus()
        self.gpu_runners = [cls.options(num_gpus=1, num_cpus=0, max_concurrency=max_jobs_per_gpu).remote()
                            for _ in range(n)]
        self.host_runner = cls.options(num_gpus=0, num_cpus=0, max_concurrency=max_jobs_per_gpu).remote()
        # the executor's device ordinal i is gpu_runners[i], on placement[i]'s node and GPU (by node, GPU id)
        info = ray.get([r.info.remote() for r in self.gpu_runners]) if n else []
        order = sorted(range(n), key=lambda i: (info[i]["node_ip"], info[i]["node_id"],
                                                [int(g) for g in info[i]["gpu_ids"]]))
        self.gpu_runners = [self.gpu_runners[i] for i in order]
        self.placement = [info[i] for i in order]
        self.tasks: dict[str, _Task] = {}

    def devices(self, total_bytes: int):
        """The executor's inventory: one device per cluster GPU, named by node and GPU id."""
        from pita.core.gpu_manager import Device

        out = []
        for i, p in enumerate(self.placement):
            gid = ",".join(p["gpu_ids"]) or str(i)
            uuid = (p["gpu_uuids"] or [f"RAY-{p['node_ip']}-GPU{gid}"])[0]
            index = int(p["gpu_ids"][0]) if p["gpu_ids"] else i  # the GPU's id on its node (labels gpuN)
            out.append(Device(ordinal=i, index=index, uuid=uuid, name=f"node {p['node_ip']} GPU {gid}",
                              total_bytes=total_bytes, node=f"{p['node_ip']} ({p['node_id'][:8]})"))
        return out

    def start(self, launch: Launch) -> None:
        p = launch.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p.launch, launch.to_json(parent_pid=None))
        try:
            p.attempt(launch.attempt).unlink()
        except FileNotFoundError:
            pass
        env = {k: v for k, v in launch.env.items() if k != "CUDA_VISIBLE_DEVICES"}
        ordinals = [d["ordinal"] for d in launch.devices if d.get("kind") != "cpu"]
        if ordinals and self.gpu_runners:
            nodes = {self.placement[o]["node_id"] for o in ordinals}
            if len(nodes) > 1:
                raise RuntimeError(f"{launch.job_id} holds GPUs on {len(nodes)} nodes ({', '.join(sorted(nodes))}); "
                                   f"a k-device job needs its k GPUs on one node")
            runner = self.gpu_runners[ordinals[0]]
            gpu_ids = [g for o in ordinals for g in self.placement[o]["gpu_ids"]]
        else:
            runner, gpu_ids = self.host_runner, []
        ref = runner.run.remote(launch.job_id, str(p.launch.resolve()), str(p.log.resolve()), env, gpu_ids)
        self.tasks[launch.job_id] = _Task(launch, ref, runner, time.time())

    def running(self) -> list[str]:
        return list(self.tasks)

    def kill(self, job_id: str, status: str = "cancelled", reason: str = "", grace_s: float | None = None) -> None:
        t = self.tasks.get(job_id)
        if t is None or t.term_sent is not None:  # TERM once; poll sends KILL after the grace
            return
        t.forced_status, t.forced_reason = status, reason
        t.grace_s = grace_s
        t.runner.signal.remote(job_id, signal.SIGTERM)
        t.term_sent = time.time()

    def _collect(self, job_id: str, t: _Task) -> Finished:
        try:
            info = self.ray.get(t.ref)
        except Exception as e:  # the actor died (its process or its node)
            if t.forced_status:
                return finished_from(t.launch, None, t.started, t.forced_status, t.forced_reason)
            f = finished_from(t.launch, None, t.started)
            if f.status == "died":
                first = str(e).splitlines()[0] if str(e) else ""
                f.error = f"the Ray actor running it died: {type(e).__name__}: {first}"
            return f
        where = {k: info.get(k) for k in ("node_ip", "hostname", "gpu_ids", "gpu_uuids")}
        if info.get("missing"):
            return Finished(job_id, t.launch.attempt, "error", None,
                            f"node {info['node_ip']} cannot see the run folder ({info['missing']} is missing "
                            f"there): with the ray backend, system.output_dir must be on a file system shared "
                            f"by every node", extra=where)
        return finished_from(t.launch, info["rc"], t.started, t.forced_status, t.forced_reason, extra=where)

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        now = time.time()
        for jid, t in self.tasks.items():  # TERM went unheeded: KILL
            grace = t.grace_s if t.grace_s is not None else self.kill_grace_s
            if t.term_sent is not None and now - t.term_sent > grace:
                t.runner.signal.remote(jid, signal.SIGKILL)
                t.term_sent = now + 3600  # KILL sent; again only if the actor never answers
        if not self.tasks:
            if timeout:
                time.sleep(min(timeout, 0.05))
            return []
        by_ref = {t.ref: jid for jid, t in self.tasks.items()}
        ready, _ = self.ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        return [self._collect(by_ref[ref], self.tasks.pop(by_ref[ref])) for ref in ready]

    def shutdown(self, grace_s: float = 10.0) -> list[Finished]:
        for jid, t in self.tasks.items():
            if t.forced_status is None:
                t.forced_status, t.forced_reason = "cancelled", "run interrupted"
            t.runner.signal.remote(jid, signal.SIGTERM)
        refs = [t.ref for t in self.tasks.values()]
        if refs:
            done, left = self.ray.wait(refs, num_returns=len(refs), timeout=grace_s)
            if left:
                for jid, t in self.tasks.items():
                    t.runner.signal.remote(jid, signal.SIGKILL)
                self.ray.wait(left, num_returns=len(left), timeout=5.0)
        finished = [self._collect(jid, t) for jid, t in list(self.tasks.items())]
        self.tasks.clear()
        for r in self.gpu_runners + [self.host_runner]:
            try:
                self.ray.kill(r)  # any worker still there dies with it (PR_SET_PDEATHSIG)
            except Exception:
                pass
        if self.owns_ray:
            self.ray.shutdown()
        return finished
