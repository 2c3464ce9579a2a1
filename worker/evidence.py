"""Evidence about runs this process does not own: deduplicated, never fatal.

A refused steal, a lost claim or a lost activation is journaled once per
(run, owner, lease, kind) address; the steal-refusal backoff ladder keeps the
driver from re-probing a vouched-for owner every tick.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from store import Store
from store.journal import evidence_address
from store.types import Conflict, Owner

log = logging.getLogger("runfleet.worker.evidence")


async def journal_evidence(
    store: Store,
    run_id: str,
    kind: str,
    owner: Owner | None,
    lease_ms: int | None,
    payload: dict[str, Any],
) -> None:
    """Write one evidence record at its derived address; failures are logged, not raised."""
    try:
        outcome = await store.journal.emit(
            run_id,
            kind,
            payload,
            source_id=evidence_address(run_id, owner, lease_ms, kind),
        )
    except psycopg.Error as exc:
        log.warning(
            "journal.evidence_failed", extra={"run_id": run_id, "kind": kind, "error": str(exc)}
        )
        return
    if isinstance(outcome, Conflict):
        log.info("journal.evidence_conflict", extra={"run_id": run_id, "kind": kind})


@dataclass
class _Rung:
    heartbeat_at_ms: int
    delay: float
    next_probe: float


class RefusalLadder:
    """When to re-probe an owner the probe vouched for: 2 × interval, doubling, capped.

    Keyed by the frozen lease (the heartbeat): a later stall of the same run is a
    new lease and starts again at the bottom.
    """

    def __init__(self, interval: float, cap: float) -> None:
        self._first = 2 * interval
        self._cap = cap
        self._rungs: dict[str, _Rung] = {}

    def due(self, run_id: str, heartbeat_at_ms: int) -> bool:
        rung = self._rungs.get(run_id)
        if rung is None or rung.heartbeat_at_ms != heartbeat_at_ms:
            return True
        return time.monotonic() >= rung.next_probe

    def refused(self, run_id: str, heartbeat_at_ms: int) -> float:
        rung = self._rungs.get(run_id)
        if rung is None or rung.heartbeat_at_ms != heartbeat_at_ms:
            delay = self._first
        else:
            delay = min(rung.delay * 2, self._cap)
        self._rungs[run_id] = _Rung(heartbeat_at_ms, delay, time.monotonic() + delay)
        return delay

    def forget(self, run_id: str) -> None:
        self._rungs.pop(run_id, None)
