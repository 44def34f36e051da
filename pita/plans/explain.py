"""What makes a plan as long as it is: the critical path, where the device-hours go, how idle the
devices are, and the lever the numbers point at (``pita plan``'s closing lines, ``--json``'s
``critical_path``, ``device_hours``, ``idle_fraction``, ``lower_bound_s``, ``levers``)."""

from __future__ import annotations

from collections import defaultdict


def _label(job) -> str:
    from pita.plans.fit import job_algorithm, job_kind

    algo = job_algorithm(job)
    return f"{algo} {job_kind(job)}" if algo not in ("shared", "family") else job_kind(job)


def critical_path(graph) -> list:
    """The longest chain of expected seconds, first job first."""
    pr = graph.priority
    roots = [j.id for j in graph.jobs if not j.deps]
    if not roots:
        return []
    cur, chain = max(roots, key=lambda j: (pr[j], j)), []
    while cur is not None:
        chain.append(graph[cur])
        nxt = graph.dependents.get(cur, ())
        cur = max(nxt, key=lambda c: (pr[c], c)) if nxt else None
    return chain


def whole_node_jobs(jobs, device_totals: list[int], memory_margin: float) -> list:
    """Jobs beside which nothing can run: they hold every device, with less room left on each
    than the smallest other device job needs."""
    n = len(device_totals)
    usable = min(device_totals) * (1 - memory_margin)
    others = [j.resources.memory_bytes for j in jobs if j.resources.devices > 0]
    smallest = min(others, default=0)
    return [j for j in jobs if j.resources.devices >= n and usable - j.resources.memory_bytes < smallest]


def gang_saturated(timeline, jobs, n: int) -> tuple[float, list[str]]:
    """Seconds in which jobs on several devices held every device between them, and their kinds."""
    by_id = {j.id: j for j in jobs}
    events = []
    for jid, start, end, devs in timeline:
        if len(devs) > 1:
            events += [(start, len(devs), jid), (end, -len(devs), jid)]
    events.sort(key=lambda e: (e[0], e[1]))
    held, since, total, kinds, live = 0, 0.0, 0.0, set(), set()
    for t, dk, jid in events:
        if held >= n:
            total += t - since
        held += dk
        (live.add if dk > 0 else live.discard)(jid)
        if held >= n:
            kinds |= {_label(by_id[j]) for j in live}
        since = t
    return total, sorted(kinds)


def idle_fraction(timeline, n: int, makespan: float) -> float:
    """The share of device-time (n x makespan) in which a device runs no job at all."""
    if makespan <= 0 or n <= 0:
        return 0.0
    spans: dict = defaultdict(list)
    for _, start, end, devs in timeline:
        for o in devs:
            spans[o].append((start, end))
    busy = 0.0
    for iv in spans.values():
        iv.sort()
        cur_s, cur_e = iv[0]
        for a, b in iv[1:]:
            if a > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = a, b
            else:
                cur_e = max(cur_e, b)
        busy += cur_e - cur_s
    return max(0.0, 1.0 - busy / (n * makespan))


def _faster(job) -> str:
    """What makes one job of this kind shorter, in the keys that do it."""
    from pita.plans.fit import job_algorithm

    a = job_algorithm(job)
    if job.kind == "algo.grpo_train":
        vllm = "" if job.params.get("use_vllm") else f", vLLM for its sampling (algos.{a}.use_vllm=true)"
        return f"more devices (algos.{a}.devices){vllm}, or fewer steps (algos.{a}.max_steps)"
    if job.kind == "algo.dpo_train":
        return f"more devices (algos.{a}.devices) or fewer epochs (algos.{a}.epochs)"
    if job.kind in ("algo.value_train", "algo.proxy_train"):
        key = "proxy_epochs" if job.kind == "algo.proxy_train" else "epochs"
        return f"fewer epochs (algos.{a}.{key}) or fewer rows per round (data_collection.*)"
    if job.kind == "generation.shard":
        return "more shards over more devices (generation shards follow the devices), or shorter samples"
    return "making that job faster"


def explain(graph, sim, device_totals: list[int], memory_margin: float) -> dict:
    jobs = graph.jobs
    n = len(device_totals)
    chain = critical_path(graph)
    steps = []
    for j in chain:  # consecutive jobs of one kind merged; merges (seconds) left out of the words
        label = _label(j)
        if steps and steps[-1]["kind"] == label:
            steps[-1]["hours"] += j.duration_hint / 3600
            steps[-1]["jobs"] += 1
        else:
            steps.append({"kind": label, "hours": j.duration_hint / 3600, "devices": j.resources.devices, "jobs": 1,
                          "first": j.id})
    hours: dict = defaultdict(float)
    for j in jobs:
        hours[_label(j)] += j.duration_hint * max(0, j.resources.devices) / 3600
    total = sum(hours.values()) or 1.0
    top = sorted(hours.items(), key=lambda kv: -kv[1])[:3]
    idle = idle_fraction(sim.timeline, n, sim.makespan)
    exclusive = whole_node_jobs(jobs, device_totals, memory_margin)
    excl_s = sum(j.duration_hint for j in exclusive)
    # nothing runs beside a whole-node job, so the rest of the longest chain runs outside them
    ex_ids = {j.id for j in exclusive}
    rest: dict = {}
    for j in reversed(graph.topological()):
        rest[j.id] = (0.0 if j.id in ex_ids else j.duration_hint) + max(
            (rest[c] for c in graph.dependents.get(j.id, ())), default=0.0)
    bound = max(sim.critical_path, sim.device_time / n, excl_s + max(rest.values(), default=0.0) if exclusive else 0.0)
    levers = []
    gang_s, gang_kinds = gang_saturated(sim.timeline, jobs, n)
    if not exclusive and gang_s > 0.1 * sim.makespan:
        levers.append(f"multi-device jobs ({', '.join(gang_kinds)}) held all {n} devices together for "
                      f"{span(gang_s / 3600)} and every other job waited meanwhile: fewer devices per job "
                      f"(algos.<A>.devices) lets the other work run beside them, more shortens each of them")
    if exclusive and excl_s > 0.1 * sim.makespan:
        kinds = sorted({_label(j) for j in exclusive})
        levers.append(f"{len(exclusive)} job(s) hold all {n} devices for {span(excl_s / 3600)} in all ({', '.join(kinds)}) "
                      f"and nothing runs beside them: fewer devices per job (algos.<A>.devices) would let the "
                      f"{span(max(rest.values(), default=0) / 3600)} chain of other jobs overlap them")
    if sim.critical_path >= 0.85 * sim.makespan and chain:
        longest = max(chain, key=lambda j: j.duration_hint)
        levers.append(f"the critical path bounds the run: its longest job, {longest.id} ({_label(longest)}, "
                      f"{longest.resources.devices} device(s), {span(longest.duration_hint / 3600)}), shortens it only "
                      f"by {_faster(longest)}")
    elif sim.device_time / n >= 0.9 * sim.makespan and top:
        levers.append(f"device-hours bound the run: {top[0][0]} takes {span(top[0][1])} of {span(total)} of device "
                      f"time; only less work or faster jobs of that kind shorten it")
    return {"critical_path": [{"kind": s["kind"], "hours": round(s["hours"], 4), "devices": s["devices"],
                               "jobs": s["jobs"], "first": s["first"]} for s in steps],
            "device_hours": {k: round(v, 4) for k, v in top}, "device_hours_total": round(total, 4),
            "idle_fraction": round(idle, 3), "lower_bound_s": round(bound, 1),
            "whole_node_hours": round(excl_s / 3600, 2), "levers": levers}


def span(hours: float) -> str:
    """A duration in the unit that shows it: 12h, 1.5h, 25m, 40s."""
    if hours >= 10:
        return f"{hours:.0f}h"
    if hours >= 1:
        return f"{hours:.1f}h"
    if hours * 60 >= 1:
        return f"{hours * 60:.0f}m"
    return f"{hours * 3600:.0f}s"


def render(ex: dict, makespan_s: float) -> list[str]:
    chain = " -> ".join(f"{s['kind']} {span(s['hours'])}" + (f" x{s['jobs']}" if s['jobs'] > 1 else "")
                        for s in ex["critical_path"] if s["hours"] >= 0.005 * max(1e-9, makespan_s / 3600))
    top = ", ".join(f"{k} {span(v)}" for k, v in ex["device_hours"].items())
    lines = [f"critical path: {chain}",
             f"device time: {span(ex['device_hours_total'])} in all; most: {top}",
             f"devices idle: {ex['idle_fraction']:.0%} of the makespan; makespan / lower bound "
             f"{makespan_s / max(1e-9, ex['lower_bound_s']):.2f}"]
    lines += [f"lever: {t}" for t in ex["levers"]]
    return lines
