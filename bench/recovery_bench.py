"""SIGKILL -> re-activation: on an empty queue, and behind a backlog with busy survivors.

Recovery is measured in database time from the kill to each ``stolen-and-activated``
journal record, for exactly the runs the dead process still held. The empty-queue
phase shows the floor (stale_after + a sweep tick); the backlog phase shows whether a
takeover waits behind pending work: 1,000 short runs are admitted to a fleet of busy
workers, one is SIGKILLed, and its runs must start on the next free slot (the recovery
lane), not after the backlog drains.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from bench import runfleet_side
from bench.figures import percentile
from bench.noop import QUEUE, nap
from runfleet.ops.bench.procs import Proc, runfleet_worker, wait_workers_started
from runfleet.ops.bench.scratch import BenchError
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import JournalRecord, Owner, RunStatus

FLOWS = runfleet_side.FLOWS_MODULE
BACKLOG_QUEUE = f"{QUEUE}-backlog"
"""Its own queue: runs left over from the empty-queue phase never take its slots."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """Kill-to-steal delays (ms, database time) over ``kills`` SIGKILLs.

    ``backlog`` is the number of runs admitted before each kill (0: an empty queue) and
    ``pending_at_kill`` how many of them were still pending when the victim died.
    """

    kills: int
    runs_per_kill: int
    delays_ms: tuple[float, ...]
    backlog: int = 0
    pending_at_kill: tuple[int, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "kills": self.kills,
            "runs_per_kill": self.runs_per_kill,
            "backlog": self.backlog,
            "pending_at_kill": list(self.pending_at_kill),
            "steals": len(self.delays_ms),
            "p50_ms": round(percentile(self.delays_ms, 50), 1),
            "p99_ms": round(percentile(self.delays_ms, 99), 1),
            "max_ms": round(max(self.delays_ms, default=0.0), 1),
        }


async def empty_queue(
    settings: Settings, store: Store, *, workers: int, kills: int, per_kill: int, nap_s: float
) -> Recovery:
    """SIGKILL the worker holding the most runs, ``kills`` times; kill -> each steal."""

    def start() -> Proc:
        return runfleet_worker(settings, flows=FLOWS, queues=QUEUE, concurrency=2 * per_kill)

    procs = [start() for _ in range(workers)]
    delays: list[float] = []
    after_seq = await _last_steal_seq(store)
    try:
        async with AsyncQueue(QUEUE, settings=settings) as queue:
            for _ in range(kills):
                await wait_workers_started(settings, procs, timeout=30)
                batch = await queue.enqueue_many([EnqueueSpec(nap, (nap_s,))] * per_kill)
                await _until_running(store, [r.id for r in batch], procs)
                owned = await store.stats.running_by_owner()
                victim = max(procs, key=lambda p: _held(owned, p.pid))
                killed_at = await store.stats.now_ms()
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait(10)
                # Counted after the kill: what the dead process still holds is exactly
                # what must be stolen (nothing is stealable for seconds yet).
                expected = _held(await store.stats.running_by_owner(), victim.pid)
                procs.remove(victim)
                victim.close()
                procs.append(start())  # the fleet is back to strength for the next kill
                steals = await _until_stolen(store, after_seq, expected, timeout=60)
                after_seq = max(r.seq for r in steals)
                delays.extend(float(r.at_ms - killed_at) for r in steals)
    finally:
        for proc in procs:
            proc.close()
    return Recovery(kills, per_kill, tuple(delays))


async def with_backlog(
    settings: Settings,
    store: Store,
    *,
    survivors: int,
    concurrency: int,
    kills: int,
    backlog: int,
    nap_ms: tuple[int, int],
) -> Recovery:
    """Per kill: a fresh fleet, ``backlog`` naps admitted, the busiest worker SIGKILLed.

    Every worker (the victim too) has ``concurrency`` slots, so the survivors are busy
    for as long as the backlog lasts: a takeover can only start on a slot one of them
    frees, and must take it before the pending runs do.
    """
    low, high = nap_ms
    specs = [
        EnqueueSpec(nap, ((low + (i * 37) % (high - low + 1)) / 1000,)) for i in range(backlog)
    ]
    delays: list[float] = []
    pending_at_kill: list[int] = []
    held_at_kill: list[int] = []
    for _ in range(kills):
        procs = [
            runfleet_worker(settings, flows=FLOWS, queues=BACKLOG_QUEUE, concurrency=concurrency)
            for _ in range(survivors + 1)
        ]
        try:
            await wait_workers_started(settings, procs, timeout=30)
            after_seq = await _last_steal_seq(store)
            async with AsyncQueue(BACKLOG_QUEUE, settings=settings) as queue:
                ids = [run.id for run in await queue.enqueue_many(specs)]
            victim = await _busiest(store, procs, at_least=max(1, concurrency // 2))
            killed_at = await store.stats.now_ms()
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait(10)
            rows = await store.runs.get_many(ids)
            held = {
                r.id
                for r in rows
                if r.status is RunStatus.RUNNING and r.owner is not None
                and r.owner.pid == victim.pid
            }  # fmt: skip
            pending_at_kill.append(sum(r.status is RunStatus.PENDING for r in rows))
            held_at_kill.append(len(held))
            steals = await _until_stolen(store, after_seq, len(held), timeout=120, of=held)
            delays.extend(float(r.at_ms - killed_at) for r in steals)
            await _until_settled(store, ids, procs, timeout=300)
        finally:
            for proc in procs:
                proc.close()
    per_kill = max(held_at_kill, default=0)
    return Recovery(kills, per_kill, tuple(delays), backlog, tuple(pending_at_kill))


def _held(owned: dict[Owner, int], pid: int) -> int:
    """How many running rows the process ``pid`` holds (summed over its owners)."""
    return sum(n for owner, n in owned.items() if owner.pid == pid)


async def _busiest(store: Store, procs: list[Proc], *, at_least: int) -> Proc:
    """The worker holding the most runs, once one holds ``at_least`` (the victim)."""
    deadline = time.monotonic() + 60
    while True:
        owned = await store.stats.running_by_owner()
        best = max(procs, key=lambda p: _held(owned, p.pid))
        if _held(owned, best.pid) >= at_least:
            return best
        _check_alive(procs)
        if time.monotonic() > deadline:
            raise BenchError(f"no worker held {at_least} runs within 60 s")
        await asyncio.sleep(0.02)


async def _until_settled(store: Store, ids: list[str], procs: list[Proc], timeout: float) -> None:
    """Until every run of the backlog settled (the stolen ones included)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await store.runs.get_many(ids)
        if all(r.status.terminal for r in rows):
            return
        if time.monotonic() > deadline:
            left = sum(not r.status.terminal for r in rows)
            raise BenchError(f"{left} backlog runs unsettled after {timeout:.0f} s")
        _check_alive([p for p in procs if p.proc.returncode != -signal.SIGKILL])
        await asyncio.sleep(0.1)


async def _until_running(store: Store, ids: list[str], procs: list[Proc]) -> None:
    deadline = time.monotonic() + 60
    while True:
        rows = await store.runs.get_many(ids)
        if len(rows) == len(ids) and all(r.status is RunStatus.RUNNING for r in rows):
            return
        if time.monotonic() > deadline:
            raise BenchError("runs did not all start within 60 s")
        _check_alive(procs)
        await asyncio.sleep(0.05)


def _check_alive(procs: list[Proc]) -> None:
    for proc in procs:
        if proc.proc.poll() is not None:
            raise BenchError(f"worker {proc.pid} exited:\n{proc.tail()}")


async def _last_steal_seq(store: Store) -> int:
    steals = await store.stats.records_of_kind(Kind.STOLEN_AND_ACTIVATED)
    return max((r.seq for r in steals), default=0)


async def _until_stolen(
    store: Store, after_seq: int, expected: int, timeout: float, of: set[str] | None = None
) -> list[JournalRecord]:
    """The first steal of each run after ``after_seq`` (only runs in ``of`` if given)."""
    deadline = time.monotonic() + timeout
    while True:
        found = await store.stats.records_of_kind(Kind.STOLEN_AND_ACTIVATED, after_seq=after_seq)
        firsts: dict[str, JournalRecord] = {}
        for record in found:
            if of is None or record.run_id in of:
                firsts.setdefault(record.run_id, record)
        steals = list(firsts.values())
        if len(steals) >= expected:
            return steals
        if time.monotonic() > deadline:
            raise BenchError(f"{len(steals)} of {expected} runs stolen within {timeout:.0f} s")
        await asyncio.sleep(0.05)
