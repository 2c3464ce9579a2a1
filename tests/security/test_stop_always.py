"""A stopping worker always stops, whatever its runs' code left behind.

Real ``runfleet worker`` processes run bodies (tests/security/leftover_flows.py) that leave
a non-daemon thread, ignore or block SIGTERM and SIGINT, hang in a thread, or schedule
``sys.exit`` on the loop; the test then does what an operator does: one SIGTERM. Before,
the first kept the process alive for as long as the thread slept (the interpreter's exit
joins it), the second took the shutdown away, the hung thread held the release for ever,
and the loop callback ended the worker with its run left ``running`` until stale.

Each process now ends within ``Settings.stop_deadline`` of its first stop (grace, then
release), exits hard, and what it could not release is taken over as after a kill.
"""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from runfleet.worker.stopping import STOP_OVERDUE_EXIT
from tests.fleet.procs import Spawn, WorkerProc
from tests.security.leftover_flows import executions
from tests.support.polling import until

FLOWS = "tests.security.leftover_flows"
GRACE = 1.0
SLACK_S = 3.0  # process start-up of the exit path and the test's own polling, on a busy host

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ledger() -> Iterator[str]:
    path = Path(tempfile.mkstemp(prefix="rf-ledger-")[1])
    path.unlink()
    yield str(path)
    path.unlink(missing_ok=True)


def _deadline(settings: Settings) -> float:
    return settings.model_copy(update={"grace_period": GRACE}).stop_deadline


async def _started(spawn: Spawn) -> WorkerProc:
    proc = spawn(flows=FLOWS, grace_period=GRACE)
    await proc.wait_started()
    return proc


async def _done(ledger: str, what: str) -> None:
    async def check() -> bool:
        return any(line.endswith(what) for line in executions(ledger))

    await until(check, 20, f"the body to have {what}")


async def _stops_in_time(proc: WorkerProc, settings: Settings) -> tuple[int, float]:
    sent = time.monotonic()
    proc.signal(signal.SIGTERM)
    code = await proc.wait_exit(timeout=_deadline(settings) + SLACK_S)
    return code, time.monotonic() - sent


async def test_a_thread_left_behind_does_not_keep_the_worker(
    spawn: Spawn, queue: AsyncQueue, settings: Settings, ledger: str
) -> None:
    proc = await _started(spawn)
    run = await queue.enqueue("lo.thread", ledger)
    assert await run.result(timeout=20) == "left"
    code, took = await _stops_in_time(proc, settings)
    assert code == 0, proc.log()[-3000:]
    assert took < GRACE + SLACK_S, took  # nothing to release: it went at once


@pytest.mark.parametrize(("flow", "deed"), [("lo.ignore", "ignored"), ("lo.block", "blocked")])
async def test_a_body_cannot_take_the_workers_signals(
    spawn: Spawn, queue: AsyncQueue, settings: Settings, ledger: str, flow: str, deed: str
) -> None:
    proc = await _started(spawn)
    run = await queue.enqueue(flow, ledger)
    await _done(ledger, deed)

    async def restored() -> bool:
        return "worker.signals_restored" in proc.log()

    await until(restored, 5, "the worker to put its signal handlers back")
    code, _ = await _stops_in_time(proc, settings)
    assert code == 0, proc.log()[-3000:]
    row = await run.fetch()  # released on the way out, not left to a steal
    assert row.owner is None and row.status is RunStatus.SUSPENDED, row


async def test_a_hung_body_is_left_to_takeover_after_the_deadline(
    spawn: Spawn, queue: AsyncQueue, settings: Settings, ledger: str
) -> None:
    first = await _started(spawn)
    run = await queue.enqueue("lo.stuck", ledger)
    await _done(ledger, "stuck")
    code, took = await _stops_in_time(first, settings)
    assert code == STOP_OVERDUE_EXIT, first.log()[-3000:]
    assert took >= _deadline(settings) - 0.5, took
    assert "worker.stop_overdue" in first.log()
    second = await _started(spawn)
    assert await run.result(timeout=30) == "second"
    kinds = [r.kind for r in await queue.store.journal.records(run.id, limit=100)]
    assert "stolen-and-activated" in kinds, kinds
    second.signal(signal.SIGTERM)
    assert await second.wait_exit(timeout=_deadline(settings) + SLACK_S) == 0


async def test_a_loop_callback_that_exits_fails_its_run_not_the_worker(
    spawn: Spawn, queue: AsyncQueue, ledger: str
) -> None:
    proc = await _started(spawn)
    run = await queue.enqueue("lo.exit_soon", ledger)

    async def settled() -> bool:
        return (await run.fetch()).status.terminal

    await until(settled, 20, "the run to settle")
    row = await run.fetch()
    assert row.status is RunStatus.FAILED, row
    assert row.state["error"]["type"] == "SystemExit", row.state
    later = await queue.enqueue("lo.exit_later", ledger)
    assert await later.result(timeout=20) == "done"

    async def both_exits_caught() -> bool:
        return proc.log().count("run.callback_exit") == 2

    await until(both_exits_caught, 10, "the second callback's exit to be caught")
    again = await queue.enqueue("lo.alive")
    assert await again.result(timeout=20) == proc.pid
    assert proc.proc.poll() is None, proc.log()[-3000:]
