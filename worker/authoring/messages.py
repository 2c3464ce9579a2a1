"""A flow's events and messages: ``ctx.set_event``, ``ctx.recv``, ``ctx.send`` and
``ctx.get_event`` (store/events.py decides).

``Messages`` is one of ``context.Context``'s parts, built with the execution's
``replay.Replay``, as ``Waits`` and ``Children`` are. Both calls take a position
like every durable call, and both record it in the transaction that does their work (the
event's new value; the message's consumption), so a replay returns the record and does
nothing again: an event is never set back to an older value, and a message is never taken
twice nor lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import runfleet.worker.tracing as tracing
from runfleet.store import validate
from runfleet.store.events import MESSAGE_TOKEN, MessageSent, Received
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
from runfleet.worker.authoring.durable import Cause, WaitTimeout
from runfleet.worker.authoring.replay import Replay
from runfleet.worker.authoring.step_timeouts import checked_timeout
from runfleet.worker.authoring.waits import _timeout_at
from runfleet.worker.wake_hints import HintFn


def _message_id(run_id: str, key: str) -> str:
    """The idempotency key of a ``ctx.send``: this run and the call's key (a digest when
    that would pass the identifier limit)."""
    plain = f"{run_id}/{key}"
    if len(plain) <= validate.MAX_ID_LENGTH:
        return plain
    return "send-" + hashlib.sha256(plain.encode()).hexdigest()


def _recorded_flag(record: StepRecord, field: str) -> bool:
    output = record.output
    return bool(output.get(field)) if isinstance(output, dict) else False


class Messages:
    """``Context``'s events and messages (``ctx.set_event``, ``ctx.recv`` call these)."""

    def __init__(self, replay: Replay, hint: HintFn | None = None) -> None:
        self._replay = replay
        self._hint = hint

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

    async def send(self, run_id: str, topic: str, value: Any = None) -> bool:
        """Send ``value`` to run ``run_id``'s ``ctx.recv(topic)`` (DBOS ``DBOS.send`` in a
        workflow); True if stored, False if that run had settled (nothing can take it).

        A durable call of its own (``send:<topic>#n``): the message carries an idempotency
        key derived from this run and that key, so a crash between the send and its record
        re-sends nothing (the store answers the first send as a duplicate), and a replay
        returns the record without sending.
        """
        validate.identifier("run_id", run_id)
        validate.identifier("topic", topic)
        call = await self._replay.next("send", topic)
        if call.record is not None:
            return _recorded_flag(call.record, "stored")
        store = self._replay.store
        message_id = _message_id(self._replay.run.id, call.key)
        sent = await self._replay.durable(
            "events.send",
            lambda: store.events.send(run_id, topic, value, message_id=message_id),
        )
        stored = isinstance(sent, MessageSent)
        if isinstance(sent, MessageSent) and sent.woke and self._hint is not None:
            target = await self._replay.durable("runs.get", lambda: store.runs.get(run_id))
            if target is not None:
                await self._hint(target)
        await self._replay.record(
            call.position, call.key, topic, "send", {"to": run_id, "stored": stored}
        )
        return stored

    async def get_event(self, run_id: str, key: str, timeout: float = 0.0) -> Any:
        """Run ``run_id``'s event ``key`` (DBOS ``DBOS.get_event`` in a workflow), or None.

        Waits up to ``timeout`` seconds for a first value (in this execution: the slot is
        held meanwhile), answering at once if that run settled without one. A durable
        call of its own (``get_event:<key>#n``): the answer is recorded, so a replay
        returns the same value whatever the event holds by then.
        """
        validate.identifier("run_id", run_id)
        validate.identifier("event key", key)
        limit = 0.0 if timeout == 0 and not isinstance(timeout, bool) else checked_timeout(timeout)
        call = await self._replay.next("get_event", key)
        if call.record is not None:
            output = call.record.output
            return output.get("value") if isinstance(output, dict) else None
        store = self._replay.store
        deadline = time.monotonic() + limit
        pause = 0.02
        value: Any = None
        while True:
            read = await self._replay.durable("events.get", lambda: store.events.get(run_id, key))
            if read is None:
                break  # no such run: no event
            if read.event is not None:
                value = read.event.value
                break
            left = deadline - time.monotonic()
            if read.status.terminal or left <= 0:
                break
            await asyncio.sleep(min(pause, left))
            pause = min(0.25, pause * 2)
        await self._replay.record(
            call.position, call.key, key, "get_event", {"run_id": run_id, "value": value}
        )
        return value

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
                    raise self._replay.suspend(WaitingReason.EVENT)  # its park committed unseen
                case NotOwner() | NotFound():
                    raise self._replay.stop(Cause.LOST_FENCE)
        raise AssertionError("unreachable: a fired clock lets the next receive time out")
