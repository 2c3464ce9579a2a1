"""Recorded flow calls: what replay returns instead of re-running, and how it is fenced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from store import validate, values
from store.config import Settings
from store.db import Database
from store.errors import InvalidInput
from store.journal import Journal, Kind, digest
from store.registry import FlowRegistry, RegisteredFlow
from store.rows import Row, owner_params
from store.types import JsonValue, Owner


@dataclass(frozen=True, slots=True)
class StepRecord:
    run_id: str
    key: str
    name: str
    kind: str
    position: int
    output: JsonValue
    """The recorded value, decoded from ``stored`` (identical in value and type)."""
    stored: str
    """The output's stored text: canonical JSON (``store.values``) for every row
    recorded since migration 0004, jsonb's rendering for older ones."""
    digest: str
    epoch: int
    recorded_at_ms: int
    compensate: str | None
    compensated_at_ms: int | None

    @property
    def intact(self) -> bool:
        """Whether the recorded output still matches the digest taken when it was written.

        The digest is over the stored canonical text, so this compares exactly what
        replay will hand the flow. A row recorded before migration 0004 holds jsonb's
        rendering instead (never canonical text): its digest was over the value, so
        that row is checked against its decoded value, as it always was.
        """
        if values.text_digest(self.stored) == self.digest:
            return True
        return not values.is_canonical(self.stored) and digest(self.output) == self.digest


def _record(row: Row) -> StepRecord:
    stored = row["output_text"] if row["output_text"] is not None else "null"
    return StepRecord(
        run_id=row["run_id"],
        key=row["key"],
        name=row["name"],
        kind=row["kind"],
        position=int(row["position"]),
        output=values.decode(stored),
        stored=stored,
        digest=row["digest"],
        epoch=int(row["epoch"]),
        recorded_at_ms=int(row["recorded_at_ms"]),
        compensate=row["compensate"],
        compensated_at_ms=row["compensated_at_ms"],
    )


class Steps:
    def __init__(self, db: Database, journal: Journal, settings: Settings) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings

    async def of_run(self, run_id: str) -> list[StepRecord]:
        return [_record(r) for r in await self._db.all("steps.of_run", {"run_id": run_id})]

    async def record(
        self,
        run_id: str,
        me: Owner,
        epoch: int,
        *,
        key: str,
        name: str,
        kind: str,
        position: int,
        output: JsonValue,
        compensate: str | None = None,
        attempt: int | None = None,
    ) -> StepRecord | None:
        """Record a call's output and digest (ending ``attempt``, if a step's); None when
        the fence (or the position) is gone.

        The output is stored as its canonical text and the digest taken over that text.
        An output that cannot be stored raises UnstorableValue before anything is
        written (or when Postgres refuses the data itself): permanent, never retried.
        """
        where = f"step output of {key}"
        text = values.encode_canonical(output, self._settings.max_payload_bytes, where)
        payload = {"key": key, "kind": kind, "position": position, "epoch": epoch}
        params = {
            "run_id": run_id,
            "key": key,
            "name": name,
            "kind": kind,
            "position": position,
            "output": text,
            "digest": values.text_digest(text),
            "epoch": epoch,
            "compensate": compensate,
            "attempt": attempt,
            "source_id": self._db.source_id,
            "source_seq": self._db.next_source_seq(),
            "payload": Jsonb(payload),
            "payload_digest": digest(payload),
            "journal_kind": Kind.STEP_RECORDED,
            **owner_params(me),
        }
        try:
            row = await self._db.one("steps.record", params)
        except psycopg.Error as exc:
            if values.refused_by_database(exc):
                raise values.UnstorableValue(where, f"Postgres refused it: {exc}") from exc
            raise
        return _record(row) if row else None

    async def start_attempt(self, run_id: str, me: Owner, epoch: int, key: str) -> int | None:
        """Number and record the next attempt of a step (the counter survives crashes)."""
        row = await self._db.one(
            "steps.attempt_start",
            {"run_id": run_id, "key": key, "epoch": epoch, **owner_params(me)},
        )
        return int(row["attempt"]) if row else None

    async def finish_attempt(self, run_id: str, key: str, attempt: int, error: str | None) -> None:
        await self._db.execute(
            "steps.attempt_finish",
            {"run_id": run_id, "key": key, "attempt": attempt, "error": error},
        )

    async def attempts(self, run_id: str, key: str) -> list[dict[str, Any]]:
        return [
            dict(r) for r in await self._db.all("steps.attempts_of", {"run_id": run_id, "key": key})
        ]

    async def mark_compensated(self, run_id: str, me: Owner, epoch: int, key: str) -> bool:
        async with self._db.transaction():
            row = await self._db.one(
                "steps.mark_compensated",
                {"run_id": run_id, "key": key, "epoch": epoch, **owner_params(me)},
            )
            if row is not None:
                await self._journal.record(run_id, Kind.STEP_COMPENSATED, {"key": key})
            return row is not None

    async def resume_quarantined(
        self,
        run_id: str,
        *,
        accept_recorded: bool = False,
        rerun_key: str | None = None,
        note: str | None = None,
    ) -> bool:
        """An operator moves a quarantined run on: trust the recorded output, or re-run a step.

        Clears the quarantine wait in the same transaction; False if the run is
        not quarantined (nothing is changed then). Journaled with the authenticated
        role (``session_user``, read under the row lock) as ``actor``; ``note`` is the
        caller's own words.
        """
        if accept_recorded == (rerun_key is not None):
            raise InvalidInput("resume", "choose exactly one of accept_recorded, rerun_key")
        if note is not None:
            validate.identifier("actor", note)  # the Queue API's name for it
        async with self._db.transaction():
            locked = await self._db.one("runs.get_for_update_by", {"id": run_id})
            if locked is None or locked["waiting_reason"] != "quarantine":
                return False
            if rerun_key is not None:
                if await self._db.one("steps.delete", {"run_id": run_id, "key": rerun_key}) is None:
                    raise InvalidInput("rerun_key", f"run has no recorded {rerun_key!r}")
            else:
                for record in await self.of_run(run_id):
                    if not record.intact:
                        await self._db.one(
                            "steps.set_digest",
                            {
                                "run_id": run_id,
                                "key": record.key,
                                "digest": values.text_digest(record.stored),
                            },
                        )
            await self._db.one("waits.wake", {"id": run_id})
            await self._journal.record(
                run_id,
                Kind.RESUMED,
                {
                    "from": "quarantine",
                    "accept_recorded": accept_recorded,
                    "rerun_step": rerun_key,
                    "actor": locked["session_role"],
                    "note": note,
                },
            )
            return True

    async def register_flow(self, name: str, queue: str, signature: str | None) -> None:
        """``FlowRegistry.register``. Deprecated: kept until ``worker/process.py`` calls
        ``store.flows.register`` (and ``Store`` has ``flows``); remove it then."""
        await FlowRegistry(self._db).register(name, queue, signature)

    async def flow(self, name: str) -> RegisteredFlow | None:
        """``FlowRegistry.get``. Deprecated: kept until ``broker/queue.py`` and
        ``ops/cli/schedule.py`` call ``store.flows.get``; remove it then."""
        return await FlowRegistry(self._db).get(name)
