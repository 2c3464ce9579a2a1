"""``Settlement.failed`` (a body that raised) and the flow a handoff's successor runs, as a
caller sees them in the store: the run's status and error, its record, count and
announcement, and the next round's flow. Runs are activated under ``OWNER_A``.
"""

from __future__ import annotations

import pytest

from runfleet.store import Kind, Store
from runfleet.store.types import RunError, RunStatus
from runfleet.worker.authoring.durable import Handoff
from tests.seed_rules import flows as sr
from tests.store.helpers import OWNER_A, make_running, must_get
from tests.worker.test_settle import Calls, journal, sample, settlement


@pytest.mark.parametrize("group", [True, False])
async def test_a_body_that_raised_fails_the_run_with_its_error_counted_and_announced(
    store: Store, group: bool
) -> None:
    row = await make_running(store, "r", OWNER_A, flow="sr.waiter")
    calls = Calls()
    before = sample("runfleet_settlements_total", status="failed")
    try:
        raise ValueError("boom")
    except ValueError as exc:
        await settlement(store, calls, group=group).failed(row, row.epoch, exc)
    failed = await must_get(store, "r")
    assert failed.status is RunStatus.FAILED and isinstance(failed.error, RunError)
    assert failed.error.type == "ValueError" and failed.error.message == "boom"
    assert 'raise ValueError("boom")' in str(failed.error.traceback)
    assert sample("runfleet_settlements_total", status="failed") == before + 1
    assert calls.announced == [("r", "failed")]
    (record,) = await journal(store, "r", Kind.TRANSITIONED)
    assert record["to"] == "failed" and record["epoch"] == row.epoch


async def test_a_handoff_to_another_flow_starts_the_next_round_as_that_flow(
    store: Store,
) -> None:
    row = await make_running(store, "L", OWNER_A, flow="sr.lineage")
    await settlement(store).hand_off(row, row.epoch, Handoff(sr.waiter), 10)
    assert (await must_get(store, "L")).status is RunStatus.COMPLETED
    successor = await must_get(store, "L@1")
    assert successor.flow == "sr.waiter", "the flow the handoff names, not the round's own"
    assert successor.status is RunStatus.PENDING
