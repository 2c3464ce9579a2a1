"""Events and messages from a flow's body (DBOS ``set_event`` / ``send`` / ``get_event`` in
a workflow): each is one durable call with its own key and position, never re-sent or
re-read on replay; a producer reads all of a run's events at once."""

from __future__ import annotations

import tests.flows.flows as f
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.worker.process import Worker
from tests.flows.conftest import parked


async def test_the_body_sets_sends_and_reads_events_as_durable_calls(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    target = await queue.enqueue(f.pinged)
    run = await queue.enqueue(f.publisher, target.id)
    await parked(store, run.id, "event", timeout=20)
    assert await queue.get_events(run.id) == {"stage": "one"}
    await queue.complete(run.id, "go")  # the body replays set_event, send and get_event
    assert await run.result(timeout=20) == {"sent": True, "seen": "yes"}
    # Sent once: the replay returned the send's record and sent nothing again.
    assert await target.result(timeout=20) == {"first": {"n": 1}, "more": 0}
    assert await queue.get_events(run.id) == {"stage": "two", "seen": "yes"}
    listed = await queue.list_steps(run.id)
    assert [(s.key, s.position) for s in listed] == [
        ("set_event:stage#1", 0),
        ("send:ping#1", 1),
        ("get_event:ready#1", 2),
        ("event:go#1", 3),
        ("set_event:stage#2", 4),
        ("set_event:seen#1", 5),
    ]
    assert await queue.get_events("no-such-run") == {}


async def test_a_sync_flow_sends_and_reads_events_too(worker: Worker, queue: AsyncQueue) -> None:
    target = await queue.enqueue(f.pinged)
    run = await queue.enqueue(f.sync_sender, target.id)
    assert await run.result(timeout=20) == {"sent": True, "seen": "yes"}
    assert await target.result(timeout=20) == {"first": {"n": 2}, "more": 0}
    assert [s.key for s in await queue.list_steps(run.id)] == ["send:ping#1", "get_event:ready#1"]
