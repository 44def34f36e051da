"""pita.core.gpu_manager: hand-built inventories, CUDA_VISIBLE_DEVICES parsing, child env, and
detection with a fake NVML (no GPU or driver needed)."""

from __future__ import annotations

import logging
import os
import re
import sys
import types
from types import SimpleNamespace

import pytest

from pita.core import gpu_manager
from pita.core.errors import ConfigError
from pita.core.gpu_manager import GPUManager, parse_visible_devices

GB = 10**9


# ---------------------------------------------------------------- from_inventory and summary
def test_from_inventory_summary_lines():
    mgr = GPUManager.from_inventory(8, 80e9)
    assert mgr.source == "manual"
    assert [d.ordinal for d in mgr.devices] == list(range(8))
    lines = mgr.summary({0: 2, 3: 1})
    assert len(lines) == 8
    assert lines[0] == "GPU 0 (Simulated GPU 0): 0.00 GB used, 80.00 GB total, 2 jobs"
    assert lines[3] == "GPU 3 (Simulated GPU 3): 0.00 GB used, 80.00 GB total, 1 job"
    assert lines[7] == "GPU 7 (Simulated GPU 7): 0.00 GB used, 80.00 GB total, 0 jobs"
    assert mgr.summary()[1] == "GPU 1 (Simulated GPU 1): 0.00 GB used, 80.00 GB total, 0 jobs"


def test_summary_shows_used_memory_and_cpu_kind():
    mgr = GPUManager.from_inventory([("A100", 40e9), ("H100", 80e9)])
    mgr.devices[1].used_bytes = int(45.234e9)
    assert mgr.summary({1: 1}) == [
        "GPU 0 (A100): 0.00 GB used, 40.00 GB total, 0 jobs",
        "GPU 1 (H100): 45.23 GB used, 80.00 GB total, 1 job",
    ]
    cpu = GPUManager.from_inventory(1, 16e9, kind="cpu")
    assert cpu.summary() == ["CPU 0 (Simulated GPU 0): 16.00 GB total, 0 jobs"]
    assert cpu.is_cpu and not mgr.is_cpu


def test_cpu_devices_show_their_jobs_rss_and_gpus_their_used_memory():
    """A CPU device has no "used" figure of its own: it shows the RSS of its jobs' processes
    where that was measured and nothing otherwise (never a meaningless 0.00 GB used)."""
    cpu = GPUManager.from_inventory(2, 16e9, kind="cpu")
    assert cpu.summary({0: 1, 1: 1}, {0: int(0.43e9)}) == [
        "CPU 0 (Simulated GPU 0): 0.43 GB RSS of its jobs, 16.00 GB total, 1 job",
        "CPU 1 (Simulated GPU 1): 16.00 GB total, 1 job"]
    assert cpu.summary({1: 0}, {1: 5 * GB}) == ["CPU 0 (Simulated GPU 0): 16.00 GB total, 0 jobs",
                                                 "CPU 1 (Simulated GPU 1): 16.00 GB total, 0 jobs"]
    gpu = GPUManager.from_inventory([("H100", 80e9)])
    gpu.devices[0].used_bytes = 3 * GB
    assert gpu.summary({0: 1}, {0: 7 * GB}) == ["GPU 0 (H100): 3.00 GB used, 80.00 GB total, 1 job"]


def test_jobs_rss_measures_each_jobs_processes_per_device():
    import os
    import subprocess

    import psutil

    mine = psutil.Process().memory_info().rss
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        theirs = psutil.Process(child.pid).memory_info().rss
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        rss = gpu_manager.jobs_rss({"a": {os.getpid(), child.pid, gone.pid}, "b": {os.getpid()},
                                    "c": {gone.pid}, "d": {os.getpid()}},
                                   {"a": [0], "b": [1, 2], "c": [3], "d": []})
    finally:
        child.kill()
        child.wait()
    assert 0.8 * (mine + theirs) < rss[0] < 1.25 * (mine + theirs)  # a job's processes together
    assert rss[1] == rss[2] and abs(rss[1] - mine / 2) < 0.2 * mine  # split over its two devices
    assert 3 not in rss  # nothing measured: no figure


def test_from_inventory_list_of_sizes():
    mgr = GPUManager.from_inventory([80e9, 40e9])
    assert [(d.name, d.total_bytes, d.uuid) for d in mgr.devices] == [
        ("Simulated GPU 0", 80 * GB, "SIM-0"), ("Simulated GPU 1", 40 * GB, "SIM-1")]
    assert mgr.capacities() == [80e9, 40e9]
    assert mgr.devices[1].label == "gpu1"


# ---------------------------------------------------------------- restrict
def test_restrict_keeps_physical_index_and_renumbers_ordinals():
    mgr = GPUManager.from_inventory([("a", 10e9), ("b", 20e9), ("c", 30e9)]).restrict([2, 0])
    assert [(d.ordinal, d.index, d.name) for d in mgr.devices] == [(0, 2, "c"), (1, 0, "a")]
    assert mgr.summary()[0].startswith("GPU 2 (c):")


@pytest.mark.parametrize("sel", [[8], [0, -1], [True]])
def test_restrict_out_of_range_names_system_devices(sel):
    mgr = GPUManager.from_inventory(8, 80e9)
    with pytest.raises(ConfigError) as ei:
        mgr.restrict(sel)
    assert "system.devices" in str(ei.value)
    assert "out of range" in str(ei.value)
    assert "0..7" in str(ei.value)


def test_restrict_duplicates_raise():
    with pytest.raises(ConfigError) as ei:
        GPUManager.from_inventory(4, 80e9).restrict([1, 1])
    assert "system.devices" in str(ei.value) and "twice" in str(ei.value)


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES
PHYS = [(0, "GPU-aaaa1111"), (1, "GPU-bbbb2222"), (2, "GPU-cccc3333"), (3, "GPU-dddd4444")]


@pytest.mark.parametrize("value,expected", [
    (None, None),
    ("2,0", [2, 0]),
    (" 3 , 1 ", [3, 1]),
    ("GPU-cccc,GPU-a", [2, 0]),           # UUID prefixes
    ("GPU-bbbb2222", [1]),
    ("bbbb2222", [1]),                    # full UUID without the GPU- prefix
    ("1,GPU-dddd", [1, 3]),
    ("0,7,1", [0]),                       # 7 names no device: the list ends there
    ("2,GPU-zzzz,1", [2]),
    ("1,-1,0", [1]),
    ("-1", []),
    ("", []),
    ("0,0,1", [0, 1]),                    # a repeat is used once
])
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value, PHYS) == expected


def test_parse_visible_devices_warns_on_a_bad_entry_only(caplog):
    with caplog.at_level(logging.WARNING, logger="pita.core.gpu_manager"):
        parse_visible_devices("-1", PHYS)
        parse_visible_devices("", PHYS)
    assert caplog.records == []
    with caplog.at_level(logging.WARNING, logger="pita.core.gpu_manager"):
        parse_visible_devices("0,9", PHYS)
    assert any("'9'" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- env_for
def test_env_for_uses_physical_indices():
    mgr = GPUManager.from_inventory(4, 80e9).restrict([3, 1, 2])
    env = mgr.env_for([0, 2])
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "3,2"}
    assert mgr.env_for([1], threads=4) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1",
                                           "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}


def test_env_for_cpu_devices_and_cpu_jobs_hide_gpus():
    cpu = GPUManager.from_inventory(2, 8e9, kind="cpu")
    assert cpu.env_for([1])["CUDA_VISIBLE_DEVICES"] == ""
    gpu = GPUManager.from_inventory(2, 80e9)
    assert gpu.env_for([]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ""}


# ---------------------------------------------------------------- distribute / largest_batch
def test_distribute_is_proportional_to_memory():
    assert GPUManager.from_inventory([80e9, 40e9, 40e9]).distribute(10) == [5, 3, 2]
    assert GPUManager.from_inventory([80e9, 40e9]).distribute(9) == [6, 3]
    assert GPUManager.from_inventory(4, 80e9).distribute(6) == [2, 2, 1, 1]


def test_largest_batch_uses_free_memory_of_the_device():
    mgr = GPUManager.from_inventory([1000, 2000])
    mgr.devices[1].used_bytes = 1000  # 1000 free
    # budget 1000 * 0.9 = 900: 100 + 7b <= 900 -> 114 on both
    assert mgr.largest_batch(lambda b: 100 + 7 * b, ordinal=1) == 114
    assert mgr.largest_batch(lambda b: 100 + 7 * b, ordinal=0) == 114
    mgr.devices[1].used_bytes = 0  # 2000 free: budget 1800 -> 100 + 7b <= 1800 -> 242
    assert mgr.largest_batch(lambda b: 100 + 7 * b, ordinal=1) == 242


# ---------------------------------------------------------------- detect
def _gpu_present() -> bool:
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except ImportError:
        pass
    return gpu_manager._nvml() is not None


def test_detect_without_gpu_gives_cpu_inventory():
    if _gpu_present():
        pytest.skip("this machine has a GPU")
    mgr = GPUManager.detect("auto", cpu_devices=2, env={})
    assert mgr.source == "cpu"
    assert mgr.is_cpu
    assert [d.uuid for d in mgr.devices] == ["CPU-0", "CPU-1"]
    assert all(d.total_bytes > 0 for d in mgr.devices)
    with pytest.raises(ConfigError, match="system.devices"):
        GPUManager.detect([0], env={})


def test_detect_cpu_and_bad_selection():
    mgr = GPUManager.detect("cpu", cpu_devices=3)
    assert mgr.source == "cpu" and len(mgr.devices) == 3
    assert re.match(r"CPU 2 \(\d+ cores?\): ", mgr.summary()[2]), mgr.summary()[2]
    with pytest.raises(ConfigError) as ei:
        GPUManager.detect("gpu")
    assert "system.devices='gpu'" in str(ei.value)


class FakeNVMLError(Exception):
    pass


def fake_pynvml(totals_gb=(80, 40, 24, 16), used_gb=(1, 2, 3, 4), init_error=False, count_error=False):
    """A pynvml stand-in with ``len(totals_gb)`` GPUs; handles are the physical indices."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.calls = []

    def nvmlInit():
        m.calls.append("init")
        if init_error:
            raise FakeNVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount():
        if count_error:
            raise FakeNVMLError("Unknown Error")
        return len(totals_gb)

    m.nvmlInit = nvmlInit
    m.nvmlDeviceGetCount = nvmlDeviceGetCount
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h[1]}{h[1]}{h[1]}-uuid".encode()  # bytes, like old pynvml
    m.nvmlDeviceGetName = lambda h: f"Fake GPU {h[1]}"
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=int(totals_gb[h[1]] * GB),
                                                          used=int(used_gb[h[1]] * GB),
                                                          free=int((totals_gb[h[1]] - used_gb[h[1]]) * GB))
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        SimpleNamespace(pid=1000 + h[1], usedGpuMemory=int(0.5 * GB)),
        SimpleNamespace(pid=2000 + h[1], usedGpuMemory=None),  # not reported (containers)
    ]
    return m


def test_detect_with_fake_nvml_honours_cuda_visible_devices(monkeypatch):
    fake = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    mgr = GPUManager.detect("auto", env={"CUDA_VISIBLE_DEVICES": "2,0"})
    assert "init" in fake.calls
    assert mgr.source == "nvml"
    assert [(d.ordinal, d.index, d.uuid, d.name, d.kind) for d in mgr.devices] == [
        (0, 2, "GPU-222-uuid", "Fake GPU 2", "cuda"),
        (1, 0, "GPU-000-uuid", "Fake GPU 0", "cuda"),
    ]
    assert [d.total_bytes for d in mgr.devices] == [24 * GB, 80 * GB]
    assert [d.used_bytes for d in mgr.devices] == [3 * GB, 1 * GB]
    assert mgr.devices[0].processes == [(1002, int(0.5 * GB)), (2002, 0)]
    assert mgr.process_usage(0, {1002, 2002, 1000}) == int(0.5 * GB)
    assert mgr.process_usage(1, {1002}) == 0
    assert mgr.env_for([0, 1])["CUDA_VISIBLE_DEVICES"] == "2,0"
    assert mgr.summary({1: 1}) == ["GPU 2 (Fake GPU 2): 3.00 GB used, 24.00 GB total, 0 jobs",
                                   "GPU 0 (Fake GPU 0): 1.00 GB used, 80.00 GB total, 1 job"]


def test_detect_with_fake_nvml_all_visible_and_selection(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    mgr = GPUManager.detect("auto", env={})
    assert [d.index for d in mgr.devices] == [0, 1, 2, 3]
    # system.devices=[1] picks the second *visible* device: physical 0 when CUDA_VISIBLE_DEVICES=2,0
    sub = GPUManager.detect([1], env={"CUDA_VISIBLE_DEVICES": "2,0"})
    assert [(d.ordinal, d.index, d.uuid) for d in sub.devices] == [(0, 0, "GPU-000-uuid")]
    assert sub.env_for([0])["CUDA_VISIBLE_DEVICES"] == "0"
    # the restricted inventory still refreshes from NVML (its handle followed the device)
    sub.devices[0].used_bytes = 0
    sub.refresh()
    assert sub.devices[0].used_bytes == 1 * GB
    with pytest.raises(ConfigError, match="system.devices"):
        GPUManager.detect([2], env={"CUDA_VISIBLE_DEVICES": "2,0"})


def test_detect_with_fake_nvml_uuid_visible_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    mgr = GPUManager.detect("auto", env={"CUDA_VISIBLE_DEVICES": "GPU-333,GPU-111"})
    assert [d.index for d in mgr.devices] == [3, 1]


def test_detect_with_everything_hidden_falls_back_to_cpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    mgr = GPUManager.detect("auto", cpu_devices=1, env={"CUDA_VISIBLE_DEVICES": "-1"})
    assert mgr.source == "cpu" and mgr.is_cpu


def _no_torch_cuda(monkeypatch):
    try:
        import torch
    except ImportError:
        return
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("where", ["init", "count"])
def test_detect_nvml_error_falls_back_to_cpu(monkeypatch, where):
    fake = fake_pynvml(init_error=where == "init", count_error=where == "count")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    _no_torch_cuda(monkeypatch)  # torch has no CUDA here; make that true on any machine
    mgr = GPUManager.detect("auto", cpu_devices=2, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert fake.calls == ["init"]
    assert mgr.source == "cpu"
    assert len(mgr.devices) == 2 and mgr.is_cpu


# ---------------------------------------------------------------- containers and MIG
def test_in_a_container_our_jobs_are_not_counted_twice(monkeypatch):
    """NVML reports host pids, which never match our workers: two 25 GB jobs using 22 GB each on
    an 80 GB card leave 80 - 50 = 30 GB (less the margin), not 80 - 44 - 50 < 0."""
    from pita.core.scheduler import DeviceLoad

    fake = fake_pynvml(totals_gb=(80,), used_gb=(44,))
    fake.nvmlDeviceGetComputeRunningProcesses = lambda h: [SimpleNamespace(pid=900001, usedGpuMemory=int(22 * GB)),
                                                           SimpleNamespace(pid=900002, usedGpuMemory=int(22 * GB))]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    mgr = GPUManager.detect("auto", env={})
    ours = {"a": {os.getpid()}, "b": {os.getpid() + 1}}  # the workers as this pid namespace sees them
    load = DeviceLoad(mgr.devices[0].total_bytes, margin_bytes=int(4 * GB), measured_used=mgr.devices[0].used_bytes,
                      reserved={"a": int(25 * GB), "b": int(25 * GB)},
                      usage={j: mgr.process_usage(0, pids) for j, pids in ours.items()})
    assert load.usage == {"a": 0, "b": 0}
    assert load.others() == 0
    assert load.available() == int(80 * GB) - int(4 * GB) - int(50 * GB)  # 26 GB
    # where NVML does attribute memory to our workers, the measured figures are used as before
    load.usage = {"a": int(22 * GB), "b": int(22 * GB)}
    load.measured_used = int(50 * GB)  # 6 GB of someone else's
    assert load.others() == int(6 * GB)


def fake_mig(monkeypatch):
    """GPU 0 (80 GB) in MIG mode with two slices (3g.40gb and 2g.20gb); GPU 1 (80 GB) without."""
    fake = fake_pynvml(totals_gb=(80, 80), used_gb=(0, 1))
    slices = {0: [("MIG-aaaa-1111", 40), ("MIG-bbbb-2222", 20)]}
    fake.nvmlDeviceGetMigMode = lambda h: (1, 1) if h[1] in slices else (0, 0)
    fake.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def slice_handle(h, k):
        if k >= len(slices.get(h[1], [])):
            raise FakeNVMLError("Not Found")
        return ("mig", h[1], k)

    fake.nvmlDeviceGetMigDeviceHandleByIndex = slice_handle
    uuid, mem = fake.nvmlDeviceGetUUID, fake.nvmlDeviceGetMemoryInfo
    fake.nvmlDeviceGetUUID = lambda h: slices[h[1]][h[2]][0] if h[0] == "mig" else uuid(h)
    fake.nvmlDeviceGetMemoryInfo = lambda h: (SimpleNamespace(total=int(slices[h[1]][h[2]][1] * GB), used=0, free=0)
                                              if h[0] == "mig" else mem(h))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_mig_slices_are_devices_of_their_own_size(monkeypatch):
    fake_mig(monkeypatch)
    mgr = GPUManager.detect("auto", env={})
    assert [(d.label, d.uuid, d.total_bytes // GB) for d in mgr.devices] == [
        ("gpu0-mig0", "MIG-aaaa-1111", 40), ("gpu0-mig1", "MIG-bbbb-2222", 20), ("gpu1", "GPU-111-uuid", 80)]
    assert mgr.env_for([1])["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb-2222"  # CUDA names a slice by its UUID
    assert mgr.env_for([2])["CUDA_VISIBLE_DEVICES"] == "1"
    only = GPUManager.detect("auto", env={"CUDA_VISIBLE_DEVICES": "MIG-bbbb"})
    assert [(d.uuid, d.total_bytes // GB) for d in only.devices] == [("MIG-bbbb-2222", 20)]


@pytest.mark.parametrize("value", ["7", "MIG-ffff-0000", "GPU-999"])
def test_a_driver_with_no_device_mapped_is_exit_2_not_a_silent_cpu_run(monkeypatch, value):
    fake_mig(monkeypatch)
    with pytest.raises(ConfigError) as e:
        GPUManager.detect("auto", env={"CUDA_VISIBLE_DEVICES": value})
    msg = str(e.value)
    assert f"CUDA_VISIBLE_DEVICES={value!r} names no device" in msg and "MIG-aaaa-1111" in msg
    assert "nvidia-smi -L" in msg and "system.devices=cpu" in msg
    # hiding every GPU on purpose is still the CPU
    assert GPUManager.detect("auto", env={"CUDA_VISIBLE_DEVICES": ""}).is_cpu


def test_device_lines_carry_gpu_utilization_and_torch_memory(monkeypatch):
    """What seed 004 tells users to grep run.log for: "GPU utilization", "allocated", "reserved"."""
    fake = fake_pynvml(totals_gb=(80,), used_gb=(30,))
    fake.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=37, memory=12)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    mgr = GPUManager.detect("auto", env={})
    [line] = mgr.summary({0: 1}, None, {0: (int(21 * GB), int(24 * GB))})
    assert line == ("GPU 0 (Fake GPU 0): 30.00 GB used, GPU utilization 37%, torch allocated 21.00 GB / "
                    "reserved 24.00 GB, 80.00 GB total, 1 job")


def test_a_worker_reports_what_its_torch_holds(tmp_path, monkeypatch):
    import json
    import time

    import torch

    from pita.core import worker

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: (i + 1) * GB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: (i + 2) * GB)
    monkeypatch.setattr(worker, "_MEMORY_REPORT", {})
    path = tmp_path / "torch-memory.json"
    worker._report_torch_memory(path, every_s=0.05)
    for _ in range(100):
        if path.exists():
            break
        time.sleep(0.05)
    m = json.loads(path.read_text())
    assert (m["allocated"], m["reserved"]) == (3 * GB, 5 * GB)


def test_a_k_device_job_on_mig_slices_is_refused(monkeypatch):
    from pita.cli.run import mig_problems
    from pita.core.job import Job, Resources

    fake_mig(monkeypatch)
    mgr = GPUManager.detect("auto", env={})
    jobs = [Job("DPO.m.d.r0.train", "algo.dpo_train", resources=Resources(2, 10.0)),
            Job("PITA.m.d.r0.train", "algo.value_train", resources=Resources(1, 10.0))]
    [line] = mig_problems(jobs, mgr)
    assert "algos.DPO.devices=1" in line and "MIG slices" in line
    whole = GPUManager.from_inventory(2, 80e9)
    assert mig_problems(jobs, whole) == []


def test_devices_found_through_torch_name_a_mig_slice_by_its_mig_uuid(monkeypatch):
    """Where NVML is absent, torch lists the devices with bare UUIDs; CUDA_VISIBLE_DEVICES names a
    MIG slice MIG-<uuid> (GPU-<uuid> names nothing), so a worker given a slice sees it."""
    from types import SimpleNamespace

    import torch

    from pita.core import gpu_manager as gm

    props = [SimpleNamespace(name="NVIDIA A100-SXM4-40GB MIG 3g.20gb", uuid="4b2f-aaaa"),
             SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid="9c1d-bbbb")]
    monkeypatch.setattr(gm.glob, "glob", lambda p: ["/dev/nvidia0"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (10 * 10**9, 20 * 10**9))
    mgr = gm.GPUManager._detect_torch()
    mig, gpu = mgr.devices
    assert mig.uuid == "MIG-4b2f-aaaa" and mig.visible_id == "MIG-4b2f-aaaa"
    assert gpu.uuid == "GPU-9c1d-bbbb" and gpu.visible_id == "1"
    assert mgr.env_for([0])["CUDA_VISIBLE_DEVICES"] == "MIG-4b2f-aaaa"
