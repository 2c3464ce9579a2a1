"""A producer whose database does not answer gets one typed error that says what to do.

Run as a user runs it: a script in a fresh process, no logging configured, so anything
a library logs at WARNING reaches stderr through Python's last-resort handler.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.broker.conftest import closed_port

SYNC = """
from runfleet import Queue
from tests.fleet.flows import add
Queue("default", database_url={url!r}, redis_url={redis!r}).enqueue(add, 1, 2)
"""
ASYNC = """
import asyncio
from runfleet import AsyncQueue
from tests.fleet.flows import add
async def main():
    async with AsyncQueue("default", database_url={url!r}, redis_url={redis!r}) as q:
        await q.enqueue(add, 1, 2)
asyncio.run(main())
"""


@pytest.mark.parametrize("script", [SYNC, ASYNC], ids=["Queue", "AsyncQueue"])
def test_enqueue_with_postgres_down(script: str, redis_url: str) -> None:
    port = closed_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    env = {**os.environ, "RUNFLEET_PRODUCER_RETRY_FOR": "2"}
    code = textwrap.dedent(script.format(url=url, redis=redis_url))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done
    assert elapsed < 20, f"{elapsed:.1f} s: the 2 s budget holds for a first connection too"
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"runfleet.store.errors.Unavailable: postgres unavailable at 127.0.0.1:{port} "
    ), done.stderr
    assert "Connection refused" in last, last  # the cause, not the pool's PoolTimeout
    assert "RUNFLEET_DATABASE_URL" in last, last  # the fix
    assert "error connecting in" not in done.stderr  # the pool's per-attempt warnings
    assert "PoolTimeout" not in done.stderr, done.stderr
