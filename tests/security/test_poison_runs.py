"""Poison runs stop: a run whose executions keep ending in a lost process is
re-activated at most ``RUNFLEET_MAX_RECOVERIES`` times, then parked ``dead``.

Real ``runfleet worker`` supervisors (``--processes 2``: a child that dies is restarted
under a new owner), real Postgres and Redis, real ``os._exit`` and ``SIGKILL`` from inside
the flow body. Each execution writes a line to a ledger outside runfleet before it ends its
process, so "exactly 1 + max executions" is counted by the body itself, not by the journal
it is checked against. The dead run shows in ``runfleet stuck`` and ``runfleet explain``
and stays parked (no sweep moves it); ``runfleet retry`` / ``runfleet resume`` move it on
with the count started again, journaled with the role that decided.

Before this, such a run walked the fleet for ever: every takeover re-ran the body, which
killed the next worker.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import pytest

import tests.security.user_code_flows as uc
from runfleet.producer import AsyncQueue
from runfleet.producer.run import AsyncRun
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.types import Owner, RunRow, RunStatus, WaitingReason
from tests.fleet.procs import Spawn, records
from tests.ops.conftest import cli_env, invoke
from tests.support.polling import until

FLOWS = "tests.security.user_code_flows"


def _ledger(path: Path) -> list[int]:
    """The pids of the executions the body recorded, oldest first."""
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]


async def _parked_dead(run: AsyncRun, timeout: float = 90.0) -> RunRow:
    async def check() -> RunRow | None:
        row = await run.fetch()
        dead = row.waiting is not None and row.waiting.reason is WaitingReason.DEAD
        return row if dead else None

    return await until(check, timeout, f"run {run.id} to be parked dead")


async def _stays_dead(run: AsyncRun, ledger: Path, executions: int, hold: float) -> None:
    """For ``hold`` seconds (several stale_after + sweep cycles), nothing moves the run."""
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        row = await run.fetch()
        assert row.waiting is not None and row.waiting.reason is WaitingReason.DEAD, row
        assert len(_ledger(ledger)) == executions, _ledger(ledger)
        await asyncio.sleep(0.25)  # sampling a state that must hold, not hoping for one


async def _check_dead(
    store: Store, run: AsyncRun, ledger: Path, max_recoveries: int, previous_kinds: int = 0
) -> RunRow:
    row = await _parked_dead(run)
    pids = _ledger(ledger)
    assert len(pids) == previous_kinds + 1 + max_recoveries, pids
    assert row.status is RunStatus.SUSPENDED and row.owner is None, row
    assert row.recoveries == max_recoveries, row
    dead = await records(store, run.id, Kind.DEAD_LETTERED)
    assert dead, "no dead-lettered record"
    evidence = dead[-1].payload
    assert evidence["recoveries"] == max_recoveries == evidence["max_recoveries"], evidence
    lost = [Owner.parse(o) for o in evidence["lost_owners"]]
    # Every execution of this episode, each on its own (dead) process, newest first.
    assert [o.pid for o in lost if o] == list(reversed(pids[-(1 + max_recoveries) :])), (
        evidence,
        pids,
    )
    assert row.waiting is not None and row.waiting.request["lost_owners"] == evidence["lost_owners"]
    return row


@pytest.mark.timeout(300)
async def test_a_run_that_kills_its_worker_every_time_is_parked_dead(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="rf-poison-"))
    ledger, fixed = tmp / "ledger", tmp / "fixed"
    fleet = spawn(flows=FLOWS, extra_args=["--processes", "2"], max_recoveries=2)
    await fleet.wait_started()
    run = await queue.enqueue(uc.poison, str(ledger), str(fixed), run_id="poison-1")

    await _check_dead(store, run, ledger, max_recoveries=2)
    assert len(await records(store, run.id, Kind.STOLEN_AND_ACTIVATED)) == 2
    await _stays_dead(run, ledger, 3, hold=4 * (settings.stale_after + settings.sweep_interval))
    assert "run.dead_lettered" in fleet.log()

    env = cli_env(settings.model_copy(update={"max_recoveries": 2}))
    stuck = await invoke(env, "stuck", "--json")
    assert stuck.code == 0, stuck
    items = [i for i in json.loads(stuck.stdout)["items"] if i["run"]["id"] == run.id]
    assert [i["kind"] for i in items] == ["dead"], stuck.stdout
    assert "runfleet resume poison-1" in items[0]["action"]
    explained = await invoke(env, "explain", run.id)
    assert explained.code == 0, explained
    text = explained.stdout
    assert "is suspended" in text and "waiting: dead" in text, text
    assert "parked dead" in text and "RUNFLEET_MAX_RECOVERIES" in text, text
    assert "needs a person:" in text and "runfleet resume poison-1" in text, text

    # `retry` of a dead run resumes it with the count started again: the flow is not
    # fixed yet, so it kills 1 + 2 more processes and is parked dead again.
    retried = await invoke(env, "retry", run.id)
    assert retried.code == 0 and "was parked dead; resumed" in retried.stdout, retried
    await _check_dead(store, run, ledger, max_recoveries=2, previous_kinds=3)

    # Fixed: `resume` moves it on, and it completes on the same run id.
    fixed.touch()
    resumed = await invoke(env, "resume", run.id)
    assert resumed.code == 0, resumed
    assert await run.result(timeout=60) == "fixed"
    assert len(_ledger(ledger)) == 6  # the fixed execution ended no process
    moved = [r.payload for r in await records(store, run.id, Kind.RESUMED)]
    assert [(p["from"], p["recoveries"]) for p in moved] == [("dead", 2), ("dead", 2)], moved
    assert all(p["actor"] for p in moved), moved  # the authenticated role decided


@pytest.mark.timeout(240)
async def test_sigkill_from_the_body_and_no_recovery_at_all(
    spawn: Spawn, queue: AsyncQueue, store: Store, settings: Settings
) -> None:
    """A body that SIGKILLs its own process counts the same; with RUNFLEET_MAX_RECOVERIES=0
    the first lost process parks the run, and a cancel still closes a dead run."""
    tmp = Path(tempfile.mkdtemp(prefix="rf-poison-"))
    ledger, fixed = tmp / "ledger", tmp / "fixed"
    fleet = spawn(flows=FLOWS, extra_args=["--processes", "2"], max_recoveries=0)
    await fleet.wait_started()
    run = await queue.enqueue(uc.poison, str(ledger), str(fixed), "sigkill")
    await _check_dead(store, run, ledger, max_recoveries=0)
    assert await records(store, run.id, Kind.STOLEN_AND_ACTIVATED) == []
    await run.cancel()

    async def cancelled() -> RunRow | None:
        row = await run.fetch()
        return row if row.status is RunStatus.CANCELLED else None

    await until(cancelled, 30, "the cancel to close the dead run")
    assert len(_ledger(ledger)) == 1  # closed without running the body again
