"""A simulated Ray cluster running a whole experiment, undisturbed and with a node lost mid-run.

    python -m bench.ray_cluster [--json] [--nodes 3] [--gpus-per-node 1] [--experiment smoke]
                                [--cache DIR] [--remove-after 8] [--victim train]
                                [-- overrides...]

Ray's own multi-node simulator (``ray.cluster_utils.Cluster``): a head without GPUs (the
driver's node) and ``--nodes`` nodes with logical GPUs, all on this machine (on a CPU machine
the jobs run on the CPU whatever GPU they are given). Two runs of ``experiment=<experiment>``
with ``executor.backend=ray``, each on a fresh cluster of that shape:

    undisturbed    every node up throughout
    node_lost      once ``--remove-after`` jobs are done and a job whose id contains ``--victim``
                   (default ``train``: a training job) runs on a node, that node is killed (no
                   graceful stop)

For each: exit code, wall seconds (run.log's "finished after"), jobs per node (the node of each
job's last attempt; host jobs count as the head's), attempts recorded as ``lost``; and for the
second, how many results.csv rows and columns match the undisturbed run's, the timing columns
(``*_device_s``) left out. Nothing is asserted; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("train_device_s", "eval_device_s")


def simulated_cluster(nodes: int, gpus: int = 2):
    """A head without GPUs (the driver's node) and ``nodes`` nodes of ``gpus`` logical GPUs and 2
    CPUs each; a node that dies is noticed within a few seconds. The tests use it too."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3}})
    workers = [c.add_node(num_cpus=2, num_gpus=gpus) for _ in range(nodes)]
    c.wait_for_nodes()
    return c, workers


def _running_on(run: Path) -> dict[str, list[str]]:
    """node id (8 characters) -> jobs started there and not yet done, from run.log."""
    try:
        text = (run / "run.log").read_text()
    except OSError:
        return {}
    running: dict[str, str] = {}
    for line in text.splitlines():
        m = re.search(r"\] start (\S+) on \S+ \(RAY-(\w{8})-GPU", line)
        if m:
            running[m.group(1)] = m.group(2)
        m = re.search(r"\] (?:done|FAILED) (\S+) ", line)
        if m:
            running.pop(m.group(1), None)
    out: dict[str, list[str]] = {}
    for job, node in running.items():
        out.setdefault(node, []).append(job)
    return out


def _done(run: Path) -> int:
    try:
        return len(re.findall(r"\] done ", (run / "run.log").read_text()))
    except OSError:
        return 0


def _rows(run: Path) -> list[dict]:
    path = run / "results" / "results.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def one(nodes: int, gpus: int, exp: str, cache: str, out: Path, extra: list[str], remove_after: int | None,
        victim_job: str = "train") -> dict:
    import ray

    cluster, workers = simulated_cluster(nodes, gpus)
    removed = None
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled")
        t0 = time.time()
        p = subprocess.Popen([sys.executable, str(ROOT / "run_parallel.py"), f"experiment={exp}",
                              f"system.cache_dir={cache}", f"system.output_dir={out}", "executor.progress=plain",
                              "executor.backend=ray", f"executor.ray.address={cluster.address}", *extra],
                             cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        run = None
        while p.poll() is None:
            time.sleep(0.5)
            if run is None and (out / exp).is_dir() and any((out / exp).iterdir()):
                run = max((out / exp).iterdir())
            if remove_after is not None and removed is None and run is not None and _done(run) >= remove_after:
                busy = {n: js for n, js in _running_on(run).items() if any(victim_job in j for j in js)}
                if busy:
                    victim_id = max(busy, key=lambda n: len(busy[n]))
                    victim = next(w for w in workers if w.node_id.startswith(victim_id))
                    removed = {"node": victim_id, "at_s": round(time.time() - t0, 1), "jobs_done": _done(run),
                               "running_there": sorted(busy[victim_id])}
                    cluster.remove_node(victim, allow_graceful=False)
        err = p.stderr.read()
        run = run or max((out / exp).iterdir())
    finally:
        ray.shutdown()
        cluster.shutdown()
    state = json.loads((run / "state.json").read_text())
    per_node: dict[str, int] = {}
    lost = []
    for jid, e in state["jobs"].items():
        last = (e.get("attempts") or [{}])[-1]
        nodes_of = {d.get("node", "") for d in last.get("devices", [])}
        key = (nodes_of.pop().split("(")[-1].rstrip(")") if nodes_of else "head (host jobs)")
        per_node[key] = per_node.get(key, 0) + 1
        lost += [jid for a in e.get("attempts", []) if a.get("status") == "lost"]
    m = re.search(r"finished after ([\d.]+)s", (run / "run.log").read_text())
    return {"exit_code": p.returncode, "wall_s": float(m.group(1)) if m else None, "jobs": len(state["jobs"]),
            "states": {s: sum(e["state"] == s for e in state["jobs"].values()) for s in ("COMPLETED", "FAILED", "SKIPPED")},
            "jobs_per_node": per_node, "lost_attempts": sorted(lost), "removed": removed, "run": str(run),
            "stderr_tail": err[-600:] if p.returncode else ""}


def compare(a: list[dict], b: list[dict]) -> dict:
    cols = [c for c in (a[0] if a else {}) if c not in TIMING]
    key = lambda r: tuple(r[c] for c in ("algorithm", "family", "train_dataset", "round", "eval_dataset", "eta",
                                          "variant"))
    bb = {key(r): r for r in b}
    same = sum(1 for r in a if key(r) in bb and all(r[c] == bb[key(r)][c] for c in cols))
    differ = [key(r) for r in a if key(r) not in bb or any(r[c] != bb[key(r)][c] for c in cols)]
    return {"rows": len(a), "rows_other": len(b), "identical_rows": same, "columns_compared": len(cols),
            "differing": differ[:5]}


def run(nodes: int = 3, gpus: int = 1, exp: str = "smoke", cache: str | None = None, extra=(),
        remove_after: int = 8, victim_job: str = "train") -> dict:
    cache = cache or str(ROOT / ".cache" / "pita")
    with tempfile.TemporaryDirectory(prefix="pita-bench-ray-") as tmp:
        tmp = Path(tmp)
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()
        a = one(nodes, gpus, exp, cache, tmp / "a", list(extra), None)
        b = one(nodes, gpus, exp, cache, tmp / "b", list(extra), remove_after, victim_job)
        rows = compare(_rows(Path(a["run"])), _rows(Path(b["run"])))
    for r in (a, b):
        r.pop("run")
    return {"cluster": {"head": "1 CPU, 0 GPU (driver, merges)", "nodes": nodes, "gpus_per_node": gpus},
            "experiment": exp, "undisturbed": a, "node_lost": b, "rows_node_lost_vs_undisturbed": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gpus-per-node", type=int, default=1)
    ap.add_argument("--experiment", default="smoke")
    ap.add_argument("--cache")
    ap.add_argument("--remove-after", type=int, default=8)
    ap.add_argument("--victim", default="train", help="remove a node running a job whose id contains this")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    out = run(a.nodes, a.gpus_per_node, a.experiment, a.cache, a.overrides, a.remove_after, a.victim)
    print(json.dumps(out, indent=None if a.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
