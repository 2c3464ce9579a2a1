"""How many runfleet source files one run crosses, from ``Queue.enqueue`` to ``wait()``.

A newcomer's measure of the seams (STYLE, "At the seams"): enqueue one run of a flow with
one step through the synchronous ``Queue`` (admission, its journal record, the stream
hint), wait for it from another thread (``job.wait``: the settled notification, the row),
and drive the delivered run as a worker does (``Coordinator.drive_many`` with the
message's flow: decide, claim, execute the body and its step, settle and journal it).
Counted: the distinct files under runfleet's folders in which at least one Python function
ran (``sys.setprofile`` in every thread), and the ``store/sql/*.sql`` files whose named
statements were sent. Modules are imported before the count starts, so import-time code
is not counted; a worker's other loops (lease, sweeps, the reader) do not run. Needs
Postgres and Redis (``RUNFLEET_DATABASE_URL``, ``RUNFLEET_REDIS_URL``); makes and drops
its own database.

    python scripts/files_crossed.py [--list]
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = tuple(sorted(p.name for p in (ROOT / "runfleet").iterdir() if p.is_symlink()))
"""Every folder the package links (store, broker, producer, ..., runtime)."""


class _Named(dict[str, str]):
    """``store.queries``' table of named statements, noting each name looked up."""

    def __init__(self, table: dict[str, str]) -> None:
        super().__init__(table)
        self.used: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.used.add(name)
        return super().__getitem__(name)


def _touched() -> tuple[set[str], Any]:
    seen: set[str] = set()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            seen.add(frame.f_code.co_filename)

    return seen, profile


async def _one_run(queue: Any, coordinator: Any, flow: Any, n: int) -> tuple[Any, Any]:
    """Enqueue ``flow(n)``, wait for it from another thread, and drive its delivery."""
    job = await asyncio.to_thread(_in_new_thread, queue.enqueue, flow, n)
    waited = asyncio.ensure_future(asyncio.to_thread(_in_new_thread, job.wait, 30))
    coordinator.drive_many([(job.id, None, "files_crossed.one_step")])
    await coordinator.join(30)
    return job, await waited


async def _profiled(profile: Any) -> None:
    """Profile the thread this runs on (``sys.setprofile`` reaches only its own thread)."""
    sys.setprofile(profile)


def _in_new_thread(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a thread started now (``threading.setprofile`` reaches new ones)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)))
    thread.start()
    thread.join()
    return out[0]


def _ours(filename: str) -> str | None:
    path = Path(os.path.realpath(filename))
    try:
        rel = path.relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts and rel.parts[0] in PACKAGES else None


async def main(show: bool) -> None:
    from runfleet.store.config import Settings
    from runfleet.store.migrate import migrate
    from runfleet.store.urls import resolve

    base = resolve(Settings())  # the URLs, else the embedded pair
    admin = base.database_url
    name = f"rf_files_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin.rsplit("/", 1)[0] + "/" + name
    try:
        await migrate(url)
        settings = base.model_copy(
            update={"database_url": url, "redis_prefix": f"rf-files-{secrets.token_hex(4)}"}
        )
        await _count(settings, show)
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def _count(settings: Any, show: bool) -> None:
    import scripts.files_crossed_flows as flows
    from runfleet.rqface.sync import Queue
    from runfleet.store import Store, queries
    from runfleet.store.types import Owner
    from runfleet.worker.coordinator import Coordinator
    from runfleet.worker.driver import Driver

    queue = Queue("default", settings=settings)
    store = await Store.open(settings)
    driver = Driver(store, Owner("files-crossed", os.getpid(), "n"), settings)
    coordinator = Coordinator(driver)
    for n in (1, 2):  # warm: imports, connections, and each lazily built part once
        await _one_run(queue, coordinator, flows.one_step, n)

    named = _Named(queries._all())
    queries._all = lambda: named  # type: ignore[assignment]  # noting names, not changing them
    seen, profile = _touched()
    threading.setprofile(profile)
    sys.setprofile(profile)
    loop = queue._driver.loop  # the sync Queue's own loop thread, started before the count
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_profiled(profile), loop))
    try:
        job, answer = await _one_run(queue, coordinator, flows.one_step, 2)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]  # None switches it off
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_profiled(None), loop))
    assert answer == 4, answer
    row = await store.runs.get(job.id)
    assert row is not None and row.status.value == "completed", row
    kinds = [r.kind for r in await store.journal.records(job.id)]
    files = sorted({f for f in map(_ours, seen) if f is not None})
    sql_files = sorted({f"store/sql/{name.split('.')[0]}.sql" for name in named.used})
    print(
        f"{len(files)} Python files and {len(sql_files)} SQL files "
        f"(run {row.status.value}; journal: {', '.join(kinds)})"
    )
    if show:
        print("\n".join([*files, *sql_files]))
    await store.close()
    queue.close()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    asyncio.run(main("--list" in sys.argv))
