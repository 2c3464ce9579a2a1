"""A flow's events and messages: ``ctx.set_event`` and ``ctx.recv`` (store/events.py decides).

``Messages`` is a mixin ``worker.context.Context`` inherits, as ``Waits`` and ``Children``
are. Both calls take a position like every durable call, and both record it in the
transaction that does their work (the event's new value; the message's consumption), so a
replay returns the record and does nothing again: an event is never set back to an older
value, and a message is never taken twice nor lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runfleet.store import validate
from runfleet.store.events import MESSAGE_TOKEN, Received
from runfleet.store.steps import StepRecord, StepWrite
from runfleet.store.types import (
    AlreadySatisfied,
    GuardFailed,
    NotFound,
    NotOwner,
    Owner,
    Parked,
    RunStatus,
    WaitingReason,
)
from runfleet.worker import tracing
from runfleet.worker.context_parts import ContextParts
from runfleet.worker.durable import Suspended, WaitTimeout
from runfleet.worker.outcomes import Cause
from runfleet.worker.waits import _timeout_at

if TYPE_CHECKING:
    from runfleet.worker.context import Interrupted


class Messages(ContextParts):
    """``Context``'s events and messages (``worker.context.Context`` inherits them)."""

    owner: Owner
    epoch: int
    records: dict[int, StepRecord]

    if TYPE_CHECKING:  # for mypy only: worker.context.Context defines these

        def _stop(self, cause: Cause) -> Interrupted: ...

        def _suspend(self, reason: str) -> Suspended: ...

    async def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` as this run's event ``key`` (``Queue.get_event`` reads it).

        May be called again for the same key: the latest call's value stands. Durable
        and replay-safe: the value is written with the call's record, once.
        """
        validate.identifier("event key", key)
        call = await self._next("set_event", key)
        position, call_key, record = call.position, call.key, call.record
        if record is not None:
            return
        # The value is in the record too: a fork rebuilds the events set before its point.
        output = {"key": key, "value": value}
        write = StepWrite(self.run.id, self.epoch, call_key, key, "set_event", position, output)
        outcome = await self._durable(
            "events.set_event", lambda: self._store.events.set_event(self.owner, write, key, value)
        )
        match outcome:
            case Received(record=done):
                self.records[position] = done
            case GuardFailed():
                raise self._stop(Cause.CANCELLED)
            case NotOwner() | NotFound():
                raise self._stop(Cause.LOST_FENCE)

    async def recv(self, topic: str, timeout: float | None = None) -> Any:
        """The next message sent to this run on ``topic`` (``Queue.send``), in send order.

        Parks the run until one arrives. ``timeout`` (seconds) raises ``WaitTimeout`` once
        it passes with none; the deadline is a durable clock, so a resumed run keeps it.
        Each message is delivered to exactly one recv, once: its consumption is recorded
        with the call, and a replay returns the recorded value.
        """
        validate.identifier("topic", topic)
        call = await self._next("recv", topic)
        position, key, record = call.position, call.key, call.record
        if record is None:
            record = await self._receive(position, key, topic, timeout)
        output = record.output if isinstance(record.output, dict) else {}
        if output.get("timed_out"):
            raise WaitTimeout(f"no message on {topic!r} within its timeout")
        return output.get("value")

    async def _receive(
        self, position: int, key: str, topic: str, timeout: float | None
    ) -> StepRecord:
        deadline: int | None = None
        if timeout is not None:
            due = _timeout_at(await self._now_ms(), timeout)  # refused before anything is kept
            assert due is not None
            deadline = await self._ensure_clock(key, due)  # an existing clock keeps its due time
        write = StepWrite(self.run.id, self.epoch, key, topic, "recv", position, None)
        for _ in range(3):  # a clock that fired just now satisfies the park: look again
            outcome = await self._durable(
                "events.receive",
                lambda: self._store.events.receive(
                    self.owner,
                    write,
                    topic,
                    deadline_ms=deadline,
                    clock=key if deadline is not None else None,
                ),
            )
            match outcome:
                case Received(record=done):
                    self.records[position] = done
                    return done
                case Parked():
                    tracing.parked(WaitingReason.EVENT, MESSAGE_TOKEN + topic, deadline)
                    raise self._suspend(WaitingReason.EVENT)
                case AlreadySatisfied():
                    continue
                case GuardFailed():
                    raise self._stop(Cause.CANCELLED)
                case NotOwner(current=current) if (
                    current.status is RunStatus.SUSPENDED
                    and current.epoch == self.epoch
                    and current.waiting is not None
                    and current.waiting.token == MESSAGE_TOKEN + topic
                ):
                    raise self._suspend(WaitingReason.EVENT)  # our park committed unseen
                case NotOwner() | NotFound():
                    raise self._stop(Cause.LOST_FENCE)
        raise AssertionError("unreachable: a fired clock lets the next receive time out")
