"""The job graph: built whole before anything runs, validated, and ranked by critical path."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

from pita.core.errors import PlanError
from pita.core.job import JOB_ID_RE, Job, known_kinds
from pita.core.names import suggest


class JobGraph:
    def __init__(self, jobs: Iterable[Job]):
        self.jobs: list[Job] = list(jobs)
        self.by_id: dict[str, Job] = {}
        for j in self.jobs:
            self.by_id.setdefault(j.id, j)
        self.dependents: dict[str, list[str]] = defaultdict(list)
        for j in self.jobs:
            for d in j.deps:
                self.dependents[d].append(j.id)
        self._priority: dict[str, float] | None = None

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, job_id: str) -> Job:
        return self.by_id[job_id]

    # ------------------------------------------------------------------ validation
    def validate(self, device_totals: Sequence[int] = (), memory_margin: float = 0.0,
                 check_kinds: bool = True) -> "JobGraph":
        """Raise one PlanError listing every problem; return self when the graph is sound.

        ``device_totals`` (bytes per device) checks that every request can ever be satisfied.
        """
        problems: list[str] = []
        seen: set[str] = set()
        for j in self.jobs:
            if j.id in seen:
                problems.append(f"duplicate job id {j.id!r}: every job needs its own id")
            seen.add(j.id)
            if not JOB_ID_RE.match(j.id):
                problems.append(f"job id {j.id!r} may hold only letters, digits, '.', '_' and '-' (it names a folder)")
            elif len(j.id.encode()) > 255:
                problems.append(f"job id {j.id[:60] + '...'!r} is {len(j.id.encode())} bytes long; it names a folder, "
                                f"which holds at most 255: use shorter names in the config that builds it")
        kinds = known_kinds() if check_kinds else None
        for j in self.jobs:
            if kinds is not None and j.kind not in kinds:
                problems.append(f"job {j.id!r}: kind {j.kind!r} is not registered{suggest(j.kind, kinds)}")
            for d in j.deps:
                if d == j.id:
                    problems.append(f"job {j.id!r} depends on itself")
                elif d not in self.by_id:
                    problems.append(f"job {j.id!r}: unknown dependency {d!r}{suggest(d, self.by_id)}")
            r = j.resources
            if not isinstance(r.devices, int) or r.devices < 0:
                problems.append(f"job {j.id!r}: resources.devices={r.devices!r} must be an integer >= 0")
            if r.memory_gb < 0:
                problems.append(f"job {j.id!r}: resources.memory_gb={r.memory_gb} must be >= 0")
            bs = j.params.get(j.retry.batch_param) if isinstance(j.params, dict) else None
            if bs is not None and (not isinstance(bs, int) or isinstance(bs, bool) or bs < 1):
                problems.append(f"job {j.id!r}: params.{j.retry.batch_param}={bs!r} must be a positive integer")
            if device_totals and isinstance(r.devices, int) and r.devices > 0:
                if r.devices > len(device_totals):
                    problems.append(f"job {j.id!r} asks for {r.devices} devices but only {len(device_totals)} exist; "
                                    f"lower its device count or add devices")
                else:
                    fits = sorted((t * (1 - memory_margin) for t in device_totals), reverse=True)
                    if r.memory_bytes > fits[r.devices - 1]:
                        problems.append(
                            f"job {j.id!r} needs {r.memory_gb:.2f} GB on each of {r.devices} device(s) but the "
                            f"largest usable is {fits[r.devices - 1] / 1e9:.2f} GB (after executor.memory_margin="
                            f"{memory_margin}); lower its batch size or use bigger devices")
        for cycle in self.find_cycles():
            problems.append("dependency cycle: " + " -> ".join(cycle))
        if problems:
            raise PlanError(problems)
        return self

    def find_cycles(self) -> list[list[str]]:
        """One cycle [a, b, ..., a] per strongly connected component of two or more jobs.

        Self-dependencies are reported on their own by validate(); unknown deps are ignored.
        Iterative Tarjan, so deep graphs do not hit the recursion limit.
        """
        edges = {j: [d for d in self.by_id[j].deps if d in self.by_id and d != j] for j in self.by_id}
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        on_stack: set[str] = set()
        stack: list[str] = []
        comps: list[list[str]] = []
        counter = 0
        for root in self.by_id:
            if root in index:
                continue
            work = [(root, 0)]
            while work:
                node, i = work.pop()
                if i == 0:
                    index[node] = low[node] = counter
                    counter += 1
                    stack.append(node)
                    on_stack.add(node)
                recurse = False
                for k in range(i, len(edges[node])):
                    nxt = edges[node][k]
                    if nxt not in index:
                        work.append((node, k + 1))
                        work.append((nxt, 0))
                        recurse = True
                        break
                    if nxt in on_stack:
                        low[node] = min(low[node], index[nxt])
                if recurse:
                    continue
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(comp)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
        return [self._cycle_in(set(c)) for c in comps]

    def _cycle_in(self, comp: set[str]) -> list[str]:
        """A concrete cycle through the first (sorted) member of a strongly connected component."""
        start = min(comp)
        prev: dict[str, str] = {}
        queue, seen = [start], {start}
        while queue:
            node = queue.pop(0)
            for d in self.by_id[node].deps:
                if d == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, node, start]
                if d in comp and d not in seen:
                    seen.add(d)
                    prev[d] = node
                    queue.append(d)
        return sorted(comp) + [min(comp)]  # unreachable for a true component

    # ------------------------------------------------------------------ ordering
    def topological(self) -> list[Job]:
        indeg = {j.id: len(j.deps) for j in self.jobs}
        order, ready = [], [j.id for j in self.jobs if not j.deps]
        while ready:
            jid = ready.pop()
            order.append(self.by_id[jid])
            for c in self.dependents.get(jid, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        return order

    @property
    def priority(self) -> dict[str, float]:
        """Critical path from each job to the end of the graph (its own duration included)."""
        if self._priority is None:
            pr: dict[str, float] = {}
            for j in reversed(self.topological()):
                pr[j.id] = j.duration_hint + max((pr[c] for c in self.dependents.get(j.id, ())), default=0.0)
            self._priority = pr
        return self._priority

    def critical_path_length(self) -> float:
        return max(self.priority.values(), default=0.0)

    def descendants(self, job_id: str) -> list[str]:
        out, stack, seen = [], [job_id], {job_id}
        while stack:
            for c in self.dependents.get(stack.pop(), ()):
                if c not in seen:
                    seen.add(c)
                    out.append(c)
                    stack.append(c)
        return out

    def fingerprints(self) -> dict[str, dict]:
        return {j.id: j.fingerprint() for j in self.jobs}
