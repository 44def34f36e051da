"""GPUManager: the device inventory (NVML first, torch.cuda next, CPU last) and memory queries.

    mgr = GPUManager.detect("auto")          # from the hardware, honouring CUDA_VISIBLE_DEVICES
    mgr = GPUManager.from_inventory(8, 80e9) # hand-built, for tests and the scheduler benchmark
    mgr.summary({0: 2})                      # ['GPU 0 (NVIDIA H100 80GB HBM3): 45.23 GB used, 80.00 GB total, 2 jobs']
    cpu.summary({0: 1}, {0: 4.3e8})          # ['CPU 0 (2 cores): 0.43 GB RSS of its jobs, 11.67 GB total, 1 job']

Device ``ordinal`` is the position in this inventory (what the scheduler uses); ``index`` is the
physical index as nvidia-smi shows it; ``uuid`` is stable across both. Child processes get
``CUDA_VISIBLE_DEVICES`` with physical indices and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA
numbers devices the way NVML and nvidia-smi do.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from pita.core import memory
from pita.core.errors import ConfigError

# device files of a GPU driver: NVIDIA (/dev/nvidia*), ROCm (/dev/kfd), WSL (/dev/dxg)
GPU_DRIVER_FILES = ("/dev/nvidia*", "/dev/kfd", "/dev/dxg")

log = logging.getLogger(__name__)



def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask (``taskset``, a cgroup cpuset, a batch
    scheduler's allocation) where the platform has one, else the machine's count. CPU devices and
    each job's thread budget are counted in these, so a run confined to one core of a shared
    machine gives its jobs one thread, not as many as the machine has."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)

@dataclass
class Device:
    ordinal: int
    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int = 0
    kind: str = "cuda"  # "cuda" or "cpu"
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes) where NVML reports it
    utilization: int | None = None  # GPU utilization (%) over NVML's last sample period, where it tells
    mig: int | None = None  # a MIG slice: its position on the parent GPU (``index``)
    node: str = ""  # the machine it is on ("" : this one); a k-device job takes k devices of one node
    threads: int | None = None  # a CPU device's cores (a Ray node's share), where not this machine's
    lost: str = ""  # why it left the inventory (its Ray node left the cluster); "" : in use
    job_bytes: dict[str, int] | None = None  # running job -> bytes, where read on its own node (Ray)

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)

    @property
    def label(self) -> str:
        if self.kind != "cuda":
            return f"cpu{self.index}"
        return f"gpu{self.index}" + (f"-mig{self.mig}" if self.mig is not None else "")

    @property
    def visible_id(self) -> str:
        """What CUDA_VISIBLE_DEVICES names this device by: its physical index, or a MIG slice's UUID."""
        return self.uuid if self.mig is not None else str(self.index)

    def describe(self) -> dict:
        return {"ordinal": self.ordinal, "index": self.index, "uuid": self.uuid, "name": self.name,
                "kind": self.kind, "total_bytes": self.total_bytes, **({"node": self.node} if self.node else {})}


def jobs_rss(pids_by_job: dict[str, set[int]], placement: dict[str, list[int]]) -> dict[int, int]:
    """Resident memory (RSS, bytes) of each device's running jobs: the processes of a job (its
    worker and the worker's children), its total split evenly over the devices it holds. A device
    appears once a process of one of its jobs could be measured. Pages a forked worker shares with
    the warm process it came from count in each worker's RSS, as ``ps`` shows them."""
    import psutil

    out: dict[int, int] = {}
    for job_id, pids in pids_by_job.items():
        ordinals = placement.get(job_id) or []
        total, seen = 0, False
        for pid in pids:
            try:
                total += psutil.Process(pid).memory_info().rss
                seen = True
            except psutil.Error:  # ended meanwhile
                continue
        if seen and ordinals:
            for o in ordinals:
                out[o] = out.get(o, 0) + total // len(ordinals)
    return out


def _nvml():
    """Import pynvml and initialise NVML; None when there is no driver or library."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def parse_visible_devices(value: str | None, physical: Sequence[tuple[int, str]]) -> list[int] | None:
    """Map ``CUDA_VISIBLE_DEVICES`` to physical indices.

    ``physical`` is [(index, uuid), ...] of every device the driver sees. Returns None when the
    variable is unset (all devices visible). Entries are indices or UUID prefixes (``GPU-1a2b``);
    like CUDA, the list ends at the first entry that names no device (with a warning).
    """
    if value is None:
        return None
    out: list[int] = []
    for raw in [v.strip() for v in value.split(",")]:
        hit = None
        if raw.lstrip("-").isdigit():
            i = int(raw)
            hit = next((idx for idx, _ in physical if idx == i), None)
        elif raw:
            hit = next((idx for idx, uuid in physical if uuid.startswith(raw) or uuid == "GPU-" + raw), None)
        if hit is None:
            if raw not in ("", "-1"):
                log.warning("CUDA_VISIBLE_DEVICES=%r: entry %r names no device; devices after it are hidden", value, raw)
            break
        if hit in out:
            log.warning("CUDA_VISIBLE_DEVICES=%r lists device %s twice; using it once", value, raw)
            continue
        out.append(hit)
    return out


def _mig_slices(nv, h) -> list[tuple[int, object]]:
    """(position, handle) of the MIG slices of a GPU with MIG on; [] when MIG is off or unknown."""
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(h)
    except (AttributeError, nv.NVMLError):  # not a MIG-capable GPU, or an old pynvml
        return []
    if not current:
        return []
    out = []
    for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            out.append((k, nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)))
        except nv.NVMLError:  # an empty slot
            continue
    return out


def _visible_slices(value: str | None, physical: list) -> list:
    """The MIG slices (and whole GPUs) CUDA_VISIBLE_DEVICES names: all of them when it is unset;
    MIG UUIDs (or their prefixes), GPU UUIDs and indices of GPUs without MIG otherwise. CUDA
    numbers no slice by an index, so an index of a GPU in MIG mode names nothing."""
    if value is None:
        return list(physical)
    out = []
    for raw in [v.strip() for v in value.split(",") if v.strip()]:
        hit = [p for p in physical if p[1] == raw or (raw.startswith(("MIG-", "GPU-")) and p[1].startswith(raw))
               or (raw.isdigit() and p[4] is None and p[0] == int(raw))]
        if not hit:
            log.warning("CUDA_VISIBLE_DEVICES=%r: entry %r names no device; devices after it are hidden", value, raw)
            break
        out += [p for p in hit if p not in out]
    return out


def _unmapped_driver(env, mgr) -> str | None:
    """When a GPU driver is present but no device could be mapped from CUDA_VISIBLE_DEVICES: the
    exit-2 message (a run would otherwise go on silently on the CPU)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None or value.strip() in ("", "-1"):  # unset (then nothing was found) or the CPU on purpose
        return None
    physical = getattr(mgr, "_physical", None) if mgr is not None else None
    if physical is None:  # no NVML: a driver's device files with no device CUDA can see
        files = sorted(f for p in GPU_DRIVER_FILES for f in glob.glob(p))
        if not files:
            return None
        return (f"CUDA_VISIBLE_DEVICES={value!r}: a GPU driver is present ({', '.join(files[:3])}) but no device is "
                f"visible through it; pita would otherwise run on the CPU. Set CUDA_VISIBLE_DEVICES to indices or "
                f"UUIDs from `nvidia-smi -L`, unset it, or run on the CPU on purpose with system.devices=cpu")
    if not physical:
        return None
    known = ", ".join(f"{i}: {u}" for i, u in physical)
    return (f"CUDA_VISIBLE_DEVICES={value!r} names no device this machine's driver reports ({known}); pita would "
            f"otherwise run on the CPU. Set CUDA_VISIBLE_DEVICES to indices or UUIDs from `nvidia-smi -L` (MIG slices "
            f"by their MIG- UUID), unset it to use every GPU, or run on the CPU on purpose with system.devices=cpu")


class GPUManager:
    """The devices this run may use, their memory, and the estimates that size jobs for them."""

    def __init__(self, devices: list[Device], source: str):
        self.devices = devices
        self.source = source  # "nvml", "torch", "cpu" or "manual"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_inventory(cls, devices: int | Iterable[float] | Iterable[tuple[str, float]],
                       total_bytes: float | None = None, kind: str = "cuda") -> "GPUManager":
        """A hand-built inventory: ``from_inventory(8, 80e9)`` or ``from_inventory([("A100", 40e9), ...])``."""
        if isinstance(devices, int):
            specs = [(f"Simulated GPU {i}", total_bytes or 80e9) for i in range(devices)]
        else:
            specs = [(d if isinstance(d, tuple) else (f"Simulated GPU {i}", d)) for i, d in enumerate(devices)]
        devs = [Device(ordinal=i, index=i, uuid=f"SIM-{i}", name=n, total_bytes=int(t), kind=kind)
                for i, (n, t) in enumerate(specs)]
        return cls(devs, source="manual")

    @classmethod
    def cpu_inventory(cls, n: int = 1) -> "GPUManager":
        """CPU-only mode: ``n`` logical devices sharing the host's available memory."""
        import psutil

        avail = psutil.virtual_memory().available
        cores = usable_cores()
        name = f"{cores} core{'s' if cores != 1 else ''}"
        devs = [Device(ordinal=i, index=i, uuid=f"CPU-{i}", name=name, total_bytes=int(avail // n), kind="cpu")
                for i in range(n)]
        return cls(devs, source="cpu")

    @classmethod
    def detect(cls, selection="auto", cpu_devices: int = 1, env: dict | None = None) -> "GPUManager":
        """Detect devices. ``selection``: "auto", "cpu", or a list of visible ordinals."""
        env = os.environ if env is None else env
        if isinstance(selection, str) and selection not in ("auto", "cpu"):
            raise ConfigError(f"system.devices={selection!r} is not valid; use auto, cpu, or a list of device indices like [0,1]")
        if selection == "cpu":
            return cls.cpu_inventory(cpu_devices)
        mgr = cls._detect_nvml(env) or cls._detect_torch()
        if mgr is None or not mgr.devices:
            unmapped = _unmapped_driver(env, mgr)
            if unmapped:
                raise ConfigError(unmapped)
            if selection != "auto":
                raise ConfigError(f"system.devices={list(selection)} asks for GPUs but none is visible; use system.devices=cpu or auto")
            return cls.cpu_inventory(cpu_devices)
        if selection != "auto":
            mgr = mgr.restrict(list(selection))
        return mgr

    @classmethod
    def _detect_nvml(cls, env) -> "GPUManager | None":
        nv = _nvml()
        if nv is None:
            return None
        try:
            # (index, uuid, name, handle, mig slice) of every device CUDA can be given: a GPU, or
            # with MIG on, each of its slices (a slice is a device of its own size, named by UUID)
            physical = []
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = _text(nv.nvmlDeviceGetName(h))
                slices = _mig_slices(nv, h)
                if slices:
                    physical += [(i, _text(nv.nvmlDeviceGetUUID(m)), f"{name} MIG {k}", m, k) for k, m in slices]
                else:
                    physical.append((i, _text(nv.nvmlDeviceGetUUID(h)), name, h, None))
            if not physical:
                return None
            value = env.get("CUDA_VISIBLE_DEVICES")
            if any(p[4] is not None for p in physical):  # MIG: CUDA_VISIBLE_DEVICES names slices by UUID
                chosen = _visible_slices(value, physical)
            else:
                visible = parse_visible_devices(value, [(p[0], p[1]) for p in physical])
                chosen = physical if visible is None else [next(p for p in physical if p[0] == v) for v in visible]
            devs = []
            for ordinal, (i, uuid, name, h, mig) in enumerate(chosen):
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                devs.append(Device(ordinal, i, uuid, name, int(mem.total), int(mem.used), mig=mig))
            mgr = cls(devs, source="nvml")
            mgr._physical = [(p[0], p[1]) for p in physical]
            mgr._nvml_handles = {d.ordinal: p[3] for d, p in zip(devs, chosen)}
            mgr.refresh()
            return mgr
        except nv.NVMLError as e:
            log.warning("NVML is present but failed (%s); trying torch.cuda", e)
            return None

    @classmethod
    def _detect_torch(cls) -> "GPUManager | None":
        """torch.cuda, for GPUs NVML does not see (ROCm, some containers). Only where a GPU driver's
        device files exist: importing torch costs the orchestrator a second, and a machine with no
        driver has no device torch could find."""
        if not any(glob.glob(p) for p in GPU_DRIVER_FILES):
            return None
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        devs = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            uuid = str(getattr(p, "uuid", f"cuda-{i}"))
            # torch gives the bare UUID; CUDA_VISIBLE_DEVICES names a MIG slice by MIG-<uuid>, a GPU by
            # GPU-<uuid> (a slice's name says MIG, as in "NVIDIA A100-SXM4-40GB MIG 3g.20gb")
            prefix = "MIG-" if " MIG " in f" {p.name} " else "GPU-"
            if not uuid.startswith(("GPU-", "MIG-")):
                uuid = prefix + uuid
            devs.append(Device(i, i, uuid, p.name, int(total), int(total - free), mig=0 if prefix == "MIG-" else None))
        return cls(devs, source="torch")

    def restrict(self, ordinals: list[int]) -> "GPUManager":
        n = len(self.devices)
        bad = [o for o in ordinals if not isinstance(o, int) or isinstance(o, bool) or not 0 <= o < n]
        if bad:
            raise ConfigError(f"system.devices={ordinals}: {bad} out of range; visible devices are 0..{n - 1} "
                              f"({', '.join(d.name for d in self.devices)})")
        if len(set(ordinals)) != len(ordinals):
            raise ConfigError(f"system.devices={ordinals} lists a device twice; list each index once")
        devs = []
        handles = getattr(self, "_nvml_handles", {})
        new_handles = {}
        for new, o in enumerate(ordinals):
            d = self.devices[o]
            devs.append(Device(new, d.index, d.uuid, d.name, d.total_bytes, d.used_bytes, d.kind, list(d.processes),
                               d.mig))
            if o in handles:
                new_handles[new] = handles[o]
        mgr = GPUManager(devs, self.source)
        mgr._nvml_handles = new_handles
        return mgr

    # ------------------------------------------------------------------ queries
    @property
    def is_cpu(self) -> bool:
        return all(d.kind == "cpu" for d in self.devices)

    def refresh(self) -> None:
        """Re-read used memory and per-process usage (NVML); a no-op for other sources."""
        handles = getattr(self, "_nvml_handles", None)
        if not handles:
            return
        import pynvml as nv

        for d in self.devices:
            h = handles[d.ordinal]
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                d.used_bytes, d.total_bytes = int(mem.used), int(mem.total)
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
                d.processes = [(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs]
            except nv.NVMLError as e:  # per-process usage is not available everywhere (containers, MIG)
                log.debug("NVML query failed on %s: %s", d.label, e)
            try:
                d.utilization = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except (AttributeError, nv.NVMLError):  # MIG slices report none
                d.utilization = None

    def process_usage(self, ordinal: int, pids: set[int], job_id: str | None = None) -> int:
        """Bytes used on a device by the given processes (0 where NVML does not tell), or by the
        job as its node measured it (a Ray node's NVML: pids there are not this machine's)."""
        d = self.devices[ordinal]
        if d.job_bytes is not None and job_id is not None:
            return int(d.job_bytes.get(job_id, 0))
        return sum(b for pid, b in d.processes if pid in pids)

    def summary(self, jobs_per_device: dict[int, int] | None = None,
                rss_per_device: dict[int, int] | None = None,
                torch_per_device: dict[int, tuple[int, int]] | None = None) -> list[str]:
        """One line per device. A GPU's used memory is the device's own figure; a CPU device has
        none (its "used" would be 0 or the whole host's), so it shows the resident memory of the
        processes of its jobs where that was measured (``rss_per_device``: ordinal -> bytes, see
        :func:`jobs_rss`), and no figure otherwise."""
        jobs_per_device = jobs_per_device or {}
        rss_per_device = rss_per_device or {}
        torch_per_device = torch_per_device or {}
        lines = []
        for d in self.devices:
            n = jobs_per_device.get(d.ordinal, 0)
            if d.lost:
                lines.append(f"{'GPU' if d.kind == 'cuda' else 'CPU'} {d.index} ({d.name}): lost, {d.lost}")
                continue
            if d.kind == "cuda":
                kind, used = "GPU", f"{d.used_bytes / memory.GB:.2f} GB used, "
                if d.utilization is not None:
                    used += f"GPU utilization {d.utilization}%, "
                if d.ordinal in torch_per_device:  # what the jobs' torch holds (reported by their workers)
                    a, r = torch_per_device[d.ordinal]
                    used += f"torch allocated {a / memory.GB:.2f} GB / reserved {r / memory.GB:.2f} GB, "
            else:
                rss = rss_per_device.get(d.ordinal)
                kind, used = "CPU", (f"{rss / memory.GB:.2f} GB RSS of its jobs, " if rss is not None and n else "")
            lines.append(f"{kind} {d.index} ({d.name}): {used}{d.total_bytes / memory.GB:.2f} GB total, "
                         f"{n} job{'s' if n != 1 else ''}")
        return lines

    def capacities(self) -> list[float]:
        return [float(d.total_bytes) for d in self.devices]

    def distribute(self, n_items: int) -> list[int]:
        """Split ``n_items`` across the devices proportionally to their memory."""
        return memory.split_proportionally(n_items, self.capacities())

    def largest_batch(self, estimate, ordinal: int = 0, margin: float = 0.1) -> int:
        """The largest batch whose estimate fits the device's free memory with a safety margin."""
        return memory.largest_batch(estimate, self.devices[ordinal].free_bytes, margin)

    def env_for(self, ordinals: Sequence[int], threads: int | None = None) -> dict[str, str]:
        """Environment for a child that may use exactly these devices (set before torch starts)."""
        devs = [self.devices[o] for o in ordinals]
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        if devs and all(d.kind == "cuda" for d in devs):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(d.visible_id for d in devs)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU jobs never touch a GPU
        if threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        return env


@dataclass(frozen=True)
class Card:
    """A GPU model an inventory may name: the memory NVML reports for it (MiB), and the figures
    the duration model scales by (dense bf16 tensor TFLOP/s, or fp16 where the card has no bf16;
    memory bandwidth TB/s), from the vendors' data sheets."""

    name: str
    memory_mib: int
    tflops: float
    hbm_tbs: float


CARDS = {c.name: c for c in (
    Card("H100-SXM", 81559, 989, 3.35), Card("H100-PCIE", 81559, 756, 2.0), Card("H100-NVL", 95830, 835, 3.9),
    Card("H200", 143771, 989, 4.8), Card("GH200", 97871, 989, 4.0), Card("B200", 183359, 2250, 8.0),
    Card("A100-80GB", 81920, 312, 2.04), Card("A100-40GB", 40960, 312, 1.56),
    Card("L40S", 46068, 362, 0.864), Card("L40", 46068, 181, 0.864), Card("A6000", 49140, 155, 0.768),
    Card("A10G", 23028, 70, 0.6), Card("A10", 23028, 125, 0.6), Card("L4", 23034, 121, 0.3),
    Card("RTX4090", 24564, 165, 1.0), Card("V100-32GB", 32768, 125, 0.9), Card("V100-16GB", 16384, 125, 0.9),
    Card("T4", 15360, 65, 0.32),
)}
# other names of one card; a name that is several cards is refused with the choice (AMBIGUOUS)
CARD_ALIASES = {"H100": "H100-SXM", "H100-80GB": "H100-SXM", "H100-SXM5": "H100-SXM", "A100-SXM4-80GB": "A100-80GB",
                "A100-SXM4-40GB": "A100-40GB", "RTX-4090": "RTX4090", "RTXA6000": "A6000", "RTX-A6000": "A6000"}
AMBIGUOUS = {"A100": ("A100-40GB", "A100-80GB"), "V100": ("V100-16GB", "V100-32GB")}
# the card durations are computed for when an inventory gives sizes only, or the GPU is not in CARDS
DEFAULT_CARD = "H100-SXM"
# What NVML reports as total memory (MiB) for GPUs an inventory may name (system.inventory=8xH100)
GPU_MEMORY_MIB = {**{n: c.memory_mib for n, c in CARDS.items()},
                  **{a: CARDS[n].memory_mib for a, n in CARD_ALIASES.items()}}


def card_of(name: str) -> Card | None:
    """The card a GPU name means (an inventory's ``A100-40GB``, or NVML's ``NVIDIA A100-SXM4-80GB``);
    None when pita does not know it or it is ambiguous."""
    key = name.upper().replace("NVIDIA", "").replace("TESLA", "").strip().replace(" ", "-").replace("_", "-")
    key = CARD_ALIASES.get(key, key)
    if key in CARDS:
        return CARDS[key]
    for n in sorted(CARDS, key=len, reverse=True):  # NVML's long names: "H100-80GB-HBM3" -> H100
        if key.startswith(n):
            return CARDS[n]
    for a in sorted(CARD_ALIASES, key=len, reverse=True):
        if key.startswith(a) and not (a in ("H100", "H100-80GB") and "PCIE" in key):
            return CARDS[CARD_ALIASES[a]]
    if "PCIE" in key and key.startswith("H100"):
        return CARDS["H100-PCIE"]
    return None


def known_card(names: list[str]) -> str | None:
    """The card every device is, when pita knows it and they are all one card; else None."""
    cards = {c.name if c is not None else None for c in (card_of(n) for n in names)}
    return next(iter(cards)) if len(cards) == 1 and None not in cards else None


def plan_card(names: list[str]) -> tuple[Card, str]:
    """The card a plan's durations are computed for, and a note saying why: the devices' own
    card when they name one (the slowest, when they name several), else DEFAULT_CARD."""
    known = [c for c in (card_of(n) for n in names) if c is not None]
    if not known:
        return CARDS[DEFAULT_CARD], (f"{DEFAULT_CARD} speed assumed (the devices do not name a GPU pita knows; "
                                     f"name the card in system.inventory, e.g. 8xA100-80GB)")
    slowest = min(known, key=lambda c: c.tflops)
    if len({c.name for c in known}) > 1 or len(known) < len(names):
        return slowest, f"{slowest.name} speed assumed for every device (the slowest card named)"
    return slowest, f"{slowest.name}"


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(GB|GIB|G|MB|MIB)$")
_COUNT = re.compile(r"^(\d+)\s*[xX*]\s*(.+)$")


def parse_inventory(value) -> list[tuple[str, int]]:
    """``system.inventory`` as (name, total bytes) per device: ``8x80GB``, ``8xH100``,
    ``[80GB,80GB,40GB]``, ``2xA100-40GB,2xL4``. GB are 10^9 bytes and GiB 2^30; a GPU name gets
    the memory NVML reports for it (:data:`GPU_MEMORY_MIB`). ConfigError names what is wrong."""
    items = str(value).strip().strip("[]").split(",") if isinstance(value, (str, int, float)) \
        else [str(x) for x in value]
    fix = ("write N x SIZE or N x GPU, e.g. system.inventory=8x80GB, system.inventory=8xH100 or "
           "system.inventory=[80GB,80GB,40GB]; known GPUs: " + ", ".join(CARDS))
    devices: list[tuple[str, int]] = []
    problems = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        n, what = 1, item
        m = _COUNT.match(item)
        if m:
            n, what = int(m.group(1)), m.group(2).strip()
        size = _SIZE.match(what.upper().replace(" ", ""))
        if size:
            x, unit = float(size.group(1)), size.group(2)
            total = int(x * {"GB": 1e9, "G": 1e9, "GIB": 2**30, "MB": 1e6, "MIB": 2**20}[unit])
            name = f"{x:g} {unit.replace('GIB', 'GiB').replace('MIB', 'MiB')} GPU"
        else:
            key_ = what.upper().replace("NVIDIA", "").replace(" ", "").replace("_", "-")
            if key_ in AMBIGUOUS:
                problems.append(f"system.inventory={value!r}: {key_} is {len(AMBIGUOUS[key_])} cards with different "
                                f"memory; write {' or '.join(AMBIGUOUS[key_])} (e.g. {n}x{AMBIGUOUS[key_][-1]})")
                continue
            if key_ not in GPU_MEMORY_MIB:
                problems.append(f"system.inventory={value!r}: {item!r} is neither a size nor a GPU pita knows; {fix}")
                continue
            name = CARD_ALIASES.get(key_, key_)
            total = GPU_MEMORY_MIB[name] * 2**20
        if n < 1 or total <= 0:
            problems.append(f"system.inventory={value!r}: {item!r} describes no memory; {fix}")
            continue
        devices += [(name, total)] * n
    if not devices and not problems:
        problems.append(f"system.inventory={value!r} lists no device; {fix}")
    if problems:
        raise ConfigError(problems)
    return devices
