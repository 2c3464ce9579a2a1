"""Throwaway Postgres and Redis servers from local binaries, on free loopback ports.

The test harness starts one of each per session; chaos tests start their own and kill,
restart or stop them. Each server keeps its port and data dir across ``kill()`` and
``restart()``, so clients reconnect to the same address as they would after a real crash.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import psycopg
import redis

MIN_POSTGRES = 14  # DROP DATABASE ... WITH (FORCE) and initdb --no-instructions
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


class ServicesUnavailable(RuntimeError):
    """No environment URL, Docker engine or local binary could provide a service."""


def postgres_bindir() -> Path | None:
    """The newest directory holding ``initdb`` and ``postgres`` of a supported version."""
    dirs = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for tool in ("initdb", "postgres", "pg_ctl"):
        if found := shutil.which(tool):
            dirs.append(Path(found).resolve().parent)
    for bindir in dirs:
        if (bindir / "initdb").exists() and (bindir / "postgres").exists():
            out = subprocess.run([bindir / "postgres", "--version"], capture_output=True, text=True)
            version = re.search(r"(\d+)(?:\.\d+)*", out.stdout)
            if version and int(version[1]) >= MIN_POSTGRES:
                return bindir
    return None


_LIVE: set[_Throwaway] = set()


@atexit.register
def _stop_leftovers() -> None:
    # Servers run in their own session (a terminal Ctrl-C must not kill them before the
    # harness tears down), so an interpreter exit has to stop them explicitly.
    for server in list(_LIVE):
        server.stop()


class _Throwaway:
    """A server process on a loopback port with its data in a private temp dir.

    The port is chosen at the first start and kept: ``restart()`` (after ``kill()`` or
    not) must bring the server back where its clients are still looking, with the same
    data dir. ``stop()`` deletes the data; stopping twice or before starting is harmless.
    """

    name = "server"
    stop_signal = signal.SIGTERM

    def __init__(self) -> None:
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        if self.running:
            return self
        fresh = self._dir is None
        try:
            if self._dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix=f"runfleet-{self.name}-"))
                _LIVE.add(self)
                if os.geteuid() == 0:  # servers run as nobody; see _credentials
                    os.chown(self._dir, *_nobody())
                self._prepare(self._dir)
            self._launch(self._dir, fresh)
        except BaseException:
            if fresh:  # nothing worth keeping: a failed first start leaves no temp dir
                self.stop()
            raise
        return self

    def stop(self) -> None:
        self._shutdown()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        _LIVE.discard(self)

    def kill(self) -> None:
        """SIGKILL the server and its children, as a crash would; the data dir stays."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGSTOP)  # a stopped parent cannot fork a child we miss
        children = _children(proc.pid)
        with _adopting_orphans():
            proc.kill()
            proc.wait()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _reap(children)

    def restart(self) -> None:
        if self._dir is None:
            raise RuntimeError(f"restart() of a {self.name} that was never started")
        self._shutdown()
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _shutdown(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(self.stop_signal)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc = proc
            self.kill()

    def _launch(self, workdir: Path, fresh: bool) -> None:
        # A first start may meet a port taken since we probed it: pick another. A restart
        # keeps its port and retries, since a killed predecessor may still be letting go.
        deadline = time.monotonic() + START_TIMEOUT
        log = workdir / "server.log"
        user, group, groups = _credentials()
        for attempt in itertools.count():
            if not self.port or (fresh and attempt > 0):
                self.port = _free_port()
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    self._command(workdir),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    cwd=workdir, start_new_session=True,
                    user=user, group=group, extra_groups=groups,
                )  # fmt: skip
            while proc.poll() is None and time.monotonic() < deadline:
                if self._answers():
                    self._proc = proc
                    return
                time.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if time.monotonic() >= deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} did not start on port {self.port}:\n{tail}")
            time.sleep(0.1)

    def _prepare(self, workdir: Path) -> None:
        """One-time setup of a fresh data dir."""

    def _command(self, workdir: Path) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        raise NotImplementedError


class ThrowawayPostgres(_Throwaway):
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
        bindir = postgres_bindir()
        if bindir is None:
            raise ServicesUnavailable(f"PostgreSQL >= {MIN_POSTGRES} server binaries not found")
        self.bindir = bindir

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _prepare(self, workdir: Path) -> None:
        for sub in ("data", "sock"):
            (workdir / sub).mkdir(mode=0o700)
            if os.geteuid() == 0:
                os.chown(workdir / sub, *_nobody())
        user, group, groups = _credentials()
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


class ThrowawayRedis(_Throwaway):
    """A private redis-server with persistence off: a restart comes back empty."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self, workdir: Path) -> list[str]:
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(workdir),
        ]  # fmt: skip

    def _answers(self) -> bool:
        return redis_answers(self.url)


def postgres_answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def redis_answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not ready within {START_TIMEOUT:.0f}s")
        time.sleep(0.05)


def _free_port() -> int:
    """A free loopback port outside the kernel's ephemeral range.

    Clients retrying a killed server connect from ephemeral ports; one that drew the
    server's own port would connect to itself (TCP simultaneous open) and hold it, and the
    restart would find its port taken.
    """
    try:
        low, high = map(int, Path(_EPHEMERAL_RANGE).read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    ports = [p for p in range(10_000, 65_536) if not low <= p <= high]
    for port in random.sample(ports, 50):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port outside the ephemeral range")


def _nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def _credentials() -> tuple[int | None, int | None, list[int] | None]:
    """Popen ``user``, ``group``, ``extra_groups``: root drops to nobody, since Postgres
    refuses to run as root; anyone else runs servers as themselves."""
    if os.geteuid() != 0:
        return None, None, None
    uid, gid = _nobody()
    return uid, gid, []


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; elsewhere none, and restart retries)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@contextlib.contextmanager
def _adopting_orphans() -> Iterator[None]:
    """Make this process the subreaper of orphans created inside the block (Linux).

    A killed server's children would otherwise be reparented to init, and an init that
    never reaps (some container and VM inits) leaves them as zombies for good.
    """
    prctl = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        if prctl is not None:
            prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _reap(pids: list[int]) -> None:
    """Wait until every pid has exited: reaped if adopted, else gone from /proc."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    wait_until(lambda: not any(_alive(pid) for pid in pids), "killed server processes")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


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


class ThrowawayPgBouncer(_Throwaway):
    """PgBouncer in front of a ``ThrowawayPostgres``, by default in transaction mode.

    Transaction pooling is what breaks a client that assumes one server session: each
    transaction may run on another server connection, so session state (psycopg's
    automatic prepared statements before PgBouncer 1.21, ``SET``) does not follow it.
    ``ignore_startup_parameters`` lists ``options``: runfleet sends its statement and
    idle-in-transaction timeouts that way, and PgBouncer refuses unknown startup
    parameters; the pooler's ``query_timeout``/``idle_transaction_timeout`` stand in
    for them. Any database name is passed through to the backend (``*``).
    """

    name = "pgbouncer"

    def __init__(
        self, backend: ThrowawayPostgres, *, pool_mode: str = "transaction", pool_size: int = 40
    ) -> None:
        super().__init__()
        self.pool_size = pool_size
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
            "ignore_startup_parameters": "extra_float_digits,options",
            "query_timeout": "30",
            "idle_transaction_timeout": "60",
        }
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


# ---- TLS: the same servers speaking only TLS, with certificates the caller made --------


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for a TLS server: the CA that signed it (clients verify against it),
    its certificate and its private key. The certificate should name ``localhost``."""

    ca: Path
    cert: Path
    key: Path


def _install_tls(files: TlsFiles, workdir: Path) -> TlsFiles:
    """Copy the server's files into its data dir, readable by the server user only.

    Postgres refuses a key readable by group or others, and as root the servers run as
    ``nobody``, which cannot read the caller's files where they are.
    """
    tls = workdir / "tls"
    tls.mkdir(mode=0o700, exist_ok=True)
    placed = TlsFiles(ca=tls / "ca.pem", cert=tls / "server.pem", key=tls / "server.key")
    for source, target in ((files.ca, placed.ca), (files.cert, placed.cert),
                           (files.key, placed.key)):  # fmt: skip
        shutil.copyfile(source, target)
        target.chmod(0o600)
    if os.geteuid() == 0:
        for path in (tls, placed.ca, placed.cert, placed.key):
            os.chown(path, *_nobody())
    return placed


class TlsPostgres(ThrowawayPostgres):
    """A throwaway Postgres with ``ssl=on`` that admits TCP clients over TLS only.

    ``pg_hba.conf`` has ``hostssl`` lines and no ``host`` line, so a client that does not
    negotiate TLS (``sslmode=disable``) is refused: a test that connects proves TLS was
    used. ``url`` verifies the server fully (``sslmode=verify-full`` against ``tls.ca``,
    host ``localhost``).
    """

    name = "postgres-tls"

    def __init__(self, tls: TlsFiles, *, durable_commits: bool = False) -> None:
        super().__init__(durable_commits=durable_commits)
        self.tls = tls
        self._placed: TlsFiles | None = None

    @property
    def url(self) -> str:
        return self.url_for()

    def url_for(
        self, *, host: str = "localhost", ca: Path | None = None, sslmode: str = "verify-full"
    ) -> str:
        """A URL to this server as ``host`` (connecting to 127.0.0.1 whatever it says)."""
        root = ca or self.tls.ca
        return (
            f"postgresql://postgres@{host}:{self.port}/postgres?hostaddr=127.0.0.1"
            f"&sslmode={sslmode}&sslrootcert={root}"
        )

    def _prepare(self, workdir: Path) -> None:
        super()._prepare(workdir)
        self._placed = _install_tls(self.tls, workdir)
        (workdir / "data" / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostssl all all ::1/128 trust\n"
        )

    def _command(self, workdir: Path) -> list[str]:
        assert self._placed is not None
        return [
            *super()._command(workdir),
            "-c", "ssl=on",
            "-c", f"ssl_cert_file={self._placed.cert}",
            "-c", f"ssl_key_file={self._placed.key}",
            "-c", f"ssl_ca_file={self._placed.ca}",
        ]  # fmt: skip


def redis_tls_supported() -> str | None:
    """None if ``redis-server`` links OpenSSL (built with TLS), else why not (a skip reason).

    Debian's and most distributions' builds do (``BUILD_TLS=yes``); a build without it
    refuses the ``tls-*`` directives at start.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        return "redis-server not found"
    if shutil.which("ldd") is None:
        return None  # cannot tell: try, and let the start fail loudly
    linked = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    if "libssl" not in linked:
        return f"{binary} was built without TLS (it does not link libssl)"
    return None


class TlsRedis(ThrowawayRedis):
    """A throwaway redis-server that listens only on a TLS port (``--port 0``).

    Clients are not asked for certificates (``--tls-auth-clients no``): the test is that
    runfleet verifies the *server*. ``url`` is ``rediss://localhost:PORT/0`` with the CA
    as ``ssl_ca_certs`` and hostname checking on (redis-py's defaults for rediss).
    """

    name = "redis-tls"

    def __init__(self, tls: TlsFiles) -> None:
        super().__init__()
        self.tls = tls
        self._placed: TlsFiles | None = None

    @property
    def url(self) -> str:
        return self.url_for()

    def url_for(self, *, host: str = "localhost", ca: Path | None = None) -> str:
        root = ca or self.tls.ca
        return f"rediss://{host}:{self.port}/0?ssl_ca_certs={root}&ssl_cert_reqs=required"

    def _prepare(self, workdir: Path) -> None:
        self._placed = _install_tls(self.tls, workdir)

    def _command(self, workdir: Path) -> list[str]:
        assert self._placed is not None
        return [
            "redis-server", "--port", "0", "--tls-port", str(self.port),
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir),
            "--tls-cert-file", str(self._placed.cert), "--tls-key-file", str(self._placed.key),
            "--tls-ca-cert-file", str(self._placed.ca), "--tls-auth-clients", "no",
        ]  # fmt: skip


# ---- Redis Cluster: masters with a replica each, from plain redis-server binaries ------


class _ClusterNode(ThrowawayRedis):
    """One cluster-enabled redis-server; a short node timeout makes failover quick."""

    name = "redis-cluster-node"

    def __init__(self, node_timeout_ms: int) -> None:
        super().__init__()
        self.node_timeout_ms = node_timeout_ms

    def _command(self, workdir: Path) -> list[str]:
        return [
            *super()._command(workdir),
            "--cluster-enabled", "yes", "--cluster-config-file", str(workdir / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica may take over however long its link was down: no data to protect.
            "--cluster-replica-validity-factor", "0",
        ]  # fmt: skip


class ThrowawayRedisCluster:
    """``masters`` masters with ``replicas`` replica each, joined by ``redis-cli --cluster
    create``; ``url`` is a ``redis+cluster://`` seed URL (runfleet's cluster scheme).

    ``kill_master_of(key)`` SIGKILLs the master serving a key and waits until one of its
    replicas serves that slot: a crash with failover, as a managed cluster would do it.
    """

    def __init__(self, *, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000):
        if shutil.which("redis-cli") is None:
            raise ServicesUnavailable("redis-cli not found (it creates the cluster)")
        self.nodes = [_ClusterNode(node_timeout_ms) for _ in range(masters * (1 + replicas))]
        self.replicas = replicas

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self._alive()[0].port}/0"

    def start(self) -> Self:
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *addresses,
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=START_TIMEOUT,
            )  # fmt: skip
            wait_until(lambda: all(self._state(n) == "ok" for n in self.nodes), "redis cluster")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def master_of(self, key: str) -> _ClusterNode:
        """The node serving ``key``'s slot now, as the live nodes see it."""
        probe = self._alive()[0]
        client = redis.Redis(port=probe.port, decode_responses=True, socket_timeout=2)
        try:
            slot = int(client.cluster("keyslot", key))
            for start, end, master, *_ in client.cluster("slots"):
                if int(start) <= slot <= int(end):
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        finally:
            client.close()
        raise RuntimeError(f"no node serves the slot of {key!r}")

    def kill_master_of(self, key: str) -> _ClusterNode:
        victim = self.master_of(key)
        victim.kill()

        def promoted() -> bool:
            try:
                return self.master_of(key) is not victim
            except (redis.RedisError, RuntimeError, StopIteration):
                return False

        wait_until(promoted, f"a replica taking over {key!r}")
        return victim

    def _alive(self) -> list[_ClusterNode]:
        return [n for n in self.nodes if n.running]

    @staticmethod
    def _state(node: _ClusterNode) -> str:
        client = redis.Redis(port=node.port, decode_responses=True, socket_timeout=2)
        try:
            return str(client.cluster("info")["cluster_state"])
        except redis.RedisError:
            return "down"
        finally:
            client.close()
