"""A Redis writer can delay runs, never decide or forge them.

Every decision is read back from Postgres: a forged "settled" notice only wakes a
watcher that then re-reads the row; a forged cancel notice or stream message only
makes a worker look at Postgres, where nothing was requested. (Arbitrary bytes into
every decoder are fuzzed in tests/broker/test_hostile_input.py.)
"""

from __future__ import annotations

import asyncio

import pytest

import tests.trust.flows as tf
from runfleet.broker.codec import message_for
from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.flows.conftest import parked


async def test_forged_notices_and_messages_decide_nothing(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.waiter)
    await parked(store, run.id, "event")
    for _ in range(3):
        await queue.notifier.publish_settled(run.id, RunStatus.COMPLETED)
        await queue.notifier.publish_cancel(run.id)
        await queue.streams.publish(
            "default", message_for(run.id, "trust.waiter", WakeReason.CANCEL)
        )
        await queue.streams.publish("default", message_for(run.id, "os:system", WakeReason.ENQUEUE))
    with pytest.raises(TimeoutError):
        await run.result(timeout=1.5)  # woken by the forged notice, it re-reads Postgres
    row = await store.runs.get(run.id)
    assert row is not None and row.status.value == "suspended"
    assert row.cancel_requested_at_ms is None and row.flow == "trust.waiter"
    assert await queue.complete(run.id, "go", "real")  # the real answer still decides
    assert await asyncio.wait_for(run.result(timeout=10), 15) == "real"
