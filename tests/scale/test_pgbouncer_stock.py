"""A stock PgBouncer (no ``ignore_startup_parameters``) does not crash-loop the fleet.

runfleet sends its server-side timeouts as the startup parameter ``options``, and a
PgBouncer that does not list it in ``ignore_startup_parameters`` refuses every such
connection (``unsupported startup parameter: options``): a worker that insisted would
log hundreds of connection errors and exit, and a producer would wait 30 s for
``PoolTimeout``. A process connects without the parameter once it is refused, and says
so in one warning that names both fixes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

from runfleet.ops.servers.postgres import ThrowawayPgBouncer, ThrowawayPostgres
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from tests.fleet.procs import WorkerProc

REFUSED = "postgres.startup_options_refused"


@pytest.fixture(scope="module")
def backend() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as server:
        yield server


@pytest.fixture(scope="module")
def stock_bouncer(backend: ThrowawayPostgres) -> Iterator[ThrowawayPgBouncer]:
    with ThrowawayPgBouncer(backend, ignore_startup_parameters=None) as server:
        yield server


async def test_a_fleet_behind_a_stock_pgbouncer_runs_and_says_why_timeouts_are_off(
    settings: Settings,
    backend: ThrowawayPostgres,
    stock_bouncer: ThrowawayPgBouncer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await migrate(backend.url)  # migrations take a session lock: directly (README)
    via = settings.model_copy(update={"database_url": stock_bouncer.url, "prepare_threshold": None})
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="runfleet.store.db"):
        async with AsyncQueue("default", settings=via, late_binding=True) as q:
            run = await asyncio.wait_for(q.enqueue("tests.sleepy", 10, "via"), 15)
    assert time.monotonic() - started < 10  # no 30 s PoolTimeout
    (warning,) = [r for r in caplog.records if r.getMessage() == REFUSED]
    line = str(warning.__dict__)
    for fix in ("ignore_startup_parameters", "RUNFLEET_STATEMENT_TIMEOUT=0", "query_timeout"):
        assert fix in line, line

    worker = WorkerProc(via, prepare_threshold="none")
    try:
        await worker.wait_started()
        async with AsyncQueue("default", settings=via, late_binding=True) as q:
            assert (await q.run(run.id).result(timeout=30))["tag"] == "via"
        assert worker.proc.poll() is None, worker.log()[-3000:]
        log = worker.log()
        # One line per process (its two pools included), not one per connection attempt.
        assert log.count(REFUSED) == 1, log[-3000:]
        assert log.count("unsupported startup parameter") == 1, log[-3000:]
    finally:
        worker.close()
    # What the warning says is true: Postgres applies no runfleet timeout on these sessions.
    store = await Store.open(via, min_size=1, max_size=1)
    try:
        async with store.transaction() as conn:
            shown = await (await conn.execute("SHOW statement_timeout")).fetchone()
        assert shown is not None and shown["statement_timeout"] == "0"
    finally:
        await store.close()
