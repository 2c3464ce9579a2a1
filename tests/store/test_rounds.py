"""The next round's ``NewRun``, built once (``store.rounds``) for handoffs, requeues, resumes."""

from __future__ import annotations

from runfleet.store import Store
from runfleet.store.rounds import next_ordinal, next_round, round_id
from runfleet.store.types import AdmissionOptions, OnParentExit, Requeued
from tests.store.helpers import create


async def test_a_next_round_continues_the_lineage_and_keeps_what_is_not_given(
    store: Store,
) -> None:
    await create(store, "p", flow="tests.parent", scopes=("s",))
    row = await create(
        store,
        "kid",
        flow="tests.flow",
        payload={"args": [1], "kwargs": {}},
        parent_id="p",
        on_parent_exit=OnParentExit.DETACH,
        scopes=("s",),
        max_rounds=5,
    )
    assert next_ordinal(row, None) == row.round_ordinal + 1
    again = next_round(row, 1, options=AdmissionOptions(origin=Requeued(row.id, "ops")))
    assert again.id == round_id(row.lineage_id, 1) == f"{row.lineage_id}@1"
    assert (again.flow, again.queue, again.payload) == (row.flow, row.queue, row.payload)
    assert (again.lineage_id, again.previous_round_id, again.round_ordinal) == (
        row.lineage_id,
        row.id,
        1,
    )
    assert again.scopes == ("s",) and again.max_rounds == 5
    assert again.options.state() == {"requeued_from": row.id, "requeued_by": "ops"}
    assert again.parent_id is None, "a requeue or a resume is not its parent's child again"
    assert again.on_parent_exit is OnParentExit.CANCEL

    handed = next_round(
        row,
        2,
        flow="tests.other",
        queue="q2",
        payload={"args": [], "kwargs": {"x": 1}},
        in_family=True,
        deadline_ms=123,
    )
    assert (handed.flow, handed.queue, handed.payload["kwargs"]) == ("tests.other", "q2", {"x": 1})
    assert handed.parent_id == "p" and handed.on_parent_exit is OnParentExit.DETACH
    assert handed.deadline_ms == 123 and handed.timeout_ms is None and handed.max_rounds == 5
    assert next_ordinal(row, await store.runs.get("kid")) == row.round_ordinal + 1
