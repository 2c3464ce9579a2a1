"""The driver's decide half (``worker.decisions``) case by case against the real store.

Each test hands a driver a run in one state and checks the one decision it makes: what
it answers, what it claims, what it journals and counts. Other owners exist only as the
owner columns of their rows.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

import runfleet.worker.decisions as decisions_module
import tests.lifecycle.tenants_all as tenants
from runfleet.broker import hostile
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.journal_records import ReleaseCause, WakeCause
from runfleet.store.runs import FreshClaim
from runfleet.store.types import (
    Activated,
    ActivateOutcome,
    AdmissionOptions,
    Claimed,
    NotFound,
    Owner,
    RunRow,
    RunStatus,
    SnapshotChanged,
    Waiting,
    WaitingReason,
)
from runfleet.worker import Context, flow
from runfleet.worker.decisions import REHINTS_KEPT, Decider
from runfleet.worker.driver import Driver, Execution
from runfleet.worker.outcomes import Decision, DriveOutcome
from runfleet.worker.takeover import Takeover
from runfleet.worker.unrunnable import Unrunnable
from tests.seed_rules import flows as sr
from tests.store.helpers import (
    OWNER_B,
    activate,
    create,
    db_now,
    make_parked,
    make_running,
    must_get,
)
from tests.support.polling import until

ME = Owner("host-me", 8101, "nonce-me")
THEM = Owner("host-them", 8102, "nonce-them")

assert sr.waiter  # registers the flows


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Lease:
    """A ``LeaseView`` a test opens and closes (``held[0]``)."""

    def __init__(self, held: list[bool]) -> None:
        self.held = held

    def open(self) -> bool:
        return self.held[0]

    def unconfirmed_ms(self) -> int | None:
        return None


def driver(store: Store, settings: Settings, *, lease: list[bool] | None = None) -> Driver:
    return Driver(store, ME, settings, lease=Lease(lease if lease is not None else [True]))


def hold(mine: Driver, run_id: str) -> None:
    """Mark ``run_id`` as executing in ``mine`` (as ``_execute`` does while a body runs)."""
    mine.owned[run_id] = Execution(ctx=None)  # type: ignore[arg-type]  # no context: the test only marks the run as executing


async def kinds(store: Store, run_id: str) -> list[str]:
    return [r.kind for r in await store.journal.records(run_id)]


# ---- decide_many -------------------------------------------------------------------


async def test_a_batch_leaves_out_what_it_may_not_claim_and_claims_nothing_then(
    store: Store, settings: Settings
) -> None:
    gate = [True]
    mine = driver(store, settings, lease=gate)
    await create(store, "held", flow="sr.waiter")
    hold(mine, "held")
    await create(store, "unknown", flow="nobody.runs.this")
    await make_running(store, "done", THEM, flow="sr.waiter")
    done = await must_get(store, "done")
    await store.lifecycle.transition_owned("done", THEM, done.epoch, RunStatus.COMPLETED)
    decided = await mine.decider.decide_many(["held", "unknown", "done", "absent"])
    assert decided == {
        "done": Decision(DriveOutcome.TERMINAL),
        "absent": Decision(DriveOutcome.NOT_FOUND),
    }
    assert (await must_get(store, "held")).status is RunStatus.PENDING
    await create(store, "fresh", flow="sr.waiter")
    gate[0] = False
    assert await mine.decider.decide_many(["fresh"]) == {}, "a closed lease claims nothing"
    assert (await must_get(store, "fresh")).status is RunStatus.PENDING
    gate[0] = True
    decided_one = (await mine.decider.decide_many(["fresh"]))["fresh"]
    outcome, activated = decided_one.outcome, decided_one.activation
    assert outcome is DriveOutcome.ACTIVATED and activated is not None
    assert activated.row.owner == ME and activated.flow is sr.waiter


async def test_a_driver_without_a_lease_gate_claims(store: Store, settings: Settings) -> None:
    mine = Driver(store, ME, settings)
    await create(store, "a", flow="sr.waiter")
    await create(store, "b", flow="sr.waiter")
    assert (await mine.decider.decide_many(["a"]))["a"].outcome is DriveOutcome.ACTIVATED
    outcome = await mine.decider._decide_delivered("b", "sr.waiter")
    assert outcome is not None and outcome.outcome is DriveOutcome.ACTIVATED


async def test_a_batch_claim_lost_to_another_worker_is_journaled(
    store: Store, settings: Settings
) -> None:
    await create(store, "r", flow="sr.waiter")
    mine = driver(store, settings)
    rows = await store.runs.get_many(["r"])
    theirs = await store.runs.claim_and_activate("r", rows[0].snapshot, THEM)  # in between
    assert isinstance(theirs, Activated)
    outcome = await mine.decider._claimed(rows[0], sr.waiter, await _claim_from(store, rows[0]))
    assert outcome == Decision(DriveOutcome.CLAIM_LOST)
    (lost,) = [r for r in await store.journal.records("r") if r.kind == Kind.CLAIM_LOST]
    assert lost.payload == {"observer": ME.key, "status": "running"}
    assert lost.source_id.startswith(
        f"evidence:r:{THEM.key}:{theirs.row.heartbeat_at_ms}:{Kind.CLAIM_LOST}"
    ), "addressed by the lease it lost to"


async def _claim_from(store: Store, row: RunRow) -> ActivateOutcome:
    return await store.runs.claim_and_activate(row.id, row.snapshot, ME)


# ---- one run, delivered or read ----------------------------------------------------


async def test_a_delivery_is_decided_by_the_row_when_it_cannot_claim_it_at_once(
    store: Store, settings: Settings
) -> None:
    gate = [True]
    mine = driver(store, settings, lease=gate)
    await create(store, "r", flow="sr.waiter")
    assert await mine.decider._decide_delivered("r", "nobody.runs.this") is None
    hold(mine, "r")
    assert await mine.decider._decide_delivered("r", "sr.waiter") is None
    mine.owned.clear()
    gate[0] = False
    assert await mine.decider._decide_delivered("r", "sr.waiter") is None
    gate[0] = True
    await make_running(store, "theirs", THEM, flow="sr.waiter")
    decided = await mine.decider._decide_delivered("theirs", "sr.waiter")
    assert decided == Decision(DriveOutcome.HEARTBEAT_FRESH), "decided from the same read"
    assert Kind.STEAL_REFUSED_OWNER_ALIVE in await kinds(store, "theirs"), (
        "not a peek: the live owner in the way is journaled"
    )
    assert await mine.decider._decide_delivered("absent", "sr.waiter") == Decision(
        DriveOutcome.NOT_FOUND
    )


async def test_each_state_of_a_row_gets_its_one_decision(store: Store, settings: Settings) -> None:
    gate = [True]
    mine = driver(store, settings, lease=gate)
    assert await mine.decider._decide(None, "absent") == Decision(DriveOutcome.NOT_FOUND)
    await make_running(store, "theirs", THEM, flow="sr.waiter")
    theirs = await must_get(store, "theirs")
    await store.lifecycle.transition_owned("theirs", THEM, theirs.epoch, RunStatus.FAILED)
    settled = await must_get(store, "theirs")
    assert await mine.decider._decide(settled, "theirs") == Decision(DriveOutcome.TERMINAL)
    await create(store, "mine", flow="sr.waiter")
    row = await must_get(store, "mine")
    hold(mine, "mine")
    assert await mine.decider._decide(row, "mine") == Decision(DriveOutcome.ALREADY_OWNED)
    mine.owned.clear()
    gate[0] = False
    assert await mine.decider._decide(row, "mine") == Decision(DriveOutcome.LEASE_CLOSED)
    gate[0] = True
    await create(store, "unknown", flow="nobody.runs.this")
    unknown = await must_get(store, "unknown")
    assert await mine.decider._decide(unknown, "unknown") == Decision(DriveOutcome.UNKNOWN_FLOW)
    await store.lifecycle.request_cancel("unknown")
    cancelled = await must_get(store, "unknown")
    decided = await mine.decider._decide(cancelled, "unknown")
    outcome, activated = decided.outcome, decided.activation
    assert outcome is DriveOutcome.ACTIVATED and activated is not None, "claimed to close it"
    assert activated.flow is None


async def test_an_unknown_flow_is_warned_about_once_per_run_and_the_memory_is_bounded(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.decisions")
    mine = driver(store, settings)
    await create(store, "u", flow="nobody.runs.this")
    row = await must_get(store, "u")
    assert mine.decider._flow(row) is None and mine.decider._flow(row) is None
    (line,) = [r for r in caplog.records if r.getMessage() == "run.unknown_flow"]
    assert (line.__dict__["run_id"], line.__dict__["flow"]) == ("u", "nobody.runs.this")
    assert "nobody.runs.this" in line.__dict__["error"]
    unrunnable = mine.decider.unrunnable = Unrunnable()
    for i in range(10_000):
        unrunnable.first(f"other-{i}", "test")
    mine.decider._flow(row)
    assert len(unrunnable) == 10_001, "at the bound nothing is forgotten yet"
    mine.decider._flow(replace(row, id="u2"))
    assert unrunnable.ids() == ["u2"], "past the bound the memory starts again"
    assert "nobody.runs.this" in (unrunnable.why("u2") or "")
    assert mine.decider._flow(await _registered(store)) is sr.waiter


async def _registered(store: Store) -> RunRow:
    await create(store, "known", flow="sr.waiter")
    return await must_get(store, "known")


# ---- claims: waits, stranded claims, the first activation ----------------------------


async def test_a_parked_run_is_claimed_only_when_its_wait_allows(
    store: Store, settings: Settings
) -> None:
    mine = driver(store, settings)
    now = await db_now(store)
    cases = {
        "event-open": (Waiting(WaitingReason.EVENT), False),
        "event-timed-out": (Waiting(WaitingReason.EVENT, wake_at_ms=now - 1), True),
        "timer-future": (Waiting(WaitingReason.TIMER, wake_at_ms=now + 60_000), False),
        "released": (Waiting(WaitingReason.RELEASED), True),
        "quarantined": (Waiting(WaitingReason.QUARANTINE), False),
    }
    for run_id, (waiting, _) in cases.items():
        await make_parked(store, run_id, waiting, OWNER_B, flow="sr.waiter")
    await make_parked(
        store, "timer-now", Waiting(WaitingReason.TIMER, wake_at_ms=now), OWNER_B, flow="sr.waiter"
    )
    for run_id, (_, claims) in {**cases, "timer-now": (None, True)}.items():
        row = await must_get(store, run_id)
        decided = await mine.decider._decide(row, run_id)
        outcome, _activated = decided.outcome, decided.activation
        expected = DriveOutcome.ACTIVATED if claims else DriveOutcome.WAITING
        assert outcome is expected, run_id
    woken = [r for r in await store.journal.records("released") if r.kind == Kind.WOKEN]
    assert [r.payload["cause"] for r in woken] == ["driver:released"]
    await make_parked(
        store, "q-cancelled", Waiting(WaitingReason.QUARANTINE), OWNER_B, flow="sr.waiter"
    )
    await store.lifecycle.request_cancel("q-cancelled")
    row = await must_get(store, "q-cancelled")
    assert (await mine.decider._decide(row, "q-cancelled")).outcome is DriveOutcome.ACTIVATED, (
        "a cancel closes even a quarantined run"
    )


async def test_a_recent_stranded_claim_is_left_and_a_recovered_one_claimed_now(
    store: Store, settings: Settings
) -> None:
    mine = driver(store, settings)
    pending = await create(store, "c", flow="sr.waiter")
    assert isinstance(await store.runs.claim("c", pending.snapshot, THEM), Claimed)
    row = await must_get(store, "c")
    assert await mine.decider._decide(row, "c") == Decision(DriveOutcome.CLAIM_PENDING)
    assert row.claimed_at_ms is not None
    claimed_at = row.claimed_at_ms
    await until(
        lambda: db_now(store),
        10.0,
        "the claim to turn stale by database time",
        accept=lambda now: now > claimed_at + settings.stale_after_ms,
        every=0.002,
    )
    decided = await mine.decider._decide(await must_get(store, "c"), "c")
    outcome, activated = decided.outcome, decided.activation
    assert outcome is DriveOutcome.ACTIVATED and activated is not None
    assert activated.row.owner == ME
    assert Kind.CLAIM_RECOVERED in await kinds(store, "c")


async def test_a_first_activation_is_timed_from_admission(store: Store, settings: Settings) -> None:
    mine = driver(store, settings)
    await create(store, "r", flow="sr.waiter")
    before = sample("runfleet_enqueue_to_start_seconds_count")
    waited = sample("runfleet_enqueue_to_start_seconds_sum")
    decided = await mine.decider._decide(await must_get(store, "r"), "r")
    outcome, activated = decided.outcome, decided.activation
    assert outcome is DriveOutcome.ACTIVATED and activated is not None
    assert sample("runfleet_enqueue_to_start_seconds_count") == before + 1
    first = activated.row
    expected = max(0, first.now_ms - first.created_at_ms) / 1000
    assert sample("runfleet_enqueue_to_start_seconds_sum") - waited == pytest.approx(expected)
    # A later activation of the same run (epoch 2) is not a start from the queue.
    running = await must_get(store, "r")
    await store.waits.release("r", ME, running.epoch, ReleaseCause.INTERRUPTED, "shutdown")
    assert (
        await mine.decider._decide(await must_get(store, "r"), "r")
    ).outcome is DriveOutcome.ACTIVATED
    assert sample("runfleet_enqueue_to_start_seconds_count") == before + 1


async def test_a_settled_run_in_a_batch_does_not_stop_the_batch(
    store: Store, settings: Settings
) -> None:
    mine = driver(store, settings)
    await make_running(store, "a-done", THEM, flow="sr.waiter")
    done = await must_get(store, "a-done")
    await store.lifecycle.transition_owned("a-done", THEM, done.epoch, RunStatus.COMPLETED)
    await create(store, "b-fresh", flow="sr.waiter")
    decided = await mine.decider.decide_many(["a-done", "b-fresh"])
    assert decided["a-done"] == Decision(DriveOutcome.TERMINAL)
    assert decided["b-fresh"].outcome is DriveOutcome.ACTIVATED


async def test_a_delivered_fresh_run_is_claimed_by_the_delivery_statement_alone(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = driver(store, settings)
    await create(store, "r", flow="sr.waiter")

    async def no_second_claim(*_args: object) -> object:
        raise AssertionError("claimed by a second statement")

    monkeypatch.setattr(store.runs, "claim_and_activate", no_second_claim)
    decided = await mine.decider._decide_delivered("r", "sr.waiter")
    assert decided is not None and decided.outcome is DriveOutcome.ACTIVATED
    assert decided.activation is not None and decided.activation.flow is sr.waiter, (
        "executed as its flow"
    )


async def test_a_timed_wait_is_due_at_its_exact_wake_time(store: Store, settings: Settings) -> None:
    mine = driver(store, settings)
    now = await db_now(store)
    for reason in (WaitingReason.TIMER, WaitingReason.QUOTA, WaitingReason.EVENT):
        run_id = f"due-{reason}"
        await make_parked(
            store, run_id, Waiting(reason, wake_at_ms=now + 5_000), OWNER_B, flow="sr.waiter"
        )
        row = await must_get(store, run_id)
        assert not mine.decider._wakeable(replace(row, now_ms=now + 4_999))
        assert mine.decider._wakeable(replace(row, now_ms=now + 5_000)), reason


async def test_a_stale_running_row_is_stolen_as_its_flow_ours_included(
    store: Store, settings: Settings
) -> None:
    """Not in this process's drives: a row of ours is self-orphaned, taken back like any."""
    mine = driver(store, settings)
    for run_id, owner in (("theirs", THEM), ("ours", ME)):
        await make_running(store, run_id, owner, flow="sr.waiter")
    heartbeat = (await must_get(store, "ours")).heartbeat_at_ms or 0
    await until(
        lambda: db_now(store),
        10.0,
        "the leases to turn stale by database time",
        accept=lambda now: now > heartbeat + settings.stale_after_ms,
        every=0.002,
    )
    for run_id in ("theirs", "ours"):
        decided = await mine.decider._decide(await must_get(store, run_id), run_id)
        outcome, activated = decided.outcome, decided.activation
        assert outcome is DriveOutcome.STOLEN, run_id
        assert activated is not None and activated.flow is sr.waiter, "executed as its flow"


async def test_a_claim_that_finds_the_run_gone_says_not_found(
    store: Store, settings: Settings
) -> None:
    await create(store, "r", flow="sr.waiter")
    row = await must_get(store, "r")
    claimed = await driver(store, settings).decider._claimed(row, sr.waiter, NotFound("r"))
    assert claimed == Decision(DriveOutcome.NOT_FOUND)


@pytest.mark.parametrize("meanwhile", ["claimed", "settled"])
async def test_a_recovered_claim_taken_again_meanwhile_is_left_to_its_new_claimant(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """Between clearing a stranded claim and claiming the run, another worker claimed it,
    or ran and settled it (forced: it lands just before this drive re-reads the row)."""
    mine = driver(store, settings)
    pending = await create(store, "c", flow="sr.waiter")
    assert isinstance(await store.runs.claim("c", pending.snapshot, THEM), Claimed)
    stuck = await must_get(store, "c")
    claimed_at = stuck.claimed_at_ms or 0
    await until(
        lambda: db_now(store),
        10.0,
        "the claim to turn stale by database time",
        accept=lambda now: now > claimed_at + settings.stale_after_ms,
        every=0.002,
    )
    stuck = await must_get(store, "c")  # read once stale, as a sweep would
    real_get = store.runs.get
    other = Owner("host-other", 8103, "nonce-other")

    async def claimed_meanwhile(run_id: str) -> RunRow | None:
        cleared = await real_get(run_id)
        assert cleared is not None and cleared.claim is None
        if meanwhile == "claimed":
            assert isinstance(await store.runs.claim(run_id, cleared.snapshot, other), Claimed)
        else:
            ran = await store.runs.claim_and_activate(run_id, cleared.snapshot, other)
            assert isinstance(ran, Activated)
            await store.lifecycle.transition_owned(
                run_id, other, ran.row.epoch, RunStatus.COMPLETED
            )
        return await real_get(run_id)

    monkeypatch.setattr(store.runs, "get", claimed_meanwhile)
    assert await mine.decider._decide(stuck, "c") == Decision(DriveOutcome.CLAIM_RECOVERED)
    monkeypatch.undo()
    left = await must_get(store, "c")
    if meanwhile == "claimed":
        assert left.claim == other and left.owner is None, "not taken from its new claimant"
    else:
        assert left.status is RunStatus.COMPLETED
    assert Kind.CLAIM_LOST not in await kinds(store, "c"), "no claim was even tried"


# ---- runs this process may not claim: another queue's, or any while stopping ----------


class Clock:
    """``time`` as ``worker.decisions`` sees it: a monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class Hints:
    """The driver's ``Hints``: records the id of every run it was asked about, by call
    (``ids``: ``hint``, a wake on its queue's stream)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.front: list[str] = []
        self.gated: list[str] = []
        self.ungated: list[str] = []
        self.settled_ids: list[str] = []

    async def hint(self, row: RunRow) -> None:
        self.ids.append(row.id)

    async def hint_front(self, row: RunRow) -> None:
        self.front.append(row.id)

    async def gate(self, row: RunRow) -> None:
        self.gated.append(row.id)

    async def started(self, row: RunRow) -> None:
        self.ungated.append(row.id)

    async def settled(self, run_id: str, status: RunStatus) -> None:
        self.settled_ids.append(run_id)


class Slots:
    """The driver's ``Slots``: records the rate refusals it hears (queue, ms to a token)."""

    def __init__(self) -> None:
        self.due: list[tuple[str, int]] = []

    def slot_freed(self, queue: str) -> None:
        pass

    def rate_due(self, queue: str, after_ms: int) -> None:
        self.due.append((queue, after_ms))


async def test_a_run_of_a_queue_not_served_is_dropped_logged_and_rehinted_once_per_stale_after(
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="runfleet.worker.decisions")
    hostile.rate_limited.reset()
    clock = Clock()
    monkeypatch.setattr(decisions_module, "time", clock)
    served = await Store.open(settings, serves=["b-queue", "a-queue"], min_size=1, max_size=2)
    try:
        hints = Hints()
        mine = Driver(served, ME, settings, hints=hints)
        await create(store, "elsewhere", flow="sr.waiter")  # queue "default"
        row = await must_get(store, "elsewhere")
        assert await mine.decider._decide(row, "elsewhere") == Decision(DriveOutcome.NOT_SERVED)
        assert hints.ids == ["elsewhere"], "one wake on its own queue's stream"
        (line,) = [r for r in caplog.records if r.getMessage() == "run.not_served"]
        assert line.levelno == logging.WARNING
        assert (line.__dict__["run_id"], line.__dict__["queue"]) == ("elsewhere", "default")
        assert line.__dict__["serves"] == ["a-queue", "b-queue"]
        assert (await must_get(store, "elsewhere")).claim is None, "never claimed"

        clock.now += settings.stale_after - 0.001
        assert (await mine.decider.decide_many(["elsewhere"]))[
            "elsewhere"
        ].outcome is DriveOutcome.NOT_SERVED
        assert hints.ids == ["elsewhere"], "at most once per run per stale_after"
        clock.now = 100.0 + settings.stale_after
        assert await mine.decider._decide(row, "elsewhere") == Decision(DriveOutcome.NOT_SERVED)
        assert hints.ids == ["elsewhere"] * 2, "a stale_after later: woken again"

        await make_running(store, "running-elsewhere", THEM, flow="sr.waiter")
        running = await must_get(store, "running-elsewhere")
        assert await mine.decider._decide(running, running.id) == Decision(DriveOutcome.NOT_SERVED)
        assert hints.ids == ["elsewhere"] * 2, "a running run is not waiting for a worker"
        assert (await must_get(store, running.id)).owner == THEM, "nor stolen"

        mine.decider._rehinted.clear()
        mine.decider._rehinted.update((f"other-{i}", clock.now) for i in range(REHINTS_KEPT - 1))
        await create(store, "second", flow="sr.waiter")
        await mine.decider._decide(await must_get(store, "second"), "second")
        assert len(mine.decider._rehinted) == REHINTS_KEPT, "at the bound nothing is forgotten yet"
        await create(store, "third", flow="sr.waiter")
        await mine.decider._decide(await must_get(store, "third"), "third")
        assert list(mine.decider._rehinted) == ["third"], "past the bound the memory starts again"
        assert hints.ids[-2:] == ["second", "third"]

        silent = Driver(served, ME, settings)  # no hint function: dropped all the same
        assert await silent.decider._decide(row, "elsewhere") == Decision(DriveOutcome.NOT_SERVED)

        await create(store, "z-served", flow="sr.waiter", queue="a-queue")
        batch = await silent.decider.decide_many(["elsewhere", "z-served"])
        assert batch["elsewhere"] == Decision(DriveOutcome.NOT_SERVED)
        assert batch["z-served"].outcome is DriveOutcome.ACTIVATED, "the rest of the batch goes on"
    finally:
        await served.close()


async def test_a_stopping_worker_claims_nothing_and_hands_the_wake_back(
    store: Store, settings: Settings
) -> None:
    hints = Hints()
    mine = Driver(store, ME, settings, hints=hints)
    await create(store, "fresh", flow="sr.waiter")
    await make_parked(store, "released", Waiting(WaitingReason.RELEASED), OWNER_B, flow="sr.waiter")
    await make_parked(store, "on-event", Waiting(WaitingReason.EVENT), OWNER_B, flow="sr.waiter")
    mine.close()
    assert await mine.decider.decide_many(["fresh"]) == {}, "a batch claims nothing either"
    assert await mine.decider._decide_delivered("fresh", "sr.waiter") is None
    for run_id in ("fresh", "released", "on-event"):
        row = await must_get(store, run_id)
        assert await mine.decider._decide(row, run_id) == Decision(DriveOutcome.STOPPING), run_id
        assert (await must_get(store, run_id)).claim is None, run_id
    assert hints.ids == ["fresh", "released"], "a wait not due is not woken"
    silent = Driver(store, ME, settings)  # no hint function: claims nothing all the same
    silent.close()
    fresh = await must_get(store, "fresh")
    assert await silent.decider._decide(fresh, "fresh") == Decision(DriveOutcome.STOPPING)
    assert (await must_get(store, "fresh")).status is RunStatus.PENDING


async def test_a_stop_that_begins_while_the_drive_wakes_the_run_claims_nothing(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    hints = Hints()
    mine = Driver(store, ME, settings, hints=hints)
    await make_parked(store, "r", Waiting(WaitingReason.RELEASED), OWNER_B, flow="sr.waiter")
    wake = store.waits.wake

    async def stop_meanwhile(run_id: str, **kwargs: WakeCause) -> object:
        mine.close()  # the worker's stop begins while this drive's wake is in flight
        return await wake(run_id, **kwargs)

    monkeypatch.setattr(store.waits, "wake", stop_meanwhile)
    row = await must_get(store, "r")
    assert await mine.decider._decide(row, "r") == Decision(DriveOutcome.STOPPING)
    after = await must_get(store, "r")
    assert after.claim is None and after.owner is None and after.waiting is None
    assert hints.ids == ["r"], "its wake goes back to the fleet"


async def test_a_claim_refused_as_not_served_is_dropped_as_not_served(
    store: Store, settings: Settings
) -> None:
    """A pending run with a cancel asked may be claimed by any worker (closing it executes
    nothing); if its own pool closes it first, the claim finds a settled run of a queue this
    process does not serve, and says so."""
    served = await Store.open(settings, serves=["a-queue"], min_size=1, max_size=2)
    try:
        mine = Driver(served, ME, settings, hints=Hints())
        await create(store, "r", flow="sr.waiter")  # queue "default"
        await store.lifecycle.request_cancel("r")
        seen = await must_get(store, "r")
        assert served.runs.may_claim(seen), "a pending run with a cancel asked"
        theirs = await activate(store, "r", OWNER_B)
        await store.lifecycle.acknowledge_cancel("r", OWNER_B, theirs.epoch)
        assert await mine.decider._decide(seen, "r") == Decision(DriveOutcome.NOT_SERVED)
        assert (await must_get(store, "r")).status is RunStatus.CANCELLED, "closed by its pool"
    finally:
        await served.close()


async def test_a_decider_is_built_alone_and_logs_under_its_own_name(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """No driver: a store, an owner, settings and a ``Takeover`` make a ``Decider``, whose
    answers are ``Decision``s and whose log lines name ``runfleet.worker.decisions``."""
    caplog.set_level(logging.WARNING, logger="runfleet.worker.decisions")
    owned: set[str] = set()
    decider = Decider(store, ME, settings, Takeover(store, ME, settings, None), owned=owned)
    assert await decider.decide("absent") == Decision(DriveOutcome.NOT_FOUND)
    await create(store, "u-alone", flow="nobody.runs.this")
    assert await decider.decide("u-alone") == Decision(DriveOutcome.UNKNOWN_FLOW)
    (line,) = [r for r in caplog.records if r.getMessage() == "run.unknown_flow"]
    assert line.name == "runfleet.worker.decisions"
    await create(store, "fresh-alone", flow="sr.waiter")
    owned.add("fresh-alone")
    assert await decider.delivered("fresh-alone", "sr.waiter") == Decision(
        DriveOutcome.ALREADY_OWNED
    ), "a run the holder executes is never claimed again"
    owned.clear()
    decided = await decider.delivered("fresh-alone", "sr.waiter")
    assert decided.outcome is DriveOutcome.ACTIVATED and decided.activation is not None
    assert decided.activation.row.owner == ME and decided.activation.flow is sr.waiter
    decider.close()
    await create(store, "late", flow="sr.waiter")
    assert await decider.decide("late") == Decision(DriveOutcome.STOPPING)


# ---- a doorbell's delivery, keyed runs in a batch, a slot taken ahead ----------------


async def test_a_peeked_delivery_lost_to_another_idle_reader_journals_nothing(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every idle reader's doorbell rang for the run: a lease fresh on another owner, or a
    claim lost while claiming, is the expected race, not evidence; the same delivery read
    from the stream is decided (and journaled) as any delivery is."""
    mine = driver(store, settings)
    await make_running(store, "fresh", THEM, flow="sr.waiter")
    before = await kinds(store, "fresh")
    peeked = await mine.decider.delivered("fresh", "sr.waiter", peeked=True)
    assert peeked == Decision(DriveOutcome.HEARTBEAT_FRESH)
    assert await kinds(store, "fresh") == before, "a peek's lost race is no refusal"
    read = await mine.decider.delivered("fresh", "sr.waiter")
    assert read == Decision(DriveOutcome.HEARTBEAT_FRESH)
    assert await kinds(store, "fresh") == [*before, Kind.STEAL_REFUSED_OWNER_ALIVE]

    await create(store, "raced", flow="sr.waiter")
    seen = await must_get(store, "raced")
    theirs = await activate(store, "raced", THEM)
    claim_if_fresh = store.runs.claim_if_fresh

    async def lost_while_claiming(*args: object, **kwargs: object) -> FreshClaim:
        await claim_if_fresh(*args, **kwargs)  # type: ignore[arg-type]  # passed through as the driver called it
        return FreshClaim(SnapshotChanged(theirs), seen)

    monkeypatch.setattr(store.runs, "claim_if_fresh", lost_while_claiming)
    before = await kinds(store, "raced")
    peeked = await mine.decider.delivered("raced", "sr.waiter", peeked=True)
    assert peeked == Decision(DriveOutcome.CLAIM_LOST)
    assert await kinds(store, "raced") == before, "a peek's lost claim is no claim-lost"
    assert await mine.decider.delivered("raced", "sr.waiter") == Decision(DriveOutcome.CLAIM_LOST)
    assert await kinds(store, "raced") == [*before, Kind.CLAIM_LOST]

    async def fresh_to_the_last_ms(*args: object, **kwargs: object) -> FreshClaim:
        found = await claim_if_fresh(*args, **kwargs)  # type: ignore[arg-type]  # passed through as the driver called it
        assert found.seen is not None and found.seen.heartbeat_at_ms is not None
        edge = found.seen.heartbeat_at_ms + settings.stale_after_ms
        return FreshClaim(found.outcome, replace(found.seen, now_ms=edge))

    monkeypatch.setattr(store.runs, "claim_if_fresh", fresh_to_the_last_ms)
    await make_running(store, "edge", THEM, flow="sr.waiter")
    before = await kinds(store, "edge")
    peeked = await mine.decider.delivered("edge", "sr.waiter", peeked=True)
    assert peeked == Decision(DriveOutcome.HEARTBEAT_FRESH), "fresh up to stale_after itself"
    assert await kinds(store, "edge") == before
    monkeypatch.setattr(store.runs, "claim_if_fresh", claim_if_fresh)

    # Any other run a peek finds is decided from the row as any delivery is.
    assert await mine.decider.delivered("absent", "sr.waiter", peeked=True) == Decision(
        DriveOutcome.NOT_FOUND
    )
    await make_parked(store, "parked", Waiting(WaitingReason.EVENT), OWNER_B, flow="sr.waiter")
    assert await mine.decider.delivered("parked", "sr.waiter", peeked=True) == Decision(
        DriveOutcome.WAITING
    )
    await make_running(store, "done", THEM, flow="sr.waiter")
    done = await must_get(store, "done")
    await store.lifecycle.transition_owned("done", THEM, done.epoch, RunStatus.COMPLETED)
    assert await mine.decider.delivered("done", "sr.waiter", peeked=True) == Decision(
        DriveOutcome.TERMINAL
    )


async def test_a_keyed_run_is_claimed_by_the_batch_and_its_key_holds_its_limit(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with a concurrency key is claimed by the batch's claim statement with the
    unkeyed ones (the key's turn decided in it: runfleet.key_pick_many), and a run of a key
    at its limit is answered at the limit, its wake left at the queue's gate."""
    await store.queues.set("keyed", key_flow=("sr.waiter", "kwargs.t"), key_concurrency=1)
    keyed = {"args": [], "kwargs": {"t": "acme"}}
    await create(store, "k1", flow="sr.waiter", queue="keyed", payload=keyed)
    await create(store, "k2", flow="sr.waiter", queue="keyed", payload=keyed)
    await create(store, "plain", flow="sr.waiter")
    assert (await must_get(store, "k1")).concurrency_key == "acme"
    batched: list[list[str]] = []
    many = store.runs.claim_and_activate_many

    async def spy(rows: list[RunRow], *args: object, **kwargs: object) -> object:
        batched.append([r.id for r in rows])
        return await many(rows, *args, **kwargs)  # type: ignore[arg-type]  # passed through as the driver called it

    monkeypatch.setattr(store.runs, "claim_and_activate_many", spy)
    gated = Hints()
    decider = Decider(store, ME, settings, Takeover(store, ME, settings, None), hints=gated)
    decided = await decider.decide_many(["k1", "plain"])
    assert set(decided) == {"k1", "plain"}
    k1 = decided["k1"]
    assert k1.outcome is DriveOutcome.ACTIVATED and k1.activation is not None
    assert k1.activation.row.id == "k1" and k1.activation.flow is sr.waiter
    assert batched == [["k1", "plain"]], "one claim statement for the keyed and the plain run"
    assert gated.gated == []
    decided = await decider.decide_many(["k2"])
    assert decided == {"k2": Decision(DriveOutcome.AT_LIMIT)}, "its key holds its one slot"
    assert gated.gated == ["k2"], "its wake waits at the queue's gate"
    assert (await must_get(store, "k2")).status is RunStatus.PENDING


@pytest.mark.parametrize("path", ["delivered", "batch", "read"])
async def test_a_run_that_took_the_delivered_slot_re_wakes_the_delivered_one_ahead(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """A delivery is a slot offered to its queue: a fresh run of a higher priority takes
    it (a single delivery's statement, a batch's, and a drive from a read alike: a
    displaced run driven again must not skip the rule), and the delivered run is woken
    again ahead of the backlog."""
    caplog.set_level(logging.INFO, logger="runfleet.worker.decisions")
    hints = Hints()
    decider = Decider(store, ME, settings, Takeover(store, ME, settings, None), hints=hints)
    await create(store, "low", flow="sr.waiter")
    await create(store, "high", flow="sr.waiter", priority=5)
    if path == "batch":
        decided = (await decider.decide_many(["low"]))["low"]
    elif path == "read":
        decided = await decider.decide("low")
    else:
        decided = await decider.delivered("low", "sr.waiter")
    assert decided.outcome is DriveOutcome.ACTIVATED and decided.activation is not None
    assert decided.activation.row.id == "high" and decided.activation.flow is sr.waiter
    assert (await must_get(store, "low")).status is RunStatus.PENDING
    assert (hints.front, hints.ids) == (["low"], []), "woken ahead of the backlog"
    (line,) = [r for r in caplog.records if r.getMessage() == "run.ahead"]
    assert (line.__dict__["run_id"], line.__dict__["ahead_of"]) == ("high", "low")
    assert line.__dict__["priority"] == 5
    assert line.levelno == logging.INFO


@flow(name="decisions.versioned", version="v2")
async def versioned(ctx: Context) -> None:
    """Carried here only at v2."""


async def test_a_delivered_run_of_a_version_not_carried_is_never_claimed(
    store: Store, settings: Settings
) -> None:
    """A versioned flow's delivery is decided by the usual read (the run's admitted version
    first), never claimed blind by the delivery statement."""
    mine = driver(store, settings)
    await create(
        store, "old", flow="decisions.versioned", options=AdmissionOptions(flow_version="v1")
    )
    assert await mine.decider.delivered("old", "decisions.versioned") == Decision(
        DriveOutcome.UNKNOWN_FLOW
    )
    assert (await must_get(store, "old")).claim is None
    await create(
        store, "new", flow="decisions.versioned", options=AdmissionOptions(flow_version="v2")
    )
    decided = await mine.decider.delivered("new", "decisions.versioned")
    assert decided.outcome is DriveOutcome.ACTIVATED and decided.activation is not None
    assert decided.activation.flow is not None
    assert decided.activation.flow.version == "v2"


async def test_a_rate_refused_claim_tells_the_rate_pump_when_the_next_token_is_due(
    store: Store, settings: Settings
) -> None:
    """A queue's rate refuses a claim with the wait for its next token: the rate pump hears
    the queue and the wait; a concurrency limit has no token to wait for and tells it
    nothing. Either way the wake waits at the queue's gate."""
    gated, slots = Hints(), Slots()
    decider = Decider(
        store, ME, settings, Takeover(store, ME, settings, None), hints=gated, slots=slots
    )
    due = slots.due
    await store.queues.set("metered", rate_per_s=0.2)  # a bucket of one, a token every 5 s
    await store.queues.set("capped", concurrency=1)
    for run_id, queue in (("m1", "metered"), ("m2", "metered"), ("c1", "capped"), ("c2", "capped")):
        await create(store, run_id, flow="sr.waiter", queue=queue)
    for run_id in ("m1", "c1"):
        assert (await decider.decide(run_id)).outcome is DriveOutcome.ACTIVATED, run_id
    assert await decider.decide("c2") == Decision(DriveOutcome.AT_LIMIT)
    assert (due, gated.gated) == ([], ["c2"]), "a concurrency limit: no token to wait for"
    assert await decider.decide("m2") == Decision(DriveOutcome.AT_LIMIT)
    assert gated.gated == ["c2", "m2"]
    ((queue, wait_ms),) = due
    assert queue == "metered" and 0 < wait_ms <= 5_000


async def test_a_woken_run_gone_before_its_claim_says_not_found(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drive wakes a parked run, then reads it again to claim it: a run gone by then
    (retention deleted it) is not found, and nothing is claimed."""
    mine = driver(store, settings)
    await make_parked(store, "r", Waiting(WaitingReason.RELEASED), OWNER_B, flow="sr.waiter")
    row = await must_get(store, "r")

    async def gone(_run_id: str) -> None:
        return None

    monkeypatch.setattr(store.runs, "get", gone)
    assert await mine.decider._decide(row, "r") == Decision(DriveOutcome.NOT_FOUND)
    monkeypatch.undo()
    after = await must_get(store, "r")
    assert after.claim is None and after.owner is None, "woken, never claimed"


async def test_a_class_bound_run_is_claimed_bound_to_its_instance_or_not_at_all(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A run of a class-bound flow executes on the instance it was admitted for; one that
    names an instance this process lacks is an unknown flow here, logged once per run."""
    caplog.set_level(logging.WARNING, logger="runfleet.worker.flows")
    mine = driver(store, settings)
    name = tenants.ACME.welcome.name
    await create(store, "acme", flow=name, options=AdmissionOptions(flow_instance="acme"))
    decided = await mine.decider.decide("acme")
    assert decided.outcome is DriveOutcome.ACTIVATED and decided.activation is not None
    assert decided.activation.flow is not None
    assert decided.activation.flow.instance == "acme"
    await create(store, "nobody", flow=name, options=AdmissionOptions(flow_instance="nobody"))
    for _ in range(2):
        assert await mine.decider.decide("nobody") == Decision(DriveOutcome.UNKNOWN_FLOW)
    (line,) = [r for r in caplog.records if r.getMessage() == "run.instance_unknown"]
    assert (line.__dict__["run_id"], line.__dict__["instance"]) == ("nobody", "nobody")
    assert (await must_get(store, "nobody")).claim is None
