"""The overview's plots read the journal incrementally: nothing counted twice or skipped."""

from __future__ import annotations

import tests.dashboard.flows as d
from runfleet.ops.cli import common as c
from runfleet.ops.dashboard.data import JournalTail
from runfleet.producer import AsyncQueue
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.worker.process import Worker


def _completed(tail: JournalTail, now_ms: int) -> int:
    return sum(tail.charts(now_ms)[0].series[0].values)


async def test_refreshes_count_each_settlement_once(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    tail = JournalTail()
    async with c.connect(settings) as conns:
        first = [await queue.enqueue(d.ticker, 1, 0) for _ in range(3)]
        for run in first:
            await run.result(timeout=10)
        now = await store.stats.now_ms()
        await tail.refresh(conns, now)
        assert _completed(tail, now) == 3
        await tail.refresh(conns, now)  # the lag overlap re-reads them: still three
        assert _completed(tail, now) == 3
        # no claim was ever recovered: that cursor still moved up near the journal's head
        # (the newest run's last record), so later refreshes do not scan the journal from
        # its start for that kind
        newest = (await store.inspect.list_runs(limit=1))[0]
        (last,) = await store.journal.last(newest.id, 1)
        assert tail.after[Kind.CLAIM_RECOVERED] >= last.seq > 0

        second = [await queue.enqueue(d.ticker, 1, 0) for _ in range(2)]
        for run in second:
            await run.result(timeout=10)
        now = await store.stats.now_ms()
        await tail.refresh(conns, now)
        assert _completed(tail, now) == 5
        # a new tail (a restarted dashboard) reads the same history from the beginning
        fresh = JournalTail()
        await fresh.refresh(conns, now)
        assert _completed(fresh, now) == 5
        assert _completed(fresh, now + 11 * 60_000) == 0  # out of the 10-minute window
