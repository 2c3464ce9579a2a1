"""Throwaway servers from local binaries, on free loopback ports: what they share.

The test harness starts one Postgres and one Redis per session; chaos tests start their own
and kill, restart or stop them. Each server keeps its port and data dir across ``kill()``
and ``restart()``, so clients reconnect to the same address as they would after a real
crash. ``Throwaway`` is the lifecycle every kind shares (``postgres``, ``redis``, ``tls``
define the kinds); the rest of this module is the process plumbing it needs on Linux.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


class ServicesUnavailable(RuntimeError):
    """No environment URL, Docker engine or local binary could provide a service."""


_LIVE: set[Throwaway] = set()


@atexit.register
def _stop_leftovers() -> None:
    # Servers run in their own session (a terminal Ctrl-C must not kill them before the
    # harness tears down), so an interpreter exit has to stop them explicitly.
    for server in list(_LIVE):
        server.stop()


class Throwaway:
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
                if os.geteuid() == 0:  # servers run as nobody; see credentials
                    os.chown(self._dir, *nobody())
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
        proc.send_signal(signal.SIGSTOP)  # a stopped parent cannot fork a child this misses
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
        # A first start may meet a port taken since it was probed: pick another. A restart
        # keeps its port and retries, since a killed predecessor may still be letting go.
        deadline = time.monotonic() + START_TIMEOUT
        log = workdir / "server.log"
        user, group, groups = credentials()
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


def nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def credentials() -> tuple[int | None, int | None, list[int] | None]:
    """Popen ``user``, ``group``, ``extra_groups``: root drops to nobody, since Postgres
    refuses to run as root; anyone else runs servers as themselves."""
    if os.geteuid() != 0:
        return None, None, None
    uid, gid = nobody()
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
