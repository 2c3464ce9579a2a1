"""Real ``runfleet worker`` processes logged in as runfleet_worker: registration, claims,
steals after SIGKILL, sweeps and settlement all work with the worker role's privileges."""

from __future__ import annotations

import signal

from runfleet.producer import AsyncQueue
from runfleet.store.roles import GroupRole
from runfleet.store.types import RunStatus
from tests.fleet.procs import Spawn
from tests.security.conftest import MakeLogin
from tests.support.polling import until


async def test_a_worker_process_takes_over_a_killed_workers_run_under_the_role(
    login: MakeLogin, spawn: Spawn
) -> None:
    fleet = await login(GroupRole.WORKER)
    producer = await login(GroupRole.PRODUCER, "s1")
    first = spawn(flows="tests.security.flows", database_url=fleet.url)
    await first.wait_started()
    async with AsyncQueue("default", settings=producer.settings, scopes=["s1"]) as q:
        run = await q.enqueue("sec.slow", 3.0, run_id="slow-1")

        async def running_on_first() -> bool:
            row = await run.fetch()
            return row.status is RunStatus.RUNNING and row.owner is not None

        await until(running_on_first, 15, "the first worker to own the run")
        first.signal(signal.SIGKILL)
        await first.wait_exit()
        second = spawn(flows="tests.security.flows", database_url=fleet.url)
        await second.wait_started()
        assert await run.result(timeout=30) == "rested"
        kinds = [r.kind for r in await q.store.journal.records(run.id, limit=100)]
        assert "stolen-and-activated" in kinds, kinds
    for proc in (first, second):
        for bad in ("Traceback", "permission denied", "row-level security"):
            assert bad not in proc.log(), proc.log()[-3000:]
