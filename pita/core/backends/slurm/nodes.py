"""The Slurm backend, the partition's nodes followed: a node that drains or goes down takes its GPUs
out of the inventory, one that returns brings them back."""

from __future__ import annotations

import time

from pita.core.backends.slurm.commands import _try, gres_gpus
from pita.core.backends.slurm.cluster import node_usable


class FollowingNodes:
    """Mixed into SlurmBackend (pita.core.backends.slurm.backend)."""

    # ------------------------------------------------------------------ the partition's nodes, followed
    lost_device_note = "finish where Slurm placed them"  # a drained node's jobs run to their end

    def follow_nodes(self, nodes: list[dict], devices: list) -> None:
        """The inventory's GPUs (``devices``, in the order of ``nodes``' usable ones) follow the
        partition: every ``partition_refresh_s`` one sinfo call; a node that drains or goes down
        takes its GPUs out (nothing new is placed for them; what runs there finishes), a node that
        returns or joins adds its GPUs."""
        self.devices_n = len(devices)  # the partition's usable devices: max_share counts them
        if not devices or devices[0].kind != "cuda" or len(devices) != sum(n["gpus"] for n in nodes if n["usable"]):
            return  # CPU devices share the largest node (or one device only): nothing to follow per node
        self._nodes, o = {}, 0
        for n in nodes:
            self._node_state[n["name"]] = n["state"]
            if n["usable"] and n["gpus"]:
                self._nodes[n["name"]] = list(range(o, o + n["gpus"]))
                o += n["gpus"]
        self._template, self._next_ordinal = devices[0], len(devices)
        self._nodes_read = time.time()

    def refresh(self) -> tuple[list[int], dict[int, str]]:
        """(ordinals added, {ordinal: why} lost) since the last call: the executor's inventory."""
        now = time.time()
        if self._nodes is None or now - self._nodes_read < self.s.partition_refresh_s:
            return [], {}
        self._nodes_read = now
        out = _try(["sinfo", "-h", "-N", *(["-p", self.s.partition] if self.s.partition else []), "-o", "%N|%t|%G"])
        if out is None:
            return [], {}  # no answer: nothing changes
        added, lost = [], {}
        seen = {}
        for line in out.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0] not in seen:
                seen[parts[0]] = (parts[1], gres_gpus(parts[2]))
        for name, (state, gpus) in seen.items():
            before = self._node_state.get(name)
            self._node_state[name] = state
            if name in self._nodes and not node_usable(state):
                for o in self._nodes.pop(name):
                    lost[o] = (f"node {name} is {state} (sinfo -R says why): nothing new is placed for its GPUs")
            elif name not in self._nodes and node_usable(state) and gpus:
                from dataclasses import replace

                ords = list(range(self._next_ordinal, self._next_ordinal + gpus))
                self._next_ordinal += gpus
                self._nodes[name] = ords
                for o in ords:
                    self._new_devices[o] = replace(self._template, ordinal=o, index=o, uuid=f"SIM-{o}", lost="",
                                                   used_bytes=0, processes=[])
                added += ords
                import logging

                logging.getLogger("pita.executor").info("node %s is %s (was %s): its %d GPU(s) join the inventory",
                                                        name, state, before or "not in the partition", gpus)
        return added, lost

    def devices(self, ordinals: list[int] | None = None, **_) -> list:
        """The devices of ``ordinals`` a refresh added."""
        return [self._new_devices[o] for o in (ordinals or [])]
