"""docs/how-to/failover.md's roles, as written: the SQL and the commands of its section.

On a fresh server (roles are per server, so not the shared one): the page's ``runfleet``
login cannot migrate, and says why in one line; its migrator can, and applies the roles.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from runfleet.ops.models import DoctorView
from runfleet.ops.servers.postgres import ThrowawayPostgres

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "failover.md"


def _section_blocks() -> tuple[str, list[str]]:
    """The section's SQL block and its commands block (a URL line, then commands)."""
    section = PAGE.read_text().split("## Roles:", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    (sql,) = [body for lang, body in blocks if lang == "sql"]
    (commands,) = [body for lang, body in blocks if lang == "text"]
    return sql, commands.strip().splitlines()


@pytest.fixture
def server() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres() as fresh:
        yield fresh


def _runfleet(url: str, args: list[str], redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNFLEET_DATABASE_URL": url, "RUNFLEET_REDIS_URL": redis_url}
    return subprocess.run(
        [sys.executable, "-m", "runfleet", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_the_pages_roles_work_as_written(server: ThrowawayPostgres, redis_url: str) -> None:
    sql, lines = _section_blocks()
    with psycopg.connect(server.url, autocommit=True) as conn:
        for statement in filter(str.strip, sql.split(";")):
            conn.execute(statement)
    hosts = f"127.0.0.1:{server.port}"
    setting, *commands = lines
    page_url = setting.split("=", 1)[1]
    url = re.sub(r"@[^/]+/", f"@{hosts}/", page_url).replace(":PASSWORD@", ":change-me@")
    runner = url.replace("runfleet_migrator:", "runfleet:")

    refused = _runfleet(runner, ["migrate"], redis_url)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.strip() == (
        "error: the database role may not migrate: permission denied for database runfleet "
        "(`runfleet migrate` needs a role that owns the database and has CREATEROLE: "
        "docs/how-to/roles.md)"
    )
    for command in commands:
        args = shlex.split(command)
        assert args[0] == "runfleet", command
        done = _runfleet(url, args[1:] + (["--json"] if args[1] == "doctor" else []), redis_url)
        if args[1] == "doctor":  # no worker runs here: only the database's checks count
            checks = {c.name: c for c in DoctorView.model_validate_json(done.stdout).checks}
            assert checks["schema"].status == checks["topology"].status == "ok", checks
        else:
            assert done.returncode == 0, (command, done.stderr)
    with psycopg.connect(runner) as conn:  # the runner is a worker now
        member = conn.execute("SELECT pg_has_role('runfleet_worker', 'MEMBER')").fetchone()
        assert member == (True,)
