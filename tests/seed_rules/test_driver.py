"""Seed rules the run driver and coordinator keep, each tested by name.

Real Postgres, the production ``Driver`` (no probe: no witness vouches, as with Redis
down), other owners simulated only by their rows' owner columns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import psycopg
import pytest

from runfleet.broker.liveness import Probe
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import Claimed, Owner, RunStatus, Waiting, WaitingReason
from runfleet.worker.authoring.durable import Cause
from runfleet.worker.coordinator import Coordinator
from runfleet.worker.driver import Driver
from runfleet.worker.lease import Lease, LeaseGate, LeaseSignals
from runfleet.worker.outcomes import Decision, DriveOutcome
from tests.seed_rules import flows as sr
from tests.seed_rules.test_lineage import in_lock_order
from tests.store.helpers import (
    OWNER_B,
    LockGate,
    activate,
    create,
    db_now,
    extra_stores,
    make_parked,
    make_running,
    must_get,
)
from tests.support.polling import until

ME = Owner("host-me", 4242, "nonce-me")
OTHER = Owner("host-other", 4343, "nonce-other")

assert sr.waiter  # registers the flows


def driver(store: Store, settings: Settings, owner: Owner = ME) -> Driver:
    return Driver(store, owner, settings)


async def kinds(store: Store, run_id: str) -> list[str]:
    return [r.kind for r in await store.journal.records(run_id)]


async def test_stranded_claim_is_recovered_and_claimed_in_the_same_drive(
    store: Store, settings: Settings
) -> None:
    pending = await create(store, "r", flow="sr.waiter")
    claimed = await store.runs.claim("r", pending.snapshot, OWNER_B)  # OWNER_B then died
    assert isinstance(claimed, Claimed), claimed
    stuck = await must_get(store, "r")
    assert stuck.claimed_at_ms is not None
    await until(
        lambda: db_now(store),
        10.0,
        "the claim to turn stale by database time",
        accept=lambda now: now > stuck.claimed_at_ms + settings.stale_after_ms,  # type: ignore[operator]  # claimed_at_ms is asserted not None above; the lambda loses it
        every=0.002,
    )
    assert await driver(store, settings).drive("r") == "activated"
    row = await must_get(store, "r")
    assert row.claim is None and row.waiting is not None and row.waiting.reason == "event"
    journal = await kinds(store, "r")
    assert journal.index(Kind.CLAIM_RECOVERED) < journal.index(Kind.CLAIMED_AND_ACTIVATED)


async def test_a_lost_claim_leaves_claim_lost_evidence(store: Store, settings: Settings) -> None:
    await create(store, "r", flow="sr.waiter")
    winner, loser = driver(store, settings, ME), driver(store, settings, OTHER)
    won, lost = await in_lock_order(
        settings.database_url, "r", lambda: winner.drive("r"), lambda: loser.drive("r")
    )
    assert (won, lost) == ("activated", "claim_lost")
    evidence = [r for r in await store.journal.records("r") if r.kind == Kind.CLAIM_LOST]
    assert len(evidence) == 1 and evidence[0].payload["observer"] == OTHER.key


async def activated_by(store: Store, run_id: str) -> list[object]:
    records = await store.journal.records(run_id)
    return [r.payload["owner"] for r in records if r.kind == Kind.CLAIMED_AND_ACTIVATED]


async def test_a_delivered_run_is_read_and_claimed_by_one_statement(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream delivery names the flow: the read and the claim are one statement."""
    await create(store, "r", flow="sr.waiter")
    reads: list[str] = []
    real_get = store.runs.get

    async def counted_get(run_id: str) -> object:
        reads.append(run_id)
        return await real_get(run_id)

    monkeypatch.setattr(store.runs, "get", counted_get)
    assert await driver(store, settings).drive_delivered("r", "sr.waiter") == "activated"
    assert reads == [], "no separate read before the claim"
    journal = await kinds(store, "r")
    assert journal.count(Kind.CLAIMED_AND_ACTIVATED) == 1


async def test_a_delivered_lost_claim_leaves_claim_lost_evidence(
    store: Store, settings: Settings
) -> None:
    """Both contenders' statements saw the row fresh; the one queued second on its row
    lock re-checks, finds it taken, and journals what it lost to, as a read-first drive."""
    await create(store, "r", flow="sr.waiter")
    winner, loser = driver(store, settings, ME), driver(store, settings, OTHER)
    won, lost = await in_lock_order(
        settings.database_url,
        "r",
        lambda: winner.drive_delivered("r", "sr.waiter"),
        lambda: loser.drive_delivered("r", "sr.waiter"),
    )
    assert (won, lost) == ("activated", "claim_lost")
    evidence = [r for r in await store.journal.records("r") if r.kind == Kind.CLAIM_LOST]
    assert len(evidence) == 1 and evidence[0].payload["observer"] == OTHER.key
    assert await activated_by(store, "r") == [ME.key]


async def test_a_delivered_message_naming_another_flow_claims_by_the_row(
    store: Store, settings: Settings
) -> None:
    """A message is only a hint: naming a flow the row does not have (a hostile or
    stale message) claims nothing by that name; the row's own flow decides."""
    await create(store, "r", flow="sr.waiter")
    assert await driver(store, settings).drive_delivered("r", "sr.timed") == "activated"
    assert await activated_by(store, "r") == [ME.key]
    row = await must_get(store, "r")  # sr.waiter ran: it parks on its event
    assert row.waiting is not None and row.waiting.reason == "event"
    await create(store, "unknown", flow="sr.no-such-flow")
    outcome = await driver(store, settings).drive_delivered("unknown", "sr.waiter")
    assert outcome == "unknown_flow"
    assert (await must_get(store, "unknown")).status is RunStatus.PENDING


async def test_a_delivered_run_with_a_cancel_asked_is_closed_not_started(
    store: Store, settings: Settings
) -> None:
    """``sr.marks_start`` writes a marker before its first durable call (which is itself
    cancel-guarded): only the driver's own check keeps user code from running."""
    sr.STARTED.clear()
    await create(store, "r", flow="sr.marks_start")
    await store.lifecycle.request_cancel("r")
    await driver(store, settings).drive_delivered("r", "sr.marks_start")
    assert sr.STARTED == [], "user code ran for a run cancelled before it started"
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED
    assert Kind.CLAIMED_AND_ACTIVATED in await kinds(store, "r")  # claimed to close it


async def test_a_run_cancelled_before_it_starts_never_executes_user_code(
    store: Store, settings: Settings
) -> None:
    """Every way a drive activates a run whose cancel was asked first (a claim from its
    row, a delivered claim, a steal of a stale lease) closes it without calling the body."""
    sr.STARTED.clear()
    mine = driver(store, settings)
    for run_id, delivered in (("claimed", None), ("delivered", "sr.marks_start")):
        await create(store, run_id, flow="sr.marks_start")
        await store.lifecycle.request_cancel(run_id)
        drive = mine.drive(run_id) if delivered is None else mine.drive_delivered(run_id, delivered)
        assert await drive == "activated"
    running = await make_running(store, "stolen", OTHER, flow="sr.marks_start")
    await store.lifecycle.request_cancel("stolen")
    await until(
        lambda: db_now(store),
        10.0,
        "the lease to turn stale by database time",
        accept=lambda now: now > (running.heartbeat_at_ms or 0) + settings.stale_after_ms,
        every=0.002,
    )
    assert await mine.drive("stolen") == "stolen"
    assert sr.STARTED == [], "user code ran for a run cancelled before it started"
    for run_id in ("claimed", "delivered", "stolen"):
        row = await must_get(store, run_id)
        assert row.status is RunStatus.CANCELLED, row
        assert Kind.INTERRUPTED in await kinds(store, run_id)
    # The same flow does run when nobody cancelled it: the marker is a real witness.
    await create(store, "control", flow="sr.marks_start")
    assert await mine.drive("control") == "activated"
    assert sr.STARTED == ["control"]


async def test_cancelled_runs_of_an_unregistered_flow_are_closed_when_suspended(
    store: Store, settings: Settings
) -> None:
    await make_parked(store, "r", Waiting(WaitingReason.EVENT), OWNER_B, flow="sr.retired-long-ago")
    await store.lifecycle.request_cancel("r")
    await driver(store, settings).drive("r")
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED


async def test_cancelled_runs_of_an_unregistered_flow_are_closed_when_stale_running(
    store: Store, settings: Settings
) -> None:
    running = await make_running(store, "r", OWNER_B, flow="sr.retired-long-ago")
    await store.lifecycle.request_cancel("r")
    assert await driver(store, settings).drive("r") == "heartbeat_fresh"  # not stale yet
    await until(
        lambda: db_now(store),
        10.0,
        "the lease to turn stale by database time",
        accept=lambda now: now > (running.heartbeat_at_ms or 0) + settings.stale_after_ms,
        every=0.002,
    )
    assert await driver(store, settings).drive("r") == "stolen"
    assert (await must_get(store, "r")).status is RunStatus.CANCELLED


async def test_a_lapsed_lease_releases_with_cause_lease_lapsed(
    store: Store, settings: Settings
) -> None:
    """End to end, wired as a worker wires it: renewals stall in Postgres itself (a lock on
    the runs table the heartbeat statement queues behind; a row lock would not stall it,
    it skips locked rows), the lapse loop interrupts the body on its
    own timer, and the drive hands the run back journaled ``lease-lapsed``, fenced at the
    epoch it ran, as soon as the database answers again. Nothing here calls ``release``."""
    sr.STARTED.clear()
    sr.STOPPED.clear()
    await create(store, "r", flow="sr.holds")
    gate = LeaseGate(settings)
    signals = LeaseSignals()
    mine = Driver(store, ME, settings, lease=gate)
    async with extra_stores(settings, 1) as (lease_store,):
        lease = Lease(lease_store, mine, ME, settings, gate=gate, signals=signals)
        assert await lease.tick() is not None and gate.open()
        drive = asyncio.ensure_future(mine.drive("r"))
        try:
            await until(
                lambda: _true_if(sr.STARTED == ["r"]), 10.0, "the body to start", every=0.005
            )
            async with _runs_table_gate(settings.database_url) as lock:
                lease.start()
                await signals.lapsed.wait(settings.stale_after * 5)
                assert lease.lapsed and not gate.open()
                await until(
                    lambda: _true_if(sr.STOPPED == ["r"]), 10.0, "the lapse to stop the body"
                )
                # The release queues behind the lock too: nothing is written while stalled.
                await until(lock.waiters, 10.0, "the release to queue", accept=lambda n: n >= 2)
                assert Kind.INTERRUPT_RELEASED not in await kinds(store, "r")
            assert await asyncio.wait_for(drive, 10.0) == "activated"
        finally:
            lease.stop()
            assert await lease.wait_stopped(5)
            if not drive.done():
                drive.cancel()
    released = [r for r in await store.journal.records("r") if r.kind == Kind.INTERRUPT_RELEASED]
    assert len(released) == 1, await kinds(store, "r")
    assert released[0].payload["cause"] == "lease-lapsed"
    assert released[0].payload["detail"] == "lease-lapsed"
    assert released[0].payload["epoch"] == 1
    assert released[0].source_id == store.db.source_id, "written by the drive that lapsed"
    parked = await must_get(store, "r")
    assert parked.status is RunStatus.SUSPENDED and parked.owner is None
    assert parked.waiting is not None and parked.waiting.reason == "released"
    assert Kind.TRANSITIONED not in await kinds(store, "r"), "a lapse is not a settlement"
    # The other cause a drive releases with is recorded as such (shutdown: "interrupted").
    await create(store, "b", flow="sr.waiter")
    row = await activate(store, "b", ME)
    assert await driver(store, settings).release(row, Cause.SHUTDOWN) is True
    (shutdown,) = [r for r in await store.journal.records("b") if r.kind == Kind.INTERRUPT_RELEASED]
    assert shutdown.payload["cause"] == "interrupted" and shutdown.payload["detail"] == "shutdown"


async def _true_if(value: bool) -> bool:
    return value


async def test_shutdown_does_not_downgrade_an_already_parked_run_to_released(
    store: Store, settings: Settings
) -> None:
    await create(store, "r", flow="sr.waiter")
    mine = driver(store, settings)
    assert await mine.drive("r") == "activated"  # ran and parked on its event
    parked = await must_get(store, "r")
    assert parked.waiting is not None and parked.waiting.reason == "event"
    activated = [
        r for r in await store.journal.records("r") if r.kind == Kind.CLAIMED_AND_ACTIVATED
    ]
    epoch = activated[-1].payload["epoch"]
    as_activated = await must_get(store, "r")
    # The shutdown's release arrives after the park (the body parked first).
    assert await mine.release(replace(as_activated, epoch=epoch), Cause.SHUTDOWN) is False
    after = await must_get(store, "r")
    assert after.waiting is not None and after.waiting.reason == "event"
    assert Kind.INTERRUPT_RELEASED not in await kinds(store, "r")


class _CountingDecider:
    """Stands in for the ``Decider``: every decision, by any path, counts one drive."""

    def __init__(self) -> None:
        self.drives = 0
        self.batches: list[list[str]] = []

    async def decide(self, run_id: str) -> Decision:
        self.drives += 1
        return Decision(DriveOutcome.ACTIVATED)

    async def delivered(self, run_id: str, flow_name: str) -> Decision:
        return await self.decide(run_id)

    async def from_batch(self, run_id: str, batch: Awaitable[object]) -> Decision:
        await batch
        return await self.decide(run_id)

    async def decide_many(self, run_ids: list[str]) -> dict[str, Decision]:
        self.batches.append(list(run_ids))
        return {}


class _BlockingDriver:
    """Stands in for the driver: each decided drive waits for ``go``."""

    def __init__(self) -> None:
        self.decider = _CountingDecider()
        self.go = asyncio.Event()

    @property
    def drives(self) -> int:
        return self.decider.drives

    async def run_decided(self, decision: Decision) -> DriveOutcome:
        await self.go.wait()
        return decision.outcome


async def test_wakes_for_a_run_in_a_drive_coalesce_into_one_more_drive() -> None:
    stub = _BlockingDriver()
    coordinator = Coordinator(stub)  # type: ignore[arg-type]  # a stub driver: only what Coordinator calls
    assert coordinator.drive("r") is True
    for _ in range(10):  # a burst of wakes while the first drive is in progress
        assert coordinator.drive("r") is False
    assert coordinator.drive("other") is True
    stub.go.set()
    assert await coordinator.join(timeout=5)
    assert stub.drives == 3, "r: the drive in progress plus ONE more; other: one"


async def test_a_read_batch_coalesces_duplicates_and_runs_already_in_a_drive() -> None:
    stub = _BlockingDriver()
    coordinator = Coordinator(stub)  # type: ignore[arg-type]  # a stand-in for the driver
    assert coordinator.drive("busy") is True
    acked: list[str] = []

    def acker(run_id: str) -> Callable[[], None]:
        return lambda: acked.append(run_id)

    started = coordinator.drive_many(
        [(run_id, acker(run_id), "f") for run_id in ("a", "busy", "b", "a")]
    )
    assert started == 2, "a and b start; busy and the second a coalesce"
    stub.go.set()
    assert await coordinator.join(timeout=5)
    assert stub.decider.batches == [["a", "b"]], "one shared decision for the new runs only"
    assert sorted(acked) == ["a", "a", "b", "busy"], "every delivery is acknowledged"
    assert stub.drives == 5, "busy, a, b, then one more each for busy and a"


async def test_the_refusal_ladder_backs_off_per_lease_and_a_new_lease_restarts_it(
    store: Store, settings: Settings
) -> None:
    """Through the driver: a vouched-for owner is probed once, then left alone on the
    ladder (no probe, no journal) until its rung is due; a renewed lease is a new key."""
    probed: list[int | None] = []

    async def vouching(owner: Owner, heartbeat_at_ms: int | None) -> Probe:
        probed.append(heartbeat_at_ms)
        return Probe(verdict="alive", evidence="cross-host-key-fresh")

    mine = Driver(store, ME, settings, probe=vouching)

    async def stale() -> int:
        row = await must_get(store, "r")
        return await until(
            lambda: db_now(store),
            10.0,
            "the lease to turn stale by database time",
            accept=lambda now: now > (row.heartbeat_at_ms or 0) + settings.stale_after_ms,
            every=0.002,
        )

    await make_running(store, "r", OTHER, flow="sr.waiter")
    await stale()
    assert await mine.drive("r") == "steal_refused_owner_alive"
    assert await mine.drive("r") == "steal_backoff"  # 2 × interval not yet passed
    assert len(probed) == 1
    await store.runs.heartbeat(OTHER, ["r"])  # the owner renews: a new lease
    await stale()
    assert await mine.drive("r") == "steal_refused_owner_alive", "a new lease is probed at once"
    assert len(probed) == 2 and probed[0] != probed[1]
    refusals = [
        r for r in await store.journal.records("r") if r.kind == Kind.STEAL_REFUSED_OWNER_ALIVE
    ]
    assert len(refusals) == 2, "one refusal journaled per lease"


async def test_a_failed_drive_cleans_up_in_place_instead_of_orphaning_its_activation(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store read that fails is injected (one call); the release that follows is real."""
    await create(store, "r", flow="sr.waiter")
    first = await activate(store, "r", ME)
    mine = driver(store, settings)
    assert await mine.release(first, Cause.SHUTDOWN)  # so the next activation is epoch 2

    async def broken(run_id: str) -> object:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(store.steps, "of_run", broken)
    with pytest.raises(psycopg.OperationalError):
        await mine.drive("r")
    row = await must_get(store, "r")
    assert row.status is RunStatus.SUSPENDED and row.owner is None, "not left owned by us"
    assert row.waiting is not None and row.waiting.reason == "released"
    released = [r for r in await store.journal.records("r") if r.kind == Kind.INTERRUPT_RELEASED]
    assert released[-1].payload["detail"] == "drive-failed" and released[-1].payload["epoch"] == 2


async def test_a_lost_steal_leaves_activation_lost_evidence(
    store: Store, settings: Settings
) -> None:
    """Two observers find the same lease stale; the row lock forces the order. The one that
    lost journals ``activation-lost`` (that exact kind: operators and tools read it) naming
    the lease it saw and what changed, once, and activates nothing."""
    third = Owner("host-third", 4444, "nonce-third")
    running = await make_running(store, "r", third, flow="sr.waiter")
    await until(
        lambda: db_now(store),
        10.0,
        "the lease to turn stale by database time",
        accept=lambda now: now > (running.heartbeat_at_ms or 0) + settings.stale_after_ms,
        every=0.002,
    )
    winner, loser = driver(store, settings, ME), driver(store, settings, OTHER)
    won, lost = await in_lock_order(
        settings.database_url, "r", lambda: winner.drive("r"), lambda: loser.drive("r")
    )
    assert (won, lost) == ("stolen", "activation_lost")
    records = await store.journal.records("r")
    evidence = [r for r in records if r.kind == "activation-lost"]
    assert len(evidence) == 1, [r.kind for r in records]
    (lost_record,) = evidence
    assert lost_record.payload == {
        "observer": OTHER.key,
        "outcome": "snapshot-changed",
        "expected_epoch": running.epoch,
    }
    assert lost_record.source_id == (
        f"evidence:r:{third.key}:{running.heartbeat_at_ms}:activation-lost::{OTHER.key}"
    ), "addressed by the lease it lost to: a repeat is a duplicate, not a second record"
    steals = [r for r in records if r.kind == Kind.STOLEN_AND_ACTIVATED]
    assert [s.payload["owner"] for s in steals] == [ME.key], "only the winner activated"


@contextlib.asynccontextmanager
async def _runs_table_gate(database_url: str) -> AsyncIterator[LockGate]:
    """Hold ``runfleet.runs`` locked ACCESS EXCLUSIVE until the block ends: every
    statement on it, the renewal's included, queues behind the lock."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        async with conn.transaction():
            await conn.execute("LOCK TABLE runfleet.runs IN ACCESS EXCLUSIVE MODE")
            async with await psycopg.AsyncConnection.connect(
                database_url, autocommit=True
            ) as observer:
                yield LockGate(observer)
