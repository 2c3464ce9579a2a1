"""``runfleet doctor`` on a synchronous cluster, run by roles with and without pg_monitor.

A primary of its own (a throwaway server, ``synchronous_standby_names`` set) with a
synchronous standby streaming from it (``pg_receivewal --synchronous``, which reports
its flushes as a standby does). Without pg_monitor, Postgres shows the standby's
``sync_state`` as NULL: doctor must say it cannot know, not "asynchronous".
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from runfleet.ops.models import DoctorView
from runfleet.ops.servers.postgres import ThrowawayPostgres
from tests.ops.conftest import Cli

STANDBY = "rf_standby"


@pytest.fixture
def synchronous_primary(tmp_path: Path) -> Iterator[ThrowawayPostgres]:
    receivewal = shutil.which("pg_receivewal")
    if receivewal is None:
        pytest.skip("pg_receivewal not installed")
    settings = {"synchronous_standby_names": STANDBY}
    with ThrowawayPostgres(durable_commits=True, extra_settings=settings) as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = local")  # no standby streams yet
            for role, monitor in (("rf_watcher", False), ("rf_monitor", True)):
                conn.execute(f"CREATE ROLE {role} LOGIN")
                if monitor:
                    conn.execute(f"GRANT pg_monitor TO {role}")
        standby = subprocess.Popen(
            [receivewal, "--synchronous", "--no-loop", "-D", str(tmp_path), "-d",
             f"host=127.0.0.1 port={server.port} user=postgres application_name={STANDBY}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            with psycopg.connect(server.url, autocommit=True) as conn:
                while (
                    conn.execute(
                        "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"
                    ).fetchone()
                    is None
                ):
                    assert standby.poll() is None, standby.stderr
                    assert time.monotonic() < deadline, "the standby never became synchronous"
                    time.sleep(0.1)
            yield server
        finally:
            standby.terminate()
            standby.wait(10)


async def _topology(cli: Cli, url: str) -> str:
    result = await cli("doctor", "--json", database_url=url)
    assert result.clean, result
    view = DoctorView.model_validate_json(result.stdout)
    (check,) = [c for c in view.checks if c.name == "topology"]
    return f"{check.status}: {check.detail}"


async def test_doctor_says_unknown_without_pg_monitor(
    synchronous_primary: ThrowawayPostgres, cli: Cli
) -> None:
    base = f"postgresql://{{}}@127.0.0.1:{synchronous_primary.port}/postgres"
    unprivileged = await _topology(cli, base.format("rf_watcher"))
    assert "asynchronous" not in unprivileged, unprivileged
    assert unprivileged.startswith("warn: ") and "unknown, grant pg_monitor" in unprivileged
    monitored = await _topology(cli, base.format("rf_monitor"))
    assert monitored.startswith("ok: ") and f"{STANDBY} sync streaming" in monitored, monitored
    assert monitored.endswith("a commit waits for a synchronous standby"), monitored
