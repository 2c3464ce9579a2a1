"""A flow's timers and waits: ``sleep``, ``sleep_until``, ``wait_for``, ``approval``, ``quota``.

``Waits`` is one of ``context.Context``'s parts, built with the execution's
``replay.Replay``; it holds only the calls that park a run on a clock, an event, a
person's answer or a quota window, and asks the replay for positions, records, parks and
clocks. Each call is replay-safe the way every durable call is: its record is written
once, and a resumed body finds it at the same position.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import secrets
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from runfleet.store import validate
from runfleet.store.errors import InvalidInput
from runfleet.store.types import DeferredRow, Waiting, WaitingReason
from runfleet.store.values import Undecodable
from runfleet.store.waits import token_hash
from runfleet.worker.authoring.durable import Decision, WaitTimeout
from runfleet.worker.authoring.replay import Replay
from runfleet.worker.threads import in_thread

T = TypeVar("T")


def _timeout_at(now_ms: int, timeout: float | None) -> int | None:
    """The database time a wait times out at, or None (it waits for ever).

    ``timeout`` is seconds from now, kept to the millisecond; ``0`` means "only if
    already answered" (the deadline is now). Anything but a finite number >= 0 is
    refused before anything is recorded.
    """
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise InvalidInput("timeout", f"must be a finite number of seconds >= 0, got {timeout!r}")
    return now_ms + validate.timeout_ms(timeout)


class Waits:
    """``Context``'s timers and waits (``ctx.sleep``, ``ctx.wait_for``... call these)."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    async def sleep(self, duration: timedelta | float) -> None:
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        await self._sleep(lambda now: now + int(seconds * 1000))

    async def sleep_until(self, when: datetime) -> None:
        await self._sleep(lambda _now: int(when.timestamp() * 1000))

    async def _sleep(self, due_from_now: Callable[[int], int]) -> None:
        """A durable timer; short remainders are slept in-process, the clock stays durable."""
        assert self._replay.settings is not None
        call = await self._replay.next("sleep", "sleep")
        position, key, record = call.position, call.key, call.record
        now = await self._replay.now_ms()
        read_at = time.monotonic()  # `now` ages while the clock and its record are written
        due = int(record.output["due_at_ms"]) if record else due_from_now(now)
        due = await self._replay.ensure_clock(key, due)
        if record is None:
            await self._replay.record(position, key, "sleep", "sleep", {"due_at_ms": due})
        if await self._replay.deferred(key) is not None:
            return
        remaining = (due - now) / 1000 - (time.monotonic() - read_at)
        if remaining <= self._replay.settings.inline_sleep_max:
            await asyncio.sleep(max(0.0, remaining))
            await self._replay.durable(
                "waits.complete_clock",
                lambda: self._replay.store.waits.complete_clock(self._replay.run.id, key),
            )
            return
        self._replay.wake_hint = time.monotonic() + remaining
        await self._replay.park(Waiting(reason=WaitingReason.TIMER, wake_at_ms=due), deferred=key)

    async def _timed_wait(
        self, kind: str, name: str, timeout: float | None, extra: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], int]:
        call = await self._replay.next(kind, name)
        position, key, record = call.position, call.key, call.record
        now = await self._replay.now_ms()
        if record is None:
            output = {"timeout_at_ms": _timeout_at(now, timeout), **(extra or {})}
            record = await self._replay.record(position, key, name, kind, output)
        return dict(record.output), now

    async def _answer_of(self, deferred: str, deadline: int | None, now: int) -> DeferredRow | None:
        """The completion of ``deferred``, or None: the wait must park for it.

        At or past ``deadline`` with no answer, the wait's timeout is written first as the
        completion (``store.deferreds.time_out``, first writer wins): from then on an answer
        that comes later writes nothing, and every replay reads the timeout again. An
        answer that wins that race is the completion instead.
        """
        done: DeferredRow | None = await self._replay.deferred(deferred)
        if done is None and deadline is not None and now >= deadline:
            await self._replay.durable(
                "waits.time_out",
                lambda: self._replay.store.deferreds.time_out(self._replay.run.id, deferred),
            )
            done = await self._replay.deferred(deferred)  # None only if the run was taken from us
        return done

    async def wait_for(self, name: str, timeout: float | None = None) -> Any:
        """Wait for an event completed through ``Queue.complete(run_id, name, value)``.

        ``timeout`` (seconds, ms precision) raises WaitTimeout once it passes unanswered;
        ``timeout=0`` takes only an answer already there and otherwise times out at once.
        The timeout is recorded, so a later answer is ``EventTimedOut`` and a replay of the
        body times out again, whatever arrived since.
        """
        recorded, now = await self._timed_wait("event", name, timeout)
        deadline = recorded["timeout_at_ms"]
        for _ in range(2):
            done = await self._answer_of(name, deadline, now)
            if done is not None:
                if done.timed_out:
                    raise WaitTimeout(f"no event {name!r} within its timeout")
                if isinstance(done.value, Undecodable):  # stored before the depth cap (0030)
                    raise InvalidInput("value", f"the answer to event {name!r}: {done.value}")
                return done.value
            await self._replay.park(
                Waiting(reason=WaitingReason.EVENT, wake_at_ms=deadline, token=name), deferred=name
            )
        raise AssertionError("unreachable: a satisfied park has a completion")

    async def approval(
        self,
        name: str,
        request: Any = None,
        timeout: float | None = None,
        *,
        on_token: Callable[[str], Any] | None = None,
    ) -> Decision:
        """Park until a person approves or denies (``Queue.approve/deny`` with the token).

        The token is a secret made when the approval is first reached and handed to
        ``on_token`` (sync or async: send it to the approver) before anything is
        recorded; only its sha256 is stored (step output, waiting row, journal), so
        nobody can read it back. A crash between delivery and record makes a new token
        on replay: delivery is at least once, and the last token delivered is the valid one.
        """
        call = await self._replay.next("approval", name)
        position, key, record = call.position, call.key, call.record
        now = await self._replay.now_ms()
        if record is None:
            timeout_at = _timeout_at(now, timeout)  # refused before a token is sent
            token = secrets.token_urlsafe(24)
            if on_token is not None:
                sent = (
                    on_token(token)
                    if inspect.iscoroutinefunction(on_token)
                    else in_thread(on_token, token)
                )
                if inspect.isawaitable(sent):
                    await sent
            output = {"timeout_at_ms": timeout_at, "token": token_hash(token)}
            record = await self._replay.record(position, key, name, "approval", output)
        recorded = dict(record.output)
        deferred, deadline = f"approval:{name}", recorded["timeout_at_ms"]
        for _ in range(2):
            done = await self._answer_of(deferred, deadline, now)
            if done is not None:
                if done.timed_out:
                    raise WaitTimeout(f"approval {name!r} was not answered within its timeout")
                answer = done.value
                return Decision(
                    bool(answer.get("approved")),
                    answer.get("value"),
                    answer.get("actor"),
                    answer.get("reason"),
                )
            await self._replay.park(
                Waiting(
                    reason=WaitingReason.APPROVAL,
                    wake_at_ms=deadline,
                    token=recorded["token"],
                    request=request,
                ),
                deferred=deferred,
            )
        raise AssertionError("unreachable: a satisfied park has a completion")

    async def quota(self, wake_at: datetime | int) -> None:
        """Park until ``wake_at`` (a provider's quota window); a datetime or epoch ms."""
        call = await self._replay.next("quota", "quota")
        position, key, record = call.position, call.key, call.record
        wake_ms = wake_at if isinstance(wake_at, int) else int(wake_at.timestamp() * 1000)
        if record is None:
            record = await self._replay.record(
                position, key, "quota", "quota", {"wake_at_ms": wake_ms}
            )
        due = int(record.output["wake_at_ms"])
        if await self._replay.now_ms() < due:
            await self._replay.park(Waiting(reason=WaitingReason.QUOTA, wake_at_ms=due))
