"""``store.admission`` and ``store.deferreds`` built alone, over a pool and nothing else.

Each is a collaborator with its own constructor (not a half of ``Runs`` or ``Waits``): a
test builds it from a ``Database``, the journal (and, for admission, the DAG) and the
settings, and the other store parts never exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runfleet.store.admit import Admission
from runfleet.store.config import Settings
from runfleet.store.dag import Dag
from runfleet.store.db import Database, open_pool
from runfleet.store.deferreds import Deferreds
from runfleet.store.journal import Journal, Kind
from runfleet.store.types import Created, DeferredCompleted, DeferredExisting, Joined, NewRun


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[Database]:
    pool = await open_pool(settings, min_size=1, max_size=2)
    try:
        yield Database(pool, "alone")
    finally:
        await pool.close()


async def test_admission_alone_creates_joins_and_journals(db: Database, settings: Settings) -> None:
    journal = Journal(db)
    admission = Admission(db, journal, Dag(db, journal), settings)
    created = await admission.create(NewRun(id="a1", flow="f", payload={"n": 1}))
    assert isinstance(created, Created)
    assert created.row.id == "a1"
    again = await admission.create(NewRun(id="a1", flow="f", payload={"n": 1}))
    assert isinstance(again, Joined)
    assert again.row.id == "a1"
    batch = await admission.admit_each([NewRun(id="a2", flow="f"), NewRun(id="a3", flow="f")])
    assert [type(o) for o in batch] == [Created, Created]
    child = await admission.create(NewRun(id="a4", flow="f", parent_id="a1"))
    assert isinstance(child, Created)
    kinds = [r.kind for r in await journal.records("a1")]
    assert kinds == [Kind.CREATED]
    assert [r.kind for r in await journal.records("a4")] == [Kind.CREATED, Kind.PARENT_RECORDED]


async def test_deferreds_alone_first_writer_wins(db: Database, settings: Settings) -> None:
    journal = Journal(db)
    await Admission(db, journal, Dag(db, journal), settings).create(NewRun(id="d1", flow="f"))
    deferreds = Deferreds(db, journal, settings)
    first = await deferreds.complete_deferred("d1", "evt", {"v": 1})
    assert isinstance(first.outcome, DeferredCompleted)
    assert not first.woke  # the run is not parked on it
    second = await deferreds.complete_deferred("d1", "evt", {"v": 2})
    assert isinstance(second.outcome, DeferredExisting)
    assert not second.outcome.same
    row = await deferreds.deferred("d1", "evt")
    assert row is not None
    assert row.value == {"v": 1}
    assert [d.name for d in await deferreds.completed_deferreds("d1")] == ["evt"]
