"""The journal: the append-only record of every decision, written with the CAS it describes."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

import runfleet.store.journal_records as jr
from runfleet.store.db import Database
from runfleet.store.journal_records import Kind as Kind  # its home; imported from here too
from runfleet.store.rows import journal_record, owner_params
from runfleet.store.types.journal import Accepted, Conflict, Duplicate, EmitOutcome, JournalRecord
from runfleet.store.types.run import Owner, canonical_json

log = logging.getLogger("runfleet.store.journal")


def digest(payload: Any) -> str:
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:32]


def evidence_address(run_id: str, owner: Owner | None, lease_ms: int | None, kind: str) -> str:
    """A stable address for evidence about a run this process does not own.

    The same refusal observed every sweep tick against the same lease maps to the
    same address, so it is written once; a later stall (new heartbeat) is new.
    """
    who = owner.key if owner else "-"
    return f"evidence:{run_id}:{who}:{lease_ms}:{kind}"


def _append_params(records: Sequence[tuple[str, str, str, int, dict[str, Any]]]) -> dict[str, Any]:
    """``journal.append``'s parallel arrays for ``(run, kind, source, seq, payload)``s."""
    return {
        "run_id": [r[0] for r in records],
        "kind": [r[1] for r in records],
        "source_id": [r[2] for r in records],
        "source_seq": [r[3] for r in records],
        "payload": [Jsonb(r[4]) for r in records],
        "digest": [digest(r[4]) for r in records],
    }


class Journal:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(self, run_id: str, payload: jr.Payload) -> int:
        """Append a record of this process's own CAS inside the current transaction: the
        payload's ``dump()``, under its type's kind.

        Failure is fatal on purpose: it propagates and rolls back the CAS with it.
        """
        row = await self._db.one("journal.append", self._own([(run_id, payload)]))
        if row is None:
            raise RuntimeError(f"journal address collision for {self._db.source_id}")
        return int(row["seq"])

    async def record_many(self, items: Sequence[tuple[str, jr.Payload]]) -> None:
        """``record`` for a batch of ``(run_id, payload)``, in one statement."""
        if not items:
            return
        rows = await self._db.all("journal.append", self._own(items))
        if len(rows) != len(items):
            raise RuntimeError(f"journal address collision for {self._db.source_id}")

    def _own(self, items: Sequence[tuple[str, jr.Payload]]) -> dict[str, Any]:
        """``journal.append``'s arrays for records at this process's next addresses."""
        return _append_params(
            [
                (run_id, p.KIND.value, self._db.source_id, self._db.next_source_seq(), p.dump())
                for run_id, p in items
            ]
        )

    async def emit_owned(
        self, run_id: str, owner: Owner, epoch: int, record: jr.Payload
    ) -> int | None:
        """Append a record only while ``owner`` still holds the run at ``epoch``.

        Returns the sequence number, or None when the fence refused the write.
        """
        kind, payload = record.KIND.value, record.dump()
        row = await self._db.one(
            "journal.append_owned",
            {
                "run_id": run_id,
                "kind": kind,
                "source_id": self._db.source_id,
                "source_seq": self._db.next_source_seq(),
                "payload": Jsonb(payload),
                "digest": digest(payload),
                "epoch": epoch,
                **owner_params(owner),
            },
        )
        return int(row["seq"]) if row else None

    async def emit(
        self,
        run_id: str,
        record: jr.Payload,
        *,
        source_id: str,
        source_seq: int = 0,
    ) -> EmitOutcome:
        """Unfenced, idempotent append addressed by the caller.

        The same payload at the same address is a ``Duplicate``; a different one
        is a ``Conflict`` (logged — audit records never stop a driver).
        """
        kind = record.KIND.value
        params = _append_params([(run_id, kind, source_id, source_seq, record.dump())])
        async with self._db.transaction():
            row = await self._db.one("journal.append", params)
            if row is not None:
                return Accepted(int(row["seq"]))
            existing = await self._db.one(
                "journal.at_address", {"source_id": source_id, "source_seq": source_seq}
            )
        if existing is None:  # pragma: no cover - the conflicting row cannot vanish
            raise RuntimeError(f"journal address {source_id}/{source_seq} vanished")
        if existing["digest"] == params["digest"][0]:
            return Duplicate(int(existing["seq"]))
        log.warning(
            "journal.idempotency_conflict",
            extra={"run_id": run_id, "source_id": source_id, "kind": kind},
        )
        return Conflict(int(existing["seq"]), existing["payload"])

    async def records(
        self, run_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[JournalRecord]:
        rows = await self._db.all(
            "journal.records", {"run_id": run_id, "after_seq": after_seq, "limit": limit}
        )
        return [journal_record(r) for r in rows]

    async def last_of(self, run_id: str, kinds: Sequence[str]) -> JournalRecord | None:
        """The run's newest record of one of ``kinds`` (None: it has none)."""
        row = await self._db.one("journal.last_of_kinds", {"run_id": run_id, "kinds": list(kinds)})
        return None if row is None else journal_record(row)

    async def last(self, run_id: str, limit: int = 20) -> list[JournalRecord]:
        rows = await self._db.all("journal.last_records", {"run_id": run_id, "limit": limit})
        return [journal_record(r) for r in rows]
