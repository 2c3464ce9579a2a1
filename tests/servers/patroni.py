"""A throwaway Patroni cluster: one etcd, Patroni nodes each running its own Postgres.

The failover tests (tests/ha) kill a node the ways a real one dies — its Postgres alone
(``kill_postgres``: Patroni restarts it in place) or every process of the node
(``kill_node``: the leader key expires and the standby is promoted) — and watch a fleet
that connects with a libpq multi-host URL. Everything runs on loopback ports as
``nobody`` when started by root (Postgres refuses root), like every other throwaway.

Patroni and etcd come from Debian's packages (``make ha`` installs them as root);
``ha_binaries()`` says what is missing, and the tests skip naming the command.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from runfleet.ops.servers.postgres import postgres_bindir
from runfleet.ops.servers.throwaway import (
    ServicesUnavailable,
    Throwaway,
    _adopting_orphans,
    _alive,
    _free_port,
    nobody,
    wait_until,
)
from runfleet.store.queries import q

HA_PACKAGES = ("patroni", "etcd-server")
INSTALL_HINT = "make ha (as root: apt-get install -y patroni etcd-server)"

TTL = 10
"""Leader key lifetime (s): a dead primary is replaced about this long after it died."""
LOOP_WAIT = 1
RETRY_TIMEOUT = 4


def ha_binaries() -> tuple[str, str] | None:
    """``(patroni, etcd)`` paths, or None when either package is missing."""
    patroni, etcd = shutil.which("patroni"), shutil.which("etcd")
    if patroni is None or etcd is None:
        return None
    return patroni, etcd


def _http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # loopback only
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux /proc), children before grandchildren."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(stat.parent.name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        children = [c for p in frontier for c in parents.get(p, [])]
        found.extend(children)
        frontier = children
    return found


class ThrowawayEtcd(Throwaway):
    """A single-member etcd (v3 API) on loopback; Patroni's DCS."""

    name = "etcd"

    def __init__(self) -> None:
        super().__init__()
        found = ha_binaries()
        if found is None:
            raise ServicesUnavailable(f"patroni/etcd not installed: {INSTALL_HINT}")
        self.binary = found[1]
        self.peer_port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self, workdir: Path) -> list[str]:
        if not self.peer_port:
            self.peer_port = _free_port()
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary, "--name", "rf", "--data-dir", str(workdir / "data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"rf={peer}", "--log-level", "warn",
        ]  # fmt: skip

    def _answers(self) -> bool:
        return _http_status(f"{self.url}/health") == 200


class PatroniNode(Throwaway):
    """One Patroni member and the Postgres it runs; ``port`` is its REST API's.

    ``synchronous`` turns on Patroni's ``synchronous_mode``: a commit returns only once
    the synchronous standby has it, and only that standby may be promoted. Without it
    replication is asynchronous: a commit acknowledged by the primary may never reach
    the standby that replaces it.
    """

    name = "patroni"

    def __init__(
        self,
        member: str,
        etcd: ThrowawayEtcd,
        *,
        scope: str,
        synchronous: bool,
        parameters: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        found = ha_binaries()
        bindir = postgres_bindir()
        if found is None:
            raise ServicesUnavailable(f"patroni/etcd not installed: {INSTALL_HINT}")
        if bindir is None:
            raise ServicesUnavailable("PostgreSQL server binaries not found")
        self.binary, self.bindir = found[0], bindir
        self.member, self.etcd, self.scope = member, etcd, scope
        self.synchronous = synchronous
        self.parameters = dict(parameters or {})
        self.pg_port = 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        assert self._dir is not None
        return self._dir / "data"

    def _prepare(self, workdir: Path) -> None:
        self.pg_port = _free_port()
        (workdir / "sock").mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(workdir / "sock", *nobody())

    def _command(self, workdir: Path) -> list[str]:
        parameters = {
            "max_connections": "300",
            "fsync": "off",  # an OS crash is never simulated; a process crash is
            "full_page_writes": "off",
            "synchronous_commit": "on",
            "wal_level": "replica",
            "hot_standby": "on",
            "wal_keep_size": "256MB",
            "unix_socket_directories": str(workdir / "sock"),
            **self.parameters,
        }
        config = {
            "scope": self.scope,
            "name": self.member,
            "log": {"level": "WARNING"},
            "restapi": {"listen": f"127.0.0.1:{self.port}",
                        "connect_address": f"127.0.0.1:{self.port}"},
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd.port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1 << 30,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {"use_pg_rewind": False, "use_slots": True,
                                   "parameters": parameters},
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(workdir / "data"),
                "bin_dir": str(self.bindir),
                "pgpass": str(workdir / "pgpass"),
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "postgres"}},
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
                "parameters": {"unix_socket_directories": str(workdir / "sock")},
            },
            "tags": {"nofailover": False, "noloadbalance": False},
        }  # fmt: skip
        path = workdir / "patroni.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        path.chmod(0o644)
        return [self.binary, str(path)]

    def _answers(self) -> bool:
        return _http_status(f"{self.api}/health") == 200

    def role(self) -> str | None:
        """``primary``, ``replica``, or None when the REST API does not answer."""
        if _http_status(f"{self.api}/primary") == 200:
            return "primary"
        if _http_status(f"{self.api}/replica") == 200:
            return "replica"
        return None

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _postmaster(self) -> int:
        pid = self.postmaster_pid()
        assert pid is not None and _alive(pid), f"{self.member} has no running postmaster"
        return pid

    def _signal_postgres(self, sig: signal.Signals) -> list[int]:
        """Stop the postmaster (a stopped one forks no child the sweep would miss), then send
        ``sig`` to each backend and to the postmaster; the pids signalled.

        Not the postmaster's process group: each child Postgres forks calls ``setsid``
        (so the postmaster can signal a child's own children), so a signal to the
        postmaster's group reaches the postmaster alone. A backend SIGSTOPped (a paused
        WAL sender) then outlived its killed postmaster, stopped, for good.
        """
        postmaster = self._postmaster()
        os.kill(postmaster, signal.SIGSTOP)
        tree = [postmaster, *_descendants(postmaster)]
        for pid in [*tree[1:], postmaster]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return tree

    def kill_postgres(self) -> float:
        """SIGKILL every process of this node's Postgres at once (Patroni lives on and
        restarts it); the wall-clock time of the kill."""
        tree = self._signal_postgres(signal.SIGKILL)
        killed_at = time.time()
        wait_until(lambda: not any(_alive(pid) for pid in tree), "killed postgres processes")
        return killed_at

    def pause_walsenders(self) -> list[int]:
        """SIGSTOP this primary's WAL senders: its standbys stop receiving (a slow link
        or a busy standby), while the primary goes on committing; their pids."""
        with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
            pids = [int(p) for (p,) in conn.execute(q("topology.walsender_pids"))]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def kill_node(self) -> float:
        """SIGKILL Patroni and its Postgres together, as a lost machine; the time of it.

        Postgres is frozen first (SIGSTOP to the postmaster and every backend: no commit,
        no WAL sent after that instant), then Patroni and Postgres are killed.
        """
        tree = self._signal_postgres(signal.SIGSTOP)
        killed_at = time.time()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with _adopting_orphans():
                proc.send_signal(signal.SIGSTOP)
                patroni = _descendants(proc.pid)
                proc.kill()
                for pid in patroni:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait()
                for pid in patroni:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(_alive(pid) for pid in tree), "killed node processes")
        return killed_at

    def stop(self) -> None:
        # Patroni stops its Postgres on SIGTERM; a node killed already has nothing left.
        pid = self.postmaster_pid() if self._dir is not None else None
        super().stop()
        if pid is not None and _alive(pid):
            for member in [pid, *_descendants(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)


@dataclass(frozen=True)
class Topology:
    """What the cluster's members say about themselves (REST API)."""

    primary: str | None
    replicas: tuple[str, ...]


class PatroniCluster:
    """etcd plus ``members`` Patroni nodes; the first bootstraps and becomes primary."""

    def __init__(
        self,
        members: int = 2,
        *,
        synchronous: bool = True,
        parameters: dict[str, str] | None = None,
    ) -> None:
        self.etcd = ThrowawayEtcd()
        scope = f"rf{os.getpid()}{int(time.time() * 1000) % 100000}"
        self.nodes = [
            PatroniNode(f"n{i}", self.etcd, scope=scope, synchronous=synchronous,
                        parameters=parameters)
            for i in range(members)
        ]  # fmt: skip
        self.synchronous = synchronous

    def start(self, timeout: float = 90) -> PatroniCluster:
        try:
            self.etcd.start()
            self.nodes[0].start()
            self.wait_primary(timeout)
            for node in self.nodes[1:]:
                node.start()
            self.wait_streaming(len(self.nodes) - 1, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.etcd.stop()

    def __enter__(self) -> PatroniCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def maintenance(self, on: bool) -> None:
        """Patroni's pause mode: it stops managing Postgres (a paused WAL replay stays
        paused instead of being resumed at its next loop)."""
        body = json.dumps({"pause": on}).encode()
        request = urllib.request.Request(
            f"{self.primary().api}/config", data=body, method="PATCH",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as reply:  # loopback only
            assert reply.status == 200, reply.status
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(f"{self.primary().api}/patroni", timeout=2) as r:
                    if bool(json.loads(r.read()).get("pause", False)) == on:
                        return
            time.sleep(0.2)
        raise TimeoutError(f"patroni pause={on} not in effect")

    def url(self, dbname: str = "postgres", nodes: Sequence[PatroniNode] | None = None) -> str:
        """The libpq multi-host URL a fleet uses: the first node that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in nodes or self.nodes)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def topology(self) -> Topology:
        roles = {n.member: n.role() for n in self.nodes}
        primary = next((m for m, r in roles.items() if r == "primary"), None)
        return Topology(primary, tuple(m for m, r in roles.items() if r == "replica"))

    def node(self, member: str) -> PatroniNode:
        return next(n for n in self.nodes if n.member == member)

    def primary(self) -> PatroniNode:
        found = self.topology().primary
        assert found is not None, "no primary"
        return self.node(found)

    def wait_primary(self, timeout: float = 60, other_than: str | None = None) -> PatroniNode:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.member != other_than and node.running and node.role() == "primary":
                    with contextlib.suppress(psycopg.OperationalError):
                        with psycopg.connect(
                            node.url, connect_timeout=2, row_factory=dict_row
                        ) as conn:
                            row = conn.execute(q("topology.server")).fetchone()
                            if row is not None and not row["in_recovery"]:
                                return node
            time.sleep(0.1)
        raise TimeoutError(f"no primary within {timeout}s: {self.topology()}")

    def wait_streaming(self, standbys: int, timeout: float = 60) -> None:
        """Until the primary streams to ``standbys`` (sync ones when synchronous)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.OperationalError, AssertionError):
                with psycopg.connect(
                    self.primary().url, connect_timeout=2, row_factory=dict_row
                ) as conn:
                    rows = conn.execute(q("topology.standbys")).fetchall()
                streaming = [r["sync_state"] for r in rows if r["state"] == "streaming"]
                if sum(1 for s in streaming if s in (want, "quorum")) >= standbys:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"{standbys} {want} standby(s) not streaming within {timeout}s")
