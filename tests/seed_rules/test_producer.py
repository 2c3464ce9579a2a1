"""Seed rules a producer's calls on an existing run keep: what is written before what is
said, and who is told.

Real Postgres and Redis, the production ``AsyncQueue``; the wakes are read back from the
queue's own streams, as a worker would read them.
"""

from __future__ import annotations

import asyncio
import json

from runfleet.broker.streams import Lane, QueueDepth
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import CancelRequested, RunStatus, Waiting, WaitingReason
from tests.store.helpers import create, make_parked, must_get, row_lock_gate


async def test_complete_writes_the_answer_before_it_wakes_the_run(
    store: Store, queue: AsyncQueue, settings: Settings
) -> None:
    """A wake that arrived before the answer committed would find the run still waiting
    and leave it to the lost-wake sweep. The answer's write is held behind a lock on the
    run's row: while it waits, nothing is on the run's streams; once it commits, the wake
    is."""
    await make_parked(store, "paying", Waiting(WaitingReason.EVENT), deferred="paid")
    async with row_lock_gate(settings.database_url, "paying") as gate:
        answering = asyncio.ensure_future(
            queue.complete("paying", "paid", {"amount": 3}, actor="billing")
        )
        try:
            while await gate.waiters() < 1:  # the answer's write queued behind the lock
                assert not answering.done(), answering
                await asyncio.sleep(0.005)
            for lane in Lane:
                assert await queue.streams.depth(queue.name, lane) == QueueDepth(0, 0), lane
        except BaseException:
            answering.cancel()
            raise
    assert await asyncio.wait_for(answering, 10)
    (answer,) = [
        r.payload for r in await store.journal.records("paying") if r.kind == "deferred-completed"
    ]
    assert answer["note"] == "billing", answer
    answered = await store.deferreds.deferred("paying", "paid")
    assert answered is not None and answered.value == {"amount": 3}
    (woken,) = await queue.streams.read("c1", [queue.name], count=4, block_ms=0)
    assert (woken.message.run, woken.lane) == ("paying", Lane.RECOVERY)


async def test_cancel_wakes_every_cascaded_child_not_only_the_lineage(
    store: Store, queue: AsyncQueue
) -> None:
    """The producer's cancel tells each descendant it asked to cancel, so a parked or
    pending child closes through its own cancel path now, not at the next sweep."""
    await create(store, "P")
    await create(store, "K", parent_id="P")  # attached
    await create(store, "G", parent_id="K")  # and its own child
    pubsub = queue.session.redis.pubsub()
    await pubsub.subscribe(queue.notifier.channel("cancel"))
    try:
        outcome = await queue.cancel("P", actor="ops")
        assert isinstance(outcome, CancelRequested), outcome
        assert set(outcome.cascaded) == {"K", "G"}
        noticed: list[str] = []
        async with asyncio.timeout(10):
            while len(noticed) < 3:
                notice = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if notice is not None:
                    noticed.append(json.loads(notice["data"])["run"])
    finally:
        await pubsub.aclose()
    assert sorted(noticed) == ["G", "K", "P"], "each owner is told by publish"
    woken = await queue.streams.read("c1", [queue.name], count=10, block_ms=0)
    assert sorted(d.message.run for d in woken) == ["G", "K", "P"]
    (asked,) = [r.payload for r in await store.journal.records("P") if r.kind == "cancel-requested"]
    assert asked["note"] == "ops", asked
    for run_id in ("K", "G"):
        child = await must_get(store, run_id)
        assert child.status is RunStatus.PENDING and child.cancel_requested_at_ms is not None
