"""300 five-step flows on 2 workers while runfleet's Postgres restarts, crashes or loses
every backend: 0 failed, 0 lost, 0 settled twice, no recorded step re-run.

A connection error inside ``ctx.step``/``ctx.sleep`` bookkeeping never reaches the flow
body (which would settle the run ``failed``): it is retried while the lease holds, and
a lapse releases the run to be resumed from its records.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import tests.chaos.flows as cf
from runfleet.ops.servers.postgres import ThrowawayPostgres, postgres_stop
from runfleet.store.config import Settings
from tests.chaos.harness import assert_clean, run_scenario

pytestmark = pytest.mark.chaos


async def test_fast_restart(
    pg_settings: Settings, own_postgres: ThrowawayPostgres, ledger_url: str
) -> None:
    """``pg_ctl restart -m fast``: every connection gets AdminShutdown mid-statement."""
    outcome = await run_scenario(
        pg_settings, ledger_url, lambda: asyncio.to_thread(own_postgres.restart)
    )
    assert_clean(outcome)


async def test_hard_stop_then_start_after_3s(
    pg_settings: Settings, own_postgres: ThrowawayPostgres, ledger_url: str
) -> None:
    """``-m immediate`` and back 3 s later: long enough for every worker's lease to lapse.

    Half the flows are plain ``def`` flows: their durable calls cross from a thread to
    the event loop, and a lapse must reach them there too. Concurrency stays below the
    default executor's size (``min(32, cpus + 4)``): a sync body holds a thread while its
    sync step needs another, so with as many sync bodies as threads the worker starves.
    """

    async def crash() -> None:
        await asyncio.to_thread(postgres_stop, own_postgres, "immediate")
        await asyncio.sleep(3)
        await asyncio.to_thread(own_postgres.start)

    outcome = await run_scenario(
        pg_settings,
        ledger_url,
        crash,
        flows=(cf.five_steps, cf.sync_five_steps),
        concurrency=4,
    )
    assert_clean(outcome)
    assert outcome.releases > 0, "the outage never lapsed a worker: the test proved nothing"


async def terminate_backends(admin_url: str, times: int = 3, gap: float = 0.3) -> int:
    """``pg_terminate_backend`` every client backend but this connection's, ``times`` over."""
    killed = 0
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        for _ in range(times):
            rows = await (
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
            ).fetchall()
            killed += sum(1 for (ok,) in rows if ok)
            await asyncio.sleep(gap)
    return killed


async def test_every_backend_terminated_three_times(
    pg_settings: Settings, own_postgres: ThrowawayPostgres, ledger_url: str
) -> None:
    killed: list[int] = []

    async def terminate() -> None:
        killed.append(await terminate_backends(own_postgres.url))

    outcome = await run_scenario(pg_settings, ledger_url, terminate)
    assert_clean(outcome)
    assert killed[0] >= 6, f"only {killed[0]} backends terminated: the fleet was not connected"
