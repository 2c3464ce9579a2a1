"""The drain's batch statements take their arrays as binary parameters, and carry any
text through them intact.

psycopg's text format writes a list as an array literal, quoting each element with a
regular expression: 20 us per jsonb or JSON-text element, ~1.3 ms per array of a 64-run
batch, a third of a draining worker's CPU with the batch's five arrays of JSON. A binary
array (``%(name)b``) carries each element as its own bytes, so nothing is quoted and
nothing can be mis-quoted (docs/explanation/backlogs.md).
"""

from __future__ import annotations

import pytest

from runfleet.store import Store
from runfleet.store.queries import q
from runfleet.store.types import RunError, RunStatus, Settle, Transitioned, Waiting, WaitingReason
from tests.store.helpers import OWNER_A, activate, create, make_running, must_get

ARRAYS = {
    "runs.get_many": ["ids"],
    "runs.claim_and_activate_many": ["ids", "epochs", "seqs", "serves", "ahead_flows"],
    "runs.settle_many": [
        "ids", "epochs", "statuses", "patches", "results", "guards", "kinds", "seqs",
        "payloads", "digests",
    ],
    "runs.attached_descendants_many": ["ids"],
    "waits.notify_parents": ["children", "values"],
}  # fmt: skip

AWKWARD = 'a "quoted" \\ back\\slash, {braces}, NULL, é, \\u0000-lookalike, \t tab'


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_a_batch_statement_takes_its_arrays_in_binary(name: str) -> None:
    text = q(name)
    for param in ARRAYS[name]:
        assert f"%({param})s" not in text, f"{name}: {param} as a text-format array"
        assert f"%({param})b" in text, f"{name}: {param} is not a parameter"


async def test_awkward_texts_survive_the_batch_claim_settlement_and_parents(
    store: Store,
) -> None:
    """Quotes, backslashes, braces, commas, ``NULL`` and non-ASCII in every array the batch
    statements take: claim ids, settlement patches, results, records, a child's outcome."""
    ids = [f'run "quoted" \\ {{a,b}} NULL é {i}' for i in range(3)]  # ids take no control chars
    for run_id in ids:
        await create(store, run_id)
    rows = await store.runs.get_many(ids)
    assert sorted(row.id for row in rows) == sorted(ids)
    claimed = await store.runs.claim_and_activate_many(rows, OWNER_A)
    assert all(type(outcome).__name__ == "Activated" for outcome in claimed.values())
    waiter = await make_running(store, "waiter")
    await create(store, "awaited", parent_id="waiter")
    awaited = await activate(store, "awaited")
    await store.waits.park(
        "waiter",
        OWNER_A,
        waiter.epoch,
        Waiting(WaitingReason.CHILD, token="awaited"),
        deferred="child:awaited",
    )
    running = {row.id: row for row in await store.runs.get_many(ids)}
    items = [
        Settle(
            ids[0], running[ids[0]].epoch, RunStatus.COMPLETED, {"result": {AWKWARD: [AWKWARD]}}
        ),
        Settle(ids[1], running[ids[1]].epoch, RunStatus.FAILED, {"error": {"message": AWKWARD}}),
        Settle(ids[2], running[ids[2]].epoch, RunStatus.COMPLETED, {"result": None}),
        Settle("awaited", awaited.epoch, RunStatus.COMPLETED, {"result": AWKWARD}),
    ]
    outcomes = await store.lifecycle.settle_many(OWNER_A, [store.lifecycle.check(i) for i in items])
    assert all(isinstance(outcome, Transitioned) for outcome in outcomes)
    assert (await must_get(store, ids[0])).result == {AWKWARD: [AWKWARD]}
    assert (await must_get(store, ids[1])).error == RunError(message=AWKWARD)
    assert (await must_get(store, ids[2])).status is RunStatus.COMPLETED
    (deferred,) = [
        d for d in await store.deferreds.completed_deferreds("waiter") if d.name == "child:awaited"
    ]
    assert deferred.value == {
        "status": "completed", "result": AWKWARD, "error": None, "handed_off_to": None,
    }  # fmt: skip
