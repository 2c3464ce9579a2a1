"""User mistakes and unreachable servers end as one clear line and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runfleet.ops.servers.resolve import Endpoints
from tests.broker.conftest import closed_port
from tests.conftest import NewDatabase
from tests.ops.conftest import Cli


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("command", ["explain", "show", "journal", "tree", "cancel"])
async def test_unknown_run(cli: Cli, command: str) -> None:
    result = await cli(command, "no-such-run")
    assert result.code == 1 and result.clean, result
    assert _one_line(result.stderr) == "error: no run with id 'no-such-run'"


async def test_database_unreachable(cli: Cli) -> None:
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres"
    for args in (["runs"], ["explain", "x"], ["enqueue", "a:b"], ["stuck"]):
        result = await cli(*args, database_url=url)
        assert result.code == 1 and result.clean, (args, result)
        assert _one_line(result.stderr).startswith("error: cannot reach the database:"), args


async def test_redis_unreachable_for_fleet(cli: Cli) -> None:
    result = await cli("fleet", redis_url=f"redis://127.0.0.1:{closed_port()}/0")
    assert result.code == 1 and result.clean, result
    assert _one_line(result.stderr).startswith("error: cannot reach Redis:")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{not json", "error: --payload is not valid JSON:"),
        ('"a string"', "error: --payload must be a JSON list (args) or object (kwargs)"),
        ('{"args": 1}', 'error: --payload "args" must be a list and "kwargs" an object'),
    ],
)
async def test_bad_payload(cli: Cli, payload: str, message: str) -> None:
    result = await cli("enqueue", "tests.fleet.flows:add", "--payload", payload)
    assert result.code == 1 and result.clean, result
    assert _one_line(result.stderr).startswith(message)


async def test_bad_durations_and_settings(cli: Cli) -> None:
    result = await cli("stuck", "--pending-for", "soon")  # a usage error, as typer's own
    assert result.code == 2 and result.clean, result
    assert "Invalid value for '--pending-for': bad duration 'soon'" in result.stderr
    result = await cli("runs", stale_after="-1")
    assert result.code == 1 and _one_line(result.stderr).startswith(
        "error: bad setting RUNFLEET_STALE_AFTER"
    )


async def test_unmigrated_database(cli: Cli, new_empty_database: NewDatabase) -> None:
    url = await new_empty_database()
    result = await cli("runs", database_url=url)
    assert result.code == 1 and result.clean, result
    assert _one_line(result.stderr) == (
        "error: the database has no runfleet schema: run `runfleet migrate`"
    )


def _runfleet(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed command as a user types it: its own process, its own stderr."""
    return subprocess.run(
        [sys.executable, "-m", "runfleet", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("RUNFLEET_DATABASE_URL", "postgres://%zz", "error: bad RUNFLEET_DATABASE_URL: invalid"),
        ("RUNFLEET_DATABASE_URL", "not a url", "error: bad RUNFLEET_DATABASE_URL: missing"),
        (
            "RUNFLEET_DATABASE_URL",
            "postgresql://u@127.0.0.1:notaport/db",
            "error: bad RUNFLEET_DATABASE_URL: port 'notaport' is not a number",
        ),
        ("RUNFLEET_REDIS_URL", "localhost:6379", "error: bad RUNFLEET_REDIS_URL: Redis URL"),
    ],
)
@pytest.mark.parametrize("command", [["runs"], ["worker", "--burst"]])
def test_malformed_urls_in_the_real_cli(
    setting: str, value: str, message: str, command: list[str]
) -> None:
    # both URLs set (one URL alone is refused before either is read), one of them malformed
    both = {
        "RUNFLEET_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres",
        "RUNFLEET_REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0",
    }
    done = _runfleet(*command, **{**both, setting: value})
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr and "╭" not in done.stderr, done.stderr
    assert _one_line(done.stderr).startswith(message), done.stderr


def test_malformed_and_unreachable_urls_for_migrate(services: Endpoints) -> None:
    done = _runfleet("migrate", "--database-url", "postgres://%zz")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert _one_line(done.stderr).startswith("error: bad --database-url: invalid percent")
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres"
    for args in (["migrate", "--database-url", url], ["enqueue", "a:b"], ["dashboard"]):
        done = _runfleet(*args, RUNFLEET_DATABASE_URL=url, RUNFLEET_REDIS_URL=services.redis_url)
        assert done.returncode == 1 and "Traceback" not in done.stderr, (args, done.stderr)
        assert _one_line(done.stderr).startswith("error: cannot reach the database"), args
