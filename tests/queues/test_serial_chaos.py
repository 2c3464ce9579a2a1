"""Chaos: a serial queue (fleet-wide concurrency 1) across three real worker processes,
the one executing SIGKILLed mid-run, twice. A ledger of body starts and ends proves no two
bodies ever overlapped, and the queue never stalls after a kill longer than the takeover."""

from __future__ import annotations

import itertools
import signal
import tempfile
import time
from pathlib import Path

import pytest

import tests.queues.flows as qf
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from tests.fleet.procs import Spawn, WorkerProc
from tests.support.polling import until

pytestmark = pytest.mark.chaos

RUNS = 12
NAP_MS = 400
KILLS = 2


def ledger(path: Path) -> list[tuple[str, str, int, float]]:
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(kind, tag, int(pid), float(at)) for kind, tag, pid, at in lines]


async def test_a_serial_queue_never_runs_two_at_once_through_sigkills(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    await store.queues.set("serial", concurrency=1, note="chaos test")
    path = Path(tempfile.mkstemp(prefix="rf-ledger-")[1])
    procs: dict[int, WorkerProc] = {}
    for _ in range(3):
        proc = spawn(flows="tests.queues.flows", queues="serial", concurrency=4)
        procs[proc.pid] = proc
    for proc in procs.values():
        await proc.wait_started()
    async with AsyncQueue("serial", settings=settings) as q:
        runs = await q.enqueue_many(
            [EnqueueSpec(qf.ledger_nap, (str(path), f"t{i}", NAP_MS)) for i in range(RUNS)]
        )
    kills: dict[int, float] = {}  # pid -> wall time of its SIGKILL
    for _ in range(KILLS):

        def executing() -> tuple[str, int] | None:
            entries = ledger(path)
            ended = {(tag, pid) for kind, tag, pid, _ in entries if kind == "end"}
            for kind, tag, pid, _ in reversed(entries):
                if kind == "start" and (tag, pid) not in ended and pid not in kills:
                    return tag, pid
            return None

        async def someone_executing() -> tuple[str, int] | None:
            return executing()

        _tag, pid = await until(someone_executing, 60, "a body to be executing")
        procs[pid].signal(signal.SIGKILL)
        kills[pid] = time.time()
        await procs[pid].wait_exit()

    ids = [r.id for r in runs]

    async def all_done() -> bool:
        return all(r.status is RunStatus.COMPLETED for r in await store.runs.get_many(ids))

    await until(all_done, 120, "every run of the serial queue to complete")
    entries = ledger(path)
    intervals: list[tuple[float, float, str, int]] = []
    for kind, tag, pid, at in entries:
        if kind != "start":
            continue
        ends = [a for k, t, p, a in entries if k == "end" and t == tag and p == pid]
        end = ends[0] if ends else kills[pid]  # a killed body stopped at its SIGKILL
        intervals.append((at, end, tag, pid))
    intervals.sort()
    for (_s1, e1, t1, p1), (s2, _e2, t2, p2) in itertools.pairwise(intervals):
        assert s2 >= e1 - 0.005, f"{t1}@{p1} ran until {e1:.3f}, {t2}@{p2} started at {s2:.3f}"
    assert len({tag for _, _, tag, _ in intervals}) == RUNS
    # No stall past the takeover: after each kill the next body starts within the time a
    # takeover takes (stale_after, a sweep tick, the probe) plus slack for a loaded box.
    budget = settings.stale_after + 6.0
    for killed_at in kills.values():
        nexts = [s for s, _, _, _ in intervals if s > killed_at]
        assert nexts and nexts[0] - killed_at <= budget, (nexts[:1], killed_at, budget)
