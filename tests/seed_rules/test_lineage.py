"""Seed rules about lineages (handoff rounds) and cancellation, against real Postgres.

Each test is named after the rule it proves and fails if the rule is broken. The
round is settled through the worker's own ``Settlement`` (the code a driver runs),
so the handoff transaction under test is the production one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import (
    AlreadyRequested,
    CancelRequested,
    NewRun,
    OnParentExit,
    RunRow,
    RunStatus,
    Transitioned,
)
from runfleet.worker.authoring.durable import Handoff
from runfleet.worker.settle import Settlement
from tests.seed_rules import flows as sr
from tests.store.helpers import (
    OWNER_A,
    activate,
    create,
    db_now,
    extra_stores,
    journal_kinds,
    make_running,
    must_get,
    row_lock_gate,
)
from tests.support.polling import until


def settlement(store: Store) -> Settlement:
    return Settlement(store, OWNER_A, hint=None, announce=None)


async def handed_off(store: Store, row: RunRow, to: Handoff, max_rounds: int | None = 10) -> RunRow:
    """Hand ``row`` (running under OWNER_A) off; the successor, activated under OWNER_A."""
    await settlement(store).hand_off(row, row.epoch, to, max_rounds)
    settled = await must_get(store, row.id)
    assert settled.status is RunStatus.COMPLETED, settled
    return await activate(store, str(settled.state["handed_off_to"]), OWNER_A)


async def test_cancel_reaches_every_round_of_a_lineage(store: Store) -> None:
    root = await make_running(store, "L", flow="sr.lineage")
    await settlement(store).hand_off(root, root.epoch, Handoff(sr.lineage, (1,)), 10)
    assert (await must_get(store, "L")).status is RunStatus.COMPLETED
    live = await must_get(store, "L@1")
    assert live.status is RunStatus.PENDING

    outcome = await store.lifecycle.request_cancel("L", note="ops")  # the id a producer holds
    assert isinstance(outcome, CancelRequested), outcome
    assert outcome.row.id == "L@1" and outcome.rounds == ("L@1",)
    assert (await must_get(store, "L@1")).cancel_requested_at_ms is not None
    record = [r for r in await store.journal.records("L@1") if r.kind == "cancel-requested"]
    assert record and record[0].payload["via"] == "L" and record[0].payload["note"] == "ops"
    assert record[0].payload["actor"] == "postgres"  # the authenticated role
    again = await store.lifecycle.request_cancel("L")
    assert isinstance(again, AlreadyRequested) and again.row.id == "L@1"


async def in_lock_order(
    database_url: str,
    run_id: str,
    first: Callable[[], Awaitable[Any]],
    then: Callable[[], Awaitable[Any]],
) -> tuple[Any, Any]:
    """Queue ``first`` then ``then`` behind a lock on ``run_id``'s row, in that order, and
    let both go: Postgres grants the row to them in queue order, so the race is forced."""
    async with row_lock_gate(database_url, run_id) as gate:
        one = asyncio.ensure_future(first())
        await until(
            gate.waiters, 10.0, "the first contender to queue", accept=lambda n: n >= 1, every=0.002
        )
        two = asyncio.ensure_future(then())
        await until(
            gate.waiters,
            10.0,
            "the second contender to queue",
            accept=lambda n: n >= 2,
            every=0.002,
        )
    return await one, await two


async def test_handoff_racing_a_cancel_never_leaves_a_live_round_uncancelled(
    settings: Settings, store: Store
) -> None:
    """Whichever commits first, the lineage ends cancelled or its live round is asked to.

    Handoff first is the hard order: the cancel's UPDATE waited on the round's lock, found
    it completed, and could not see the successor the handoff committed meanwhile.
    """
    async with extra_stores(settings, 2) as (worker_store, producer_store):
        for handoff_first in (True, False):
            lineage = f"race-{handoff_first}"
            row = await make_running(store, lineage, flow="sr.lineage")

            def hand_off(row: RunRow = row) -> Awaitable[None]:
                return settlement(worker_store).hand_off(
                    row, row.epoch, Handoff(sr.lineage, (0,)), 10
                )

            def cancel(lineage: str = lineage) -> Awaitable[Any]:
                return producer_store.lifecycle.request_cancel(lineage)

            if handoff_first:
                _, cancelled = await in_lock_order(settings.database_url, lineage, hand_off, cancel)
            else:
                cancelled, _ = await in_lock_order(settings.database_url, lineage, cancel, hand_off)
            assert isinstance(cancelled, CancelRequested), cancelled
            first = await must_get(store, lineage)
            successor = await store.runs.get(f"{lineage}@1")
            if handoff_first:  # the cancel found the successor it could not see
                assert first.status is RunStatus.COMPLETED
                assert successor is not None and successor.cancel_requested_at_ms is not None
                assert cancelled.row.id == successor.id
            else:  # the guard failed the handoff: rolled back, the round closed cancelled
                assert first.status is RunStatus.CANCELLED
                assert successor is None


async def test_a_handoff_does_not_end_the_rounds_children(store: Store) -> None:
    root = await make_running(store, "L", flow="sr.lineage")
    await create(store, "kid", parent_id="L")  # attached
    last = await handed_off(store, root, Handoff(sr.lineage, (0,)))
    kid = await must_get(store, "kid")
    assert kid.cancel_requested_at_ms is None and kid.status is RunStatus.PENDING
    assert "child-policy-applied" not in await journal_kinds(store, "L")
    # The lineage's LAST settlement ends the children of every round.
    done = await store.lifecycle.transition_owned(last.id, OWNER_A, last.epoch, RunStatus.COMPLETED)
    assert isinstance(done, Transitioned) and done.cascaded == ("kid",)
    assert (await must_get(store, "kid")).cancel_requested_at_ms is not None


async def test_the_lineage_budget_cannot_be_reset_by_a_later_flow(store: Store) -> None:
    root = await make_running(store, "L", flow="sr.lineage", max_rounds=2)
    second = await handed_off(store, root, Handoff(sr.big_budget, (1,)), max_rounds=10)
    assert second.state["max_rounds"] == 2
    # sr.big_budget declares 50; the lineage was admitted with 2 and keeps it.
    await settlement(store).hand_off(second, second.epoch, Handoff(sr.big_budget, (2,)), 50)
    ended = await must_get(store, second.id)
    assert ended.status is RunStatus.FAILED and ended.state["error"]["type"] == "LineageExhausted"
    assert await store.runs.get("L@2") is None


async def test_the_successor_gets_the_target_flows_timeout_as_its_deadline(store: Store) -> None:
    root = await make_running(store, "L", flow="sr.lineage")
    before = await db_now(store)
    await settlement(store).hand_off(root, root.epoch, Handoff(sr.timed), 10)
    after = await db_now(store)
    successor = await must_get(store, "L@1")
    assert before + 30_000 <= successor.state["deadline_ms"] <= after + 30_000

    explicit = datetime.now(UTC) + timedelta(hours=1)
    other = await make_running(store, "M", flow="sr.lineage")
    await settlement(store).hand_off(other, other.epoch, Handoff(sr.timed, deadline=explicit), 10)
    assert (await must_get(store, "M@1")).state["deadline_ms"] == int(explicit.timestamp() * 1000)


async def test_a_handoff_to_a_flow_this_worker_does_not_run_still_opens_the_round(
    store: Store,
) -> None:
    """The next leg may run on other workers only: its name alone is enough to admit the
    round (no deadline this process could read from the flow; an explicit one is kept)."""
    root = await make_running(store, "L", flow="sr.lineage")
    await settlement(store).hand_off(root, root.epoch, Handoff("billing.settle", (7,)), 10)
    handed = await must_get(store, "L")
    assert handed.status is RunStatus.COMPLETED and handed.state["handed_off_to"] == "L@1"
    successor = await must_get(store, "L@1")
    assert successor.status is RunStatus.PENDING and successor.flow == "billing.settle"
    assert successor.deadline_ms is None
    assert "round-invalid" not in await journal_kinds(store, "L")


async def _refused_rounds(store: Store, prefix: str) -> list[tuple[str, RunRow, Handoff]]:
    """Two running rounds whose handoff is refused: one past its lineage's budget
    (``lineage-exhausted``), one whose arguments the next flow does not take
    (``round-invalid``)."""
    exhausted = await make_running(store, f"{prefix}-x", flow="sr.lineage", max_rounds=1)
    invalid = await make_running(store, f"{prefix}-i", flow="sr.lineage")
    return [
        ("lineage-exhausted", exhausted, Handoff(sr.lineage, (1,))),
        ("round-invalid", invalid, Handoff(sr.lineage, (1, 2, 3))),
    ]


async def test_a_refused_round_keeps_its_cancel_guard(store: Store) -> None:
    """A cancel asked while the round ran wins over its refused handoff: the round closes
    ``cancelled`` (through its own cancel path), not ``failed``."""
    for kind, row, handoff in await _refused_rounds(store, "g"):
        asked = await store.lifecycle.request_cancel(row.id)
        assert isinstance(asked, CancelRequested), asked
        await settlement(store).hand_off(row, row.epoch, handoff, 10)
        closed = await must_get(store, row.id)
        assert closed.status is RunStatus.CANCELLED, (kind, closed.status, closed.state)
        assert kind not in await journal_kinds(store, row.id)


async def test_a_refused_round_ends_the_children_of_its_whole_lineage(store: Store) -> None:
    """A refused handoff is the lineage's last settlement: the attached children of every
    round, the first round's included, are asked to cancel; a detached one is left."""
    for kind, row, handoff in await _refused_rounds(store, "c"):
        first = row.id
        await create(store, f"{first}-kid", parent_id=first)
        await create(store, f"{first}-free", parent_id=first, on_parent_exit=OnParentExit.DETACH)
        if kind == "round-invalid":  # a later round refused: the first round's kid too
            row = await handed_off(store, row, Handoff(sr.lineage, (0,)))
            await create(store, f"{row.id}-kid", parent_id=row.id)
        await settlement(store).hand_off(row, row.epoch, handoff, 10)
        refused = await must_get(store, row.id)
        assert refused.status is RunStatus.FAILED and kind in await journal_kinds(store, row.id)
        kids = [f"{first}-kid"] + ([f"{row.id}-kid"] if row.id != first else [])
        for kid in kids:
            asked = await must_get(store, kid)
            assert asked.cancel_requested_at_ms is not None, (kind, kid)
        free = await must_get(store, f"{first}-free")
        assert free.cancel_requested_at_ms is None, kind


async def test_a_handoff_settles_the_round_and_admits_the_next_or_neither(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The successor's admission fails once after the round's settlement was written
    (injected: the connection drops there, as a SIGKILL or an outage would leave it).
    Nothing of that try stays: the retry settles the round and admits the successor
    together, and the round names the successor it admitted."""
    root = await make_running(store, "L", flow="sr.lineage")
    real = store.admission.create
    failures = [ConnectionError("connection lost after the round's update")]

    async def create_once_failing(run: NewRun) -> object:
        settled = await store.runs.get("L")  # read on the handoff's own connection
        assert settled is not None and settled.status is RunStatus.COMPLETED
        if failures:
            raise failures.pop()
        return await real(run)

    monkeypatch.setattr(store.admission, "create", create_once_failing)
    await settlement(store).hand_off(root, root.epoch, Handoff(sr.lineage, (0,)), 10)
    monkeypatch.undo()
    assert failures == [], "the admission failed once"
    handed = await must_get(store, "L")
    assert handed.status is RunStatus.COMPLETED and handed.state["handed_off_to"] == "L@1"
    successor = await must_get(store, "L@1")
    assert successor.status is RunStatus.PENDING and successor.lineage_id == "L"
    assert (await journal_kinds(store, "L")).count("handed-off") == 1
