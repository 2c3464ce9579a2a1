"""A producer's answer, resume or revive whose first try committed but whose reply was lost.

The connection is dropped after the write committed (injected: the store call runs for
real, then raises the error a lost connection raises), so the producer retries and finds
the wait already answered. Its own journal record tells it the write was its own: the
call succeeds, once, instead of reporting a refusal; a record that is not its own (another
actor's, another step's) still refuses. Real Postgres and Redis, a worker in the test's
event loop where a run must really park.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import tests.flows.flows as f
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.types import Waiting, WaitingReason
from runfleet.store.waits import token_hash
from runfleet.worker.process import Worker
from tests.flows.conftest import parked
from tests.flows.test_quarantine import _quarantined
from tests.store.helpers import make_parked, must_get


def reply_lost_once(
    monkeypatch: pytest.MonkeyPatch, target: object, name: str
) -> Callable[[], int]:
    """``target.name`` commits for real, and its first reply is lost with the connection."""
    real: Callable[..., Awaitable[Any]] = getattr(target, name)
    calls = [0]

    async def lossy(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        answer = await real(*args, **kwargs)
        if calls[0] == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return answer

    monkeypatch.setattr(target, name, lossy)
    return lambda: calls[0]


async def _kinds(store: Store, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [dict(r.payload) for r in await store.journal.records(run_id) if r.kind == kind]


@pytest.mark.parametrize("approved", [True, False])
async def test_an_approval_whose_reply_was_lost_is_not_refused(
    worker: Worker,
    queue: AsyncQueue,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    approved: bool,
) -> None:
    run = await queue.enqueue(f.approver, 10)
    await parked(store, run.id, "approval")
    token = f.TOKENS[run.id]
    calls = reply_lost_once(monkeypatch, queue.store.deferreds, "answer_approval")
    answer = queue.approve if approved else queue.deny
    await answer(run.id, token, {"limit": 5}, actor="alice", reason="budget")
    assert calls() == 2, "the first try's reply was lost and the call retried"
    kind = "approval-approved" if approved else "approval-denied"
    (decision,) = await _kinds(store, run.id, kind)
    assert decision["reason"] == "budget", decision
    result = await run.result(timeout=10)
    assert result["approved"] is approved and result["value"] == {"limit": 5}, result


def answered_first_by(
    monkeypatch: pytest.MonkeyPatch, queue: AsyncQueue, approved: bool, actor: str
) -> None:
    """The first try of ``answer_approval`` commits another decision (``approved`` by
    ``actor``) instead of the caller's, and its reply is lost."""
    real = queue.store.deferreds.answer_approval
    seen = [0]

    async def lossy(run_id: str, token: str, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == 1:
            await real(run_id, token, approved=approved, value=None, actor=actor, reason=None)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(run_id, token, **kwargs)

    monkeypatch.setattr(queue.store.deferreds, "answer_approval", lossy)


async def test_a_lost_reply_is_not_mistaken_for_another_actors_answer(
    worker: Worker, queue: AsyncQueue, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry finds the wait answered, but by a decision that is not this call's (the
    other verdict, another actor): it is refused, as without the lost reply."""
    for approved, actor in ((False, "alice"), (True, "bob")):
        run = await queue.enqueue(f.approver, 11)
        await parked(store, run.id, "approval")
        answered_first_by(monkeypatch, queue, approved, actor)
        with pytest.raises(InvalidInput):
            await queue.approve(run.id, f.TOKENS[run.id], actor="alice")
        monkeypatch.undo()


async def test_a_resume_whose_reply_was_lost_is_not_refused(
    worker: Worker,
    queue: AsyncQueue,
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = await _quarantined(store, settings, queue)
    calls = reply_lost_once(monkeypatch, queue.store.steps, "resume_quarantined")
    await queue.resume(run_id, rerun_step="step:a#1", actor="ops")
    assert calls() == 2
    (resumed,) = await _kinds(store, run_id, "resumed")
    assert resumed["rerun_step"] == "step:a#1" and resumed["note"] == "ops"
    assert await queue.run(run_id).result(timeout=15) is not None


@pytest.mark.parametrize("note", ["other", "ops"])
async def test_a_resume_of_another_step_is_refused_after_a_lost_reply(
    worker: Worker,
    queue: AsyncQueue,
    store: Store,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    note: str,
) -> None:
    """Another resume (accepting the record) committed, by someone else or under this
    call's own note; this call's retry finds the run no longer quarantined and the record
    not this call's own (it asked to re-run a step): refused."""
    run_id = await _quarantined(store, settings, queue)
    real = queue.store.steps.resume_quarantined
    seen = [0]

    async def resumed_by_someone_else(run: str, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == 1:
            await real(run, accept_recorded=True, rerun_key=None, note=note)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(run, **kwargs)

    monkeypatch.setattr(queue.store.steps, "resume_quarantined", resumed_by_someone_else)
    with pytest.raises(InvalidInput):
        await queue.resume(run_id, rerun_step="step:a#1", actor="ops")


async def test_a_revive_whose_reply_was_lost_is_not_refused(
    queue: AsyncQueue, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_parked(store, "dead", Waiting(WaitingReason.DEAD))
    calls = reply_lost_once(monkeypatch, queue.store.runs, "revive")
    await queue.resume("dead", actor="ops")
    assert calls() == 2
    (revived,) = await _kinds(store, "dead", "resumed")
    assert revived["from"] == "dead" and revived["note"] == "ops"
    assert (await must_get(store, "dead")).waiting is None
    with pytest.raises(InvalidInput):  # and a revive of a run no longer dead is refused
        await queue.resume("dead", actor="ops")


async def test_a_revive_by_another_actor_is_refused_after_a_lost_reply(
    queue: AsyncQueue, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone else revived the dead run first; this call's retry finds it no longer dead
    and the resume record not its own: refused, as without the lost reply."""
    await make_parked(store, "dead", Waiting(WaitingReason.DEAD))
    real = queue.store.runs.revive
    seen = [0]

    async def revived_by_someone_else(run_id: str, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == 1:
            await real(run_id, note="other")
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(run_id, **kwargs)

    monkeypatch.setattr(queue.store.runs, "revive", revived_by_someone_else)
    with pytest.raises(InvalidInput) as refused:
        await queue.resume("dead", actor="ops")
    assert (refused.value.field, refused.value.problem) == (
        "run_id",
        "run 'dead' is not parked dead",
    )
    assert seen[0] == 2


async def test_a_revive_that_lost_a_race_without_a_lost_reply_is_refused(
    queue: AsyncQueue, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is dead when the call reads it, and revived by a concurrent call with the
    same note before this one writes; no reply was lost (nothing retried), so the record
    is not this call's own: refused."""
    await make_parked(store, "dead", Waiting(WaitingReason.DEAD))
    real = queue.store.runs.revive

    async def revived_meanwhile(run_id: str, **kwargs: Any) -> Any:
        await real(run_id, note="ops")
        return await real(run_id, **kwargs)

    monkeypatch.setattr(queue.store.runs, "revive", revived_meanwhile)
    with pytest.raises(InvalidInput) as refused:
        await queue.resume("dead", actor="ops")
    assert (refused.value.field, refused.value.problem) == (
        "run_id",
        "run 'dead' is not parked dead",
    )


async def test_a_lost_reply_is_recognised_on_a_run_with_a_long_journal(
    queue: AsyncQueue, store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with more than ten thousand journal records before its revive (a long life of
    steps): the retry still finds the revive's own record, the newest, and succeeds."""
    await make_parked(store, "dead", Waiting(WaitingReason.DEAD))
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        await c.execute(
            "INSERT INTO runfleet.journal (run_id, kind, source_id, source_seq, payload,"
            " digest, at_ms) SELECT 'dead', 'transitioned', 'bulk', g, '{}'::jsonb, 'x',"
            " runfleet.now_ms() FROM generate_series(1, 10100) AS g"
        )
    calls = reply_lost_once(monkeypatch, queue.store.runs, "revive")
    await queue.resume("dead", actor="ops")
    assert calls() == 2
    assert (await must_get(store, "dead")).waiting is None


async def test_an_answer_refused_after_a_failed_first_try_is_still_refused(
    queue: AsyncQueue, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try fails before it commits (a dropped connection) and the retry finds
    the token is not the pending one: the run has no decision on record, so the call is
    refused, as without the failure."""
    approval = Waiting(WaitingReason.APPROVAL, token=token_hash("tok"))
    await make_parked(store, "ap", approval, deferred="approval")
    real = queue.store.deferreds.answer_approval
    seen = [0]

    async def dropped_first(run_id: str, token: str, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(run_id, token, **kwargs)

    monkeypatch.setattr(queue.store.deferreds, "answer_approval", dropped_first)
    with pytest.raises(InvalidInput) as refused:
        await queue.approve("ap", "not-the-token", actor="alice")
    assert refused.value.field == "token" and seen[0] == 2
    assert (await must_get(store, "ap")).waiting is not None
