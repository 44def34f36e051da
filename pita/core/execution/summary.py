"""How a run ended: its counts, failures and exit code."""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_INTERRUPTED = 130


@dataclass
class RunSummary:
    counts: dict[str, int]
    failures: list[dict] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0
    disk_full: str = ""  # the message, when the run stopped because its disk filled

    @property
    def exit_code(self) -> int:
        if self.disk_full:
            return 1
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 1 if self.counts.get("FAILED", 0) or self.counts.get("SKIPPED", 0) else 0
