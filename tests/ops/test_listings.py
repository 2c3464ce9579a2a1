"""Listings print whole ids (piped, on a narrow terminal, ``--wide``, ``--json``); ``info``
is the queue overview and ``requeue --all-failed`` the bulk requeue of failed runs.

The width tests run the real command in its own process, once with stdout a pipe (as
``runfleet runs | cat``) and once on a pseudo-terminal 80 columns wide.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from datetime import timedelta

import pytest

import tests.fleet.flows as flows
from runfleet.ops.models import InfoView, RequeueResult, RunList
from runfleet.producer import AsyncQueue, RunFailed
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker.process import Worker
from tests.ops.conftest import Cli, cli_env

LONG_ID = "order-2026-12-07-customer-000042-invoice-" + "x" * 24  # 65 characters


def _env(settings: Settings, columns: int) -> dict[str, str]:
    env = {**os.environ, **cli_env(settings)}
    env["COLUMNS"] = str(columns)
    return env


def piped(settings: Settings, *args: str) -> str:
    """``runfleet ARGS | cat``: stdout is a pipe, the environment says 80 columns."""
    done = subprocess.run(
        [sys.executable, "-m", "runfleet", *args],
        capture_output=True, text=True, env=_env(settings, 80), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def on_terminal(settings: Settings, *args: str, columns: int = 80) -> str:
    """The command on a pseudo-terminal ``columns`` wide, as a person at a console runs it."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = _env(settings, columns)
    env.pop("COLUMNS")  # the terminal's own size decides
    proc = subprocess.Popen(
        [sys.executable, "-m", "runfleet", *args],
        stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(60) == 0, b"".join(chunks)
    text = b"".join(chunks).decode()
    return "".join(ch for ch in text.replace("\r\n", "\n") if ch.isprintable() or ch == "\n")


async def _admit(queue: AsyncQueue) -> None:
    await queue.enqueue(flows.sleepy, 10, run_id=LONG_ID)


async def test_runs_and_stuck_print_whole_ids_when_piped(
    queue: AsyncQueue, settings: Settings
) -> None:
    await _admit(queue)
    listing = await asyncio.to_thread(piped, settings, "runs")
    assert LONG_ID in listing, listing
    stuck = await asyncio.to_thread(piped, settings, "stuck", "--pending-for", "1ms")
    assert LONG_ID in stuck, stuck


async def test_runs_and_stuck_on_an_80_column_terminal(
    queue: AsyncQueue, settings: Settings
) -> None:
    await _admit(queue)
    for args in (["runs"], ["stuck", "--pending-for", "1ms"]):
        screen = await asyncio.to_thread(on_terminal, settings, *args)
        assert LONG_ID in screen, screen  # other cells fold; the id stays whole
        assert "…" not in screen, screen
        wide = await asyncio.to_thread(on_terminal, settings, *args, "--wide")
        (row,) = [line for line in wide.splitlines() if LONG_ID in line]
        assert "sleepy" in row, wide  # one whole line per run, however narrow the screen


async def test_json_never_cuts(queue: AsyncQueue, cli: Cli) -> None:
    await _admit(queue)
    result = await cli("runs", "--json")
    assert [r.id for r in RunList.model_validate_json(result.stdout).runs] == [LONG_ID]


async def _failed(settings: Settings, queue: AsyncQueue, count: int) -> list[str]:
    """``count`` runs of ``flows.boom`` failed by a worker, which is then stopped (so a
    requeued round stays pending for the test to see)."""
    worker = Worker(settings, queues=["default"], concurrency=4)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.started.wait(), 10)
    ids = []
    try:
        for i in range(count):
            run = await queue.enqueue(flows.boom, f"bad input {i}")
            with pytest.raises(RunFailed):
                await run.result(timeout=10)
            ids.append(run.id)
    finally:
        worker.stop(hard=True)
        await asyncio.wait_for(task, 15)
    return ids


async def test_info_counts_each_queue(settings: Settings, queue: AsyncQueue, cli: Cli) -> None:
    await _failed(settings, queue, 2)
    async with AsyncQueue("reports", settings=settings) as reports:
        await reports.enqueue(flows.sleepy, 10)
        await reports.enqueue_in(timedelta(hours=1), flows.sleepy, 20)
    result = await cli("info", "--json")
    assert result.code == 0, result
    view = InfoView.model_validate_json(result.stdout)
    lines = {q.queue: q for q in view.queues}
    assert (lines["default"].failed, lines["default"].pending) == (2, 0)
    assert (lines["reports"].pending, lines["reports"].scheduled) == (1, 1)
    assert view.failed == 2 and view.workers == 0
    text = await cli("info")
    assert "0 live worker(s), 2 failed run(s) not requeued" in text.stdout, text


async def test_requeue_all_failed(
    settings: Settings, queue: AsyncQueue, store: Store, cli: Cli
) -> None:
    failed = await _failed(settings, queue, 3)
    async with AsyncQueue("default", settings=settings, scopes=["billing"]) as billing:
        (private,) = await _failed(settings, billing, 1)
    dry = await cli("requeue", "--queue", "default", "--all-failed", "--dry-run", "--json")
    assert RequeueResult.model_validate_json(dry.stdout).requeued == {i: i for i in failed}
    assert [await store.runs.get(f"{i}@1") for i in failed] == [None] * 3  # nothing changed

    other_flow = await cli("requeue", "--queue", "default", "--all-failed", "--flow", "x.y")
    assert "0 failed run(s) of queue default requeued" in other_flow.stdout, other_flow

    done = await cli("requeue", "--queue", "default", "--all-failed", "--json")
    assert done.code == 0, done
    answer = RequeueResult.model_validate_json(done.stdout)
    assert answer.requeued == {i: f"{i}@1" for i in failed}  # the scoped run is not theirs
    for i in failed:
        again = await store.runs.get(f"{i}@1")
        assert again is not None and again.status.value == "pending"
        created = [r for r in await store.journal.records(again.id) if r.kind == "created"]
        assert created, "the requeue is journaled"
    repeat = await cli("requeue", "--queue", "default", "--all-failed", "--json")
    assert RequeueResult.model_validate_json(repeat.stdout).requeued == {}  # never doubles

    scoped = await cli(
        "requeue", "--queue", "default", "--all-failed", "--scope", "billing", "--json"
    )
    assert json.loads(scoped.stdout)["requeued"] == {private: f"{private}@1"}
    info = InfoView.model_validate_json((await cli("info", "--json")).stdout)
    assert info.failed == 0 and {q.queue: q.pending for q in info.queues}["default"] == 4


async def test_requeue_needs_all_failed(cli: Cli) -> None:
    result = await cli("requeue", "--queue", "default")
    assert result.code == 2 and "--all-failed" in result.stderr, result
