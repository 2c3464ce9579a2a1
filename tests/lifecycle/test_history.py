"""Resume a settled run, fork a run from call N, delete a run (real Postgres, Redis,
workers, and a SIGKILL in the middle of a fork)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import tests.lifecycle.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.errors import InvalidInput
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, records, running_on
from tests.flows.conftest import parked
from tests.support.polling import until

LIFECYCLE_FLOWS = "tests.lifecycle.flows"


def _lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


async def _executed(path: Path) -> list[str]:
    """The steps executed, in order (the ledger's second column)."""
    return [line.split()[1] for line in await asyncio.to_thread(_lines, path)]


async def test_a_failed_run_resumes_from_its_recorded_steps(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger, flag = tmp_path / "ledger", tmp_path / "fail"
    flag.touch()
    run = await queue.enqueue(flows.four_steps, str(ledger), str(flag), 0)
    with pytest.raises(Exception, match="step 2 fails"):
        await run.result(timeout=20)
    flag.unlink()
    resumed = await queue.resume_run(run.id, actor="ops")
    again = await queue.resume_run(run.id)  # while it is open: harmless, the same round
    # Resumed under the id the caller holds (DBOS): it answers through the new round.
    assert again.id == resumed.id == run.id
    round_id = f"{run.id}@1"
    assert (await resumed.current()).id == round_id
    result = await resumed.result(timeout=20)
    assert [r["i"] for r in result] == [0, 1, 2, 3]
    assert await run.get_status() is RunStatus.COMPLETED
    # s0 and s1 ran once, on the failed round; s2 failed there and ran again here.
    assert await _executed(ledger) == ["step0", "step1", "step2", "step2", "step3"]
    assert (await store.runs.get(run.id)).status is RunStatus.FAILED  # type: ignore[union-attr]  # the settled round stays settled (DESIGN §3)
    (mark,) = await records(store, run.id, "resumed-as")
    assert mark.payload == {"to": round_id, "calls": 3, "actor": "postgres", "note": "ops"}
    (copied,) = await records(store, round_id, "history-copied")
    assert copied.payload["from"] == run.id
    # Resuming a run that completed is harmless: nothing new is admitted.
    assert (await queue.resume_run(run.id)).id == run.id
    assert (await queue.resume_run(round_id)).id == round_id
    assert len(await records(store, run.id, "resumed-as")) == 1
    assert await store.runs.get(f"{run.id}@2") is None


async def test_a_cancelled_run_resumes_and_waits_where_it_stopped(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    run = await queue.enqueue(flows.step_then_recv, str(ledger))
    await parked(store, run.id, "event", timeout=20)
    await queue.cancel(run.id)
    await until(lambda: run.get_status(), 20, "cancel", accept=lambda s: s.terminal)
    resumed = await queue.resume_run(run.id)
    assert resumed.id == run.id
    await parked(store, f"{run.id}@1", "event", timeout=20)
    await queue.send(run.id, "go", 7)  # the id the caller holds: its open round takes it
    assert await run.result(timeout=20) == ["first", 7]
    assert await _executed(ledger) == ["first"]


async def test_a_fork_replays_the_first_n_calls_and_sets_their_events(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    run = await queue.enqueue(flows.four_steps, str(ledger), str(tmp_path / "no"), 0)
    await run.result(timeout=20)
    # Positions: s0 (0), set_event (1), s1 (2), s2 (3), s3 (4), set_event (5).
    fork = await queue.fork(run.id, 3, new_run_id="the-fork", actor="ops")
    assert fork.id == "the-fork"
    assert await queue.get_event(fork.id, "stage") == "after s0"
    result = await fork.result(timeout=20)
    assert [r["i"] for r in result] == [0, 1, 2, 3]
    assert await _executed(ledger) == ["step0", "step1", "step2", "step3", "step2", "step3"]
    assert await queue.get_event(fork.id, "stage") == "done"
    (forked,) = await records(store, run.id, "forked")
    assert forked.payload["to"] == "the-fork" and forked.payload["calls"] == 3
    assert len(await records(store, fork.id, "history-copied")) == 1
    with pytest.raises(InvalidInput, match="recorded 6 calls, not 7"):
        await queue.fork(run.id, 7)


async def test_delete_removes_a_settled_run_and_refuses_an_open_one(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    run = await queue.enqueue(flows.progress)
    assert await queue.get_event(run.id, "stage", timeout=20) == {"n": 1}
    with pytest.raises(InvalidInput, match="not settled"):
        await queue.delete_run(run.id)
    await queue.send(run.id, "go", 1)
    await run.result(timeout=20)
    done = await queue.delete_run(run.id, actor="ops")
    assert done.run_ids == (run.id,) and done.journal > 0 and done.steps == 4
    assert await store.runs.get(run.id) is None
    assert await store.events.of_run(run.id) == []
    assert await store.events.messages_of_run(run.id) == []
    assert await store.journal.records(run.id) == []
    # DBOS's answers for an id that names no run: deleting again, or an id never used,
    # deletes nothing; its events read None.
    again = await queue.delete_run(run.id)
    assert again.run_ids == () and again.journal == again.steps == 0
    assert (await queue.delete_run("never-used")).run_ids == ()
    assert await queue.get_event("never-used", "stage") is None


@pytest.mark.chaos
async def test_a_forked_run_never_reexecutes_a_step_before_n_across_a_sigkill(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    a = spawn(flows=LIFECYCLE_FLOWS)
    await a.wait_started()
    run = await queue.enqueue(flows.four_steps, str(ledger), str(tmp_path / "no"), 6000)
    await until(lambda: _executed(ledger), 30, "s3 on A", accept=lambda s: "step3" in s)
    a.signal(signal.SIGKILL)  # the source dies in s3: its first four calls are recorded
    await a.wait_exit()
    fork = await queue.fork(run.id, 3)
    b = spawn(flows=LIFECYCLE_FLOWS)
    await b.wait_started()
    await until(lambda: running_on(store, fork.id, b.pid), 30, "the fork to start on B")
    await until(
        lambda: _executed(ledger), 30, "s3 of the fork on B", accept=lambda s: s.count("step3") >= 2
    )
    b.signal(signal.SIGKILL)  # and the fork dies in its own s3
    await b.wait_exit()
    c = spawn(flows=LIFECYCLE_FLOWS)
    await c.wait_started()
    assert [r["i"] for r in await fork.result(timeout=90)] == [0, 1, 2, 3]
    assert [r["i"] for r in await run.result(timeout=90)] == [0, 1, 2, 3]
    executed = await _executed(ledger)
    # s0 and s1 (before N = 3 calls) ran once, on the source, never on the fork.
    assert executed.count("step0") == 1 and executed.count("step1") == 1, executed
    assert executed.count("step2") == 2, executed  # once each: source, fork (after N)
