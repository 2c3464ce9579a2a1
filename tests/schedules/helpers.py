"""What the schedule tests read back: the runs a schedule admitted, from Postgres."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from runfleet.store.cron import Cron
from runfleet.store.schedules import Overlap, ScheduleSpec


@dataclass(frozen=True)
class TickRun:
    id: str
    tick_ms: int
    late: bool
    status: str
    created_at_ms: int
    updated_at_ms: int
    admitted_by: str
    """The journal source of its ``created`` record: the admitting worker's owner key."""


async def tick_runs(database_url: str, schedule: str) -> list[TickRun]:
    """Every run the schedule admitted, by tick (a read; nothing is written behind the code)."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT r.id, (r.state->>'tick_ms')::bigint,"
            " coalesce((r.state->>'late')::boolean, false), r.status, r.created_at_ms,"
            " r.updated_at_ms, j.source_id FROM runfleet.runs r"
            " JOIN runfleet.journal j ON j.run_id = r.id AND j.kind = 'created'"
            " WHERE r.state->>'schedule' = %s ORDER BY 2, 1",
            (schedule,),
        )
        return [TickRun(*row) for row in await cur.fetchall()]


def every_second(
    name: str,
    flow: str = "sched.noop",
    *,
    catch_up: int = 0,
    overlap: Overlap = Overlap.ALLOW,
    queue: str = "default",
) -> ScheduleSpec:
    return ScheduleSpec(
        name=name,
        flow=flow,
        cron=Cron("* * * * * *"),
        queue=queue,
        payload={"args": [], "kwargs": {}},
        catch_up=catch_up,
        overlap=overlap,
    )


def assert_one_run_per_tick(runs: list[TickRun], period_ms: int = 1000) -> None:
    """Every tick from the first to the last has exactly one run, none twice."""
    ticks = [r.tick_ms for r in runs]
    assert len(ticks) == len(set(ticks)), f"a tick admitted twice: {ticks}"
    expected = list(range(ticks[0], ticks[-1] + 1, period_ms))
    missing = sorted(set(expected) - set(ticks))
    assert ticks == expected, f"missing ticks {missing} in {len(expected)}"


def gap(runs: list[TickRun], period_ms: int = 1000) -> int:
    """Ticks between the schedule's first and last run that have no run."""
    ticks = {r.tick_ms for r in runs}
    return (max(ticks) - min(ticks)) // period_ms + 1 - len(ticks)
