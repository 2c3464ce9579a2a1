"""``make demo``: a live fleet survives a worker being SIGKILLed mid-run.

Starts three worker processes, admits 300 runs of 50–500 ms, SIGKILLs the worker
holding the most runs while they execute, and shows progress until every run
settles. The summary counts what the journal says: completions, takeovers by
evidence, recovery time from the kill to each steal, lost and settled-twice
runs. Exit status is non-zero if any run was lost or settled twice.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import runfleet
from runfleet.ops.demo.flows import work
from runfleet.ops.servers.resolve import Endpoints, database_url_for, resolve
from runfleet.producer import AsyncQueue, EnqueueSpec
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.migrate import migrate
from runfleet.store.types import RunStatus

console = Console()


@dataclass
class DemoResult:
    total: int
    completed: int
    lost: int
    settled_twice: int
    steals: Counter[str]
    recovery_ms: list[int]


async def _fresh_database(admin_url: str) -> str:
    name = f"runfleet_demo_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')  # name is ours: hex only
    url = database_url_for(admin_url, name)
    await migrate(url)
    return url


def _start_workers(
    settings: Settings, count: int, concurrency: int
) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env.update({f"RUNFLEET_{k.upper()}": str(v) for k, v in settings.model_dump().items()})
    # The folder runfleet/ is in (a checkout, or site-packages): children import it from there.
    env["PYTHONPATH"] = str(Path(runfleet.__file__).resolve().parents[1])
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runfleet.ops",
                "worker",
                "--flows",
                "runfleet.ops.demo.flows",
                "--queues",
                "demo",
                "--concurrency",
                str(concurrency),
                "--log-level",
                "WARNING",
            ],
            env=env,
        )
        for _ in range(count)
    ]


async def _victim(store: Store, pids: list[int]) -> int:
    """The worker pid holding the most running runs right now."""
    owned = await store.stats.running_by_owner()
    return max(pids, key=lambda pid: sum(n for o, n in owned.items() if o.pid == pid))


async def run_demo(runs: int = 300, workers: int = 3, concurrency: int = 8) -> DemoResult:
    endpoints: Endpoints = resolve("app")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        database_url = await _fresh_database(endpoints.database_url)
        settings = Settings(
            database_url=database_url,
            redis_url=endpoints.redis_url,
            redis_prefix=f"rf-demo-{uuid.uuid4().hex[:6]}",
        )
        console.print(
            f"[bold]runfleet demo[/bold]: database {database_url}, redis "
            f"{endpoints.redis_url}; lease {settings.heartbeat_interval:g} s, "
            f"stale after {settings.stale_after:g} s"
        )
        procs = _start_workers(settings, workers, concurrency)
        store = await Store.open(settings)
        async with AsyncQueue("demo", settings=settings) as queue:
            await _wait_for_fleet(queue, len(procs))
            specs = [EnqueueSpec(work, (random.randint(50, 500),)) for _ in range(runs)]
            admitted = await queue.enqueue_many(specs)
            console.print(
                f"admitted {len(admitted)} runs on {workers} workers × {concurrency} slots"
            )
            await asyncio.sleep(1.0)
            victim = await _victim(store, [p.pid for p in procs])
            killed_at_ms = await store.stats.now_ms()
            os.kill(victim, signal.SIGKILL)
            console.print(f"[red]SIGKILL[/red] worker pid {victim} while it held runs")
            await _progress(store, runs, deadline_s=90)
        return await _summary(store, runs, killed_at_ms)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        endpoints.close()


async def _wait_for_fleet(queue: AsyncQueue, count: int) -> None:
    from runfleet.broker.liveness import Liveness

    liveness = Liveness(queue.session.redis, queue.settings.redis_prefix, queue.settings.host_id)
    deadline = time.monotonic() + 30
    while len(await liveness.fleet()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start within 30 s")
        await asyncio.sleep(0.1)


async def _progress(store: Store, total: int, deadline_s: float) -> None:
    columns = (
        TextColumn("settled"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}"),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("runs", total=total, detail="")
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            counts = await store.stats.status_counts()
            settled = sum(n for status, n in counts.items() if status.terminal)
            detail = f"running {counts[RunStatus.RUNNING]}  pending {counts[RunStatus.PENDING]}"
            progress.update(task, completed=settled, detail=detail)
            if settled >= total:
                return
            await asyncio.sleep(0.2)


async def _summary(store: Store, total: int, killed_at_ms: int) -> DemoResult:
    counts = await store.stats.status_counts()
    steals = await store.stats.records_of_kind("stolen-and-activated")
    recovery = sorted(max(0, r.at_ms - killed_at_ms) for r in steals)
    result = DemoResult(
        total=total,
        completed=counts[RunStatus.COMPLETED],
        lost=total - sum(n for status, n in counts.items() if status.terminal),
        settled_twice=len(await store.stats.settled_more_than_once()),
        steals=Counter(str(r.payload.get("probe")) for r in steals),
        recovery_ms=recovery,
    )
    await store.close()
    table = Table(title="runfleet demo summary", show_header=False)
    table.add_row("runs admitted", str(total))
    table.add_row("completed", str(result.completed))
    evidence = ", ".join(f"{k}: {v}" for k, v in result.steals.items()) or "none"
    table.add_row("recovered by steal", f"{len(steals)} ({evidence})")
    if recovery:
        p50 = statistics.median(recovery)
        p99 = recovery[min(len(recovery) - 1, int(len(recovery) * 0.99))]
        table.add_row("recovery after SIGKILL", f"p50 {p50 / 1000:.2f} s, p99 {p99 / 1000:.2f} s")
    table.add_row("lost", str(result.lost), style="green" if result.lost == 0 else "red")
    table.add_row(
        "settled twice",
        str(result.settled_twice),
        style="green" if result.settled_twice == 0 else "red",
    )
    console.print(table)
    return result


def main() -> int:
    result = asyncio.run(run_demo())
    return 0 if result.lost == 0 and result.settled_twice == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
