"""Runs this process found it cannot execute, and why.

A run of a flow this worker does not have (an unknown name, a module that fails to
import, a version it does not carry, an instance it did not make) is left for a worker
that has it, never failed: the warning about it is logged once per run, and a burst
worker names these runs when it exits without them (``worker.burst``).
"""

from __future__ import annotations

KEPT = 10_000
"""Runs remembered: bounded memory (past it the memory starts again, and a run may be
warned about a second time)."""


class Unrunnable:
    def __init__(self, kept: int = KEPT) -> None:
        self._why: dict[str, str] = {}
        self._kept = kept

    def first(self, run_id: str, why: str) -> bool:
        """Remember that ``run_id`` cannot run here; True the first time (log it then)."""
        if run_id in self._why:
            return False
        if len(self._why) > self._kept:
            self._why.clear()
        self._why[run_id] = why
        return True

    def why(self, run_id: str) -> str | None:
        """Why ``run_id`` cannot run here; None if this process never found it so."""
        return self._why.get(run_id)

    def ids(self) -> list[str]:
        return list(self._why)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._why

    def __len__(self) -> int:
        return len(self._why)
