"""Hosts as network namespaces, and links that can be cut without refusing anything.

Two bridges live in the root namespace: one carries Postgres (``10.213.{2k+1}.1``), the
other Redis (``10.213.{2k+2}.1``). Each host namespace has one veth into each bridge, so
a host can lose Postgres, Redis or both independently. A cut takes the root-side end of
a veth down: the host's packets are dropped silently (every neighbour entry is static,
so not even an ARP failure turns the silence into a fast "unreachable"), its connections
hang exactly as they do behind a dead switch port. A heal brings the end back up and the
hung connections carry on.

Several copies of the suite may run on one machine (engineers, CI): each takes a slot
``k`` under an exclusive ``flock`` and uses only the names and subnets of that slot. A
slot whose lock is free may hold the leftovers of a crashed run; they are removed first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

SLOTS = 16
LOCK_DIR = Path("/tmp")
IP_TIMEOUT = 10.0
_LINK = re.compile(r"^rfp(\d+)[a-z]?-(pg|rd)$")
_NAMESPACE = re.compile(r"^rfp(\d+)-[a-z]+$")


class Service(StrEnum):
    POSTGRES = "pg"
    REDIS = "rd"


class TopologyUnavailable(RuntimeError):
    """Namespaces cannot be created here: the suite skips with this reason."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One ``ip`` command; a failure raises with its stderr (never hangs: bounded)."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (CI runs the suite as root)"
    if shutil.which("ip") is None:
        return "the iproute2 `ip` command is not installed"
    probe = f"rfp-probe-{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        link = ip("link", "add", f"rfpv{os.getpid() % 100000}", "type", "bridge", check=False)
        if link.returncode != 0:
            return f"cannot create a bridge: {link.stderr.strip()}"
        ip("link", "del", f"rfpv{os.getpid() % 100000}", check=False)
    finally:
        ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One simulated machine: a namespace with an address on each service bridge."""

    name: str  # "a", "b", ...
    index: int
    namespace: str
    host_id: str  # its RUNFLEET_HOST_ID

    def link(self, slot: int, service: Service) -> str:
        """The root-side end of this host's veth into ``service``'s bridge."""
        return f"rfp{slot}{self.name}-{service.value}"

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


@dataclass
class Topology:
    """The namespaces, veths and bridges of one slot; build with ``Topology.create``."""

    slot: int
    hosts: dict[str, Host]
    _lock_fd: int
    _cut: set[tuple[str, Service]] = field(default_factory=set)

    @property
    def postgres_address(self) -> str:
        return f"10.213.{2 * self.slot + 1}.1"

    @property
    def redis_address(self) -> str:
        return f"10.213.{2 * self.slot + 2}.1"

    @classmethod
    def create(cls, names: Sequence[str]) -> Topology:
        slot, fd = _take_slot()
        hosts = {
            name: Host(name, i, f"rfp{slot}-{name}", f"host-{name}") for i, name in enumerate(names)
        }
        topo = cls(slot, hosts, fd)
        try:
            _remove_slot(slot)
            topo._build()
        except BaseException:
            topo.destroy()
            raise
        return topo

    def cut(self, host: str, *services: Service) -> None:
        for service in services:
            ip("link", "set", self.hosts[host].link(self.slot, service), "down")
            self._cut.add((host, service))

    def heal(self, host: str | None = None) -> None:
        """Bring back the links of ``host`` (every host if None)."""
        for name, service in sorted(self._cut):
            if host is None or name == host:
                ip("link", "set", self.hosts[name].link(self.slot, service), "up")
                self._cut.discard((name, service))

    def destroy(self) -> None:
        """Remove everything of this slot and release it; safe to call twice."""
        if self._lock_fd < 0:
            return
        _remove_slot(self.slot)
        os.close(self._lock_fd)
        self._lock_fd = -1

    # ---- building ------------------------------------------------------------

    def _build(self) -> None:
        for service, subnet in ((Service.POSTGRES, 2 * self.slot + 1),
                                (Service.REDIS, 2 * self.slot + 2)):  # fmt: skip
            bridge = f"rfp{self.slot}-{service.value}"
            bridge_mac = _mac(self.slot, subnet, 1)
            ip("link", "add", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
            ip("link", "set", bridge, "address", bridge_mac)
            ip("addr", "add", f"10.213.{subnet}.1/24", "dev", bridge)
            ip("link", "set", bridge, "up")
            for host in self.hosts.values():
                self._attach(host, service, bridge, bridge_mac, subnet)
        for host in self.hosts.values():
            ip("-n", host.namespace, "link", "set", "lo", "up")

    def _attach(
        self, host: Host, service: Service, bridge: str, bridge_mac: str, subnet: int
    ) -> None:
        outer, inner = host.link(self.slot, service), f"{service.value}0"
        addr = f"10.213.{subnet}.{10 + host.index}"
        inner_mac = _mac(self.slot, subnet, 10 + host.index)
        if host.namespace not in _namespaces():
            ip("netns", "add", host.namespace)
        ip("link", "add", outer, "type", "veth", "peer", "name", inner, "address", inner_mac,
           "netns", host.namespace)  # fmt: skip
        ip("link", "set", outer, "master", bridge)
        ip("link", "set", outer, "up")
        ip("-n", host.namespace, "addr", "add", f"{addr}/24", "dev", inner)
        ip("-n", host.namespace, "link", "set", inner, "up")
        # Static neighbours both ways: a cut must drop packets, never answer "unreachable".
        ip("-n", host.namespace, "neigh", "replace", f"10.213.{subnet}.1", "lladdr", bridge_mac,
           "dev", inner, "nud", "permanent")  # fmt: skip
        ip("neigh", "replace", addr, "lladdr", inner_mac, "dev", bridge, "nud", "permanent")


def _mac(slot: int, subnet: int, host: int) -> str:
    return f"02:13:{slot:02x}:{subnet:02x}:00:{host:02x}"


def _namespaces() -> set[str]:
    out = ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _take_slot() -> tuple[int, int]:
    """An exclusive slot: its lock is held until ``destroy`` or this process dies."""
    for slot in range(SLOTS):
        fd = os.open(LOCK_DIR / f"runfleet-partition-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    raise TopologyUnavailable(f"all {SLOTS} partition-suite slots are in use")


def _remove_slot(slot: int) -> None:
    """Delete this slot's namespaces, veths and bridges, whoever left them.

    A run killed outright (SIGKILL, OOM) leaves worker processes in the namespaces and
    servers bound to the slot's bridge addresses: nothing else can be using them while
    this process holds the slot's lock, so they are killed first.
    """
    _kill_leftovers(slot)
    links = ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@", 1)[0]
        found = _LINK.match(name)
        if found and int(found[1]) == slot:
            ip("link", "del", name, check=False)
    for ns in _namespaces():
        found = _NAMESPACE.match(ns)
        if found and int(found[1]) == slot:
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", ns)


def _kill_leftovers(slot: int) -> None:
    pids: set[int] = set()
    for ns in _namespaces():
        found = _NAMESPACE.match(ns)
        if found and int(found[1]) == slot:
            out = ip("netns", "pids", ns, check=False).stdout
            pids.update(int(pid) for pid in out.split() if pid.isdigit())
    # Redis rewrites its title to "redis-server ADDR:PORT", Postgres keeps "-h ADDR".
    server = re.compile(rf"10\.213\.({2 * slot + 1}|{2 * slot + 2})\.1(?![0-9])".encode())
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, ValueError):
            raw = cmdline.read_bytes()
            name = raw.split(b"\0", 1)[0]
            if (b"postgres" in name or b"redis-server" in name) and server.search(raw):
                pids.add(int(cmdline.parent.name))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def topology(names: Sequence[str]) -> Iterator[Topology]:
    topo = Topology.create(names)
    try:
        yield topo
    finally:
        topo.destroy()
