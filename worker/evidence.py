"""Evidence about runs this process does not own: deduplicated, never fatal.

A refused steal, a lost claim or a lost activation is journaled once per
(run, owner, lease, kind, witness) address; the steal-refusal backoff ladder keeps the
driver from re-probing a vouched-for owner every tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.config import Settings
from runfleet.store.journal import evidence_address
from runfleet.store.types import Conflict, Owner

log = logging.getLogger("runfleet.worker.evidence")


async def journal_evidence(
    store: Store,
    run_id: str,
    owner: Owner | None,
    lease_ms: int | None,
    record: jr.Payload,
) -> None:
    """Write one evidence record at its derived address; failures are logged, not raised.

    The address is (run, owner, lease, journal kind, the payload's ``evidence`` and
    ``observer``, and its ``probe`` when it names one): one lease refused for two reasons
    (``lease-fresh``, then ``probe``) makes two records, one lease the probe vouched for
    on two witnesses (``cross-host-key-fresh``, later ``same-host-pid-alive``) makes two,
    and the same refusal repeated every tick is one. The payload must therefore be a pure
    function of that address (no ages, no retry delays: the record's own time and the
    lease it names give those), so a repeat is a ``Duplicate``, never a conflict.
    """
    kind, payload = record.KIND, record.dump()
    parts = [str(payload.get(k, "")) for k in ("evidence", "observer")]
    witness = payload.get("probe")
    if witness:  # absent from every other record: their addresses are as they were
        parts.append(str(witness))
    qualifier = ":".join(parts)
    address = evidence_address(run_id, owner, lease_ms, f"{kind}:{qualifier}")
    try:
        outcome = await store.journal.emit(run_id, record, source_id=address)
    except Exception as exc:  # evidence is audit: it never stops a drive
        log.warning(
            "journal.evidence_failed", extra={"run_id": run_id, "kind": kind, "error": repr(exc)}
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

    Bounded: a row that leaves the stale window (its owner renewed, another worker
    stole or settled it) is never driven here again, so nothing would ever remove
    its rung. A rung nobody consulted for ``forget_after`` past its next probe is
    dropped (``prune``, run on every refusal); while the row stays stale and vouched
    for, the stale sweep drives it at least once per cycle and keeps its rung alive.
    Dropping a live rung early costs one extra probe from the bottom rung, nothing
    more. ``max_rungs`` caps memory even if every row were refused at once.
    """

    def __init__(
        self,
        interval: float,
        cap: float,
        *,
        forget_after: float | None = None,
        max_rungs: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._first = 2 * interval
        self._cap = cap
        self._forget_after = forget_after if forget_after is not None else max(4 * cap, 60.0)
        self._max = max_rungs
        self._clock = clock
        self._rungs: dict[str, _Rung] = {}
        self._pruned_at = float("-inf")

    @classmethod
    def for_settings(cls, settings: Settings) -> RefusalLadder:
        """The ladder a worker of a fleet configured by ``settings`` climbs: from two
        heartbeat intervals up to ``Settings.reprobe_backoff_max``."""
        return cls(settings.heartbeat_interval, settings.reprobe_backoff_max)

    def __len__(self) -> int:
        return len(self._rungs)

    def due(self, run_id: str, heartbeat_at_ms: int) -> bool:
        rung = self._rungs.get(run_id)
        if rung is None or rung.heartbeat_at_ms != heartbeat_at_ms:
            return True
        return self._clock() >= rung.next_probe

    def refused(self, run_id: str, heartbeat_at_ms: int) -> float:
        now = self._clock()
        rung = self._rungs.pop(run_id, None)
        if rung is None or rung.heartbeat_at_ms != heartbeat_at_ms:
            delay = self._first
        else:
            delay = min(rung.delay * 2, self._cap)
        if now - self._pruned_at >= 1.0 or len(self._rungs) >= self._max:
            self.prune()
        self._rungs[run_id] = _Rung(heartbeat_at_ms, delay, now + delay)
        return delay

    def forget(self, run_id: str) -> None:
        self._rungs.pop(run_id, None)

    def prune(self) -> int:
        """Drop rungs of rows that left the stale window (unconsulted too long); the count."""
        self._pruned_at = self._clock()
        horizon = self._pruned_at - self._forget_after
        gone = [run_id for run_id, rung in self._rungs.items() if rung.next_probe < horizon]
        for run_id in gone:
            del self._rungs[run_id]
        overflow = len(self._rungs) - (self._max - 1)
        if overflow > 0:
            # Insertion order is refusal order (refused() re-inserts): drop the oldest.
            for run_id in list(self._rungs)[:overflow]:
                del self._rungs[run_id]
            return len(gone) + overflow
        return len(gone)
