"""Deferred completions and answers: the rows a park waits for, and who may write them.

A deferred is written once, first writer wins, under the run's row lock: by runfleet
itself (``complete_deferred``, e.g. a fired clock) or by a producer's answer through
runfleet.answer (migration 0009), which decides in the database what an answer from
outside may write. ``Deferreds`` is ``store.deferreds``, beside ``store.waits`` (which
holds it: a clock's firing completes its deferred).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, assert_never

import psycopg
from psycopg.types.json import Jsonb

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
import runfleet.store.values as values
from runfleet.store.config import Settings
from runfleet.store.db import Database
from runfleet.store.errors import InvalidInput, LimitExceeded, NotAnswerable
from runfleet.store.journal import Journal
from runfleet.store.rows import deferred_row, run_row
from runfleet.store.types.outcomes import AlreadyTerminal
from runfleet.store.types.waits import (
    TIMED_OUT,
    DeferredCompleted,
    DeferredExisting,
    DeferredRow,
    EventAnswer,
    EventCompleted,
    EventExisting,
    EventRunSettled,
    EventTimedOut,
)

INTERNAL_PREFIXES = ("approval:", "child:", "spawn:", "sleep:", "step:", "quota:")
"""Namespaces of the deferreds runfleet completes itself (approvals, children, timers,
retry backoffs, quotas): an answer from outside never writes one a flow did not declare.
runfleet.answer (migration 0009) enforces them; keep its pattern in step with this."""

_RUNFLEETS = "children, timers, sleeps and quotas are settled by runfleet only"
_NOT_YOURS = {
    "approval": "an approval wait: answer it with approve/deny and its token",
    "child": "a child wait: only the child's own settlement answers it",
    "timer": "a durable timer: only its clock fires it",
    "quota": "a quota window: only its time ends it",
}


class AnswerOutcome(StrEnum):
    """What runfleet.answer (migration 0009) decided; each maps to a result or an error."""

    ANSWERED = "answered"
    EXISTING = "existing"
    TERMINAL = "terminal"
    NOT_FOUND = "not_found"
    NOT_ANSWERABLE = "not_answerable"
    LIMIT = "limit"
    NO_MATCH = "no_match"


@dataclass(frozen=True, slots=True)
class Completion:
    """A deferred completion and whether it cleared the run's wait (caller sends a wake)."""

    outcome: DeferredCompleted | DeferredExisting | AlreadyTerminal
    woke: bool


def _same(existing: DeferredRow, text: str) -> bool:
    """Whether the completion that won holds the value whose canonical text is ``text``.

    By digest (the digest of exactly the text stored); a row written before migration
    0014 has none and is compared by JSON value. A wait's timeout is never the same."""
    if existing.timed_out:
        return False
    if existing.digest is not None:
        return existing.digest == values.text_digest(text)
    return values.same_json(existing.value, values.decode(text))


class Deferreds:
    """Deferred completions, reads and answers (``store.deferreds``); built alone over a
    database, the journal and the settings."""

    def __init__(self, db: Database, journal: Journal, settings: Settings) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings

    async def complete_deferred(
        self, run_id: str, name: str, value: Any = None, metadata: Any = None
    ) -> Completion:
        """Record a completion, first writer wins; wake the run if it parked on it.

        A settled run takes nothing: AlreadyTerminal, no deferred row, no wake and no
        journal record. A late answer to a run that can never read it is not a receipt.

        The value is stored as its canonical text with that text's digest, which the
        ``deferred-completed`` record repeats: the journal says which value won. A
        completion that loses answers DeferredExisting with ``same`` (the winner has the
        digest of the value offered).
        """
        validate.identifier("deferred name", name)
        text = values.encode_canonical(value, self._settings.max_payload_bytes, "value")
        validate.json_value("metadata", metadata, self._settings.max_payload_bytes)
        async with self._db.transaction():
            locked = await self._db.one("runs.get_for_update", {"id": run_id})
            if locked is None:
                raise InvalidInput("run_id", f"run {run_id!r} does not exist")
            current = run_row(locked)
            if current.status.terminal:
                return Completion(AlreadyTerminal(current), woke=False)
            row = await self._db.one(
                "waits.deferred_insert",
                {
                    "run_id": run_id,
                    "name": name,
                    "value": text,  # canonical text, kept verbatim: floats stay floats
                    "metadata": Jsonb(metadata),
                },
            )
            if row is None:
                existing = await self.deferred(run_id, name)
                assert existing is not None, "deferred vanished"
                return Completion(DeferredExisting(existing, _same(existing, text)), woke=False)
            won = deferred_row(row)
            woke = await self._db.one("waits.wake_if_awaiting", {"run_id": run_id, "name": name})
            said = metadata if isinstance(metadata, dict) else {}
            completed = jr.DeferredCompleted(
                name=name,
                woke=woke is not None,
                digest=won.digest,
                answered_by=said.get("answered_by"),
                note=said.get("note"),
                timed_out=said.get(TIMED_OUT),
            )
            await self._journal.record(run_id, completed)
            return Completion(DeferredCompleted(won), woke=woke is not None)

    async def time_out(self, run_id: str, name: str) -> Completion:
        """Record that the wait on deferred ``name`` timed out, unless an answer came first.

        A wait's timeout is a completion like any other (first writer wins, no value,
        metadata ``timed_out``): once it is written, an answer that arrives later finds
        it and writes nothing (``EventTimedOut``), and a replay of the flow reads the
        timeout again instead of an answer that came too late. DeferredExisting means
        an answer won the race: the wait is answered, not timed out.
        """
        return await self.complete_deferred(run_id, name, None, {TIMED_OUT: True})

    async def deferred(self, run_id: str, name: str) -> DeferredRow | None:
        row = await self._db.one("waits.deferred_get", {"run_id": run_id, "name": name})
        return deferred_row(row) if row else None

    async def consume_deferred(self, run_id: str, name: str) -> bool:
        """Mark a completion observed (its row stays as replay evidence)."""
        return (
            await self._db.one("waits.deferred_consume", {"run_id": run_id, "name": name})
            is not None
        )

    async def completed_deferreds(self, run_id: str) -> list[DeferredRow]:
        rows = await self._db.all("waits.deferreds_completed", {"run_id": run_id})
        return [deferred_row(r) for r in rows]

    async def answer_event(
        self, run_id: str, name: str, value: Any = None, *, note: str | None = None
    ) -> EventAnswer:
        """A producer's answer to ``ctx.wait_for(name)``; NotAnswerable for anything else.

        Decided by runfleet.answer (migration 0009) under the run's row lock, by what the
        run declared: the wait it is parked on (an ``event`` wait only) or a recorded
        ``event`` step of that name. A name the run has not reached yet may be answered
        early (first writer wins), unless it is in an internal namespace or an approval,
        child or timer of the run owns it. The answer is journaled with the authenticated
        role (``session_user``); ``note`` is the caller's words. The checks live in the
        database, not here, because producers may not write deferreds themselves: raw SQL
        with their credentials meets the same function.

        The outcome says what stands: EventCompleted (this answer, with its digest),
        EventExisting (an earlier answer; ``same`` if it has this answer's digest: a retry
        after a lost reply), EventTimedOut (the wait's timeout came first) or
        EventRunSettled.
        """
        validate.identifier("deferred name", name)
        if note is not None:
            validate.identifier("actor", note)
        text = values.encode_canonical(value, self._settings.max_payload_bytes, "value")
        answered = await self._answer(run_id, name=name, value=text, note=note)
        assert answered is not None, "event answers always have an outcome"
        match answered.outcome:
            case DeferredCompleted(row=row):
                return EventCompleted(run_id, name, row.digest, answered.woke)
            case DeferredExisting(row=row) if row.timed_out:
                return EventTimedOut(run_id, name)
            case DeferredExisting(row=row):
                return EventExisting(run_id, name, row.digest, _same(row, text))
            case AlreadyTerminal(row=row):
                return EventRunSettled(run_id, row.status)
            case unreachable:
                assert_never(unreachable)

    async def answer_approval(
        self,
        run_id: str,
        token: str,
        *,
        approved: bool,
        value: Any = None,
        actor: str,
        reason: str | None = None,
    ) -> Completion | None:
        """Answer the approval a run is parked on; None if the token is not the pending one.

        The decision, who made it (the authenticated role; ``actor`` is kept as a note)
        and why are journaled by runfleet.answer in the statement that records it, so the
        answer and its audit trail cannot come apart.
        """
        validate.identifier("actor", actor)
        if reason is not None:
            validate.json_value("reason", reason, self._settings.max_payload_bytes)
        if not isinstance(token, str) or len(token) > validate.MAX_ID_LENGTH:
            raise InvalidInput("token", "must be a string of at most 255 characters")
        if not token or "\x00" in token or any(0xD800 <= ord(c) <= 0xDFFF for c in token):
            return None  # no issued token is empty or holds these: it cannot be the pending one
        text = values.encode_canonical(value, self._settings.max_payload_bytes, "value")
        return await self._answer(
            run_id, token=token, approved=approved, value=text, note=actor, reason=reason
        )

    async def _answer(
        self,
        run_id: str,
        *,
        name: str = "",
        token: str | None = None,
        approved: bool = False,
        value: str = "null",
        note: str | None = None,
        reason: str | None = None,
    ) -> Completion | None:
        """``waits.answer``, its outcome turned into a Completion or a typed error.

        ``value`` is canonical JSON text, kept verbatim (floats stay floats) and digested
        as stored by runfleet.answer."""
        seq = self._db.next_source_seq()
        self._db.next_source_seq()  # an approval journals two records: seq and seq + 1
        cap = self._settings.max_answers_per_run
        try:
            row = await self._db.one(
                "waits.answer",
                {
                    "run_id": run_id,
                    "name": name,
                    "token": token,
                    "approved": approved,
                    # Canonical text, kept verbatim: runfleet.answer digests it as stored
                    # and holds it to the same cap validate measured (0013).
                    "value": value,
                    "note": note,
                    "reason": reason,
                    "max_answers": cap,
                    "source_id": self._db.source_id,
                    "source_seq": seq,
                },
            )
        except psycopg.errors.CheckViolation as exc:
            raise (validate.database_refusal(exc) or exc) from exc
        assert row is not None, "runfleet.answer returns one row"
        outcome, target = AnswerOutcome(row["outcome"]), row["deferred_name"] or name
        if outcome is AnswerOutcome.NOT_FOUND:
            raise InvalidInput("run_id", f"run {run_id!r} does not exist")
        if outcome is AnswerOutcome.NOT_ANSWERABLE:
            raise NotAnswerable(run_id, target, _NOT_YOURS.get(row["why"] or "", _RUNFLEETS))
        if outcome is AnswerOutcome.LIMIT:
            raise LimitExceeded("max_answers_per_run", cap, f"run {run_id!r} took its answers")
        if outcome is AnswerOutcome.NO_MATCH:
            return None
        if outcome is AnswerOutcome.TERMINAL:
            settled = await self._db.one("runs.get", {"id": run_id})
            assert settled is not None, "a run seen settled vanished"
            return Completion(AlreadyTerminal(run_row(settled)), woke=False)
        written = await self.deferred(run_id, target)
        assert written is not None, "deferred vanished"
        if outcome is AnswerOutcome.EXISTING:
            return Completion(DeferredExisting(written, _same(written, value)), woke=False)
        return Completion(DeferredCompleted(written), woke=bool(row["woke"]))
