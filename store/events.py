"""Events a flow publishes and messages sent to a run: the decisions behind them.

An **event** is a named value a run sets (``ctx.set_event``) and anyone may read or wait
on (``Queue.get_event``): settable again, the latest value wins. Its row is written in the
transaction that records the ``set_event`` call, owner-fenced, so a replay of the body —
which finds the record and writes nothing — never puts an older value back.

A **message** is sent to a run (``Queue.send``) and taken by the body's ``ctx.recv``:
every message once, in the order sent. The message is marked consumed in the transaction
that records the ``recv`` call, so a SIGKILL either loses both (the next owner takes the
same message) or keeps both (replay returns the recorded value). Each takes the run's row
lock first, as parks and completions do: a message sent before the park is seen by it,
one sent after it wakes the parked run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import runfleet.store.journal_records as jr
import runfleet.store.validate as validate
import runfleet.store.values as values
from runfleet.store.config import Settings
from runfleet.store.db import Database
from runfleet.store.errors import InvalidInput
from runfleet.store.journal import Journal
from runfleet.store.rows import Row, run_row
from runfleet.store.steps import StepRecord, Steps, StepWrite
from runfleet.store.types.outcomes import AlreadySatisfied, GuardFailed, NotFound, NotOwner, Parked
from runfleet.store.types.run import Owner, RunStatus, Waiting, WaitingReason
from runfleet.store.waits import Waits

MESSAGE_TOKEN = "message:"
"""A recv parks with waiting token ``message:<topic>``: what a send on that topic wakes."""


@dataclass(frozen=True, slots=True)
class EventRow:
    run_id: str
    key: str
    value: Any
    digest: str
    version: int
    """How many times the run set it (1 = the first value)."""
    set_at_ms: int


@dataclass(frozen=True, slots=True)
class EventRead:
    """``Events.get``: the event as it stands (None: not set yet) and its run's status."""

    status: RunStatus
    event: EventRow | None


@dataclass(frozen=True, slots=True)
class MessageSent:
    run_id: str
    topic: str
    seq: int
    digest: str
    woke: bool
    """Whether it woke the run from a recv on its topic (the caller sends a wake hint)."""
    duplicate: bool = False
    """A send with this ``message_id`` was already taken: nothing was written."""


@dataclass(frozen=True, slots=True)
class MessageRunSettled:
    """The run is settled: nothing can receive the message, so none was stored."""

    run_id: str
    status: RunStatus


@dataclass(frozen=True, slots=True)
class MessageRow:
    run_id: str
    seq: int
    topic: str
    message_id: str | None
    digest: str
    sent_at_ms: int
    consumed_key: str | None
    consumed_at_ms: int | None


@dataclass(frozen=True, slots=True)
class Received:
    """The recv is recorded: a message (``record.output["value"]``) or its timeout."""

    record: StepRecord


SendOutcome: TypeAlias = MessageSent | MessageRunSettled
RecordOutcome: TypeAlias = Received | GuardFailed | NotOwner | NotFound
ReceiveOutcome: TypeAlias = Received | Parked | AlreadySatisfied | GuardFailed | NotOwner | NotFound


class _Retried(Exception):
    """Rolls back a transaction whose record already exists (a retry after a lost reply)."""


def _event(row: Row) -> EventRow:
    return EventRow(
        row["run_id"] if "run_id" in row else "",
        row["key"],
        values.decode(row["value_text"]),
        row["digest"],
        int(row["version"]),
        int(row["set_at_ms"]),
    )


class Events:
    """Run events and messages; steps and parks are the collaborators' (``Steps``, ``Waits``)."""

    def __init__(
        self, db: Database, journal: Journal, settings: Settings, steps: Steps, waits: Waits
    ) -> None:
        self._db = db
        self._journal = journal
        self._settings = settings
        self._steps = steps
        self._waits = waits

    # ---- events ------------------------------------------------------------

    async def set_event(self, me: Owner, write: StepWrite, key: str, value: Any) -> RecordOutcome:
        """Record the ``set_event`` call ``write`` and make ``value`` the event ``key``'s.

        One transaction, fenced by the record: a lost fence writes neither. A retry whose
        first try committed unseen finds its own record (``Received``) and writes nothing.
        """
        validate.identifier("event key", key)
        text = values.encode_canonical(value, self._settings.max_payload_bytes, "event value")
        try:
            async with self._db.transaction():
                fenced = await self._fence(write.run_id, me, write.epoch, guard=False)
                if not isinstance(fenced, dict):
                    return fenced
                record = (await self._steps.record_many(me, [write]))[0]
                if record is None:
                    raise _Retried
                row = await self._db.one(
                    "events.event_upsert", {"run_id": write.run_id, "key": key, "value": text}
                )
                assert row is not None, "an upsert returns its row"
                await self._journal.record(
                    write.run_id,
                    jr.EventSet(key=key, version=int(row["version"]), digest=row["digest"]),
                )
                return Received(record)
        except _Retried:
            return await self._own(write, me)

    async def get(self, run_id: str, key: str) -> EventRead | None:
        """The event ``key`` of ``run_id`` and the run's status; None if there is no such run."""
        row = await self._db.one("events.event_get", {"run_id": run_id, "key": key})
        if row is None:
            return None
        event = None if row["key"] is None else _event({**row, "run_id": run_id})
        return EventRead(RunStatus(row["status"]), event)

    async def of_run(self, run_id: str) -> list[EventRow]:
        return [_event(r) for r in await self._db.all("events.events_of_run", {"run_id": run_id})]

    # ---- messages ----------------------------------------------------------

    async def send(
        self, run_id: str, topic: str, value: Any, *, message_id: str | None = None
    ) -> SendOutcome:
        """Store a message for the run's ``recv(topic)``, and wake the run if it waits there.

        Under the run's row lock (a recv parking concurrently either sees the message or is
        woken by it). ``message_id``: the sender's idempotency key; a send repeating one
        writes nothing and answers the first's ``MessageSent`` with ``duplicate``. A settled
        run takes nothing (``MessageRunSettled``).
        """
        validate.identifier("run_id", run_id)
        validate.identifier("topic", topic)
        if message_id is not None:
            validate.identifier("message_id", message_id)
        text = values.encode_canonical(value, self._settings.max_payload_bytes, "message value")
        async with self._db.transaction():
            locked = await self._db.one("runs.get_for_update", {"id": run_id})
            if locked is None:
                raise InvalidInput("run_id", f"run {run_id!r} does not exist")
            current = run_row(locked)
            params = {"run_id": run_id, "message_id": message_id}
            if message_id is not None:
                # Before the settled check: a retry of a send that was stored is answered as
                # such even if the run settled since.
                seen = await self._db.one("events.message_by_id", params)
                if seen is not None:
                    return MessageSent(run_id, topic, int(seen["seq"]), seen["digest"], False, True)
            if current.status.terminal:
                return MessageRunSettled(run_id, current.status)
            row = await self._db.one(
                "events.message_insert", {**params, "topic": topic, "value": text}
            )
            assert row is not None, "a message_id seen under the row lock is answered above"
            woke = await self._db.one(
                "events.wake_receiver", {"run_id": run_id, "token": MESSAGE_TOKEN + topic}
            )
            seq, digest = int(row["seq"]), row["digest"]
            sent = jr.MessageSent(
                topic=topic, seq=seq, digest=digest, woke=woke is not None, message_id=message_id
            )
            await self._journal.record(run_id, sent)
            return MessageSent(run_id, topic, seq, digest, woke is not None)

    async def receive(
        self,
        me: Owner,
        write: StepWrite,
        topic: str,
        *,
        deadline_ms: int | None,
        clock: str | None,
    ) -> ReceiveOutcome:
        """Take the oldest message on ``topic`` for the recv ``write`` records, or park.

        In one transaction under the run's row lock: the message is marked consumed by
        ``write.key`` and ``write`` is recorded with ``{"value": …, "seq": …}``; with no
        message and ``deadline_ms`` passed, ``{"timed_out": true}`` is recorded; otherwise
        the run parks on ``message:<topic>`` (its timeout's ``clock`` wakes it too; the park
        answers AlreadySatisfied once that clock fired). A cancel request refuses the park
        (GuardFailed). A retry whose first try committed unseen finds its own record.
        """
        run_id = write.run_id
        try:
            async with self._db.transaction():
                fenced = await self._fence(run_id, me, write.epoch, guard=False)
                if not isinstance(fenced, dict):
                    return fenced
                message = await self._db.one(
                    "events.message_next", {"run_id": run_id, "topic": topic}
                )
                now_ms = int(fenced["now_ms"])
                if message is None and (deadline_ms is None or now_ms < deadline_ms):
                    waiting = Waiting(
                        reason=WaitingReason.EVENT,
                        wake_at_ms=deadline_ms,
                        token=MESSAGE_TOKEN + topic,
                    )
                    parked = await self._waits.park(
                        run_id, me, write.epoch, waiting, deferred=clock
                    )
                    return parked
                if message is None:
                    output: dict[str, Any] = {"timed_out": True}
                else:
                    seq = int(message["seq"])
                    await self._db.one(
                        "events.message_consume", {"run_id": run_id, "seq": seq, "key": write.key}
                    )
                    output = {"value": values.decode(message["value_text"]), "seq": seq}
                recorded = StepWrite(
                    run_id, write.epoch, write.key, write.name, write.kind, write.position, output
                )
                record = (await self._steps.record_many(me, [recorded]))[0]
                if record is None:
                    raise _Retried
                if message is not None:
                    await self._journal.record(
                        run_id,
                        jr.MessageReceived(topic=topic, seq=output["seq"], key=write.key),
                    )
                return Received(record)
        except _Retried:
            return await self._own(write, me)

    async def messages_of_run(self, run_id: str) -> list[MessageRow]:
        rows = await self._db.all("events.messages_of_run", {"run_id": run_id})
        return [
            MessageRow(
                run_id,
                int(r["seq"]),
                r["topic"],
                r["message_id"],
                r["digest"],
                int(r["sent_at_ms"]),
                r["consumed_key"],
                r["consumed_at_ms"],
            )
            for r in rows
        ]

    # ---- shared ------------------------------------------------------------

    async def _fence(
        self, run_id: str, me: Owner, epoch: int, *, guard: bool
    ) -> GuardFailed | NotOwner | NotFound | Row:
        """Lock the run: its row (with the database's ``now_ms``) while ``me`` holds it
        running at ``epoch``, else the outcome that says why not."""
        locked = await self._db.one("runs.get_for_update", {"id": run_id})
        if locked is None:
            return NotFound(run_id)
        current = run_row(locked)
        if current.status is not RunStatus.RUNNING or current.owner != me or current.epoch != epoch:
            return NotOwner(current)
        if guard and current.cancel_requested_at_ms is not None:
            return GuardFailed(current)
        return locked

    async def _own(self, write: StepWrite, me: Owner) -> RecordOutcome:
        """The record this tenure already wrote for ``write`` (its commit's reply was lost)."""
        for record in await self._steps.of_run(write.run_id):
            if record.position == write.position and record.key == write.key:
                if record.epoch == write.epoch:
                    return Received(record)
        row = await self._db.one("runs.get", {"id": write.run_id})
        return NotOwner(run_row(row)) if row else NotFound(write.run_id)
