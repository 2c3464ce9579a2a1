"""Hop stamps of an idle start, taken inside a worker process (``scripts/idle_hops.py``).

A worker started with ``--flows idle_probe`` imports this module: it registers the
``probe.noop`` flow (its body's first line is the last stamp) and wraps the calls an idle
start crosses, each stamping ``time.monotonic_ns()`` (CLOCK_MONOTONIC: one clock for every
process on the host) into this process's file under ``$IDLE_PROBE_DIR``:

- ``doorbell``: the reader's non-consuming ``XREAD`` answered;
- ``script``: the group read's script answered;
- ``claim_sent`` / ``claim_back``: the one statement that reads and claims a fresh run;
- ``execute``: the driver began executing the activated run;
- ``body``: the body's first line;
- ``settle`` / ``settled``: its settlement asked and committed (group-committed with
  the process's other settlements); ``announce``: its settled notice sent.

Only the wrapped names are read, each looked up where it exists, so the same module
stamps two checkouts side by side (``--trees``).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

from runfleet.worker import Context, flow

QUEUE = "probe"
_out = Path(os.environ.get("IDLE_PROBE_DIR", "/tmp")) / f"hops-{os.getpid()}.txt"
_lines: list[str] = []


def stamp(event: str, run_id: str = "") -> None:
    _lines.append(f"{time.monotonic_ns()} {os.getpid()} {event} {run_id}\n")


def _flush() -> None:
    with _out.open("a") as f:
        f.writelines(_lines)
    _lines.clear()


@flow(name="probe.noop", queue=QUEUE)
async def probe_noop(ctx: Context) -> None:
    stamp("body", ctx.run.id)
    _flush()


def _wrap_async(
    owner: Any, name: str, before: str | None, after: str | None, run_arg: int | None
) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    @functools.wraps(original)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        run = str(args[run_arg]) if run_arg is not None and len(args) > run_arg else ""
        if before:
            stamp(before, run)
        result = await original(*args, **kwargs)
        if after:
            stamp(after, run)
        return result

    setattr(owner, name, wrapped)


def _install() -> None:
    if os.environ.get("IDLE_PROBE_DIR") is None:
        return
    import redis.asyncio

    from runfleet.broker.streams import Streams
    from runfleet.store.runs import Runs

    _wrap_async(redis.asyncio.Redis, "xread", None, "doorbell", None)
    _wrap_async(Streams, "_read_once", None, "script", None)
    _wrap_async(Runs, "claim_if_fresh", "claim_sent", "claim_back", 1)
    import psycopg
    import psycopg_pool

    _wrap_async(psycopg_pool.AsyncConnectionPool, "getconn", None, "getconn", None)
    _wrap_async(psycopg_pool.AsyncConnectionPool, "check_connection", "pg_probe", None, None)
    _wrap_async(psycopg.AsyncConnection, "execute", "pg_sent", "pg_back", None)
    from runfleet.worker.settle import Settlement

    settle = Settlement.result

    @functools.wraps(settle)
    async def result(self: Any, row: Any, *args: Any) -> None:
        stamp("settle", row.id)
        await settle(self, row, *args)
        stamp("settled", row.id)

    Settlement.result = result  # type: ignore[method-assign]  # the probe wraps it from outside
    from runfleet.broker.notify import Notifier

    announce = Notifier.publish_settled_many

    @functools.wraps(announce)
    async def publish_settled_many(self: Any, settled: Any) -> bool:
        for run_id, _ in settled:
            stamp("announce", run_id)
        return await announce(self, settled)

    Notifier.publish_settled_many = publish_settled_many  # type: ignore[method-assign]  # the probe wraps it from outside
    try:
        from runfleet.worker.driver import Driver
    except ImportError:
        return
    original = Driver._execute

    @functools.wraps(original)
    async def execute(self: Any, row: Any, flow: Any) -> None:
        stamp("execute", row.id)
        await original(self, row, flow)

    Driver._execute = execute  # type: ignore[method-assign]  # the probe wraps it from outside


_install()
