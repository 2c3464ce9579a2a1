"""A run body can do anything to itself and nothing to its process.

Real ``runfleet worker`` processes, real Postgres and Redis. ``sys.exit()``,
``KeyboardInterrupt``, a ``CancelledError`` runfleet did not cause, ``GeneratorExit`` and
BaseExceptions of the user's own — out of async bodies, sync bodies (threads), step
functions (async and in threads), tasks a body created, and rq-style plain functions —
each fail THAT run with the exception's type recorded, while the same worker process goes
on executing its neighbour and the next run. A body that raises runfleet's own control
exceptions (``Interrupted``, ``Suspended``) fails the same way: only the instances runfleet
raised mean "stop" or "parked". Runfleet's own stops keep their meaning: a cancel still
cancels, and SIGTERM / SIGINT to the worker still shut it down gracefully.

Before this, ``sys.exit()`` or ``KeyboardInterrupt`` in a body ended the whole worker
(exit 3 / 130) with the run left ``running``, and a body's own ``CancelledError`` was
taken for a shutdown and released, to be re-run for ever.
"""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import pytest

import tests.security.user_code_flows as uc
from runfleet.producer import AsyncQueue
from runfleet.producer.run import AsyncRun
from runfleet.store.types import RunError, RunRow, RunStatus, WaitingReason
from tests.fleet.procs import Spawn, WorkerProc
from tests.support.polling import until

FLOWS = "tests.security.user_code_flows"

EXPECTED = {
    "exit": "SystemExit",
    "keyboard": "KeyboardInterrupt",
    "cancelled": "CancelledError",
    "generator-exit": "GeneratorExit",
    "custom": "Hostile",
    "exit-subclass": "HostileExit",
    "forged-interrupted": "Interrupted",
    "forged-suspended": "Suspended",
}
CASES: list[tuple[object, str]] = [
    *((uc.async_body, kind) for kind in EXPECTED),
    *((uc.sync_body, kind) for kind in ("exit", "keyboard", "cancelled", "custom")),
    *((uc.sync_body, kind) for kind in ("forged-interrupted", "forged-suspended")),
    *((uc.async_step, kind) for kind in ("exit", "keyboard", "cancelled", "generator-exit")),
    *((uc.sync_step, kind) for kind in ("exit", "keyboard", "custom")),
    *((uc.sub_task, kind) for kind in ("exit", "keyboard")),
    *((uc.plain_raises, kind) for kind in ("exit", "keyboard")),
]


async def _settled(run: AsyncRun, timeout: float = 30.0) -> RunRow:
    async def check() -> RunRow | None:
        row = await run.fetch()
        return row if row.status.terminal else None

    return await until(check, timeout, f"run {run.id} to settle")


def _alive(proc: WorkerProc) -> None:
    code = proc.proc.poll()
    assert code is None, f"the worker exited ({code}):\n{proc.log()[-3000:]}"


@pytest.mark.timeout(180)
async def test_base_exceptions_fail_their_run_and_the_worker_goes_on(
    spawn: Spawn, queue: AsyncQueue
) -> None:
    proc = spawn(flows=FLOWS, concurrency=4)
    await proc.wait_started()
    neighbour = await queue.enqueue(uc.nap, 4.0)  # executing while the others misbehave
    runs = [(fn, kind, await queue.enqueue(fn, kind)) for fn, kind in CASES]
    report = Path(tempfile.mkdtemp(prefix="rf-uc-")) / "on_failure"
    rq_style = await queue.enqueue(uc.plain_raises, "exit", str(report), on_failure=uc.on_failure)
    swallowed = await queue.enqueue(uc.swallowing_step, "keyboard")

    for fn, kind, run in runs:
        row = await _settled(run)
        where = f"{getattr(fn, 'name', fn)}({kind!r})"
        assert row.status is RunStatus.FAILED, (where, row.status, row.state)
        error = row.error
        assert isinstance(error, RunError), (where, error)
        assert error.type == EXPECTED[kind], (where, error)
        assert "raised by the run's own code" in str(error.message), (where, error)
        assert EXPECTED[kind] in str(error.traceback), (where, error)
        _alive(proc)

    row = await _settled(rq_style)
    assert row.status is RunStatus.FAILED and row.error is not None, row.state
    assert row.error.type == "SystemExit", row.state
    assert report.read_text() == "SystemExit"  # rq's on_failure ran, as for any failure
    assert await swallowed.result(timeout=30) == "caught KeyboardInterrupt"

    # The same process executed its neighbour through all of it, and takes new work.
    assert (await neighbour.result(timeout=30))["pid"] == proc.pid
    after = await queue.enqueue(uc.alive, "after")
    assert await after.result(timeout=30) == {"tag": "after", "pid": proc.pid}
    _alive(proc)
    log = proc.log()
    for bad in ("worker.stopped", "worker.crashed", "never retrieved"):
        assert bad not in log, log[-3000:]
    # The tracebacks in the log are the failed runs' own (each run.failed line carries
    # one), never the worker's.
    assert log.count("Traceback") <= log.count(" run.failed "), log[-3000:]


async def _running(run: AsyncRun) -> RunRow | None:
    row = await run.fetch()
    return row if row.status is RunStatus.RUNNING else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_runfleet_stops_keep_their_meaning(
    spawn: Spawn, queue: AsyncQueue, sig: signal.Signals
) -> None:
    """A cancel still cancels a run (its CancelledError is runfleet's), and a signal to the
    worker still shuts it down gracefully: the run it held is released, not failed."""
    proc = spawn(flows=FLOWS, concurrency=2, grace_period=0.5)
    await proc.wait_started()
    doomed = await queue.enqueue(uc.forever)
    await until(lambda: _running(doomed), 30, "the run to start")
    await doomed.cancel()
    assert (await _settled(doomed)).status is RunStatus.CANCELLED

    held = await queue.enqueue(uc.forever)
    await until(lambda: _running(held), 30, "the run to start")
    proc.signal(sig)
    assert await proc.wait_exit(30) == 0, proc.log()[-3000:]
    row = await held.fetch()
    assert row.status is RunStatus.SUSPENDED, row
    assert row.waiting is not None and row.waiting.reason is WaitingReason.RELEASED, row
