"""Per-run limits fail the run with a typed error; producers cannot write derived ids,
cannot pass scopes as one string, and a conflict never shows another run's data."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

import tests.trust.flows as tf
from runfleet.producer import AsyncQueue, RunFailed
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import ExecutionIdentityConflict, InvalidInput, ReservedRunId
from runfleet.worker.process import Worker
from tests.ops.conftest import Cli
from tests.support.workers import running


@pytest.fixture
async def tight(settings: Settings) -> AsyncIterator[Settings]:
    capped = settings.model_copy(update={"max_children_per_run": 2, "max_steps_per_run": 4})
    w = Worker(capped, queues=["default"], concurrency=4)
    async with running(w):
        yield capped


async def test_children_per_run_are_capped(tight: Settings, store: Store) -> None:
    async with AsyncQueue("default", settings=tight) as q:
        run = await q.enqueue(tf.spawner, 3)
        with pytest.raises(RunFailed) as caught:
            await run.result(timeout=15)
    assert caught.value.exc_type == "LimitExceeded"
    assert "max_children_per_run=2" in caught.value.exc_message
    children = await store.runs.get_many([f"{run.id}/spawn:trust.leaf#{i}" for i in (1, 2, 3)])
    assert sorted(c.id[-1] for c in children) == ["1", "2"]  # the third was never admitted


async def test_steps_per_run_are_capped(tight: Settings, store: Store) -> None:
    async with AsyncQueue("default", settings=tight) as q:
        ok = await q.enqueue(tf.stepper, 4)
        assert await ok.result(timeout=15) == 4
        run = await q.enqueue(tf.stepper, 5)
        with pytest.raises(RunFailed) as caught:
            await run.result(timeout=15)
    assert caught.value.exc_type == "LimitExceeded"
    assert len(await store.steps.of_run(run.id)) == 4  # nothing past the cap was recorded


@pytest.mark.parametrize(
    "run_id", ["p/child:trust.leaf#1", "x/y/spawn:f#2", "order@1", "lineage@12"]
)
async def test_derived_ids_are_reserved(queue: AsyncQueue, store: Store, run_id: str) -> None:
    with pytest.raises(ReservedRunId) as caught:
        await queue.enqueue(tf.leaf, 1, run_id=run_id)
    assert caught.value.field == "run_id"
    assert await store.runs.get(run_id) is None


async def test_ids_near_the_reserved_ones_are_fine(queue: AsyncQueue) -> None:
    for run_id in ("a@b", "a@1b", "child:x", "p/x", f"u{uuid.uuid4().hex}@"):
        assert (await queue.enqueue(tf.leaf, 1, run_id=run_id)).id == run_id


async def test_a_squatted_child_id_cannot_fail_the_parent(
    worker: Worker, queue: AsyncQueue
) -> None:
    parent_id = uuid.uuid4().hex
    with pytest.raises(ReservedRunId):
        await queue.enqueue(tf.leaf, 99, run_id=f"{parent_id}/spawn:trust.leaf#1")
    run = await queue.enqueue(tf.spawner, 1, run_id=parent_id)
    assert await run.result(timeout=15) == 1


async def test_cli_enqueue_refuses_a_reserved_id(cli: Cli) -> None:
    out = await cli("enqueue", "trust.leaf", "--id", "p/child:trust.leaf#1", "--payload", "[1]")
    assert out.code != 0 and out.clean and "reserved for derived ids" in out.stderr


@pytest.mark.parametrize("scopes", ["abc", b"abc", 3, ["ok", ""], ["ok", 1]])
def test_scopes_must_be_a_list_of_names(settings: Settings, scopes: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        AsyncQueue("default", settings=settings, scopes=scopes)  # type: ignore[arg-type]  # wrong types on purpose: the check under test
    assert caught.value.field == "scopes"


async def test_a_conflict_never_shows_the_other_runs_data(settings: Settings) -> None:
    run_id = uuid.uuid4().hex
    async with AsyncQueue("default", settings=settings, scopes=["tenantA"]) as a:
        await a.enqueue(tf.leaf, 424242, run_id=run_id)
    async with AsyncQueue("default", settings=settings, scopes=["tenantB"]) as b:
        with pytest.raises(ExecutionIdentityConflict) as caught:
            await b.enqueue(tf.leaf, 7, run_id=run_id)
    assert "424242" not in str(caught.value) and "tenantA" not in str(caught.value)
    assert not hasattr(caught.value, "existing")
