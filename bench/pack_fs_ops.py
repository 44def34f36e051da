"""Metadata operations packs cost a shared filesystem in steady state: the file system calls (stat,
open, rename, unlink, ...: strace's %file class) of the driver's main thread and of each pack's,
counted with ``strace -c`` attached for ``--window`` seconds, first while every pack runs an
attempt that hangs (the steady state of a grid of short jobs), then while every pack is idle.

No cluster: stand-in sbatch and squeue run each pack's batch script on this machine, as slurmd
would, and the driver (this process) polls as the executor does (every 0.1 s). Needs strace and
the right to attach to these processes (root, or ptrace_scope 0). Prints JSON; asserts nothing.

    python -m bench.pack_fs_ops --packs 4 --window 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_slurm(root: Path) -> Path:
    """sbatch runs the script in the background and prints an id; squeue lists those alive as
    RUNNING, the others COMPLETED; scancel kills; sacct knows nothing."""
    bin_dir, jobs = root / "bin", root / "jobs"
    bin_dir.mkdir()
    jobs.mkdir()
    tools = {
        "sbatch": f'n=$(( $(ls {jobs} | wc -l) + 501 ))\nscript="${{@: -1}}"\n'
                  f'SLURM_JOB_ID=$n nohup bash "$script" > /dev/null 2>&1 &\necho $! > {jobs}/$n\necho $n\n',
        "squeue": f'for j in {jobs}/*; do [ -e "$j" ] || continue; id=$(basename $j)\n'
                  f'  if kill -0 $(cat $j) 2>/dev/null; then echo "$id|RUNNING|None|0"; '
                  f'else echo "$id|COMPLETED|None|0"; fi; done\n',
        "scancel": f'for a in "$@"; do [ -f {jobs}/$a ] && kill $(cat {jobs}/$a) 2>/dev/null; done; exit 0\n',
        "sacct": "exit 0\n", "scontrol": "exit 1\n",
    }
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def launch_of(root: Path, job_id: str, kind: str):
    from pita.core.backends.base import Launch
    from pita.core.paths import RunPaths, atomic_write_json

    run = RunPaths(root / "run")
    launch = Launch(job={"id": job_id, "kind": f"synthetic.{kind}", "resources": {"devices": 1, "memory_gb": 1.0},
                         "duration_hint": 5.0, "params": {}, "deps": []},
                    target=f"pita.core.synthetic_kinds:{kind}", attempt=1, run_dir=str(run.root), config={},
                    devices=[{"kind": "cpu", "label": "cpu0"}], env={"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
                    paths=run.job(job_id), tag=job_id, fingerprint="x")
    launch.paths.dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(launch.paths.launch, launch.to_json())
    return launch


def count(pids: list[int], seconds: float, driver_poll) -> dict[int, dict[str, int]]:
    """strace -c of each pid's main thread for ``seconds`` (the driver polling meanwhile):
    {pid: {syscall: calls}} of the %file class."""
    procs, outs = [], []
    for pid in pids:
        out = tempfile.NamedTemporaryFile(suffix=".strace", delete=False).name
        procs.append(subprocess.Popen(["strace", "-c", "-e", "trace=%file", "-o", out, "-p", str(pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        outs.append(out)
    time.sleep(1.0)  # attached
    t0 = time.time()
    while time.time() - t0 < seconds:
        driver_poll()
    for p in procs:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    result = {}
    for pid, out in zip(pids, outs):
        calls = {}
        for line in Path(out).read_text().splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
            if m and m.group(2) != "total":
                calls[m.group(2)] = int(m.group(1))
        result[pid] = calls
        os.unlink(out)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", type=int, default=4)
    ap.add_argument("--window", type=float, default=20.0, help="seconds counted in each phase")
    a = ap.parse_args(argv)
    from pita.core.backends import slurm
    from pita.core.backends.slurm import SlurmBackend, SlurmSettings

    root = Path(tempfile.mkdtemp(prefix="pita-packfs-"))
    os.environ["PATH"] = f"{fake_slurm(root)}{os.pathsep}{os.environ['PATH']}"
    os.environ["PYTHONPATH"] = str(ROOT)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.chdir(root)
    be = SlurmBackend(SlurmSettings(pack_below_s=60, pack_idle_s=3600, poll_interval_s=5.0, max_poll_interval_s=60.0,
                                    outcome_wait_s=0.0, min_minutes=10))
    launches = [launch_of(root, f"A{i}.f.d.r0.gen.s0", "hang") for i in range(a.packs)]
    for la in launches:
        be.start(la)
    poll = lambda: be.poll(0.1)  # noqa: E731 - the executor's loop: a poll every 0.1 s
    t0 = time.time()
    while (sum(1 for t in be.tasks.values() if t.taken) < a.packs) and time.time() - t0 < 600:
        poll()
    started = {pk.name: json.loads((Path(pk.dir) / "started").read_text())["pid"] for pk in be.packs.values()}
    out = {"packs": a.packs, "window_s": a.window, "PACK_LOOK_S": slurm.PACK_LOOK_S, "phases": {}}
    try:
        for phase in ("running", "idle"):
            if phase == "idle":
                for la in launches:
                    be.kill(la.job_id, reason="bench: idle phase")
                t1 = time.time()
                while be.tasks and time.time() - t1 < 120:
                    poll()
                time.sleep(2.0)
            counts = count([os.getpid(), *started.values()], a.window, poll)
            driver = counts.pop(os.getpid())
            packs = list(counts.values())
            out["phases"][phase] = {
                "driver_ops_per_s": round(sum(driver.values()) / a.window, 2),
                "driver_calls": driver,
                "per_pack_ops_per_s": [round(sum(c.values()) / a.window, 2) for c in packs],
                "pack_calls": packs[0] if packs else {},
            }
    finally:
        be.shutdown(1.0)
        be.close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
