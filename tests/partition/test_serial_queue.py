"""Chaos: a serial queue (fleet-wide concurrency 1) on two hosts, the host executing its
run partitioned (Postgres and Redis cut) mid-body, then a worker SIGKILLed mid-body. A
ledger of body starts and ends (on a disk no cut reaches) proves no two bodies ever ran
at once, and after the cut and after the kill the next body starts within the takeover's
time (stale_after, a sweep tick, the probe) plus slack for a loaded box. The kill half
alone, on one host, is tests/queues/test_serial_chaos.py."""

from __future__ import annotations

import itertools
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from psycopg import sql

import tests.queues.flows as qf
from runfleet.ops.servers.resolve import database_url_for
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from tests.partition.cluster import timing
from tests.partition.conftest import Servers, _admin
from tests.partition.hosts import HostWorkers
from tests.partition.net import Service, Topology
from tests.support.polling import until

pytestmark = [pytest.mark.chaos, pytest.mark.partition, pytest.mark.timeout(240)]

RUNS = 16
NAP_MS = 700
SLACK_S = 6.0


Entry = tuple[str, str, int, float]


def ledger(path: Path) -> list[Entry]:
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(kind, tag, int(pid), float(at)) for kind, tag, pid, at in lines]


def executing(path: Path, pids: set[int], dead: set[int]) -> tuple[str, int] | None:
    """A body that started in one of ``pids`` and has not ended (its process alive)."""
    entries = ledger(path)
    ended = {(tag, pid) for kind, tag, pid, _ in entries if kind == "end"}
    for kind, tag, pid, _ in reversed(entries):
        if kind == "start" and (tag, pid) not in ended and pid in pids and pid not in dead:
            return tag, pid
    return None


class SerialFleet:
    def __init__(self, topo: Topology, settings: Settings, store: Store) -> None:
        self.topo, self.settings, self.store = topo, settings, store
        flows = "tests.queues.flows"
        self.a = HostWorkers(topo.hosts["a"], settings, flows=flows, processes=2, concurrency=2)
        self.b = HostWorkers(topo.hosts["b"], settings, flows=flows, processes=1, concurrency=2)

    def close(self) -> None:
        self.topo.heal()
        self.a.close()
        self.b.close()


@pytest.fixture
async def fleet(
    net: Topology, bridge_servers: Servers, partition_template: str
) -> AsyncIterator[SerialFleet]:
    postgres, redis = bridge_servers
    name = f"rf_p_{uuid.uuid4().hex[:12]}"
    await _admin(
        postgres.url,
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(partition_template)
        ),
    )
    settings = timing(
        Settings(
            database_url=database_url_for(postgres.url, name),
            redis_url=redis.url,
            redis_prefix=f"rfp-{uuid.uuid4().hex[:8]}",
        )
    )
    store = await Store.open(settings)
    built = SerialFleet(net, settings, store)
    try:
        await built.a.wait_started()
        await built.b.wait_started()
        yield built
    finally:
        built.close()
        await store.close()
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        await _admin(postgres.url, drop)


async def test_a_serial_queue_through_a_partition_and_a_sigkill(
    fleet: SerialFleet, tmp_path: Path
) -> None:
    store, settings = fleet.store, fleet.settings
    await store.queues.set("default", concurrency=1, note="serial partition chaos")
    path = tmp_path / "ledger"
    path.touch(mode=0o666)
    tags = itertools.count()
    ids: list[str] = []

    async def admit(n: int) -> None:
        async with AsyncQueue("default", settings=settings) as q:
            runs = await q.enqueue_many(
                [
                    EnqueueSpec(qf.ledger_nap, (str(path), f"t{next(tags)}", NAP_MS))
                    for _ in range(n)
                ]
            )
        ids.extend(r.id for r in runs)

    await admit(RUNS)
    dead: set[int] = set()
    b_pids = set(fleet.b.pids())

    async def b_executing() -> tuple[str, int] | None:
        return executing(path, b_pids, dead)

    async def b_executing_or_fed() -> tuple[str, int] | None:
        """Which host claims each body is a race: should host A win a whole wave, admit
        another (as tests/partition/scenario.py does), so the cut always finds B busy."""
        found = await b_executing()
        if found is None:
            rows = await store.runs.get_many(ids)
            if sum(r.status is not RunStatus.COMPLETED for r in rows) < 2:
                await admit(RUNS)
        return found

    # The partition: host B loses Postgres and Redis while its body runs.
    await until(b_executing_or_fed, 90, "host B to execute a body of the serial queue")
    fleet.topo.cut("b", Service.POSTGRES, Service.REDIS)
    cut_at = time.time()
    a_pids = set(fleet.a.pids())

    async def a_started_after_cut() -> bool:
        return any(k == "start" and p in a_pids and at > cut_at for k, _, p, at in ledger(path))

    await until(a_started_after_cut, settings.stale_after + 60, "host A to take over")
    fleet.topo.heal("b")

    # The kill: whichever worker executes next is SIGKILLed mid-body.
    async def anyone_executing() -> tuple[str, int] | None:
        return executing(path, set(fleet.a.pids()) | set(fleet.b.pids()), dead)

    _tag, pid = await until(anyone_executing, 60, "a body to be executing")
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    dead.add(pid)

    async def all_done() -> bool:
        return all(r.status is RunStatus.COMPLETED for r in await store.runs.get_many(ids))

    await until(all_done, 150, "every run of the serial queue to complete")
    entries = ledger(path)
    intervals: list[tuple[float, float, str, int]] = []
    for kind, tag, p, at in entries:
        if kind != "start":
            continue
        ends = [a for k, t, q2, a in entries if k == "end" and t == tag and q2 == p and a >= at]
        assert ends or p == pid, f"{tag}@{p} never ended and was not killed"
        intervals.append((at, min(ends) if ends else killed_at, tag, p))
    intervals.sort()
    for (_s1, e1, t1, p1), (s2, _e2, t2, p2) in itertools.pairwise(intervals):
        assert s2 >= e1 - 0.005, f"{t1}@{p1} ran until {e1:.3f}, {t2}@{p2} started at {s2:.3f}"
    assert len({tag for _, _, tag, _ in intervals}) == len(ids)
    budget = settings.stale_after + SLACK_S
    stalls = {}
    for what, at in (("partition", cut_at), ("sigkill", killed_at)):
        nexts = [s for s, _, _, _ in intervals if s > at]
        assert nexts, f"nothing started after the {what}"
        stalls[what] = nexts[0] - at
    print(f"serial queue: next body {stalls} s after each event (budget {budget} s)")
    assert all(stall <= budget for stall in stalls.values()), (stalls, budget)
