"""One owner at a time under partitions and stalls.

Every test runs real worker processes whose Postgres and/or Redis traffic passes through
a freezable TCP proxy (bytes stall both ways, as in a silent packet drop), and flows that
write a side-effect ledger (a file: reachable whatever the network does). The ledger
proves what each owner really executed, and when, against the journal's database time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import tests.fleet.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner, RunStatus
from runfleet.worker.watchdog import FAILSTOP_EXIT
from tests.fleet.procs import WorkerProc, records
from tests.fleet.tcpproxy import FreezableProxy
from tests.support.polling import until

pytestmark = pytest.mark.chaos

Proxy = Callable[[str], Awaitable[tuple[FreezableProxy, str]]]


@pytest.fixture
async def proxied() -> AsyncIterator[Proxy]:
    """Route a URL through a new freezable proxy; returns (proxy, proxied URL)."""
    started: list[FreezableProxy] = []

    async def make(url: str) -> tuple[FreezableProxy, str]:
        parts = urlsplit(url)
        proxy = await FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 0).start()
        started.append(proxy)
        netloc = parts.netloc.rsplit(":", 1)[0] + f":{proxy.port}"
        return proxy, urlunsplit(parts._replace(netloc=netloc))

    yield make
    for proxy in started:
        proxy.thaw()
        await proxy.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.jsonl"
    path.touch(mode=0o666)
    return path


def read_ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def all_settled(store: Store, run_ids: list[str]) -> bool:
    rows = await store.runs.get_many(run_ids)
    return len(rows) == len(run_ids) and all(r.status.terminal for r in rows)


async def steals(store: Store, run_ids: list[str]) -> list[Any]:
    found = []
    for run_id in run_ids:
        found += await records(store, run_id, "stolen-and-activated")
    return found


async def assert_settled_once(store: Store, run_ids: list[str]) -> None:
    for row in await store.runs.get_many(run_ids):
        assert row.status is RunStatus.COMPLETED, (row.id, row.status, row.state)
        assert len(await records(store, row.id, "transitioned")) == 1, row.id


def dump(store_records: list[Any], *procs: WorkerProc | None) -> None:
    for r in store_records:
        print(r.kind, r.source_id, r.payload, r.at_ms)
    for proc in procs:
        if proc is not None:
            print(f"--- worker {proc.pid} ---\n{proc.log()[-4000:]}")


@pytest.mark.parametrize("cut", ["one-host", "every-host"])
async def test_redis_only_partition_steals_nothing(
    settings: Settings, store: Store, proxied: Proxy, ledger: Path, cut: str
) -> None:
    """Owners that still renew in Postgres keep their runs whatever Redis does."""
    proxy_a, redis_a = await proxied(settings.redis_url)
    proxy_b, redis_b = await proxied(settings.redis_url)
    # Different hosts: no pid check on the same host can stand in for the key.
    a = WorkerProc(settings, redis_url=redis_a, concurrency=4, host_id="host-a")
    b: WorkerProc | None = None
    run_ids: list[str] = []
    try:
        await a.wait_started()
        # With every host cut, runs must outlast the Redis client's 10 s socket timeout:
        # that is when a worker falls back to driving runs without Redis.
        steps = 10 if cut == "one-host" else 45
        async with AsyncQueue("default", settings=settings) as queue:
            for i in range(4):
                run = await queue.enqueue(
                    flows.ledger_steps, str(ledger), steps, 300, run_id=f"r{i}"
                )
                run_ids.append(run.id)

            async def all_running_on_a() -> bool:
                rows = await store.runs.get_many(run_ids)
                return all(r.status is RunStatus.RUNNING and r.owner for r in rows)

            await until(all_running_on_a, 15, "every run running on A")
            b = WorkerProc(settings, redis_url=redis_b, host_id="host-b")
            await b.wait_started()
            proxy_a.freeze()
            if cut == "every-host":
                proxy_b.freeze()
            # Many times stale_after: a Redis-blind thief would have stolen by now.
            await until(lambda: all_settled(store, run_ids), 45, "runs to settle")
        assert await steals(store, run_ids) == []
        await assert_settled_once(store, run_ids)
        owners = {line["pid"] for line in read_ledger(ledger)}
        assert owners == {a.pid}, "a step ran on a worker that did not own the run"
    except BaseException:
        dump([r for i in run_ids for r in await store.journal.records(i)], a, b)
        raise
    finally:
        proxy_a.thaw()
        proxy_b.thaw()
        a.close()
        if b is not None:
            b.close()


async def test_full_partition_lapses_before_takeover(
    settings: Settings, store: Store, proxied: Proxy, ledger: Path
) -> None:
    """Cut from both services, the owner stops its steps before anyone may take them."""
    pg_proxy, pg_a = await proxied(settings.database_url)
    redis_proxy, redis_a = await proxied(settings.redis_url)
    a = WorkerProc(settings, database_url=pg_a, redis_url=redis_a, concurrency=4, host_id="a")
    b: WorkerProc | None = WorkerProc(settings, host_id="b")
    run_ids: list[str] = []
    try:
        await a.wait_started()
        assert b is not None
        await b.wait_started()
        # B is frozen while the runs are admitted, so that A holds every one of them,
        # and is ready the moment A is cut off (a slow start would let the runs finish).
        b.signal(signal.SIGSTOP)
        async with AsyncQueue("default", settings=settings) as queue:
            for i in range(3):
                run = await queue.enqueue(flows.ledger_steps, str(ledger), 12, 150, run_id=f"p{i}")
                run_ids.append(run.id)

            async def running() -> bool:
                rows = await store.runs.get_many(run_ids)
                return all(r.status is RunStatus.RUNNING for r in rows)

            await until(running, 15, "runs running on A")
            b.signal(signal.SIGCONT)
            pg_proxy.freeze()
            redis_proxy.freeze()
            await until(lambda: all_settled(store, run_ids), 40, "runs to settle on B")
        taken = await steals(store, run_ids)
        assert len(taken) == len(run_ids)
        a_lines = [x for x in read_ledger(ledger) if x["pid"] == a.pid]
        for steal in taken:
            late = [x for x in a_lines if x["run"] == steal.run_id and x["t_ms"] > steal.at_ms]
            assert late == [], f"A executed {late} after B took {steal.run_id} at {steal.at_ms}"
        await assert_settled_once(store, run_ids)
        assert "lease.lapsed" in a.log()
    except BaseException:
        dump([r for i in run_ids for r in await store.journal.records(i)], a, b)
        raise
    finally:
        pg_proxy.thaw()
        redis_proxy.thaw()
        a.close()
        if b is not None:
            b.close()


async def test_lapsed_worker_claims_nothing_until_reconfirmed(
    settings: Settings, store: Store, spawn: Any, ledger: Path, proxied: Proxy
) -> None:
    """Hung renewals (A's Postgres link frozen) lapse A; A then claims no new run until a
    renewal is confirmed again. (A row lock does not hang a renewal: it skips the row.)"""
    proxy, database_a = await proxied(settings.database_url)
    a = spawn(concurrency=4, database_url=database_a)
    b: WorkerProc | None = None
    await a.wait_started()
    try:
        async with AsyncQueue("default", settings=settings) as queue:
            held = await queue.enqueue(flows.ledger_steps, str(ledger), 40, 100, run_id="held")
            await until(lambda: _running(store, "held"), 15, "held run on A")
            proxy.freeze()  # A's renewals now hang, unconfirmed
            await until(lambda: _true(lambda: "lease.lapsed" in a.log()), 15, "A to lapse")
            b = spawn(concurrency=4)
            await b.wait_started()
            fresh = [
                (await queue.enqueue(flows.ledger_steps, str(ledger), 2, 50)).id for _ in range(12)
            ]
            await until(lambda: all_settled(store, fresh), 30, "new runs to settle")
            for run_id in fresh:
                (claim,) = await records(store, run_id, "claimed-and-activated")
                claimant = Owner.parse(str(claim.payload["owner"]))
                assert claimant is not None and claimant.pid == b.pid, f"lapsed A claimed {run_id}"
            proxy.thaw()
            await until(lambda: all_settled(store, [held.id]), 30, "held run to settle")
            # Reconfirmed, A takes work again.
            again = [
                (await queue.enqueue(flows.ledger_steps, str(ledger), 1, 300)).id for _ in range(16)
            ]
            await until(lambda: all_settled(store, again), 30, "runs after reconfirmation")
            owners = {
                str((await records(store, r, "claimed-and-activated"))[0].payload["owner"])
                for r in again
            }
            assert any(f":{a.pid}:" in o for o in owners), owners
        _no_overlap(read_ledger(ledger))
    except BaseException:
        dump(await store.journal.records("held"), a, b)
        raise
    finally:
        proxy.thaw()


async def test_sync_step_thread_is_not_released_while_running(
    settings: Settings, store: Store, spawn: Any, ledger: Path
) -> None:
    """Shutdown cannot stop a thread: the run is released only after its step ended.

    The grace (2 s) ends while the 2.5 s step runs, and the step ends inside the stop
    deadline (grace + 2 s); a step still running at the deadline ends with its process
    instead, and the run is taken over (tests/security/test_stop_always.py)."""
    a = spawn(concurrency=2, grace_period=2.0)
    await a.wait_started()
    async with AsyncQueue("default", settings=settings) as queue:
        run = await queue.enqueue(flows.ledger_sync_steps, str(ledger), 2, 2500, run_id="t")
        await until(
            lambda: _true(lambda: any(x["at"] == "start" for x in read_ledger(ledger))),
            15,
            "the first step to start on A",
        )
        a.signal(signal.SIGTERM)
        b = spawn(concurrency=2)
        await b.wait_started()
        await until(lambda: all_settled(store, [run.id]), 40, "run to settle")
    released = await records(store, run.id, "interrupt-released")
    lines = read_ledger(ledger)
    a_end = [x for x in lines if x["pid"] == a.pid and x["at"] == "end" and x["step"] == 0]
    if released:  # A released the run once its step had ended
        assert a_end, "A's thread did not finish its step"
        assert released[0].at_ms >= a_end[0]["t_ms"] - 5, "released while A's step was running"
    else:  # a loaded machine: the stop deadline came first, A ended with its process
        assert await records(store, run.id, "stolen-and-activated"), "neither released nor taken"
    _no_overlap(lines)  # either way, B never ran a step while A's thread still ran it
    await assert_settled_once(store, [run.id])


async def test_blocked_event_loop_fails_stop_before_the_lease_is_stale(
    settings: Settings, store: Store, spawn: Any, ledger: Path
) -> None:
    """CPU-bound code freezes the loop: the watchdog ends the process before a takeover."""
    a = spawn(concurrency=2)
    await a.wait_started()
    async with AsyncQueue("default", settings=settings) as queue:
        run = await queue.enqueue(flows.block_loop, str(ledger), 30.0, run_id="cpu")
        await until(lambda: _running(store, "cpu"), 15, "run on A")
        code = await a.wait_exit(timeout=15)
        exited_ms = int(time.time() * 1000)
        assert code == FAILSTOP_EXIT, a.log()[-3000:]
        assert "worker.failstop" in a.log()
        b = spawn(concurrency=2)
        await b.wait_started()
        (steal,) = await until(lambda: records(store, run.id, "stolen-and-activated"), 20, "steal")
        # A was gone (it exited) before B took the run: no second owner while A ran.
        assert steal.at_ms >= exited_ms - 50
    assert not any(x["at"] == "unblocked" and x["pid"] == a.pid for x in read_ledger(ledger))
    row = await store.runs.get(run.id)
    assert row is not None and row.owner is not None and row.owner.pid == b.pid


def _no_overlap(lines: list[dict[str, Any]]) -> None:
    """No two processes were inside the same step of the same run at the same time."""
    spans: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    open_: dict[tuple[str, int, int], int] = {}
    for x in sorted(lines, key=lambda x: x["t_ms"]):
        key = (x["run"], x.get("step", -1), x["pid"])
        if x["at"] == "start":
            open_[key] = x["t_ms"]
        elif x["at"] == "end" and key in open_:
            spans.setdefault(key[:2], []).append((open_.pop(key), x["t_ms"], x["pid"]))
    for step, intervals in spans.items():
        intervals.sort()
        for (_s1, e1, p1), (s2, _e2, p2) in itertools.pairwise(intervals):
            assert not (p1 != p2 and s2 < e1), f"{step} ran on {p1} and {p2} at once"


async def _running(store: Store, run_id: str) -> bool:
    row = await store.runs.get(run_id)
    return row is not None and row.status is RunStatus.RUNNING


async def _true(check: Callable[[], bool]) -> bool:
    await asyncio.sleep(0)
    return check()
