"""Permanent errors settle once: a result or step output that cannot be stored fails the
run (or raises into the flow at that step) with ``UnstorableValue``, exactly once.

Before, such a run hit ``run.drive_failed``, stayed running, was taken back as
``self-orphaned`` every few seconds and ran its whole body again, forever. These tests
use a real worker process and then watch the runs for a while: any re-activation, any
second execution of a body or step, any ``run.drive_failed`` fails them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

import tests.flows.values_flows as vf
from runfleet.producer import AsyncQueue, AsyncRun, RunFailed
from runfleet.store import Store
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.fleet.procs import Spawn, WorkerProc

KINDS = ["big", "nul", "surrogate", "deep", "nan", "object"]
LIMIT = 2000
WATCH_S = 8.0


async def _worker(spawn: Spawn) -> WorkerProc:
    proc = spawn(flows="tests.flows.values_flows", max_payload_bytes=LIMIT)
    await proc.wait_started()
    return proc


async def _failed(run: AsyncRun) -> RunFailed:
    with pytest.raises(RunFailed) as caught:
        await run.result(timeout=20)
    return caught.value


async def _settled_once(
    store: Store, proc: WorkerProc, runs: list[AsyncRun], ledger: Path, per_run: int
) -> None:
    """Watch for ``WATCH_S``: every run stays settled at epoch 1, nothing ran again."""
    deadline = time.monotonic() + WATCH_S
    while True:
        for run in runs:
            row = await store.runs.get(run.id)
            assert row is not None and row.status.terminal, row
            assert row.epoch == 1, f"{run.id} was re-activated (epoch {row.epoch})"
        kinds = [r.kind for run in runs for r in await store.journal.records(run.id)]
        assert "stolen-and-activated" not in kinds and "interrupt-released" not in kinds
        lines = ledger.read_text().splitlines()  # noqa: ASYNC240 - a small test file
        assert len(lines) == per_run * len(runs), lines
        assert "run.drive_failed" not in proc.log()
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.25)  # polling the watch window, not waiting for an outcome


async def test_unstorable_result_fails_once(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    proc = await _worker(spawn)
    ledger = tmp_path / f"ledger-{uuid.uuid4().hex[:6]}"
    ledger.touch()
    runs = [await queue.enqueue(vf.unstorable_result, k, LIMIT, str(ledger)) for k in KINDS]
    for kind, run in zip(KINDS, runs, strict=True):
        error = await _failed(run)
        assert error.exc_type == "UnstorableValue", (kind, error)
        assert error.exc_message.startswith('cannot store state: $["result"]'), error
    errors = {k: (await _failed(r)).exc_message for k, r in zip(KINDS, runs, strict=True)}
    assert f"the limit is {LIMIT}" in errors["big"]
    assert "NUL" in errors["nul"] and "lone surrogate" in errors["surrogate"]
    assert "nested deeper than 512" in errors["deep"] and "is nan" in errors["nan"]
    assert "not a JSON value" in errors["object"]
    await _settled_once(store, proc, runs, ledger, per_run=1)
    for run in runs:
        row = await store.runs.get(run.id)
        assert row is not None and row.status is RunStatus.FAILED


async def test_unstorable_step_output_fails_step_once(
    spawn: Spawn, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    proc = await _worker(spawn)
    ledger = tmp_path / f"ledger-{uuid.uuid4().hex[:6]}"
    ledger.touch()
    failing = [await queue.enqueue(vf.unstorable_step, k, LIMIT, str(ledger), False) for k in KINDS]
    caught = [await queue.enqueue(vf.unstorable_step, k, LIMIT, str(ledger), True) for k in KINDS]
    for kind, run in zip(KINDS, failing, strict=True):
        error = await _failed(run)
        assert error.exc_type == "UnstorableValue", (kind, error)
        assert "cannot store step output of step:bad#1" in error.exc_message, error
    for kind, run in zip(KINDS, caught, strict=True):
        seen = await run.result(timeout=20)  # the flow itself caught the typed error
        assert seen["caught"] == "UnstorableValue", (kind, seen)
        assert seen["field"] == "step output of step:bad#1"
    await _settled_once(store, proc, failing + caught, ledger, per_run=2)  # body + step
    for run in failing + caught:
        assert await store.steps.of_run(run.id) == []  # nothing was recorded for the step


async def test_an_error_message_nothing_could_store_still_fails_the_run_once(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    """The flow's own exception may carry a NUL or a lone surrogate: escaped, not a loop."""
    run = await queue.enqueue(vf.raises)
    error = await _failed(run)
    assert error.exc_type == "ValueError"
    assert error.exc_message == "nul \\x00 and a lone \\ud800 in the message"
    row = await store.runs.get(run.id)
    assert row is not None and row.status is RunStatus.FAILED and row.epoch == 1


async def test_a_handoff_that_cannot_be_admitted_fails_the_round_once(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    """Next-round args jsonb refuses, or args the next flow does not take: permanent."""
    for how, error_type in (("surrogate", "UnstorableValue"), ("arity", "InvalidInput")):
        run = await queue.enqueue(vf.hands_off_badly, how)
        error = await _failed(run)
        assert error.exc_type == error_type and "payload" in error.exc_message, error
        row = await store.runs.get(run.id)
        assert row is not None and row.status is RunStatus.FAILED and row.epoch == 1
        assert "round-invalid" in [r.kind for r in await store.journal.records(run.id)]
        assert await store.runs.get(f"{run.id}@1") is None


async def test_a_malformed_handoff_fails_the_round_once_naming_the_field(
    worker: Worker, queue: AsyncQueue, store: Store, tmp_path: Path
) -> None:
    """``Handoff(next, 5)``, ``args=None``, a str as args, a non-dict or non-str-keyed
    kwargs, a deadline that is no datetime: the round fails once with ``InvalidHandoff``
    naming the field. Before, the error escaped the settlement: the run was released and
    its body ran again on every re-drive (or, for a str, handed off with its letters)."""
    runs = {}
    for how in vf.MALFORMED_HANDOFFS:
        ledger = tmp_path / f"{how}.ledger"
        runs[how] = (await queue.enqueue(vf.hands_off_malformed, how, str(ledger)), ledger)
    for how, (run, ledger) in runs.items():
        field = vf.MALFORMED_HANDOFFS[how][0]
        error = await _failed(run)
        assert error.exc_type == "InvalidHandoff", (how, error)
        assert error.exc_message.startswith(f"invalid Handoff.{field}: "), (how, error)
        row = await store.runs.get(run.id)
        assert row is not None and row.status is RunStatus.FAILED and row.epoch == 1, how
        (invalid,) = [r for r in await store.journal.records(run.id) if r.kind == "round-invalid"]
        assert invalid.payload["successor"] == f"{run.id}@1"
        assert await store.runs.get(f"{run.id}@1") is None
        assert ledger.read_text().splitlines() == [run.id], how  # the body ran once
