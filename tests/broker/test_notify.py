"""Cancel/settled pub/sub hints: delivered fast when Redis is there, harmless when it is not."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from runfleet.broker.client import connect
from runfleet.broker.notify import Notice, Notifier, SubscriptionSignals
from runfleet.store.types import RunStatus
from tests.support.polling import until


@pytest.fixture
async def named_redis(redis_url: str, redis_prefix: str) -> AsyncIterator[Redis]:
    """A client whose connections carry a name unique to this test, so it can kill them."""
    client = connect(redis_url, client_name=f"{redis_prefix}-sub")
    try:
        yield client
    finally:
        await client.aclose()


async def test_publish_settled_wakes_a_watch(notifier: Notifier) -> None:
    async with notifier.watch_settled("r1", "r2") as watch:
        # Subscribed on entry: a settle right after (the caller's Postgres check) is seen.
        assert await notifier.publish_settled("other", RunStatus.COMPLETED)
        assert await notifier.publish_settled("r2", RunStatus.FAILED)
        assert await watch.wait(2.0) == Notice("settled", "r2", RunStatus.FAILED)


async def _subscribers(redis: Redis, channel: str) -> int:
    counts = await redis.pubsub_numsub(channel)
    return int(dict(counts).get(channel.encode(), dict(counts).get(channel, 0)))


async def test_concurrent_watches_share_one_subscription_and_get_only_their_runs(
    notifier: Notifier, redis: Redis
) -> None:
    """Sixteen waiting ``wait()`` calls are one subscriber of the channel, not sixteen each
    parsing every notice of the fleet; each watch gets its own run's notice, and the
    subscription ends with the last watch."""
    channel = notifier.channel("settled")
    entered = asyncio.Event()
    ready: list[str] = []
    got: dict[str, object] = {}

    async def watch(run_id: str) -> None:
        async with notifier.watch_settled(run_id) as w:
            ready.append(run_id)
            if len(ready) == 16:
                entered.set()
            got[run_id] = await w.wait(5.0)

    waiters = [asyncio.create_task(watch(f"r{i}")) for i in range(16)]
    await asyncio.wait_for(entered.wait(), 5.0)
    assert await _subscribers(redis, channel) == 1
    assert await notifier.publish_settled_many(
        [(f"r{i}", RunStatus.COMPLETED) for i in reversed(range(16))]
    )
    await asyncio.wait_for(asyncio.gather(*waiters), 5.0)
    assert got == {f"r{i}": Notice("settled", f"r{i}", RunStatus.COMPLETED) for i in range(16)}
    assert await _subscribers(redis, channel) == 0


async def test_a_batch_of_settled_notices_is_each_its_own_message_in_order(
    notifier: Notifier, redis: Redis
) -> None:
    """One script call (``SETTLED_SCRIPT``) publishes exactly what one PUBLISH per run did."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(notifier.channel("settled"))
    try:
        confirmed = await pubsub.get_message(timeout=2.0)
        assert confirmed is not None and confirmed["type"] in ("subscribe", b"subscribe")
        settled = [
            (f"r{i}", RunStatus.FAILED if i % 3 == 0 else RunStatus.COMPLETED) for i in range(7)
        ]
        async with notifier.watch_settled("r4") as watch:
            assert await notifier.publish_settled_many(settled)
            assert await watch.wait(2.0) == Notice("settled", "r4", RunStatus.COMPLETED)
        got: list[object] = []
        while len(got) < len(settled):
            msg = await pubsub.get_message(timeout=2.0)
            assert msg is not None, f"only {len(got)} of {len(settled)} notices arrived"
            if msg["type"] in ("message", b"message"):
                got.append(json.loads(msg["data"]))
        assert got == [{"run": run, "status": status} for run, status in settled]
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # redis-py < 8 leaves it unannotated


async def test_wait_settled_returns_the_notice(notifier: Notifier) -> None:
    waiter = asyncio.create_task(notifier.wait_settled("r1", timeout=5.0))

    async def publish_until_woken() -> bool:
        await notifier.publish_settled("r1", RunStatus.COMPLETED)
        await asyncio.sleep(0.02)
        return waiter.done()

    await until(publish_until_woken, accept=bool)
    assert waiter.result() == Notice("settled", "r1", RunStatus.COMPLETED)


async def test_wait_settled_times_out_with_none(notifier: Notifier, redis: Redis) -> None:
    async with notifier.watch_settled("r1") as watch:
        await redis.publish(notifier.channel("settled"), b"\xc1 not json")
        await notifier.publish_settled("someone-else", RunStatus.COMPLETED)
        started = time.monotonic()
        assert await watch.wait(0.2) is None
        assert 0.15 < time.monotonic() - started < 1.5


async def test_publish_with_redis_down_does_not_raise(
    dead_redis: Redis, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    offline = Notifier(dead_redis, redis_prefix, timeout=0.5)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="runfleet.broker.notify"):
        assert await offline.publish_cancel("r1") is False
        assert await offline.publish_settled("r1", RunStatus.COMPLETED) is False
        assert await offline.publish_settled_many([("r1", RunStatus.COMPLETED)]) is False
    assert time.monotonic() - started < 3.0
    events = [r.getMessage() for r in caplog.records]
    assert events == ["notify.cancel_failed", "notify.settled_failed"]  # rate-limited per event
    assert all(r.__dict__["run_id"] == "r1" for r in caplog.records)


async def test_wait_settled_with_redis_down_keeps_the_poll_pace(
    dead_redis: Redis, redis_prefix: str
) -> None:
    offline = Notifier(dead_redis, redis_prefix, timeout=0.2)
    started = time.monotonic()
    assert await offline.wait_settled("r1", timeout=0.5) is None
    # Neither raised nor returned at once (which would make a caller's poll loop spin).
    assert 0.4 < time.monotonic() - started < 2.0


async def test_subscription_delivers_cancels_and_survives_a_bad_callback(
    notifier: Notifier, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Notice] = []

    async def on_cancel(notice: Notice) -> None:
        if notice.run_id == "boom":
            raise RuntimeError("callback bug")
        seen.append(notice)

    signals = SubscriptionSignals()
    sub = notifier.subscription("cancel", on_cancel, signals=signals)
    sub.stop()  # before start: harmless
    assert await sub.wait_stopped(0)
    sub.start()
    sub.start()  # twice: one listener
    assert await sub.wait_ready(3.0)
    with caplog.at_level(logging.WARNING, logger="runfleet.broker.notify"):
        await notifier.publish_cancel("boom")
        await redis.publish(notifier.channel("cancel"), b'{"no-run": 1}')
        await notifier.publish_cancel("r1")
        assert (await signals.handled.wait()).run_id == "boom"  # raised, logged, survived
        assert (await signals.handled.wait()).run_id == "r1"
    assert seen == [Notice("cancel", "r1")]
    events = [r.getMessage() for r in caplog.records]
    assert "notify.callback_failed" in events
    assert "notify.malformed" in events
    assert signals.subscribed.count == 1
    sub.stop()
    sub.stop()
    assert await sub.wait_stopped(1.0)
    assert not sub.ready
    sub.start()  # after a stop: a service runs once
    assert await sub.wait_stopped(0)


async def test_subscription_resubscribes_after_its_connection_is_killed(
    named_redis: Redis, redis: Redis, redis_prefix: str
) -> None:
    signals = SubscriptionSignals()
    sub = Notifier(named_redis, redis_prefix).subscription(
        "settled", lambda n: None, signals=signals
    )
    sub.start()
    try:
        await signals.subscribed.wait(3.0)
        publisher = Notifier(redis, redis_prefix)
        await publisher.publish_settled("before", RunStatus.COMPLETED)
        assert (await signals.handled.wait()).run_id == "before"

        victims = [
            c["id"]
            for c in await redis.client_list()
            if c.get("name") == f"{redis_prefix}-sub" and "P" in c.get("flags", "")
        ]
        assert victims, "the subscription's connection should be listed"
        for client_id in victims:
            await redis.client_kill_filter(_id=client_id)

        await signals.subscribed.wait(10.0)  # resubscribed: nothing published now is missed
        await publisher.publish_settled("after", RunStatus.COMPLETED)
        assert (await signals.handled.wait()).run_id == "after"
    finally:
        sub.stop()
        await sub.wait_stopped(1.0)


async def test_a_shared_watch_reads_again_after_its_subscription_is_killed(
    named_redis: Redis, redis: Redis, redis_prefix: str
) -> None:
    """Notices published while the shared subscription was away are lost: once it is back,
    every watch's ``wait`` returns at once (its caller reads Postgres again) instead of
    sleeping out its timeout, and what is published from then on reaches it."""
    notifier = Notifier(named_redis, redis_prefix)
    publisher = Notifier(redis, redis_prefix)
    async with notifier.watch_settled("r1") as watch:
        victims = [
            c["id"]
            for c in await redis.client_list()
            if c.get("name") == f"{redis_prefix}-sub" and "P" in c.get("flags", "")
        ]
        assert len(victims) == 1, "one shared subscription"
        await redis.client_kill_filter(_id=victims[0])
        started = time.monotonic()
        assert await watch.wait(20.0) is None
        assert time.monotonic() - started < 10.0, "woken by the resubscription"

        async def notice_arrives() -> Notice | None:
            await publisher.publish_settled("r1", RunStatus.COMPLETED)
            return await watch.wait(0.2)

        assert await until(notice_arrives, accept=bool) == Notice(
            "settled", "r1", RunStatus.COMPLETED
        )


async def _received(notifier: Notifier, n: int) -> None:
    hub = notifier._settled_hub()

    async def counted() -> bool:
        return hub.received >= n

    await until(counted, 10, f"{n} notices received")


async def test_a_mark_hands_a_watch_the_notices_received_since_it(
    notifier: Notifier, redis: Redis, redis_prefix: str
) -> None:
    """A run admitted under a live shared subscription (its mark taken before the commit)
    has not settled unless a notice said so: a notice that came before its watch entered
    is handed to the watch at once; one that comes later wakes it; one received before the
    mark (an earlier run of the same id) is not handed on."""
    publisher = Notifier(redis, redis_prefix)
    assert notifier.settled_mark() is None, "no subscription up: nothing to trust"
    async with notifier.watch_settled("holder"):
        await publisher.publish_settled("old", RunStatus.FAILED)
        await _received(notifier, 1)
        mark = notifier.settled_mark()
        assert mark is not None and mark.received == 1
        await publisher.publish_settled("early", RunStatus.COMPLETED)
        await _received(notifier, 2)
        async with notifier.watch_settled("early", "late", "old") as watch:
            assert watch.caught_up(mark)
            assert await watch.wait(0) == Notice("settled", "early", RunStatus.COMPLETED)
            assert await watch.wait(0) is None, "the notice before the mark is not handed on"
            await publisher.publish_settled("late", RunStatus.COMPLETED)
            assert await watch.wait(5) == Notice("settled", "late", RunStatus.COMPLETED)
            assert not watch.caught_up(None)


async def test_a_mark_is_not_trusted_across_a_resubscription_or_a_forgotten_notice(
    named_redis: Redis, redis: Redis, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notices published while the subscription was away are lost, and a notice pushed out
    of the bounded memory is forgotten: a mark from before either says nothing, so the
    wait reads Postgres first. A mark of a subscription that closed says nothing either."""
    notifier = Notifier(named_redis, redis_prefix)
    publisher = Notifier(redis, redis_prefix)
    async with notifier.watch_settled("holder"):
        lost = notifier.settled_mark()
        assert lost is not None
        victims = [
            c["id"]
            for c in await redis.client_list()
            if c.get("name") == f"{redis_prefix}-sub" and "P" in c.get("flags", "")
        ]
        await redis.client_kill_filter(_id=victims[0])
        hub = notifier._settled_hub()

        async def resubscribed() -> bool:
            return hub.live and hub.subscriptions == 2

        await until(resubscribed, 10, "the resubscription")
        async with notifier.watch_settled("r1") as watch:
            assert not watch.caught_up(lost)
            kept = notifier.settled_mark()
            assert kept is not None and watch.caught_up(kept)

        monkeypatch.setattr("runfleet.broker.notify.RECENT_NOTICES", 2)
        mark = notifier.settled_mark()
        assert mark is not None
        for run_id in ("a", "b", "c"):  # "a" is forgotten to keep two
            await publisher.publish_settled(run_id, RunStatus.COMPLETED)
        await _received(notifier, 3)
        async with notifier.watch_settled("a") as watch:
            assert not watch.caught_up(mark), "a notice since the mark was forgotten"
            later = notifier.settled_mark()
            assert later is not None and watch.caught_up(later)
    async with notifier.watch_settled("r2") as watch:  # a new subscription
        assert not watch.caught_up(later)
