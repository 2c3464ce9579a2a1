"""Only registered code runs: producers never import by string, workers run only their
``--flows`` modules and ``--allow-import`` prefixes, compensations resolve the same way
and only on a recorded output that matches its digest."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import psycopg
import pytest

import tests.trust.flows as tf
from runfleet.producer import AsyncQueue, RunCancelled
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.errors import UnknownFlow
from runfleet.worker.process import Worker
from runfleet.worker.resolver import import_allowed, resolve
from tests.flows.conftest import parked
from tests.ops.conftest import Cli
from tests.support.polling import until


@pytest.mark.parametrize(
    "name",
    [
        "os:system",
        "subprocess:run",
        "builtins:eval",
        "tests.trust.evil:system",  # a builtin imported into an allowed module
        "tests.trust.evil:getenv",  # a function re-exported from elsewhere
        "tests.trust.evil:os.system",  # a walk through another module
        "tests.trust.flows:__builtins__",
        "tests.trust.flows:Context",  # a class, not a function
        "runfleet.ops.demo.flows:nothing",  # outside every allowed prefix
    ],
)
def test_a_worker_resolves_nothing_unregistered(name: str) -> None:
    with pytest.raises(UnknownFlow):
        resolve(name)


def test_the_allow_list_is_by_module_prefix() -> None:
    assert import_allowed("tests.trust.flows")  # registers flows (and under RUNFLEET_ALLOW_IMPORT)
    assert not import_allowed("os") and not import_allowed("testsuite.x")
    assert resolve("tests.trust.flows:plain_add").fn is tf.plain_add


async def test_a_producer_refuses_a_string_it_would_have_to_import(queue: AsyncQueue) -> None:
    for name in ("os:system", "subprocess:run", "tests.trust.never_imported:fn", "a:b"):
        with pytest.raises(UnknownFlow):
            await queue.enqueue(name, "touch /tmp/pwned")
    assert "tests.trust.never_imported" not in __import__("sys").modules


async def test_a_late_bound_builtin_is_never_executed(
    worker: Worker,
    settings: Settings,
    store: Store,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    marker = tmp_path / "pwned"
    caplog.set_level(logging.WARNING, logger="runfleet")
    async with AsyncQueue("default", settings=settings, late_binding=True) as q:
        run = await q.enqueue("os:system", f"touch {marker}")

        async def refused() -> bool:
            return any(
                r.getMessage() == "run.unknown_flow" and getattr(r, "run_id", None) == run.id
                for r in caplog.records
            )

        await until(refused, 10, "the worker to look at the run and refuse its flow")
        row = await run.fetch()
    assert row.status.value == "pending" and not marker.exists()
    (warning,) = [r for r in caplog.records if getattr(r, "run_id", None) == run.id]
    assert "--allow-import" in str(getattr(warning, "error", ""))


async def test_enqueue_from_the_cli_refuses_os_system(cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    out = await cli("enqueue", "os:system", "--payload", json.dumps([f"touch {marker}"]))
    assert out.code != 0 and out.clean and "unknown flow 'os:system'" in out.stderr
    assert not marker.exists()


async def test_compensations_run_only_registered_code_on_intact_records(
    worker: Worker, queue: AsyncQueue, store: Store, settings: Settings, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    marker = tmp_path / "pwned"
    run = await queue.enqueue(tf.compensating, tag)
    await parked(store, run.id, "event")
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        # a database writer forges a compensation, and tampers with another step's output
        await conn.execute(
            "UPDATE runfleet.steps SET compensate = 'os:system', output = %s::json"
            " WHERE run_id = %s AND key = 'step:one#1'",
            (json.dumps(f"touch {marker}"), run.id),
        )
        await conn.execute(
            "UPDATE runfleet.steps SET output = %s::json WHERE run_id = %s AND key = 'step:two#1'",
            (json.dumps(f"{tag}-forged"), run.id),
        )
        await conn.commit()
    await queue.cancel(run.id)
    with pytest.raises(RunCancelled):
        await run.result(timeout=10)
    assert not marker.exists()
    assert f"{tag}-3" in tf.UNDONE  # the intact, registered compensation ran
    assert not any(str(x).startswith(f"{tag}-forged") for x in tf.UNDONE)
    failed = {
        r.payload["key"]: r.payload["error"]
        for r in await store.journal.records(run.id)
        if r.kind == "step-compensation-failed"
    }
    assert set(failed) == {"step:one#1", "step:two#1"}
    assert "unknown flow 'os:system'" in failed["step:one#1"]
    assert "digest" in failed["step:two#1"]


async def test_a_compensation_outside_the_allowed_code_is_refused_when_declared(
    worker: Worker, queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(tf.bad_compensation)
    assert await run.result(timeout=10) == "UnknownFlow"
    assert await store.steps.of_run(run.id) == []  # nothing recorded with it
