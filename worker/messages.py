"""A flow's events and messages: ``ctx.set_event`` and ``ctx.recv`` (store/events.py decides).

``Messages`` is one of ``worker.context.Context``'s parts, built with the execution's
``worker.replay.Replay``, as ``Waits`` and ``Children`` are. Both calls take a position
like every durable call, and both record it in the transaction that does their work (the
event's new value; the message's consumption), so a replay returns the record and does
nothing again: an event is never set back to an older value, and a message is never taken
twice nor lost.
"""

from __future__ import annotations

from typing import Any

from runfleet.store import validate
from runfleet.store.events import MESSAGE_TOKEN, Received
from runfleet.store.steps import StepRecord, StepWrite
from runfleet.store.types import (
    AlreadySatisfied,
    GuardFailed,
    NotFound,
    NotOwner,
    Parked,
    RunStatus,
    WaitingReason,
)
from runfleet.worker import tracing
from runfleet.worker.durable import WaitTimeout
from runfleet.worker.outcomes import Cause
from runfleet.worker.replay import Replay
from runfleet.worker.waits import _timeout_at


class Messages:
    """``Context``'s events and messages (``ctx.set_event``, ``ctx.recv`` call these)."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    async def set_event(self, key: str, value: Any) -> None:
        """Publish ``value`` as this run's event ``key`` (``Queue.get_event`` reads it).

        May be called again for the same key: the latest call's value stands. Durable
        and replay-safe: the value is written with the call's record, once.
        """
        validate.identifier("event key", key)
        call = await self._replay.next("set_event", key)
        position, call_key, record = call.position, call.key, call.record
        if record is not None:
            return
        # The value is in the record too: a fork rebuilds the events set before its point.
        output = {"key": key, "value": value}
        write = StepWrite(
            self._replay.run.id, self._replay.epoch, call_key, key, "set_event", position, output
        )
        outcome = await self._replay.durable(
            "events.set_event",
            lambda: self._replay.store.events.set_event(self._replay.owner, write, key, value),
        )
        match outcome:
            case Received(record=done):
                self._replay.records[position] = done
            case GuardFailed():
                raise self._replay.stop(Cause.CANCELLED)
            case NotOwner() | NotFound():
                raise self._replay.stop(Cause.LOST_FENCE)

    async def recv(self, topic: str, timeout: float | None = None) -> Any:
        """The next message sent to this run on ``topic`` (``Queue.send``), in send order.

        Parks the run until one arrives. ``timeout`` (seconds) raises ``WaitTimeout`` once
        it passes with none; the deadline is a durable clock, so a resumed run keeps it.
        Each message is delivered to exactly one recv, once: its consumption is recorded
        with the call, and a replay returns the recorded value.
        """
        validate.identifier("topic", topic)
        call = await self._replay.next("recv", topic)
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
            due = _timeout_at(
                await self._replay.now_ms(), timeout
            )  # refused before anything is kept
            assert due is not None
            deadline = await self._replay.ensure_clock(
                key, due
            )  # an existing clock keeps its due time
        write = StepWrite(
            self._replay.run.id, self._replay.epoch, key, topic, "recv", position, None
        )
        for _ in range(3):  # a clock that fired just now satisfies the park: look again
            outcome = await self._replay.durable(
                "events.receive",
                lambda: self._replay.store.events.receive(
                    self._replay.owner,
                    write,
                    topic,
                    deadline_ms=deadline,
                    clock=key if deadline is not None else None,
                ),
            )
            match outcome:
                case Received(record=done):
                    self._replay.records[position] = done
                    return done
                case Parked():
                    tracing.parked(WaitingReason.EVENT, MESSAGE_TOKEN + topic, deadline)
                    raise self._replay.suspend(WaitingReason.EVENT)
                case AlreadySatisfied():
                    continue
                case GuardFailed():
                    raise self._replay.stop(Cause.CANCELLED)
                case NotOwner(current=current) if (
                    current.status is RunStatus.SUSPENDED
                    and current.epoch == self._replay.epoch
                    and current.waiting is not None
                    and current.waiting.token == MESSAGE_TOKEN + topic
                ):
                    raise self._replay.suspend(WaitingReason.EVENT)  # our park committed unseen
                case NotOwner() | NotFound():
                    raise self._replay.stop(Cause.LOST_FENCE)
        raise AssertionError("unreachable: a fired clock lets the next receive time out")
