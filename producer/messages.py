"""Producer calls for a run's events and messages: ``get_event`` and ``send``.

``RunMessages`` is built with the producer's session (``producer.session``), and
``producer.queue.AsyncQueue`` delegates to it, as it does to ``RunControl``. Both read the run
through ``authorized`` first (scopes), and Postgres decides (store/events.py); the wake a
send publishes is only a hint.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer.session import ProducerSession
from runfleet.store.errors import InvalidInput, RunNotFound
from runfleet.store.events import EventRead, EventRow, MessageSent, SendOutcome

POLL_FIRST_S = 0.02
POLL_MAX_S = 0.25
"""``get_event`` polls the row, from every 20 ms up to every 250 ms (a wait is cheap)."""


class RunMessages:
    """A producer's calls on a run's events and messages, built with its session."""

    def __init__(self, session: ProducerSession) -> None:
        self._session = session

    async def get_event(self, run_id: str, key: str, timeout: float = 0.0) -> Any:
        """The value the run last set as event ``key`` (``ctx.set_event``), or None.

        Waits up to ``timeout`` seconds for a first value; None if none was set by then,
        or at once if the run settled without setting one (nothing will set it now).
        ``get_event_row`` answers the row itself (its version and when it was set).
        """
        row = await self.get_event_row(run_id, key, timeout)
        return row.value if row is not None else None

    async def get_event_row(self, run_id: str, key: str, timeout: float = 0.0) -> EventRow | None:
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise InvalidInput(
                "timeout", f"must be a finite number of seconds >= 0, got {timeout!r}"
            )
        try:  # the round that answers for the id (a resumed run's: its events were copied)
            run_id = (await self._session.answering(run_id)).id
        except RunNotFound:
            return None  # an id never used, or deleted: no event (DBOS answers None)
        deadline = time.monotonic() + timeout
        pause = POLL_FIRST_S
        while True:
            read: EventRead | None = await self._session.available(
                lambda: self._session.store.events.get(run_id, key)
            )
            if read is None:
                return None  # deleted since authorized
            if read.event is not None or read.status.terminal:
                event: EventRow | None = read.event
                return event
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(pause, left))
            pause = min(POLL_MAX_S, pause * 2)

    async def get_events(self, run_id: str) -> dict[str, Any]:
        """Every event the run set, by key, with its latest value (DBOS
        ``get_all_events``); empty for a run that set none or an id never used."""
        try:
            run_id = (await self._session.answering(run_id)).id
        except RunNotFound:
            return {}
        rows: list[EventRow] = await self._session.available(
            lambda: self._session.store.events.of_run(run_id)
        )
        return {row.key: row.value for row in rows}

    async def send(
        self, run_id: str, topic: str, value: Any = None, *, message_id: str | None = None
    ) -> SendOutcome:
        """Send ``value`` to the run's ``ctx.recv(topic)``: delivered once, in send order.

        ``message_id`` (an idempotency key) makes a retried send a no-op answered as
        ``MessageSent(duplicate=True)``. A settled run takes nothing: ``MessageRunSettled``.
        A run not started yet keeps the message until its recv reaches it.
        """
        row = await self._session.answering(run_id)  # a resumed run's open round takes it
        run_id = row.id
        sent = await self._session.available(
            lambda: self._session.store.events.send(run_id, topic, value, message_id=message_id)
        )
        if isinstance(sent, MessageSent) and sent.woke:
            await self._session.hint(run_id, WakeReason.MESSAGE, row)
        return sent
