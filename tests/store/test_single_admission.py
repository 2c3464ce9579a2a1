"""A single admission (runfleet.admit_one, 0022) writes and answers what a batch writes.

``Admission`` sends a batch of one run (every single ``enqueue``) as ``admit.one``, with
scalar parameters, and any larger batch as ``admit.batch``. The same runs admitted both
ways come out equal column by column: what the triggers fill (the queue's default
priority, the flow's concurrency key and its ``queue_keys`` row), the deadline, the timer
wait, the ``created`` record; and a taken id, a held dedup key (joined or refused) are
answered alike. Each test first checks which statement carried the admission, so neither
can pass by both paths being the same one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from runfleet.store import Store
from runfleet.store.errors import DuplicateRun
from runfleet.store.types import AdmissionOptions, Created, Joined, NewRun, OnDuplicate, RqOptions

KEYED = "tests.keyed"


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """The names of the SQL blocks the store ran inside the block."""
    names: list[str] = []
    real = store.db.all

    async def spy(name: str, params: dict[str, Any] | None = None) -> Any:
        names.append(name)
        return await real(name, params)

    store.db.all = spy  # type: ignore[method-assign]  # a spy on this instance only
    try:
        yield names
    finally:
        del store.db.all


def _new(run_id: str, now_ms: int, **over: Any) -> NewRun:
    fields: dict[str, Any] = {
        "id": run_id,
        "flow": KEYED,
        "queue": "kq",
        "payload": {"args": [1], "kwargs": {"tenant": "acme"}},
        "scopes": ("s1",),
        "timeout_ms": 90_000,
        "deadline_ms": now_ms + 600_000,
        "delay_until_ms": now_ms + 60_000,
        "options": AdmissionOptions(rq=RqOptions(meta={"m": 1})),
    }
    return NewRun(**(fields | over))


COMPARED = """
SELECT r.flow, r.queue, r.status, r.payload::text AS payload, r.priority, r.concurrency_key,
       r.dedup_key, r.round_ordinal, r.parent_run_id, r.waiting_reason,
       r.waiting_wake_at_ms, r.rank_ms - r.created_at_ms AS rank_offset,
       r.state - 'deadline_ms' AS state,
       (r.state->>'deadline_ms')::bigint - r.created_at_ms = 90000 AS deadline_is_the_timeout,
       r.lineage_id = r.id AS own_lineage, r.updated_at_ms = r.created_at_ms AS fresh,
       (SELECT array_agg(j.kind || ' ' || j.payload::text || ' ' || j.writer::text)
          FROM runfleet.journal j WHERE j.run_id = r.id) AS records,
       EXISTS (SELECT FROM runfleet.queue_keys k
                WHERE k.queue = r.queue AND k.key = r.concurrency_key) AS key_row
  FROM runfleet.runs r WHERE r.id = %(id)s
"""


async def _compared(url: str, run_id: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(url, row_factory=dict_row) as conn:
        row = await (await conn.execute(COMPARED, {"id": run_id})).fetchone()
    assert row is not None, run_id
    return row


@pytest.fixture
async def keyed(store: Store) -> int:
    """Queue ``kq`` with a default priority and a keyed flow; the database's now."""
    await store.queues.set("kq", default_priority=7, key_flow=(KEYED, "kwargs.tenant"), note="test")
    async with await psycopg.AsyncConnection.connect(store.settings.database_url) as conn:
        now = await (await conn.execute("SELECT runfleet.now_ms()")).fetchone()
    assert now is not None
    return int(now[0])


async def test_a_run_admitted_alone_equals_one_admitted_in_a_batch(
    store: Store, keyed: int
) -> None:
    with statements(store) as alone:
        (one,) = await store.admission.admit_each([_new("alone", keyed)])
    with statements(store) as batched:
        pair = await store.admission.admit_each([_new("batched", keyed), _new("other", keyed)])
    assert alone == ["admit.one"] and batched == ["admit.batch"]
    assert isinstance(one, Created) and all(isinstance(o, Created) for o in pair)
    url = store.settings.database_url
    a, b = await _compared(url, "alone"), await _compared(url, "batched")
    assert a == b
    # What the triggers filled, the deadline and the wait, and the record: not defaults.
    assert (a["priority"], a["concurrency_key"], a["key_row"]) == (7, "acme", True)
    assert a["waiting_reason"] == "timer" and a["deadline_is_the_timeout"]
    assert a["records"] and a["records"][0].startswith("created ")
    # The answer is the row as stored, the same on both paths.
    assert one.row.priority == 7 and one.row.concurrency_key == "acme"
    first = pair[0]
    assert isinstance(first, Created)
    assert one.row.state["deadline_ms"] - one.row.created_at_ms == (
        first.row.state["deadline_ms"] - first.row.created_at_ms
    )


async def test_an_explicit_priority_and_no_key_are_kept_alike(store: Store, keyed: int) -> None:
    plain = {"flow": "tests.plain", "priority": -3, "payload": None, "delay_until_ms": None}
    with statements(store) as alone:
        await store.admission.admit_each([_new("p-alone", keyed, **plain)])
    with statements(store) as batched:
        await store.admission.admit_each(
            [_new("p-batched", keyed, **plain), _new("p-other", keyed, **plain)]
        )
    assert alone == ["admit.one"] and batched == ["admit.batch"]
    url = store.settings.database_url
    a, b = await _compared(url, "p-alone"), await _compared(url, "p-batched")
    assert a == b
    # a run with no key on a keyed queue is in the no-key bucket ('': docs/how-to/queues.md)
    assert (a["priority"], a["concurrency_key"], a["waiting_reason"]) == (-3, "", None)


async def test_a_taken_id_and_a_held_key_are_answered_alike(store: Store, keyed: int) -> None:
    held = _new("holder", keyed, dedup_key="k1", delay_until_ms=None)
    assert isinstance((await store.admission.admit_each([held]))[0], Created)
    fresh = _new("fresh", keyed, delay_until_ms=None)

    async def both(new: NewRun) -> tuple[Any, Any]:
        with statements(store) as alone:
            (one,) = await store.admission.admit_each([new])
        with statements(store) as batched:
            pair = await store.admission.admit_each([new, fresh])
        assert alone == ["admit.one"] and batched == ["admit.batch"]
        return one, pair[0]

    # The same run again: joined, as it is now, and no second record.
    one, many = await both(held)
    assert isinstance(one, Joined) and isinstance(many, Joined)
    assert one.row.id == many.row.id == "holder"
    # Another id with the held key: joined to the holder, or refused naming it.
    one, many = await both(_new("dup", keyed, dedup_key="k1", delay_until_ms=None))
    assert isinstance(one, Joined) and isinstance(many, Joined)
    assert one.row.id == many.row.id == "holder"
    refuse = _new("dup2", keyed, dedup_key="k1", delay_until_ms=None,
                  on_duplicate=OnDuplicate.REFUSE)  # fmt: skip
    one, many = await both(refuse)
    assert isinstance(one, DuplicateRun) and isinstance(many, DuplicateRun)
    assert str(one) == str(many) and "holder" in str(one)
    url = store.settings.database_url
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT run_id, count(*) FROM runfleet.journal GROUP BY 1 ORDER BY 1"
        )
        assert await cur.fetchall() == [("fresh", 1), ("holder", 1)]
        cur = await conn.execute("SELECT id FROM runfleet.runs ORDER BY 1")
        assert await cur.fetchall() == [("fresh",), ("holder",)]
