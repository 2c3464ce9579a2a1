"""What a real ``runfleet worker`` process says and does on a user's first day.

A burst worker drains and exits even when its queue holds runs it cannot execute: it
names each one (``run.left_behind``), leaves it pending for a worker that can, and exits
``EXIT_LEFT_BEHIND``; a signal stops it whatever it waits on. A module that fails to
import is one line, not a logging crash per run. Every run leaves ``run.started`` and
``run.completed`` / ``run.failed`` lines in the worker's default output.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from runfleet.producer import AsyncQueue
from runfleet.rqface import Queue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from runfleet.worker.burst import EXIT_LEFT_BEHIND
from tests.fleet.procs import ROOT, Spawn, running_on, settings_env
from tests.support.polling import until

UNKNOWN = "nosuch.module:fn"
UNIMPORTABLE = "tests.fleet.not_there:fn"
"""Allowed (``RUNFLEET_ALLOW_IMPORT=tests``), but no such module: it fails to import."""


def _burst(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``runfleet worker --burst`` as a user types it: no ``--log-level`` (the default)."""
    return subprocess.run(
        [sys.executable, "-m", "runfleet.ops", "worker", "--burst", "--flows",
         "tests.fleet.flows", *args],
        env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def _lines(output: str, event: str) -> list[str]:
    return [line for line in output.splitlines() if f" {event} " in line]


def test_a_burst_worker_leaves_runs_it_cannot_execute_names_them_and_exits_3(
    settings: Settings,
) -> None:
    with Queue("default", settings=settings, late_binding=True) as q:
        unknown = q.enqueue(UNKNOWN, 1)
        unimportable = [q.enqueue(UNIMPORTABLE, i) for i in range(3)]
        done = q.enqueue("tests.sleepy", 10)
        started = time.monotonic()
        proc = _burst(settings)
        took = time.monotonic() - started
        output = proc.stdout + proc.stderr
        assert proc.returncode == EXIT_LEFT_BEHIND, output[-3000:]
        assert took < 30, f"a burst worker took {took:.1f} s to give up on two unrunnable flows"
        left = {
            re.search(r"run_id=(\w+)", line).group(1): line  # type: ignore[union-attr]  # every run.left_behind line names its run
            for line in _lines(output, "run.left_behind")
        }
        assert set(left) == {unknown.id, *(j.id for j in unimportable)}, output[-3000:]
        assert "not registered" in left[unknown.id]
        assert "failed to import: ModuleNotFoundError" in left[unimportable[0].id]
        (drained,) = _lines(output, "worker.burst_drained")
        assert "left_behind=4" in drained
        # Left for a worker that can: pending, unclaimed, never failed.
        for job in (unknown, *unimportable):
            assert job.get_status() == "queued", job.id
        assert done.return_value()["slept"] == 10
        # The per-run lines are in the default output (info).
        assert any(done.id in line for line in _lines(output, "run.started")), output[-3000:]
        (completed,) = [line for line in _lines(output, "run.completed") if done.id in line]
        assert re.search(r"flow=tests\.sleepy ms=\d+", completed), completed
        # The start line says what this worker may run.
        (start,) = _lines(output, "worker.started")
        assert "'tests.sleepy'" in start and "allow_import=['tests']" in start, start
        assert "burst=True" in start


def test_a_module_that_fails_to_import_is_one_line_without_a_logging_crash(
    settings: Settings,
) -> None:
    with Queue("default", settings=settings, late_binding=True) as q:
        for i in range(5):
            q.enqueue(UNIMPORTABLE, i)
        proc = _burst(settings)
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_LEFT_BEHIND, output[-3000:]
    assert "KeyError" not in output and "Logging error" not in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    (line,) = _lines(output, "flow.import_failed")  # once per module, not once per run
    assert "module_name=tests.fleet.not_there" in line
    assert "error=ModuleNotFoundError: No module named 'tests.fleet.not_there'" in line


def test_a_supervised_burst_fleet_exits_once_every_child_drained(settings: Settings) -> None:
    with Queue("default", settings=settings, late_binding=True) as q:
        unknown = q.enqueue(UNKNOWN, 1)
        proc = _burst(settings, "--processes", "2")
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_LEFT_BEHIND, output[-3000:]
    assert not _lines(output, "supervisor.child_died"), "a drained child is not restarted"
    assert len(_lines(output, "worker.burst_drained")) == 2
    assert unknown.id in output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_burst_worker_waiting_on_a_run_stops_on_a_signal(
    spawn: Spawn, store: Store, settings: Settings, sig: signal.Signals
) -> None:
    """A run another live worker executes keeps a burst worker waiting (it could take it
    over); a stop signal ends the wait at once."""
    holder = spawn()
    await holder.wait_started()
    async with AsyncQueue("default", settings=settings, late_binding=True) as q:
        held = await q.enqueue("tests.forever")
        await q.enqueue(UNKNOWN, 1)  # and one it cannot run, left pending
    await until(lambda: running_on(store, held.id, holder.pid), 20, "the holder to run it")
    burst = spawn(extra_args=["--burst"])
    await burst.wait_started()
    await until(
        lambda: _true_if(" run.unknown_flow " in burst.log()), 20, "the burst worker's check"
    )
    assert burst.proc.poll() is None, "still waiting: the held run may need it"
    burst.signal(sig)
    assert await burst.wait_exit(timeout=15) == 0
    assert " worker.stopped " in burst.log()
    row = await store.runs.get(held.id)
    assert row is not None and row.status is RunStatus.RUNNING and row.owner is not None
    assert row.owner.pid == holder.pid


async def test_each_run_leaves_its_lines_and_a_failure_its_traceback(
    spawn: Spawn, store: Store, settings: Settings
) -> None:
    worker = spawn()
    await worker.wait_started()
    async with AsyncQueue("default", settings=settings, late_binding=True) as q:
        ok = await q.enqueue("tests.sleepy", 5)
        bad = await q.enqueue("tests.boom", "bad input")
        plain = await q.enqueue("tests.fleet.flows:add", 1, 2)

    async def settled() -> bool:
        rows = await store.runs.get_many([ok.id, bad.id, plain.id])
        return len(rows) == 3 and all(r.status.terminal for r in rows)

    await until(settled, 30, "the three runs to settle")
    await until(
        lambda: _true_if(" run.failed " in worker.log() and plain.id in worker.log()),
        10,
        "the settlement lines",
    )
    log = worker.log()
    for run in (ok, bad, plain):
        assert re.search(rf"INFO run\.started run_id={run.id} flow=\S+ queue=default", log), log
    assert re.search(rf"INFO run\.completed run_id={ok.id} flow=tests\.sleepy ms=\d+", log)
    assert re.search(rf"INFO run\.completed run_id={plain.id} flow=tests\.fleet\.flows:add", log)
    failed = log[log.index(f"run.failed run_id={bad.id}") :]
    first, *trace = failed.splitlines()
    assert re.search(r"flow=tests\.boom ms=\d+ error=ValueError: bad input$", first), first
    assert trace[0] == "Traceback (most recent call last):", trace[:3]
    assert "raise ValueError(message)" in "\n".join(trace[:20])


async def _true_if(value: bool) -> bool:
    return value
