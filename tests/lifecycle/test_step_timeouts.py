"""``ctx.step(..., timeout=)``: async cancelled, sync abandoned and counted, retried, and
timed again on the next owner after a SIGKILL (real Postgres, Redis, workers)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import tests.lifecycle.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.types import RunStatus
from runfleet.worker.authoring.step_timeouts import ABANDONED
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, records, running_on
from tests.support.polling import until

LIFECYCLE_FLOWS = "tests.lifecycle.flows"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_an_async_step_past_its_timeout_is_cancelled_and_retried(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    run = await queue.enqueue(flows.async_timeout, str(ledger), 2, 3)
    assert (await run.result(timeout=30))["attempt"] == 3
    attempts = await store.steps.attempts(run.id, "step:call#1")
    errors = [a["error"] for a in attempts]
    assert len(errors) == 3 and errors[2] is None
    assert all("timed out after 0.5 s (cancelled)" in e for e in errors[:2]), errors


async def test_a_step_out_of_attempts_fails_the_run_with_its_timeout(
    worker: Worker, queue: AsyncQueue, tmp_path: Path
) -> None:
    run = await queue.enqueue(flows.async_timeout, str(tmp_path / "l"), 99, 2)
    with pytest.raises(Exception, match="StepTimeout"):
        await run.result(timeout=30)
    assert await run.get_status() == RunStatus.FAILED


async def test_a_sync_step_past_its_timeout_is_abandoned_and_counted(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    before = ABANDONED.count()
    run = await queue.enqueue(flows.sync_timeout, str(ledger), 4.0)
    # Attempt 2 answers while attempt 1's thread still sleeps: it is abandoned, not awaited.
    assert await run.result(timeout=30) == 2
    assert "sync-first-ended" not in " ".join(await asyncio.to_thread(_lines, ledger))
    assert ABANDONED.count() == before + 1
    await until(
        lambda: asyncio.to_thread(_lines, ledger),
        30,
        "the abandoned thread to end",
        accept=lambda lines: any("sync-first-ended" in line for line in lines),
    )
    await until(lambda: _count(), 5, "the count to drop", accept=lambda n: n == before)
    (first, second) = await store.steps.attempts(run.id, "step:call#1")
    assert "thread abandoned" in first["error"] and second["error"] is None


async def _count() -> int:
    return ABANDONED.count()


async def test_the_steps_own_timeout_error_is_not_a_step_timeout(
    worker: Worker, queue: AsyncQueue
) -> None:
    run = await queue.enqueue(flows.own_timeout_error)
    assert await run.result(timeout=20) == "the step's own"


async def test_a_bad_timeout_is_refused_before_anything_runs(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(flows.bad_timeout)
    with pytest.raises(Exception, match="timeout"):
        await run.result(timeout=20)
    assert await store.steps.attempts(run.id, "step:call#1") == []


@pytest.mark.chaos
async def test_a_step_timeout_holds_on_the_next_owner_after_a_sigkill(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    a = spawn(flows=LIFECYCLE_FLOWS)
    await a.wait_started()
    # Attempts 1 (on A) and 2 (on B) hang; the timeout ends attempt 2, attempt 3 answers.
    run = await queue.enqueue(flows.async_timeout, str(ledger), 2, 4)
    await until(lambda: running_on(store, run.id, a.pid), 20, "run to start on A")
    await until(lambda: asyncio.to_thread(_lines, ledger), 20, "attempt 1 on A", accept=bool)
    a.signal(signal.SIGKILL)
    await a.wait_exit()
    b = spawn(flows=LIFECYCLE_FLOWS)
    await b.wait_started()
    result = await run.result(timeout=60)
    assert result == {"attempt": 3, "pid": b.pid}
    first, second, third = await store.steps.attempts(run.id, "step:call#1")
    assert first["finished_at_ms"] is None  # its process died mid-attempt
    assert "timed out after 0.5 s" in second["error"] and third["error"] is None
    assert len(await records(store, run.id, "stolen-and-activated")) == 1
