"""The driver's batch decision against the real store, with a fake probe.

``decide_many`` is what a stream read of many deliveries costs: one row read and one
claim statement. It must decide every run exactly as a drive of that run alone would,
leave to the per-run path what it does not batch, and a second worker handed the same
deliveries must lose each run cleanly with the evidence journaled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from runfleet.broker.liveness import Probe
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner, RunStatus
from runfleet.worker import Context, flow
from runfleet.worker.coordinator import Coordinator
from runfleet.worker.driver import Driver
from runfleet.worker.outcomes import Decision, DriveOutcome
from tests.seed_rules import flows as sr
from tests.store.helpers import OWNER_B, create, make_running, must_get
from tests.support.polling import until

ME = Owner("host-me", 5151, "nonce-me")
THEM = Owner("host-them", 5252, "nonce-them")

assert sr.waiter  # registers the flows


def _double(n: int) -> int:
    return n * 2


@flow(name="tw.two_steps")
async def two_steps(ctx: Context, n: int) -> int:
    doubled = await ctx.step("double", _double, n)
    return int(await ctx.step("again", _double, doubled))


async def _dead(_owner: Owner, _heartbeat_ms: int | None) -> Probe:
    return Probe(verdict="dead", evidence="same-host-pid-dead")


async def test_a_batch_decides_each_run_as_a_drive_alone_would(
    store: Store, settings: Settings
) -> None:
    driver = Driver(store, ME, settings, probe=_dead)
    fresh = [await create(store, f"f{i}", flow="sr.waiter") for i in range(3)]
    await create(store, "unknown-flow", flow="nobody.runs.this")
    running = await make_running(store, "theirs", OWNER_B, flow="sr.waiter")
    cancelled = await create(store, "cancel-me", flow="sr.waiter")
    await store.lifecycle.request_cancel(cancelled.id)
    ids = [r.id for r in fresh] + ["unknown-flow", running.id, cancelled.id, "never-admitted"]

    decided = await driver.decider.decide_many(ids)

    for row in fresh:
        outcome, activated = decided[row.id].outcome, decided[row.id].activation
        assert outcome is DriveOutcome.ACTIVATED and activated is not None
        assert activated.row.owner == ME and activated.row.status is RunStatus.RUNNING
    assert decided["never-admitted"] == Decision(DriveOutcome.NOT_FOUND)
    # Not batched: each goes through the drive of that run alone, which decides them.
    for left in ("unknown-flow", running.id, cancelled.id):
        assert left not in decided
    assert (await must_get(store, running.id)).owner == OWNER_B, "a fresh lease is kept"


async def test_two_workers_handed_the_same_read_activate_each_run_once(
    store: Store, settings: Settings
) -> None:
    """Both read the batch (in opposite orders) before either claims, most rounds: one
    activation per run, and no deadlock: the loser either saw the winner's commit
    (claim-lost, journaled) or skipped the row the winner held (row_locked: the batch
    waits on no row). A side whose read came after the other's commit leaves the run out
    (its own drive decides it)."""
    mine, theirs = Driver(store, ME, settings), Driver(store, THEM, settings)
    contested = 0
    for round_no in range(10):
        ids = [(await create(store, f"d{round_no}-{i}", flow="sr.waiter")).id for i in range(6)]
        a, b = await asyncio.gather(
            mine.decider.decide_many(ids), theirs.decider.decide_many(list(reversed(ids)))
        )
        for run_id in ids:
            outcomes = [answer[run_id].outcome for answer in (a, b) if run_id in answer]
            assert outcomes.count(DriveOutcome.ACTIVATED) == 1, outcomes
            lost = {DriveOutcome.CLAIM_LOST, DriveOutcome.ROW_LOCKED}
            assert set(outcomes) <= {DriveOutcome.ACTIVATED, *lost}, outcomes
            kinds = [r.kind for r in await store.journal.records(run_id)]
            assert kinds.count("claimed-and-activated") == 1
            if len(outcomes) == 2:
                contested += 1
            if DriveOutcome.CLAIM_LOST in outcomes:
                assert "claim-lost" in kinds, "the loser journals what it saw"
    assert contested > 0, "the two reads never overlapped: the race was not exercised"


async def test_the_coordinator_runs_a_read_to_completion_through_the_batch(
    store: Store, settings: Settings
) -> None:
    """End to end in one process: the batch activates, the bodies run their steps (their
    attempts and records batched across runs), the settlements are group-committed, and
    every delivery is acknowledged once."""
    driver = Driver(store, ME, settings)
    coordinator = Coordinator(driver)
    ids = [
        (await create(store, f"c{i}", flow="tw.two_steps", payload={"args": [i]})).id
        for i in range(8)
    ]
    acked: list[str] = []

    def acker(run_id: str) -> Callable[[], None]:
        return lambda: acked.append(run_id)

    assert coordinator.drive_many([(run_id, acker(run_id), "tw.two_steps") for run_id in ids]) == 8
    assert await coordinator.join(timeout=20)
    rows = await store.runs.get_many(ids)
    assert {r.status for r in rows} == {RunStatus.COMPLETED}
    assert sorted(r.state["result"] for r in rows) == [4 * i for i in range(8)]
    for run_id in ids:
        assert len(await store.steps.of_run(run_id)) == 2
    assert sorted(acked) == sorted(ids)
    await until(lambda: _settled_once(store, ids), 5, "one settlement record per run")


async def _settled_once(store: Store, ids: list[str]) -> bool:
    for run_id in ids:
        kinds = [r.kind for r in await store.journal.records(run_id)]
        if kinds.count("transitioned") != 1:
            return False
    return True


async def test_a_failed_batch_decision_leaves_each_run_to_its_own_drive(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = Driver(store, ME, settings)

    async def broken(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("the claim statement's connection dropped")

    monkeypatch.setattr(store.runs, "claim_and_activate_many", broken)
    coordinator = Coordinator(driver)
    ids = [
        (await create(store, f"b{i}", flow="tw.two_steps", payload={"args": [i]})).id
        for i in range(3)
    ]
    assert coordinator.drive_many([(run_id, None, "tw.two_steps") for run_id in ids]) == 3
    assert await coordinator.join(timeout=20)
    rows = await store.runs.get_many(ids)
    assert {r.status for r in rows} == {RunStatus.COMPLETED}, "each decided and run alone"


@flow(name="driver.hold")
async def hold_a_moment(ctx: Context) -> str:
    """Holds its slot long enough for the test to look at the drives under way."""
    await asyncio.sleep(1.0)
    return "held"


async def test_a_run_that_took_anothers_slot_executes_under_a_drive_of_its_own(
    store: Store, settings: Settings
) -> None:
    """The delivered run whose slot a higher priority took is no longer in a drive: its
    re-published wake starts a fresh drive at once, instead of coalescing into a drive
    busy executing the other run (and being decided only after that run settled)."""
    coordinator = Coordinator(Driver(store, ME, settings))
    await create(store, "low", flow="driver.hold")
    await create(store, "high", flow="driver.hold", priority=5)
    assert coordinator.drive("low", None, "driver.hold")

    async def high_runs_alone() -> bool:
        return coordinator.driving("high") and not coordinator.driving("low")

    await until(high_runs_alone, 5, "the high run to execute under its own drive")
    assert coordinator.drive("low", None, "driver.hold"), "a fresh drive, not coalesced"
    assert await coordinator.join(timeout=20)
    rows = await store.runs.get_many(["low", "high"])
    assert {r.status for r in rows} == {RunStatus.COMPLETED}
