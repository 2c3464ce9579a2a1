"""Recorded flow calls: what replay returns instead of re-running, and how it is fenced."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
import runfleet.store.values as values
from runfleet.store.config import Settings
from runfleet.store.db import Database
from runfleet.store.errors import InvalidInput
from runfleet.store.journal import Journal, Kind, digest
from runfleet.store.rows import Row, owner_params
from runfleet.store.types.run import JsonValue, Owner, WaitingReason


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


class StepState(enum.StrEnum):
    """Where a listed step stands (``Steps.listing``)."""

    COMPLETED = "completed"
    """Recorded: replay returns its output."""
    FAILED = "failed"
    """Never recorded; its last attempt ended with an error (retries exhausted, or the run
    ended before the next one)."""
    UNFINISHED = "unfinished"
    """Never recorded; its last attempt has no end (in flight, or cut off by a crash)."""


@dataclass(frozen=True, slots=True)
class StepEntry:
    """One step of a run's listing: a recorded call, or a step attempted and not recorded."""

    key: str
    """``kind:name#occurrence`` (``step:charge#1``)."""
    name: str
    kind: str
    state: StepState
    position: int | None
    """Its place among the run's durable calls; None for a step never recorded."""
    output: JsonValue
    error: str | None
    """The last attempt's error (a completed step's is None)."""
    attempts: int
    recorded_at_ms: int | None
    compensated_at_ms: int | None


def _entry(row: Row) -> StepEntry:
    key = str(row["key"])
    if row["position"] is not None:
        kind, name = str(row["kind"]), str(row["name"])
        state = StepState.COMPLETED
    else:  # only attempted: the key names it (kind:name#occurrence)
        kind, _, rest = key.partition(":")
        name = rest.rpartition("#")[0] or rest
        finished = row["last_finished_at_ms"] is not None and row["last_error"] is not None
        state = StepState.FAILED if finished else StepState.UNFINISHED
    return StepEntry(
        key=key,
        name=name,
        kind=kind,
        state=state,
        position=None if row["position"] is None else int(row["position"]),
        output=None if row["output_text"] is None else values.decode(row["output_text"]),
        error=None if state is StepState.COMPLETED else row["last_error"],
        attempts=int(row["attempts"]),
        recorded_at_ms=row["recorded_at_ms"],
        compensated_at_ms=row["compensated_at_ms"],
    )


@dataclass(frozen=True, slots=True)
class StepWrite:
    """One call's output to record (``Steps.record_many``)."""

    run_id: str
    epoch: int
    key: str
    name: str
    kind: str
    position: int
    output: JsonValue
    compensate: str | None = None
    attempt: int | None = None


class Steps:
    def __init__(self, db: Database, journal: Journal, settings: Settings) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings

    async def of_run(self, run_id: str) -> list[StepRecord]:
        return [_record(r) for r in await self._db.all("steps.of_run", {"run_id": run_id})]

    async def listing(self, run_id: str) -> list[StepEntry]:
        """The run's steps as a user lists them: recorded calls, then steps attempted and
        never recorded (failed or unfinished), each with its attempts and last error."""
        return [_entry(r) for r in await self._db.all("steps.listing", {"run_id": run_id})]

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
        write = StepWrite(run_id, epoch, key, name, kind, position, output, compensate, attempt)
        return (await self.record_many(me, [write]))[0]

    def encode(self, write: StepWrite) -> str:
        """``write``'s output as stored text; UnstorableValue if it cannot be stored."""
        where = f"step output of {write.key}"
        return values.encode_canonical(write.output, self._settings.max_payload_bytes, where)

    async def record_many(self, me: Owner, writes: Sequence[StepWrite]) -> list[StepRecord | None]:
        """``record`` for the calls of several runs ``me`` owns, in one statement.

        Each is fenced by its own run and epoch and answers its own record, or None.
        An output that cannot be stored raises UnstorableValue for the whole batch and
        writes nothing (``encode`` each first to attribute it).
        """
        if not writes:
            return []
        texts = [self.encode(write) for write in writes]  # all refused or none written
        batch = []
        for write, text in zip(writes, texts, strict=True):
            payload = jr.StepRecorded(
                key=write.key, kind=write.kind, position=write.position, epoch=write.epoch
            ).dump()
            batch.append(
                {
                    "run_id": write.run_id,
                    "key": write.key,
                    "name": write.name,
                    "kind": write.kind,
                    "position": write.position,
                    "output": text,
                    "digest": values.text_digest(text),
                    "epoch": write.epoch,
                    "compensate": write.compensate,
                    "attempt": write.attempt,
                    "seq": self._db.next_source_seq(),
                    "payload": payload,
                    "payload_digest": digest(payload),
                }
            )
        params = {
            "batch": Jsonb(batch),
            "source_id": self._db.source_id,
            "journal_kind": Kind.STEP_RECORDED,
            **owner_params(me),
        }
        try:
            rows = await self._db.all("steps.record", params)
        except psycopg.Error as exc:
            if values.refused_by_database(exc):
                where = f"step output of {writes[0].key}" if len(writes) == 1 else "step outputs"
                raise values.UnstorableValue(where, f"Postgres refused it: {exc}") from exc
            raise
        found = {(row["run_id"], row["key"]): _record(row) for row in rows}
        return [found.get((w.run_id, w.key)) for w in writes]

    async def start_attempt(self, run_id: str, me: Owner, epoch: int, key: str) -> int | None:
        """Number and record the next attempt of a step (the counter survives crashes)."""
        return (await self.start_attempts(me, [(run_id, epoch, key)]))[0]

    async def start_attempts(
        self, me: Owner, steps: Sequence[tuple[str, int, str]]
    ) -> list[int | None]:
        """``start_attempt`` for (run id, epoch, step key) of several runs, one statement."""
        if not steps:
            return []
        rows = await self._db.all(
            "steps.attempt_start",
            {
                "batch": Jsonb(
                    [{"run_id": run_id, "key": key, "epoch": epoch} for run_id, epoch, key in steps]
                ),
                **owner_params(me),
            },
        )
        found = {(row["run_id"], row["key"]): int(row["attempt"]) for row in rows}
        return [found.get((run_id, key)) for run_id, _, key in steps]

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
                compensated = jr.StepCompensated(key=key)
                await self._journal.record(run_id, compensated)
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
            if locked is None or locked["waiting_reason"] != WaitingReason.QUARANTINE:
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
                jr.Resumed(
                    from_state=jr.ResumedFrom.QUARANTINE,
                    accept_recorded=accept_recorded,
                    rerun_step=rerun_key,
                    actor=locked["session_role"],
                    note=note,
                ),
            )
            return True
