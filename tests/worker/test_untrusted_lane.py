"""A queue whose consumer group a client set ahead of its stream is not trusted again at once
(``worker.wake_marks``, ``worker.intake``), against a real Redis and Postgres.

A client that sets the group ahead once may do it again right after any repair or wake
(tests/fleet/test_redis_state.py holds it there every 20 ms under a real worker). So the
repair's reading counts every entry the stream held as delivered, whatever the rewind
brings back, and the marks pass those runs; and the lost-pending sweep's wakes for the
queue are driven in the process instead of published where they could be hidden again.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from redis.asyncio import Redis

import tests.fleet.flows as flows
from runfleet.broker.keys import GROUP
from runfleet.broker.stream_health import StreamHealth
from runfleet.broker.streams import Lane, Streams
from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker.coordinator import Coordinator
from runfleet.worker.intake import Intake
from runfleet.worker.outbox import Outbox
from runfleet.worker.wake_marks import WakeMarks
from tests.store.helpers import OWNER_A

AHEAD = "99999999999999-0"


@pytest.fixture
def redis(redis_client: Redis) -> Redis:
    return redis_client


async def _admit(settings: Settings, count: int) -> list[str]:
    async with AsyncQueue("default", settings=settings) as queue:
        return [(await queue.enqueue(flows.sleepy, 1, f"u{i}")).id for i in range(count)]


async def test_a_group_found_ahead_lets_the_marks_pass_what_its_stream_held(
    settings: Settings, store: Store, redis: Redis
) -> None:
    """The repair rewinds the group to the last id a sound reading saw delivered (here
    0-0: nothing was read), so a re-read shows the admissions undelivered; they count as
    delivered all the same, and the queue's mark passes them once that reading is one
    claim grace old (its witness)."""
    streams = Streams(redis, settings.redis_prefix)
    await streams.ensure_groups(["default"])
    marks = WakeMarks(store, streams, ["default"], settings, StreamHealth(redis))
    await _admit(settings, 2)
    await marks.sample()  # sound: the group has delivered nothing yet
    assert not marks.untrusted("default")
    before = (await store.sweeps.wake_marks()).get("default")
    await redis.execute_command(  # type: ignore[no-untyped-call]  # unannotated in redis-py
        "XGROUP", "SETID", streams.stream_key("default"), GROUP, AHEAD
    )
    await marks.sample()  # finds the group ahead, repairs it, counts what it hid
    assert marks.untrusted("default")
    await asyncio.sleep(settings.wake_claim_grace_ms / 1000 + 0.1)
    await marks.sample()  # the repair's reading is now old enough to be the witness

    after = (await store.sweeps.wake_marks()).get("default")
    assert after is not None and (before is None or after > before), (before, after)
    info = await redis.xinfo_groups(streams.stream_key("default"))
    assert info[0]["last-delivered-id"] in (b"0-0", "0-0"), info  # rewound, not skipped


async def test_a_queue_whose_group_was_only_destroyed_stays_trusted(
    settings: Settings, store: Store, redis: Redis
) -> None:
    """A missing group is recreated from id 0 (everything its stream holds is delivered
    again), so wakes published there are delivered: the queue stays trusted."""
    streams = Streams(redis, settings.redis_prefix)
    await streams.ensure_groups(["default"])
    marks = WakeMarks(store, streams, ["default"], settings, StreamHealth(redis))
    await _admit(settings, 1)
    await marks.sample()
    assert not marks.untrusted("default")
    await redis.xgroup_destroy(streams.stream_key("default"), GROUP)
    await marks.sample()
    assert await redis.xinfo_groups(streams.stream_key("default"))  # repaired
    assert not marks.untrusted("default")


class _Drives:
    """Stands in for the coordinator: records the drives asked for, runs none."""

    def __init__(self) -> None:
        self.driven: list[str] = []
        self.closed = False

    def active(self) -> int:
        return len(self.driven)

    def drive(self, run_id: str, *args: Any, **kwargs: Any) -> None:
        self.driven.append(run_id)

    def driving(self, run_id: str) -> bool:
        return run_id in self.driven


def _intake(
    settings: Settings, store: Store, streams: Streams, drives: _Drives, untrusted: bool, slots: int
) -> Intake:
    return Intake(
        store=store,
        streams=streams,
        outbox=cast(Outbox, None),  # dispatch publishes through the streams, not the outbox
        coordinator=cast(Coordinator, drives),
        settings=settings,
        owner=OWNER_A,
        queues=["default"],
        concurrency=slots,
        may_claim=lambda: True,
        untrusted=lambda queue: untrusted and queue == "default",
    )


@pytest.mark.parametrize("untrusted", [False, True])
async def test_the_lost_pending_wake_of_an_untrusted_queue_is_driven_here(
    settings: Settings, store: Store, redis: Redis, untrusted: bool
) -> None:
    """Trusted: the wake goes on the stream (the fleet shares it), no drive here.
    Untrusted: no entry is published; the runs are driven here as far as slots go, and
    only those count as dispatched (the sweep comes back for the rest)."""
    streams = Streams(redis, settings.redis_prefix)
    await streams.ensure_groups(["default"])
    run_ids = await _admit(settings, 3)
    key = streams.stream_key("default", Lane.NORMAL)
    published = await redis.xlen(key)
    drives = _Drives()
    intake = _intake(settings, store, streams, drives, untrusted, slots=2)

    dispatched = await intake.dispatch(run_ids, WakeReason.SWEEP_LOST_PENDING)

    if untrusted:
        assert await redis.xlen(key) == published
        assert drives.driven == run_ids[:2]
        assert dispatched == set(run_ids[:2])
    else:
        assert await redis.xlen(key) == published + 3
        assert drives.driven == []
        assert dispatched == set(run_ids)
