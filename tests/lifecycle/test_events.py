"""Events a flow publishes and messages sent to it (real Postgres, Redis, workers)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import tests.lifecycle.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.rqface import Queue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.events import MessageRunSettled, MessageSent
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, records, running_on
from tests.support.polling import until

LIFECYCLE_FLOWS = "tests.lifecycle.flows"


async def test_an_event_is_set_again_and_the_latest_value_wins(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(flows.progress)
    assert await queue.get_event(run.id, "stage", timeout=20) == {"n": 1}
    # The run now waits in recv("go"): the event stays as set, and a get does not block.
    assert await queue.get_event(run.id, "stage") == {"n": 1}
    assert await queue.get_event(run.id, "unset", timeout=0.1) is None
    sent = await queue.send(run.id, "go", "now")
    assert isinstance(sent, MessageSent)
    assert await run.result(timeout=20) == "done"
    row = await queue.get_event_row(run.id, "stage")
    assert row is not None and row.value == {"n": 3} and row.version == 3
    # Settled without it: answered at once, not after the timeout.
    started = asyncio.get_running_loop().time()
    assert await queue.get_event(run.id, "unset", timeout=30) is None
    assert asyncio.get_running_loop().time() - started < 5
    kinds = [r.kind for r in await store.journal.records(run.id)]
    assert kinds.count("event-set") == 3
    assert kinds.count("message-sent") == 1 and kinds.count("message-received") == 1


async def test_the_sync_queue_reads_events_and_sends(
    worker: Worker, settings: Settings, store: Store
) -> None:
    q = Queue("default", settings=settings)
    try:
        run = await asyncio.to_thread(q.enqueue, flows.sync_messages)
        assert await asyncio.to_thread(q.get_event, run.id, "ready", 20) is True
        for value in ("a", "b"):
            assert isinstance(await asyncio.to_thread(q.send, run.id, "in", value), MessageSent)
        result = await asyncio.to_thread(run.wait, 20)
        assert result == ["a", "b", True]
        assert await asyncio.to_thread(q.get_event, run.id, "ready") is False
    finally:
        await asyncio.to_thread(q.close)


async def test_messages_sent_before_the_run_starts_arrive_in_order(
    queue: AsyncQueue, store: Store, settings: Settings, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    run = await queue.enqueue(flows.consume, 5, str(ledger), 0)
    for i in range(5):
        await queue.send(run.id, "item", i)
    w = Worker(settings, queues=["default"], concurrency=4)
    task = asyncio.create_task(w.run())
    try:
        assert await run.result(timeout=30) == [0, 1, 2, 3, 4]
    finally:
        w.stop(hard=True)
        await asyncio.wait_for(task, 15)
    messages = await store.events.messages_of_run(run.id)
    assert [m.consumed_key for m in messages] == [f"recv:item#{i}" for i in range(1, 6)]


async def test_a_retried_send_is_delivered_once_and_a_settled_run_takes_none(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    run = await queue.enqueue(flows.consume, 2, str(tmp_path / "l"), 0)
    first = await queue.send(run.id, "item", "x", message_id="m-1")
    again = await queue.send(run.id, "item", "x", message_id="m-1")
    assert isinstance(first, MessageSent) and isinstance(again, MessageSent)
    assert again.duplicate and again.seq == first.seq
    await queue.send(run.id, "item", "y", message_id="m-2")
    assert await run.result(timeout=20) == ["x", "y"]
    late = await queue.send(run.id, "item", "z")
    assert isinstance(late, MessageRunSettled) and late.status.value == "completed"
    assert len(await store.events.messages_of_run(run.id)) == 2
    with pytest.raises(InvalidInput):
        await queue.send(run.id, "", 1)
    with pytest.raises(InvalidInput):
        await queue.get_event(run.id, "stage", timeout=-1)


async def test_a_recv_times_out_on_its_durable_clock(worker: Worker, queue: AsyncQueue) -> None:
    run = await queue.enqueue(flows.recv_timeout, 0.5)
    assert await run.result(timeout=20) == "timed out"
    zero = await queue.enqueue(flows.recv_timeout, 0)
    assert await zero.result(timeout=20) == "timed out"


@pytest.mark.chaos
async def test_an_event_set_before_a_sigkill_is_read_after_it(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    a = spawn(flows=LIFECYCLE_FLOWS)
    await a.wait_started()
    run = await queue.enqueue(flows.event_then_slow, str(ledger), 6000)
    await until(lambda: running_on(store, run.id, a.pid), 20, "run to start on A")
    assert await queue.get_event(run.id, "url", timeout=20) == "https://pay.example/1"
    await until(lambda: _has(ledger, "slow-start"), 20, "the slow step to start on A")
    a.signal(signal.SIGKILL)
    await a.wait_exit()
    row = await queue.get_event_row(run.id, "url")
    assert row is not None and row.value == "https://pay.example/1" and row.version == 1
    b = spawn(flows=LIFECYCLE_FLOWS)
    await b.wait_started()
    result = await run.result(timeout=60)
    assert result["pid"] == b.pid
    row = await queue.get_event_row(run.id, "url")
    # The replay skipped the recorded first set: two sets in all, never three.
    assert row is not None and row.value == "https://pay.example/2" and row.version == 2
    assert len(await records(store, run.id, "stolen-and-activated")) == 1
    assert len(await records(store, run.id, "event-set")) == 2


@pytest.mark.chaos
async def test_every_message_is_delivered_once_in_order_across_a_sigkill(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    n = 8
    a = spawn(flows=LIFECYCLE_FLOWS)
    await a.wait_started()
    run = await queue.enqueue(flows.consume, n, str(ledger), 400)
    for i in range(n // 2):
        await queue.send(run.id, "item", {"i": i})
    await until(
        lambda: _count(ledger, "work"), 30, "A to work through two", accept=lambda c: c >= 2
    )
    a.signal(signal.SIGKILL)
    await a.wait_exit()
    b = spawn(flows=LIFECYCLE_FLOWS)
    await b.wait_started()
    for i in range(n // 2, n):
        await queue.send(run.id, "item", {"i": i})
    assert await run.result(timeout=90) == [{"i": i} for i in range(n)]
    messages = await store.events.messages_of_run(run.id)
    assert [m.seq for m in messages] == sorted(m.seq for m in messages)
    assert [m.consumed_key for m in messages] == [f"recv:item#{i}" for i in range(1, n + 1)]
    received = await records(store, run.id, "message-received")
    assert sorted(int(r.payload["seq"]) for r in received) == [m.seq for m in messages]
    assert len(await records(store, run.id, "stolen-and-activated")) == 1


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def _has(path: Path, text: str) -> bool:
    return text in await asyncio.to_thread(_read, path)


async def _count(path: Path, text: str) -> int:
    return (await asyncio.to_thread(_read, path)).count(text)
