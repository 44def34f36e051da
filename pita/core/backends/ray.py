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
on k GPUs of one node. A cluster without GPUs gets CPU devices instead: ``cpu_slots`` actors on
every node, each pinned to its node, with the node's cores and memory shared out between them.

Each attempt runs the same worker as the local backend (``python -m pita.core.worker
launch.json``) as a child of the actor, started in the run's folder, with ``CUDA_VISIBLE_DEVICES``
= its GPU(s), output to the job's ``job.log`` (which the driver copies into ``run.log``); the node
IP, GPU ids and UUIDs are recorded in ``state.json``. Run folders must be on a file system every
node sees: an actor that cannot see the run folder fails the job with that reason. Killing an
attempt signals the worker's process group (TERM, then KILL); a worker dies with its actor
(PR_SET_PDEATHSIG), so stopping the run leaves no process holding GPU memory.

The inventory follows the cluster (``refresh``, asked by the executor every loop, at most every
``refresh_s``): a node that leaves (or an actor that dies) takes its devices out of the inventory
and its running attempts end as ``lost`` (requeued by the executor without counting as the job's
crash; a worker killed by a signal nobody sent is judged once its actor answers a ping, since a
dying actor kills its children and may report their exit before its own death is known); GPUs that come free, on a node that joins or where a dead actor was, get new actors, which
join the inventory once Ray has placed them. Each GPU's memory is read by NVML on its own node
(``executor.ray.gpu_memory_gb`` or the driver's GPU only where a node has no NVML, said in the
log). Host jobs (merges) run on an actor pinned to the driver's node, so losing any other node
never loses them, and a host actor that dies is replaced.
"""

from __future__ import annotations

import logging
import math
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

log = logging.getLogger("pita.ray")

INSTALL = "pip install -e '.[ray]' (or pip install 'ray[default]')"


def node_gpus(ids: list[str]) -> dict:
    """What NVML says on this node about the GPUs ``ids`` (Ray's ids: indices on the node): UUIDs,
    total and used memory, utilization, and the compute processes (pid, bytes). Empty where there
    is no NVML (CPU nodes, logical GPUs)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    out = {"uuids": [], "total": [], "used": [], "utilization": [], "processes": []}
    try:
        for i in ids:
            h = pynvml.nvmlDeviceGetHandleByIndex(int(i))
            u = pynvml.nvmlDeviceGetUUID(h)
            out["uuids"].append(u.decode() if isinstance(u, bytes) else str(u))
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out["total"].append(int(mem.total))
            out["used"].append(int(mem.used))
            try:
                out["utilization"].append(int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
            except Exception:
                out["utilization"].append(None)
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                out["processes"].append([(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs])
            except Exception:
                out["processes"].append([])
    except Exception:
        return {}
    return out


def _tree(pid: int) -> set[int]:
    """A process and its descendants (a worker's children hold GPU memory too)."""
    try:
        import psutil

        p = psutil.Process(pid)
        return {pid} | {c.pid for c in p.children(recursive=True)}
    except Exception:
        return {pid}


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
    """A Ray actor, one per cluster GPU (or CPU slot, and one for host jobs): runs attempts'
    workers on its node."""

    def __init__(self):
        self.procs: dict[str, subprocess.Popen] = {}

    def info(self) -> dict:
        import psutil
        import ray

        ids = [str(g) for g in ray.get_gpu_ids()]
        nv = node_gpus(ids)
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return {"node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(), "gpu_ids": ids,
                "gpu_uuids": nv.get("uuids", []), "gpu_total_bytes": nv.get("total", []), "pid": os.getpid(),
                "cores": cores, "host_available_bytes": int(psutil.virtual_memory().available),
                # Ray's own id of the node: nodes may share an address (several on one machine)
                "node_id": ray.get_runtime_context().get_node_id()}

    def memory(self) -> dict:
        """This actor's GPU(s) now (NVML on its node), with the bytes each running job's processes use."""
        import ray

        ids = [str(g) for g in ray.get_gpu_ids()]
        nv = node_gpus(ids)
        if not nv:
            return {}
        procs = dict(p for ps in nv["processes"] for p in ps)
        jobs = {j: sum(procs.get(pid, 0) for pid in _tree(p.pid)) for j, p in list(self.procs.items())}
        return {"used": sum(nv["used"]), "total": sum(nv["total"]), "utilization": nv["utilization"][0],
                "jobs": jobs}

    def run(self, job_id: str, launch_path: str, log_path: str, env: dict, gpu_ids: list[str],
            cwd: str | None = None) -> dict:
        import ray

        where = {"node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(), "gpu_ids": gpu_ids}
        if not os.path.exists(launch_path):
            return dict(where, rc=None, missing=launch_path)
        uuids = node_gpus(gpu_ids).get("uuids", [])
        full = dict(os.environ)
        full.update(env)
        full["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        full["PITA_PARENT_PID"] = str(os.getpid())
        full["PYTHONUNBUFFERED"] = "1"
        with open(log_path, "ab", buffering=0) as log_file:
            log_file.write(f"[ray] node {where['node_ip']} ({where['hostname']}), GPU ids {','.join(gpu_ids) or '-'}"
                           f"{' ' + ','.join(uuids) if uuids else ''}, pid {os.getpid()}\n".encode())
            proc = subprocess.Popen([sys.executable, "-m", "pita.core.worker", launch_path], stdout=log_file,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full, close_fds=True,
                                    start_new_session=True, cwd=cwd if cwd and os.path.isdir(cwd) else None)
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
    ordinals: list[int]
    forced_status: str | None = None
    forced_reason: str = ""
    term_sent: float | None = None
    grace_s: float | None = None
    # a worker that died by a signal nobody sent: (its result, a ping of its actor, until when)
    settle: tuple | None = None


class RayBackend(Backend):
    """``gpu_memory_bytes``: a GPU's memory where its node has no NVML (None: the driver's GPU,
    else 80 GiB); ``startup_timeout_s``: how long to wait for a first GPU when every GPU of the
    cluster is held by other Ray work; ``cpu_slots``: devices per node on a cluster without GPUs."""

    name = "ray"

    def __init__(self, owns_ray: bool = False, kill_grace_s: float = 10.0, max_jobs_per_gpu: int = 64,
                 gpu_memory_bytes: int | None = None, startup_timeout_s: float = 120.0, cpu_slots: int = 2,
                 refresh_s: float = 2.0, settle_s: float = 30.0):
        ray = import_ray()
        self.ray = ray
        self.owns_ray = owns_ray
        self.kill_grace_s = kill_grace_s
        self.max_jobs = max_jobs_per_gpu
        self.gpu_memory_bytes = gpu_memory_bytes
        self.cpu_slots = max(1, int(cpu_slots))
        self.refresh_s = refresh_s
        self.settle_s = settle_s
        self._fallback_noted: set[str] = set()  # nodes without NVML, said once each
        self.notes: list[str] = []  # start-up findings, for run.log (written once its folder exists)
        self.started = False
        self.cls = ray.remote(DeviceRunner)
        self.driver_node = ray.get_runtime_context().get_node_id()
        self.runners: list = []  # ordinal -> actor
        self.placement: list[dict] = []  # ordinal -> the actor's info (node, GPU ids, memory)
        self.lost: dict[int, str] = {}  # ordinal -> why it left the inventory
        self.pending: dict = {}  # info ref -> actor, started but not yet placed by Ray
        self.added: list[int] = []  # ordinals placed since the executor last asked
        self.newly_lost: dict[int, str] = {}  # ordinals lost since the executor last asked
        self.tasks: dict[str, _Task] = {}
        self._last_refresh = 0.0
        self.gpu_mode = cluster_gpus() > 0
        self.host_runner = self._host_actor()
        self._start_up(startup_timeout_s)

    # ------------------------------------------------------------------ actors and inventory
    def _host_actor(self):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # on the driver's node: losing any other node never loses the merges
        return self.cls.options(num_gpus=0, num_cpus=0, max_concurrency=self.max_jobs, scheduling_strategy=
                                NodeAffinitySchedulingStrategy(self.driver_node, soft=False)).remote()

    def _alive(self) -> dict[str, dict]:
        return {n["NodeID"]: n for n in self.ray.nodes() if n.get("Alive")}

    def _request(self) -> None:
        """Ask for actors on whatever this run does not hold yet: each free GPU of the cluster (GPU
        mode), or ``cpu_slots`` per node that has none of ours (CPU mode)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self.gpu_mode:
            free = math.floor(self.ray.available_resources().get("GPU", 0) + 1e-9) - len(self.pending)
            for _ in range(max(0, free)):
                a = self.cls.options(num_gpus=1, num_cpus=0, max_concurrency=self.max_jobs).remote()
                self.pending[a.info.remote()] = a
            return
        ours = {p["node_id"] for o, p in enumerate(self.placement) if o not in self.lost}
        ours |= {getattr(a, "_pita_node", None) for a in self.pending.values()}
        for nid, n in self._alive().items():
            if nid in ours or n.get("Resources", {}).get("CPU", 0) < 1:
                continue
            slots = max(1, min(self.cpu_slots, int(n["Resources"]["CPU"])))
            for _ in range(slots):
                a = self.cls.options(num_cpus=0, max_concurrency=self.max_jobs, scheduling_strategy=
                                     NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
                a._pita_node, a._pita_slots = nid, slots
                self.pending[a.info.remote()] = a

    def _collect_placed(self, timeout: float = 0.0) -> list[int]:
        """Actors Ray has placed since the last call join the inventory; returns their ordinals."""
        if not self.pending:
            return []
        ready, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout)
        placed = []
        for ref in ready:
            actor = self.pending.pop(ref)
            try:
                info = self.ray.get(ref)
            except Exception as e:  # died before it was placed (its node left): nothing to add
                log.debug("an actor died before it was placed: %s", e)
                continue
            placed.append((info, actor))
        if not self.gpu_mode:  # a node's slots, numbered on the node, share its cores and memory
            # as many as were asked of the node: under load Ray may place a node's actors across
            # two calls, and a slot counted from one call alone took all of the node's cores
            nodes = self._alive()
            for info, actor in placed:
                n = nodes.get(info["node_id"], {})
                same = [p for p in placed if p[0]["node_id"] == info["node_id"]]
                slots = int(getattr(actor, "_pita_slots", 0) or len(same))
                declared = int(n.get("Resources", {}).get("CPU", info["cores"]) or info["cores"])
                taken = {p.get("slot") for o, p in enumerate(self.placement)
                         if o not in self.lost and p["node_id"] == info["node_id"]}
                taken |= {p[0]["slot"] for p in same if "slot" in p[0]}
                info["slots"] = slots
                info["threads"] = max(1, declared // slots)
                info["cpu_bytes"] = int(info["host_available_bytes"] // slots)
                info["slot"] = next(i for i in range(len(taken) + 1) if i not in taken)
        placed.sort(key=lambda p: (p[0]["node_ip"], p[0]["node_id"], [int(g) for g in p[0]["gpu_ids"]],
                                   p[0].get("slot", 0)))
        out = []
        for info, actor in placed:
            self.runners.append(actor)
            self.placement.append(info)
            out.append(len(self.runners) - 1)
        self.added.extend(out)
        return out

    def _held_elsewhere(self) -> str:
        """Per node: its GPUs, how many are this run's, how many are free (for the start-up wait)."""
        try:
            from ray._private.state import available_resources_per_node

            avail = available_resources_per_node()
        except Exception:
            avail = {}
        ours: dict[str, int] = {}
        for o, p in enumerate(self.placement):
            if o not in self.lost:
                ours[p["node_id"]] = ours.get(p["node_id"], 0) + 1
        parts = []
        for nid, n in sorted(self._alive().items(), key=lambda kv: kv[1].get("NodeManagerAddress", "")):
            total = int(n.get("Resources", {}).get("GPU", 0))
            if total:
                free = int(avail.get(nid, {}).get("GPU", 0))
                parts.append(f"node {n.get('NodeManagerAddress')} ({nid[:8]}): {total} GPU(s), {ours.get(nid, 0)} "
                             f"this run's, {free} free, {total - free - ours.get(nid, 0)} held by other Ray work")
        return "; ".join(parts)

    def _start_up(self, timeout_s: float) -> None:
        """Start actors on the cluster's free GPUs (or every node's CPU slots). Waits for a first
        GPU while every one is held by other Ray work, naming them every 15 s; none within
        ``timeout_s``: exit 2."""
        t0 = time.monotonic()
        last_note = t0
        while True:
            self._request()
            self._collect_placed(timeout=1.0)
            now = time.monotonic()
            # every free GPU placed, or some placed and the rest slow to come (they join later)
            if self.runners and (not self.pending or now - t0 > 10):
                break
            if now - t0 > timeout_s:
                for a in self.pending.values():
                    self.ray.kill(a)
                self.pending.clear()
                raise ConfigError(f"no {'GPU' if self.gpu_mode else 'node'} of the Ray cluster came free within "
                                  f"{timeout_s:g}s (executor.ray.startup_timeout_s): "
                                  f"{self._held_elsewhere() or 'no node could take an actor'}. Free them "
                                  f"(ray list actors, ray job list), wait longer with "
                                  f"executor.ray.startup_timeout_s=600, or add a node")
            if now - last_note >= 15:
                last_note = now
                log.warning("waiting for GPUs of the Ray cluster (%d s of %g s, executor.ray.startup_timeout_s): %s",
                            now - t0, timeout_s, self._held_elsewhere())
            if not self.pending:
                time.sleep(1.0)
        if self.gpu_mode and (self.pending or cluster_gpus() > len(self.runners)):
            self._note(f"Ray cluster: starting on {len(self.runners)} of its {cluster_gpus()} GPUs; the others join "
                       f"the run when they come free ({self._held_elsewhere()})")
        self.added.clear()  # the start-up devices are the executor's first inventory, not additions
        self.devices()  # their memory: a node without NVML is said with the start-up notes
        self.started = True

    def _note(self, line: str) -> None:
        """Start-up findings wait in ``notes`` for run.log (the run folder does not exist yet);
        later ones are logged now."""
        if self.started:
            log.warning("%s", line)
        else:
            self.notes.append(line)

    def refresh(self) -> tuple[list[int], dict[int, str]]:
        """Follow the cluster: (ordinals placed since the last call, {ordinal: why} lost since the
        last call). Looks at the cluster at most every ``refresh_s``."""
        now = time.monotonic()
        if now - self._last_refresh >= self.refresh_s:
            self._last_refresh = now
            self._check_nodes()
            self._request()
            self._collect_placed()
        added, self.added = self.added, []
        lost, self.newly_lost = self.newly_lost, {}
        return added, lost

    def _check_nodes(self) -> None:
        alive = self._alive()
        for o, p in enumerate(self.placement):
            if o not in self.lost and p["node_id"] not in alive:
                self._lose(o, f"node {p['node_ip']} ({p['node_id'][:8]}) left the Ray cluster")

    def _lose(self, ordinal: int, why: str) -> None:
        if ordinal in self.lost:
            return
        self.lost[ordinal] = self.newly_lost[ordinal] = why
        try:
            self.ray.kill(self.runners[ordinal])  # its GPU comes free for a new actor (a live node)
        except Exception:
            pass

    def devices(self, total_bytes: int | None = None, ordinals: list[int] | None = None):
        """The executor's inventory (``ordinals``: those devices only): one device per GPU actor,
        named by node and GPU id, with its memory as NVML read it on its node; or a CPU slot."""
        from pita.core.gpu_manager import Device

        out = []
        fallback = self.gpu_memory_bytes or total_bytes
        for i in (range(len(self.placement)) if ordinals is None else ordinals):
            p = self.placement[i]
            node = f"{p['node_ip']} ({p['node_id'][:8]})"
            if not self.gpu_mode:
                cores = p.get("threads", 1)
                out.append(Device(ordinal=i, index=p.get("slot", 0), uuid=f"RAY-{p['node_id'][:8]}-CPU{p.get('slot', 0)}",
                                  name=f"node {node} {cores} core{'s' if cores != 1 else ''}",
                                  total_bytes=int(p.get("cpu_bytes", p["host_available_bytes"])), kind="cpu",
                                  node=node, threads=cores))
                continue
            gid = ",".join(p["gpu_ids"]) or str(i)
            uuid = (p["gpu_uuids"] or [f"RAY-{p['node_id'][:8]}-GPU{gid}"])[0]
            index = int(p["gpu_ids"][0]) if p["gpu_ids"] else i  # the GPU's id on its node (labels gpuN)
            measured = (p.get("gpu_total_bytes") or [None])[0]
            if measured is None:
                if not fallback:
                    fallback = int(80 * 2**30)
                if node not in self._fallback_noted:
                    self._fallback_noted.add(node)
                    self._note(f"node {node} has no NVML: its GPUs are taken to have {fallback / 2**30:.1f} GiB "
                               f"(executor.ray.gpu_memory_gb, else the driver's first GPU, else 80 GiB)")
            out.append(Device(ordinal=i, index=index, uuid=uuid, name=f"node {node} GPU {gid}",
                              total_bytes=int(measured or fallback), node=node))
        return out

    def read_memory(self, ordinals: list[int], timeout: float = 2.0) -> dict[int, dict]:
        """NVML on each live GPU actor's node: {ordinal: {used, total, utilization, jobs: {job: bytes}}}."""
        if not self.gpu_mode:
            return {}
        live = [o for o in ordinals if o not in self.lost and o < len(self.runners)]
        refs = {self.runners[o].memory.remote(): o for o in live}
        if not refs:
            return {}
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        out = {}
        for ref in ready:
            try:
                m = self.ray.get(ref)
            except Exception:
                continue
            if m:
                out[refs[ref]] = m
        return out

    # ------------------------------------------------------------------ attempts
    def start(self, launch: Launch) -> None:
        p = launch.paths
        p.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p.launch, launch.to_json(parent_pid=None))
        try:
            p.attempt(launch.attempt).unlink()
        except FileNotFoundError:
            pass
        env = {k: v for k, v in launch.env.items() if k != "CUDA_VISIBLE_DEVICES"}
        ordinals = [d["ordinal"] for d in launch.devices]
        lost = [o for o in ordinals if o in self.lost]
        if lost:
            raise RuntimeError(f"{launch.job_id} was given a lost device ({self.lost[lost[0]]})")
        if ordinals and self.runners:
            nodes = {self.placement[o]["node_id"] for o in ordinals}
            if len(nodes) > 1:
                raise RuntimeError(f"{launch.job_id} holds devices on {len(nodes)} nodes ({', '.join(sorted(nodes))}); "
                                   f"a k-device job needs its k devices on one node")
            runner = self.runners[ordinals[0]]
            gpu_ids = [g for o in ordinals for g in self.placement[o]["gpu_ids"]]
        else:
            runner, gpu_ids = self.host_runner, []
        run_dir = os.path.abspath(launch.run_dir)
        ref = runner.run.remote(launch.job_id, str(p.launch.resolve()), str(p.log.resolve()), env, gpu_ids, run_dir)
        self.tasks[launch.job_id] = _Task(launch, ref, runner, time.time(), ordinals)

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

    def _lost_finished(self, t: _Task, why: str) -> Finished:
        return finished_from(t.launch, None, t.started, "lost", why)

    def _actor_died(self, t: _Task, e: BaseException) -> Finished:
        """The attempt of an actor that died (its process or its node): lost, not the job's crash."""
        first = str(e).splitlines()[0] if str(e) else ""
        if t.runner is self.host_runner:
            self.host_runner = self._host_actor()  # the next host job gets a fresh one
            why = f"the host actor died ({type(e).__name__}: {first}); a new one runs the next host jobs"
        else:
            self._check_nodes()
            for o in t.ordinals:
                self._lose(o, f"its Ray actor died ({type(e).__name__}: {first})")
            why = self.lost[t.ordinals[0]]
        return self._lost_finished(t, why)

    def _collect(self, job_id: str, t: _Task) -> Finished | None:
        """How the attempt ended; None while a worker killed by a signal waits for its actor's
        ping (``_settled``)."""
        try:
            info = self.ray.get(t.ref)
        except Exception as e:  # the actor died (its process or its node)
            if t.forced_status:
                return finished_from(t.launch, None, t.started, t.forced_status, t.forced_reason)
            return self._actor_died(t, e)
        if info.get("missing"):
            where = {k: info.get(k) for k in ("node_ip", "hostname", "gpu_ids", "gpu_uuids")}
            return Finished(job_id, t.launch.attempt, "error", None,
                            f"node {info['node_ip']} cannot see the run folder ({info['missing']} is missing "
                            f"there): with the ray backend, system.output_dir must be on a file system shared "
                            f"by every node", extra=where)
        if (info.get("rc") or 0) < 0 and not t.forced_status:
            # Killed by a signal nobody here sent. An actor that is dying (its node gone, Ray
            # stopping it) SIGKILLs its children first and may still return their exit: that is
            # the device's loss, not the job's crash. Ask the actor whether it is still there.
            try:
                ping = t.runner.pids.remote()
            except Exception as e:  # noqa: BLE001 - a call Ray refuses to send: the actor is gone
                return self._actor_died(t, e)
            t.settle = (info, ping, time.time() + self.settle_s)
            return None
        return self._ended(t, info)

    def _ended(self, t: _Task, info: dict) -> Finished:
        where = {k: info.get(k) for k in ("node_ip", "hostname", "gpu_ids", "gpu_uuids")}
        return finished_from(t.launch, info["rc"], t.started, t.forced_status, t.forced_reason, extra=where)

    def _settled(self, t: _Task) -> Finished | None:
        """A signal-killed worker's verdict once its actor answers (a crash), dies or stays
        silent past ``settle_s`` (lost: the actor is killed, so no second writer is left)."""
        info, ping, deadline = t.settle
        if t.forced_status:
            return self._ended(t, info)
        ready, _ = self.ray.wait([ping], num_returns=1, timeout=0)
        if ready:
            try:
                self.ray.get(ping)
            except Exception as e:
                return self._actor_died(t, e)
            return self._ended(t, info)
        if time.time() < deadline:
            return None
        return self._actor_died(t, TimeoutError(f"no answer in {self.settle_s:.0f} s after its worker was "
                                                f"killed by signal {-info['rc']}"))

    def poll(self, timeout: float = 0.0) -> list[Finished]:
        now = time.time()
        out = []
        for jid, t in list(self.tasks.items()):
            if t.settle is not None and not any(o in self.lost for o in t.ordinals):
                f = self._settled(t)
                if f is not None:
                    out.append(f)
                    self.tasks.pop(jid)
                continue
            if any(o in self.lost for o in t.ordinals) and not t.forced_status:
                # its device left the inventory (its node is gone): the attempt is over now,
                # whenever Ray gets round to failing the call
                out.append(self._lost_finished(self.tasks.pop(jid), self.lost[next(o for o in t.ordinals
                                                                                    if o in self.lost)]))
                continue
            grace = t.grace_s if t.grace_s is not None else self.kill_grace_s
            if t.term_sent is not None and now - t.term_sent > grace:  # TERM went unheeded: KILL
                t.runner.signal.remote(jid, signal.SIGKILL)
                t.term_sent = now + 3600  # KILL sent; again only if the actor never answers
        if out:
            return out
        if not self.tasks:
            if timeout:
                time.sleep(min(timeout, 0.05))
            return []
        by_ref = {t.ref: jid for jid, t in self.tasks.items() if t.settle is None}
        if not by_ref:
            time.sleep(min(timeout, 0.05))
            return []
        ready, _ = self.ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        for ref in ready:
            jid = by_ref[ref]
            f = self._collect(jid, self.tasks[jid])
            if f is not None:
                out.append(f)
                self.tasks.pop(jid)
        return out

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
        for r in self.runners + list(self.pending.values()) + [self.host_runner]:
            try:
                self.ray.kill(r)  # any worker still there dies with it (PR_SET_PDEATHSIG)
            except Exception:
                pass
        self.pending.clear()
        if self.owns_ray:
            self.ray.shutdown()
        return finished
