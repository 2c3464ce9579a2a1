"""The producer's session and the collaborators built with it, each built alone.

``ProducerSession`` (connections, scopes, the retry budget) is built over an open store
and a Redis client with no ``AsyncQueue``; ``RunControl``, ``RunMessages`` and
``RunHistory`` are built with a session and nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from runfleet.broker.client import connect
from runfleet.broker.streams import Lane
from runfleet.producer.control import RunControl
from runfleet.producer.history import RunHistory
from runfleet.producer.messages import RunMessages
from runfleet.producer.run import AsyncRun
from runfleet.producer.session import ProducerSession
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import RunNotFound, ScopeDenied, Unavailable
from runfleet.store.events import MessageSent
from runfleet.store.types import CancelRequested, Created, NewRun, RunStatus


@pytest.fixture
async def session(settings: Settings, store: Store) -> AsyncIterator[ProducerSession]:
    built = ProducerSession(settings.model_copy(update={"producer_retry_for": 0.5}), ["a"])
    redis = connect(settings)
    built.attach(store=store, redis=redis)
    try:
        yield built
    finally:
        built.detach()
        await redis.aclose()


def test_a_session_not_attached_says_so(settings: Settings) -> None:
    session = ProducerSession(settings)
    assert not session.connected
    with pytest.raises(RuntimeError, match="not connected"):
        _ = session.store


async def test_available_retries_then_names_the_service(session: ProducerSession) -> None:
    calls = 0

    async def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return 7

    retried: list[BaseException] = []
    assert await session.available(flaky, retried=retried) == 7
    assert calls == 2 and len(retried) == 1

    async def down() -> int:
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(Unavailable) as caught:
        await session.available(down)
    assert caught.value.service == "postgres"


async def test_authorized_checks_the_scopes(session: ProducerSession, store: Store) -> None:
    await store.admission.create(NewRun(id="mine", flow="f", scopes=("a",)))
    await store.admission.create(NewRun(id="theirs", flow="f", scopes=("a", "b")))
    assert (await session.authorized("mine")).id == "mine"
    with pytest.raises(ScopeDenied):
        await session.authorized("theirs")
    with pytest.raises(RunNotFound):
        await session.authorized("ghost")


async def test_publish_ready_sends_only_runs_that_may_start(
    session: ProducerSession, store: Store
) -> None:
    now = await store.admission.create(NewRun(id="now", flow="f"))
    later = await store.admission.create(NewRun(id="later", flow="f", delay_until_ms=2**50))
    assert isinstance(now, Created) and isinstance(later, Created)
    assert later.row.status is RunStatus.PENDING
    await session.publish_ready([now.row, later.row], lane=Lane.NORMAL)
    key = session.streams.stream_key("default", Lane.NORMAL)
    entries = await session.redis.xrange(key)
    assert entries is not None and len(entries) == 1 and "now" in repr(entries[0])


async def test_the_collaborators_are_built_with_a_session_alone(
    session: ProducerSession, store: Store
) -> None:
    await store.admission.create(NewRun(id="r1", flow="f", scopes=("a",)))
    control = RunControl(session)
    cancelled = await control.cancel("r1", actor="test")
    assert isinstance(cancelled, CancelRequested)
    messages = RunMessages(session)
    await store.admission.create(NewRun(id="r2", flow="f"))
    sent = await messages.send("r2", "topic", {"x": 1})
    assert isinstance(sent, MessageSent)
    assert await messages.get_event("r2", "missing") is None

    def no_handle(run_id: str) -> AsyncRun:
        raise AssertionError(f"no run was made, yet a handle on {run_id!r} was asked for")

    history = RunHistory(session, no_handle)
    assert (await history.delete_run("ghost")).run_ids == ()  # DBOS's answer: nothing to do
