"""Redis state is checked, not trusted: whatever a Redis client does to a queue's streams,
a run admitted meanwhile starts within the lost-wake bound (``lost_wake_within_ms``).

Each scenario freezes the worker (SIGSTOP), admits runs whose wakes then sit undelivered
in the stream, sends real Redis commands at the queue's keys as any client with access
could, and thaws the worker: every run must start within the bound the settings state,
measured on the database clock from its admission to its activation record.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import tests.fleet.flows as flows
from runfleet.broker.client import connect
from runfleet.broker.keys import GROUP, Keys
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.fleet.procs import WorkerProc
from tests.support.polling import until

pytestmark = pytest.mark.chaos

AHEAD = "99999999999999-0"
RUNS = 3
SLACK_MS = 3000
"""What a loaded two-core box adds to one dispatch, read and claim beyond the bound."""

Command = Callable[[Redis, str], Awaitable[None]]


async def _cmd(r: Redis, *args: str | bytes) -> Any:
    """One raw command, as ``redis-cli`` would send it."""
    return await r.execute_command(*args)  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated


async def _setid_ahead(r: Redis, key: str) -> None:
    await _cmd(r, "XGROUP", "SETID", key, GROUP, AHEAD)


async def _recreated_ahead(r: Redis, key: str) -> None:
    await _cmd(r, "XGROUP", "DESTROY", key, GROUP)
    await _cmd(r, "XGROUP", "CREATE", key, GROUP, AHEAD, "MKSTREAM")


async def _recreated_at_tail(r: Redis, key: str) -> None:
    await _cmd(r, "XGROUP", "DESTROY", key, GROUP)
    await _cmd(r, "XGROUP", "CREATE", key, GROUP, "$")


async def _destroyed(r: Redis, key: str) -> None:
    await _cmd(r, "XGROUP", "DESTROY", key, GROUP)


async def _deleted(r: Redis, key: str) -> None:
    await _cmd(r, "DEL", key)


async def _trimmed(r: Redis, key: str) -> None:
    await _cmd(r, "XTRIM", key, "MAXLEN", "0")


async def _setid_zero(r: Redis, key: str) -> None:
    await _cmd(r, "XGROUP", "SETID", key, GROUP, "0")


async def _consumers_deleted(r: Redis, key: str) -> None:
    """Read the waiting entries as the worker's own consumer, then delete it (its pending
    list goes with it)."""
    for consumer in await _cmd(r, "XINFO", "CONSUMERS", key, GROUP):
        name = consumer[1] if isinstance(consumer, list) else consumer[b"name"]
        await _cmd(r, "XREADGROUP", "GROUP", GROUP, name, "STREAMS", key, ">")
        await _cmd(r, "XGROUP", "DELCONSUMER", key, GROUP, name)


async def _claimed_by_a_ghost(r: Redis, key: str) -> None:
    await _cmd(r, "XREADGROUP", "GROUP", GROUP, "fake", "STREAMS", key, ">")
    for entry_id, *_ in await _cmd(r, "XRANGE", key, "-", "+"):
        await _cmd(r, "XCLAIM", key, GROUP, "ghost", "0", entry_id)


async def _wrong_type(r: Redis, key: str) -> None:
    await _cmd(r, "DEL", key)
    await _cmd(r, "SET", key, "x")


COMMANDS: dict[str, Command] = {
    "xgroup-setid-ahead": _setid_ahead,
    "group-recreated-ahead": _recreated_ahead,
    "group-recreated-at-tail": _recreated_at_tail,
    "xgroup-destroy": _destroyed,
    "del": _deleted,
    "xtrim-maxlen-0": _trimmed,
    "xgroup-setid-0": _setid_zero,
    "xgroup-delconsumer": _consumers_deleted,
    "xclaim-to-a-ghost": _claimed_by_a_ghost,
    "set-wrong-type": _wrong_type,
}


REPAIRED_BY_THE_TICK = {"xgroup-setid-ahead", "group-recreated-ahead", "set-wrong-type"}
"""Commands only the sweep tick's check repairs (a read neither fails nor recreates)."""


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = connect(settings)
    try:
        yield client
    finally:
        await client.aclose()


async def _start_delays_ms(store: Store, run_ids: list[str]) -> list[int]:
    """Each run's admission-to-activation time on the database clock (-1: not started)."""
    delays = []
    for run_id in run_ids:
        row = await store.runs.get(run_id)
        assert row is not None
        started = [r for r in await store.journal.records(run_id) if r.kind.startswith("claimed")]
        delays.append(started[0].at_ms - row.created_at_ms if started else -1)
    return delays


async def _await_starts(store: Store, settings: Settings, run_ids: list[str]) -> list[int]:
    async def delays() -> list[int]:
        return await _start_delays_ms(store, run_ids)

    bound_s = (settings.lost_wake_within_ms + SLACK_MS) / 1000
    try:
        return await until(delays, bound_s + 5, "the runs to start", accept=lambda d: -1 not in d)
    except TimeoutError as exc:
        raise AssertionError(f"runs still pending past the bound ({bound_s} s): {exc}") from exc


@pytest.mark.parametrize("command", list(COMMANDS))
async def test_a_queue_survives_any_redis_command(
    command: str, settings: Settings, store: Store, redis: Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    worker = WorkerProc(settings, concurrency=2)
    try:
        await worker.wait_started()
        async with AsyncQueue("default", settings=settings) as queue:
            warm = await queue.enqueue(flows.sleepy, 1, "warm")
            await warm.result(timeout=30)
            worker.signal(signal.SIGSTOP)
            try:
                runs = await queue.enqueue_many(
                    [EnqueueSpec(flows.sleepy, (1, f"r{i}")) for i in range(RUNS)]
                )
                for key in (keys.stream("default"), keys.recovery_stream("default")):
                    await COMMANDS[command](redis, key)
            finally:
                worker.signal(signal.SIGCONT)
            delays = await _await_starts(store, settings, [r.id for r in runs])
            # And a run admitted after the command, once the worker is running again.
            await asyncio.sleep(0.2)
            later = await queue.enqueue(flows.sleepy, 1, "later")
            delays += await _await_starts(store, settings, [later.id])
        print(
            f"{command}: started {delays} ms after admission (bound {settings.lost_wake_within_ms})"
        )
        assert max(delays) <= settings.lost_wake_within_ms + SLACK_MS, (
            delays,
            settings.lost_wake_within_ms,
        )
        assert worker.proc.poll() is None, worker.log()[-3000:]
        if command in REPAIRED_BY_THE_TICK:
            assert "stream.repaired" in worker.log(), worker.log()[-3000:]
    finally:
        worker.close()


async def test_a_group_held_ahead_does_not_stop_the_sweep(
    settings: Settings, store: Store, redis: Redis
) -> None:
    """A client that keeps the group ahead of the stream (every 20 ms, faster than any
    repair sticks): the lost-wake sweep's wake is not delivered, so it must not count as
    one; the run still starts within the bound."""
    keys = Keys(settings.redis_prefix)
    worker = WorkerProc(settings, concurrency=2)
    stop = asyncio.Event()

    async def hold_ahead() -> None:
        while not stop.is_set():
            for key in (keys.stream("default"), keys.recovery_stream("default")):
                try:
                    await _setid_ahead(redis, key)
                except Exception:
                    pass  # the stream may be gone for an instant
            await asyncio.sleep(0.02)

    try:
        await worker.wait_started()
        holder = asyncio.create_task(hold_ahead())
        try:
            async with AsyncQueue("default", settings=settings) as queue:
                runs = await queue.enqueue_many(
                    [EnqueueSpec(flows.sleepy, (1, f"h{i}")) for i in range(RUNS)]
                )
                delays = await _await_starts(store, settings, [r.id for r in runs])
        finally:
            stop.set()
            await holder
        print(f"held ahead: started {delays} ms after admission")
        assert max(delays) <= settings.lost_wake_within_ms + SLACK_MS, delays
        assert "stream.repaired" in worker.log(), worker.log()[-3000:]
    finally:
        worker.close()
