"""A stopping worker claims nothing and exits (DESIGN §10): in-process and real processes."""

from __future__ import annotations

import asyncio
import signal
from functools import partial
from typing import Any

import tests.fleet.flows as flows
from runfleet.broker.client import connect
from runfleet.broker.streams import Lane, Streams
from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import JournalRecord, NewRun, Owner, RunStatus
from runfleet.worker.driver import Driver
from runfleet.worker.outbox import publish_wakes
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, WorkerProc, records, running_on
from tests.support.polling import until


async def test_a_hard_stop_does_not_claim_again_the_run_it_released(
    settings: Settings, queue: AsyncQueue, store: Store
) -> None:
    """A wake that arrived mid-drive is coalesced into one more drive of the same run;
    after a hard stop released the run, that drive must not claim it again."""
    w = Worker(settings, concurrency=4)
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(w.started.wait(), 10)
    try:
        run = await queue.enqueue(flows.forever)
        started = await until(lambda: running_on(store, run.id), 10, "the run to start")
        await publish_wakes(
            w.streams, [started], WakeReason.ENQUEUE
        )  # a second wake, read mid-drive
        await until(lambda: _coalesced(w, run.id), 10, "the wake to be coalesced")
        w.stop(hard=True)
        await asyncio.wait_for(asyncio.shield(task), 10)
    finally:
        w.stop(hard=True)
        await asyncio.wait_for(task, 15)
    row = await store.runs.get(run.id)
    assert row is not None and row.status is RunStatus.SUSPENDED
    assert row.waiting is not None and row.waiting.reason == "released"
    (released,) = await records(store, run.id, "interrupt-released")
    claims = await records(store, run.id, "claimed-and-activated")
    again = [r for r in claims if r.seq > released.seq]
    assert again == [], "the stopping worker claimed the run it had just released"


async def _coalesced(w: Worker, run_id: str) -> bool:
    return run_id in w.coordinator._again


ITERATIONS = 4


async def test_two_sigterms_with_runs_and_a_backlog_claim_nothing_and_exit(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    """Two SIGTERMs while the worker runs bodies, holds a duplicate wake for one of them
    (a sweep's or a release's), reads a backlog and receives new runs: it exits at once,
    leaves nothing owned, and claims none of the runs it released.

    The moment of the signals within the churn, and the gap between them, differ in each
    iteration: a read or a claim in flight when the stop begins is the race."""
    redis = connect(settings)
    streams = Streams(redis, settings.redis_prefix)
    try:
        for i in range(ITERATIONS):
            # A queue of its own: what an earlier iteration handed back is no backlog here.
            async with AsyncQueue(f"stop-{i}", settings=settings) as queue:
                await _one_hard_stop(spawn, queue, store, streams, i)
    finally:
        await redis.aclose()


async def _one_hard_stop(
    spawn: Spawn, queue: AsyncQueue, store: Store, streams: Streams, i: int
) -> None:
    a = spawn(concurrency=4, grace_period=30, queues=queue.name)
    await a.wait_started()
    held = [await queue.enqueue(flows.sleepy, 60_000, f"held-{i}") for _ in range(2)]
    rows = [
        await until(partial(running_on, store, run.id, a.pid), 10, "the held runs") for run in held
    ]
    await publish_wakes(
        streams, rows, WakeReason.ENQUEUE
    )  # duplicate wakes: read while the runs run
    await until(lambda: _all_read(streams, queue.name), 10, "the duplicate wakes to be read")
    churn = [await queue.enqueue(flows.sleepy, 20, f"churn-{i}") for _ in range(40)]
    late: list[str] = []

    async def keep_enqueuing() -> None:
        while True:
            late.append((await queue.enqueue(flows.sleepy, 60_000, f"late-{i}")).id)
            await asyncio.sleep(0.005)

    producer = asyncio.create_task(keep_enqueuing())
    try:
        await asyncio.sleep(0.03 * i)  # a different moment of the churn each time
        a.signal(signal.SIGTERM)
        await asyncio.sleep(0.01 * i)  # and a different gap (none: the signals may merge)
        a.signal(signal.SIGTERM)
        await until(lambda: _hard(a), 10, "the worker to stop hard", every=0.3)
    finally:
        producer.cancel()
    assert await a.wait_exit(20) == 0
    ids = [r.id for r in held] + [r.id for r in churn] + late
    for row in await store.runs.get_many(ids):
        assert row.owner is None or row.owner.pid != a.pid, (row.id, row.status)
        assert await _claims_after_release(store, row.id, a.pid) == [], row.id


async def _all_read(streams: Streams, queue: str) -> bool:
    depths = [await streams.depth(queue, lane) for lane in Lane]
    return all(d.total == 0 for d in depths)


async def _hard(a: WorkerProc) -> bool:
    """True once the worker logged its hard release; otherwise signal it again (two
    signals sent back to back can reach the process as one)."""
    if "worker.releasing" in a.log() or a.proc.poll() is not None:
        return True
    a.signal(signal.SIGTERM)
    return False


async def _claims_after_release(store: Store, run_id: str, pid: int) -> list[JournalRecord]:
    """Activations by process ``pid`` recorded after that process released the run."""
    journal = await store.journal.records(run_id)

    def by_pid(record: JournalRecord) -> bool:
        owner = Owner.parse(str(record.payload.get("owner")))
        return owner is not None and owner.pid == pid

    released = [r.seq for r in journal if r.kind == "interrupt-released" and by_pid(r)]
    if not released:
        return []
    claims = [r for r in journal if r.kind == "claimed-and-activated" and by_pid(r)]
    return [r for r in claims if r.seq > released[0]]


async def test_a_claim_in_flight_when_the_stop_begins_is_released_before_its_body_runs(
    settings: Settings, store: Store
) -> None:
    """The claim statement was already sent when the stop began: it commits, and the run
    is handed back at once instead of running a body the worker would then wait for."""
    driver = Driver(store, Owner.for_this_process(settings.host_id), settings)
    await store.admission.create(NewRun(id="r", flow="tests.forever"))
    sent: list[str] = []

    def then_stop(name: str) -> Any:
        real = getattr(store.runs, name)

        async def claim_then_stop(*args: Any, **kwargs: Any) -> Any:
            outcome = await real(*args, **kwargs)
            sent.append(name)
            driver.close()  # the stop arrives while the claim's answer is on its way
            return outcome

        return claim_then_stop

    # Stand-ins for the claim statements: a fresh admission is claimed by
    # ``claim_if_fresh`` (the priority look-ahead), any other row by ``claim_and_activate``.
    for name in ("claim_if_fresh", "claim_and_activate"):
        setattr(store.runs, name, then_stop(name))
    assert await asyncio.wait_for(driver.drive("r"), 10) == "activated"
    assert sent == ["claim_if_fresh"], sent  # the stop began after exactly one claim was sent
    assert driver.executing == set() and driver.owned == {}
    row = await store.runs.get("r")
    assert row is not None and row.waiting is not None and row.waiting.reason == "released"
    kinds = [r.kind for r in await store.journal.records("r")]
    assert kinds == ["created", "claimed-and-activated", "parked", "interrupt-released"], kinds
    assert await driver.drive("r") == "stopping"  # and it claims nothing after that
