"""Which algorithms a report shows, in which order and colour, and which learn from labelled pairs.

    roster = Roster(("PITA", "QSharp", "DPO"), preference_pairs=frozenset({"PITA", "DPO"}))
    roster.order({"DPO", "PITA", "Mine"})  # ['PITA', 'DPO', 'Mine']: the roster's order, then others sorted
    roster.colour("DPO")                   # fixed by its place in the roster, the same in every plot

The command line builds it from the algorithm registry (``pita.cli.report.algorithm_roster``) and
hands it to the report, so the report layer imports no algorithm. Without one, the report takes
the order of the run's own ``config.yaml`` (its ``algos`` section lists every registered
algorithm, plug-ins included, in registry order when the run was made) and names no
preference-pair methods.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from pita.report.config import run_config

BASE_COLOUR = "dimgray"
# tab10 without its grey (the base model's colour)
PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
           "tab:cyan", "navy", "darkgoldenrod", "teal"]


@dataclass(frozen=True)
class Roster:
    names: tuple[str, ...] = ()
    preference_pairs: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of_run(cls, run) -> "Roster":
        """The order of the run's ``config.yaml`` ``algos`` section (empty if it cannot be read)."""
        try:
            cfg = run_config(run)
            return cls(tuple(str(k) for k in (cfg.get("algos") or {}).keys()))
        except Exception:  # noqa: BLE001 - a missing or damaged config only loses the order
            return cls()

    def order(self, names) -> list[str]:
        """``names`` in the roster's order, then any others sorted (base excluded)."""
        names = set(names) - {"base"}
        return [a for a in self.names if a in names] + sorted(names - set(self.names))

    def colour(self, algo: str) -> str:
        """The algorithm's colour in every plot: fixed by its place in the roster."""
        if algo == "base":
            return BASE_COLOUR
        n = len(self.names)
        # a name outside the roster (a plug-in not loaded here) gets a colour fixed by its name
        i = self.names.index(algo) if algo in self.names else n + zlib.crc32(algo.encode()) % max(1, len(PALETTE) - n)
        return PALETTE[i % len(PALETTE)]
