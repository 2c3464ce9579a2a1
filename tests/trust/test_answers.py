"""Answers need their credentials: ``complete`` answers only ``ctx.wait_for`` events.

Each forged answer is refused with ``NotAnswerable`` and leaves no trace (no deferred,
no journal record, the run still waits); every accepted answer is journaled with the
authenticated database role, the caller's ``actor`` only as a note.
"""

from __future__ import annotations

import pytest

import tests.trust.flows as tf
from runfleet.producer import AsyncQueue, EventCompleted, EventExisting, EventRunSettled
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput, LimitExceeded, NotAnswerable
from runfleet.store.types import RunStatus
from runfleet.store.values import text_digest
from runfleet.store.waits import token_hash
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.ops.conftest import Cli


async def _trace(store: Store, run_id: str) -> tuple[int, list[str]]:
    records = await store.journal.records(run_id, limit=10_000)
    deferreds = [d.name for d in await store.deferreds.completed_deferreds(run_id)]
    return len(records), deferreds


async def test_an_approval_is_not_answerable_by_complete(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.approver)
    await parked(store, run.id, "approval")
    before = await _trace(store, run.id)
    with pytest.raises(NotAnswerable) as caught:
        await queue.complete(run.id, "approval:manager", {"approved": True, "actor": "boss"})
    assert "approve/deny" in str(caught.value)
    assert await _trace(store, run.id) == before
    row = await store.runs.get(run.id)
    assert row is not None and row.waiting is not None and row.waiting.reason == "approval"


async def test_an_approval_cannot_be_preanswered_before_the_flow_reaches_it(
    queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.approver)  # no worker: the run has declared nothing yet
    for name in ("approval:manager", "child:x", "sleep:sleep#1", "step:s#1:retry1", "quota:q"):
        with pytest.raises(NotAnswerable):
            await queue.complete(run.id, name, {"approved": True})
    assert (await _trace(store, run.id))[1] == []


async def test_a_child_result_cannot_be_forged(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.parent)
    await parked(store, run.id, "child")
    child_id = f"{run.id}/child:trust.blocked_child#1"
    await parked(store, child_id, "event")
    with pytest.raises(NotAnswerable) as caught:
        await queue.complete(run.id, f"child:{child_id}", {"status": "completed", "result": 1})
    assert "child wait" in str(caught.value)
    assert await store.deferreds.deferred(run.id, f"child:{child_id}") is None
    # The real child still decides: answer it, and the parent gets its true result.
    assert await queue.complete(child_id, "release", "real")
    assert await run.result(timeout=10) == "real"


async def test_a_durable_sleep_cannot_be_skipped(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.sleeper)
    await parked(store, run.id, "timer")
    before = await _trace(store, run.id)
    with pytest.raises(NotAnswerable):
        await queue.complete(run.id, "sleep:sleep#1", {"fired_at_ms": 0})
    assert await _trace(store, run.id) == before
    (clock,) = await store.waits.pending_clocks(run.id)
    assert clock.completed_at_ms is None


async def test_a_quota_wait_is_not_woken_by_an_answer(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.quota, await store.stats.now_ms() + 3_600_000)
    await parked(store, run.id, "quota")
    with pytest.raises(NotAnswerable):
        await queue.complete(run.id, "quota:quota#1")
    row = await store.runs.get(run.id)
    assert row is not None and row.waiting is not None and row.waiting.reason == "quota"


async def test_an_event_answer_is_journaled_with_the_database_role(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.waiter)
    await parked(store, run.id, "event")
    assert await queue.complete(run.id, "go", "yes", actor="mallory-says-she-is-alice")
    assert await run.result(timeout=10) == "yes"
    (done,) = [r for r in await store.journal.records(run.id) if r.kind == "deferred-completed"]
    assert done.payload["answered_by"] == "postgres"  # session_user, not the free text
    assert done.payload["note"] == "mallory-says-she-is-alice"


async def test_a_declared_event_is_answerable_whatever_its_name(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    """Decided by what the run declared, not by a prefix: wait_for("child:…") is an event."""
    run = await queue.enqueue(tf.odd_event)
    await parked(store, run.id, "event")
    assert await queue.complete(run.id, "child:not-a-child", 7)
    assert await run.result(timeout=10) == 7


async def test_an_early_answer_to_an_ordinary_event_still_lands(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.waiter)
    assert await queue.complete(run.id, "go", "early")  # before or after the park: both fine
    assert await run.result(timeout=10) == "early"


async def test_a_second_answer_learns_whether_its_value_is_the_one_that_stands(
    settings: Settings, store: Store
) -> None:
    """EventCompleted, then EventExisting(same=True) for the same value (a retry after a
    lost reply: truthy, even at the answer cap) or same=False for another; the winner's
    digest on the deferred and in the journal."""
    tight = settings.model_copy(update={"max_answers_per_run": 1})
    async with AsyncQueue("default", settings=tight) as q:
        run = await q.enqueue(tf.waiter)  # nobody runs it: early answers only
        first = await q.complete(run.id, "go", {"b": 2, "a": 1.5})
        assert isinstance(first, EventCompleted) and first
        assert first.digest == text_digest('{"a":1.5,"b":2}')
        again = await q.complete(run.id, "go", {"a": 1.5, "b": 2})
        assert again == EventExisting(run.id, "go", first.digest, same=True) and again
        other = await q.complete(run.id, "go", "something else")
        assert other == EventExisting(run.id, "go", first.digest, same=False) and not other
    stored = await store.deferreds.deferred(run.id, "go")
    assert stored is not None and stored.digest == first.digest
    (done,) = [r for r in await store.journal.records(run.id) if r.kind == "deferred-completed"]
    assert done.payload["digest"] == first.digest


async def test_an_answer_to_a_settled_run_is_run_settled(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.waiter)
    await queue.complete(run.id, "go", "yes")
    assert await run.result(timeout=10) == "yes"
    late = await queue.complete(run.id, "late", "no")
    assert late == EventRunSettled(run.id, RunStatus.COMPLETED) and not late


async def test_answers_per_run_are_capped(settings: Settings, store: Store) -> None:
    tight = settings.model_copy(update={"max_answers_per_run": 2})
    async with AsyncQueue("default", settings=tight) as q:
        run = await q.enqueue(tf.waiter)  # nobody runs it: early answers only
        assert await q.complete(run.id, "a", 1)
        assert await q.complete(run.id, "b", 2)
        with pytest.raises(LimitExceeded) as caught:
            await q.complete(run.id, "c", 3)
        assert caught.value.limit == "max_answers_per_run"
    assert await store.deferreds.deferred(run.id, "c") is None


async def test_approve_compares_hashes_and_journals_the_role(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.approver)
    row = await parked(store, run.id, "approval")
    token = tf.TOKENS[run.id]
    assert row.waiting is not None and row.waiting.token == token_hash(token)
    for wrong in (row.waiting.token, token[:-1], token.upper(), ""):
        with pytest.raises(InvalidInput):
            await queue.approve(run.id, wrong, actor="eve")
    await queue.approve(run.id, token, {"cap": 3}, actor="ann", reason="ok")
    assert await run.result(timeout=10) == {
        "approved": True,
        "actor": "postgres",
        "value": {"cap": 3},
    }
    texts = [str(r.payload) for r in await store.journal.records(run.id)]
    texts += [str(s.output) for s in await store.steps.of_run(run.id)]
    assert not any(token in t for t in texts), "the token itself is stored nowhere"


async def test_views_never_print_the_token(
    worker: Worker, queue: AsyncQueue, store: Store, cli: Cli
) -> None:
    run = await queue.enqueue(tf.approver)
    row = await parked(store, run.id, "approval")
    token = tf.TOKENS[run.id]
    assert row.waiting is not None and row.waiting.token is not None
    digest = row.waiting.token.removeprefix("sha256:")
    for args in (
        ("explain", run.id),
        ("explain", run.id, "--json"),
        ("show", run.id),
        ("show", run.id, "--json"),
        ("journal", run.id),
        ("journal", run.id, "--json"),
    ):
        out = await cli(*args)
        assert out.code == 0, (args, out.stderr)
        assert token not in out.stdout, args
        assert digest not in out.stdout, args  # at most an 8-character prefix of the hash
    shown = await cli("show", run.id)
    assert digest[:8] in shown.stdout


async def test_complete_from_the_cli_refuses_an_approval(
    worker: Worker, queue: AsyncQueue, store: Store, cli: Cli
) -> None:
    run = await queue.enqueue(tf.approver)
    await parked(store, run.id, "approval")
    out = await cli("complete", run.id, "approval:manager", "--value", '{"approved": true}')
    assert out.code != 0 and out.clean
    assert "approve/deny" in out.stderr and "Traceback" not in out.stderr + out.stdout


async def test_cli_complete_journals_the_role_and_keeps_actor_as_a_note(
    worker: Worker, queue: AsyncQueue, store: Store, cli: Cli
) -> None:
    run = await queue.enqueue(tf.waiter)
    await parked(store, run.id, "event")
    out = await cli("complete", run.id, "go", "--value", '"v"', "--actor", "ceo@example.com")
    assert out.code == 0, out.stderr
    assert await run.result(timeout=10) == "v"
    (done,) = [r for r in await store.journal.records(run.id) if r.kind == "deferred-completed"]
    assert done.payload["answered_by"] == "postgres" and done.payload["note"] == "ceo@example.com"


async def test_a_name_a_child_owns_stays_runfleets_even_if_waited_for_as_an_event(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.sneaky)
    await parked(store, run.id, "event")
    child_id = f"{run.id}/spawn:trust.blocked_child#1"
    with pytest.raises(NotAnswerable):
        await queue.complete(run.id, f"child:{child_id}", {"status": "completed", "result": 0})
    assert await store.deferreds.deferred(run.id, f"child:{child_id}") is None
    assert await queue.complete(child_id, "release", "from the child")  # the real settlement
    assert (await run.result(timeout=10))["result"] == "from the child"
