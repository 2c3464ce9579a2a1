"""``runfleet doctor``: every check runs, and only a failure makes the exit non-zero."""

from __future__ import annotations

import pytest

import tests.fleet.flows as flows
from runfleet.broker.client import connect
from runfleet.broker.keys import Keys
from runfleet.broker.streams import Streams
from runfleet.ops.models import DoctorView
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from runfleet.store.migrate import migrations
from tests.broker.conftest import closed_port
from tests.conftest import NewDatabase
from tests.fleet.procs import Spawn
from tests.ops.conftest import Cli, CliResult


def _view(result: CliResult) -> DoctorView:
    assert result.clean, result
    return DoctorView.model_validate_json(result.stdout)


def _status(view: DoctorView) -> dict[str, str]:
    return {check.name: check.status for check in view.checks}


@pytest.mark.chaos
async def test_healthy_fleet(spawn: Spawn, settings: Settings, cli: Cli) -> None:
    worker = spawn()
    await worker.wait_started()
    async with AsyncQueue("nobody", settings=settings) as nobody:
        await nobody.enqueue(flows.sleepy, 10)
    result = await cli("doctor", "--json", "--queue", "extra")
    assert result.code == 0, result
    view = _view(result)
    status = _status(view)
    assert status["postgres"] == status["schema"] == status["redis"] == "ok"
    assert status["clock skew"] == "ok" and abs(view.clock_skew_ms or 0) < 1000
    assert status["workers"] == "ok" and view.live_workers == 1
    assert view.schema_version == view.latest_migration == migrations()[-1].version
    assert view.stream_lag == {"extra": 0, "default": 0, "nobody": 1}
    assert status["lag nobody"] == "warn" and status["lag default"] == "ok"
    text = await cli("doctor")
    assert text.code == 0 and "no live worker reads nobody" in text.stdout


async def test_no_workers_is_a_warning_not_a_failure(cli: Cli) -> None:
    result = await cli("doctor", "--json")
    assert result.code == 0, result
    view = _view(result)
    assert _status(view)["workers"] == "warn" and view.live_workers == 0


async def test_unreachable_redis_fails_but_postgres_is_still_checked(cli: Cli) -> None:
    result = await cli("doctor", "--json", redis_url=f"redis://127.0.0.1:{closed_port()}/0")
    assert result.code == 1
    status = _status(_view(result))
    assert status["postgres"] == "ok" and status["schema"] == "ok"
    assert status["redis"] == "fail"


async def test_unmigrated_database_fails_the_schema_check(
    cli: Cli, new_empty_database: NewDatabase
) -> None:
    url = await new_empty_database()
    result = await cli("doctor", "--json", database_url=url)
    assert result.code == 1
    view = _view(result)
    assert _status(view)["postgres"] == "ok" and _status(view)["schema"] == "fail"
    assert view.schema_version == 0
    (schema,) = [c for c in view.checks if c.name == "schema"]
    assert "runfleet migrate" in schema.detail


async def test_unreachable_database_fails(cli: Cli) -> None:
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres"
    result = await cli("doctor", "--json", database_url=url)
    assert result.code == 1
    status = _status(_view(result))
    assert status["postgres"] == "fail" and "schema" not in status and status["redis"] == "ok"


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (("XGROUP", "SETID", "{key}", "workers", "99999999999999-0"), "past the stream's last id"),
        (("SET", "{key}", "x"), "a key of type string"),
    ],
)
async def test_a_stranded_queue_fails_and_is_named(
    settings: Settings, cli: Cli, command: tuple[str, ...], named: str
) -> None:
    """A queue whose group is ahead of its stream, or whose stream's name holds another
    type of key, delivers nothing: doctor names it and does not say ok."""
    async with AsyncQueue("default", settings=settings) as queue:
        await queue.enqueue(flows.sleepy, 10)
    key = Keys(settings.redis_prefix).stream("default")
    client = connect(settings)
    try:
        await Streams(client, settings.redis_prefix).ensure_groups(["default"])
        if command[0] == "SET":
            await client.delete(key)
        await client.execute_command(*(a.format(key=key) for a in command))  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated
    finally:
        await client.aclose()
    result = await cli("doctor", "--json")
    assert result.code == 1, result
    view = _view(result)
    assert not view.ok
    check = next(ch for ch in view.checks if ch.name == "streams default")
    assert check.status == "fail" and "STRANDED" in check.detail and named in check.detail, check
    text = await cli("doctor")
    assert text.code == 1 and "STRANDED" in text.stdout, text


async def test_a_stream_without_its_group_is_a_warning(settings: Settings, cli: Cli) -> None:
    """A producer's first append makes the stream before any worker made its group: the
    next read recreates it, so that is no failure."""
    async with AsyncQueue("default", settings=settings) as queue:
        await queue.enqueue(flows.sleepy, 10)
    result = await cli("doctor", "--json")
    assert result.code == 0, result
    status = _status(_view(result))
    assert status["streams default"] == "warn", status
