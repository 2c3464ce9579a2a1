"""An idle worker starts a run from its doorbell's entry (one Redis round trip fewer), and
the group's copy of that entry, which the doorbell did not consume, costs no second drive.

``Streams.read(peek=True)`` answers an idle wait with the entries the doorbell's XREAD
returned; the claim in Postgres decides who runs each. The consumer group still holds the
entry and hands it to the next group read: where that is this process, the intake
acknowledges it without driving the run again (tests/broker/test_idle_read.py proves a
frozen reader holds nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

import tests.fleet.flows as flows
from runfleet.broker.client import connect
from runfleet.broker.streams import Lane, Streams
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker.outcomes import DriveOutcome
from runfleet.worker.process import Worker
from tests.support.polling import until


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The doorbell peek is opt-in (``Settings.idle_peek``): these tests turn it on."""
    return settings.model_copy(update={"idle_peek": True})


RUNS = 6


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def _outcomes() -> dict[str, float]:
    found: dict[str, float] = {}
    for outcome in DriveOutcome:
        value = REGISTRY.get_sample_value(
            "runfleet_claim_outcomes_total", {"outcome": outcome.value}
        )
        if value:
            found[outcome.value] = value
    return found


async def test_idle_starts_from_the_doorbell_are_one_drive_each(
    worker: Worker,
    queue: AsyncQueue,
    settings: Settings,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    streams = Streams(redis, settings.redis_prefix)
    peeked: list[str] = []
    real = Streams._peeked

    def spy(self: Streams, *args: object, **kwargs: object) -> object:
        found = real(self, *args, **kwargs)  # type: ignore[arg-type]  # the spy passes them on
        peeked.extend(d.message.run for d in found)
        return found

    monkeypatch.setattr(Streams, "_peeked", spy)

    async def caught_up() -> bool:
        depth = await streams.depth("default", Lane.NORMAL)
        return depth.total == 0

    before = _outcomes()
    ids = []
    for i in range(RUNS):
        # The worker is back in its idle wait once the group holds nothing for it.
        await until(caught_up, timeout=10)
        run = await queue.enqueue(flows.add, i, 1)
        ids.append(run.id)
        assert await run.result(timeout=10) == i + 1
    await until(caught_up, timeout=10)  # every entry, doorbell-started or not, acknowledged
    after = _outcomes()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert delta == {DriveOutcome.ACTIVATED.value: RUNS}, delta
    assert set(peeked) & set(ids), "no run started from the doorbell"


async def test_two_idle_workers_race_for_each_doorbell_and_journal_only_the_winner(
    worker: Worker,
    queue: AsyncQueue,
    settings: Settings,
    store: Store,
    redis: Redis,
) -> None:
    """Both idle workers' doorbells ring for every run and both claim it in Postgres: one
    runs it, and the loser's race is not journaled (it is the doorbell's, not evidence)."""
    second = Worker(settings, queues=["default"], concurrency=8)
    task = asyncio.create_task(second.run())
    await asyncio.wait_for(second.started.wait(), 10)
    streams = Streams(redis, settings.redis_prefix)

    async def caught_up() -> bool:
        return (await streams.depth("default", Lane.NORMAL)).total == 0

    try:
        before = _outcomes()
        ids = []
        for i in range(RUNS):
            await until(caught_up, timeout=10)
            run = await queue.enqueue(flows.add, i, 1)
            ids.append(run.id)
            assert await run.result(timeout=10) == i + 1
        await until(caught_up, timeout=10)
        after = _outcomes()
    finally:
        second.stop(hard=True)
        await asyncio.wait_for(task, 15)
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert delta.get(DriveOutcome.ACTIVATED.value) == RUNS, delta
    for run_id in ids:
        kinds = [r.kind for r in await store.journal.records(run_id)]
        assert kinds == ["created", "claimed-and-activated", "transitioned"], (run_id, kinds, delta)
