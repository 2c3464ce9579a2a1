"""The worker fleet of one simulated host: ``runfleet worker --processes N`` in a namespace.

The supervisor and its children share a process group of their own, so a whole host can
be frozen (SIGSTOP), thawed and killed at once, and the supervisor restarts a child that
exits (a fail-stop) as it would in production. Logs are JSON lines, parsed for events.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runfleet.store.config import Settings
from runfleet.store.types import Owner
from tests.fleet.procs import ROOT, settings_env
from tests.partition.net import Host
from tests.support.polling import until

KILL_TIMEOUT = 10.0


@dataclass(frozen=True)
class Event:
    """One JSON log line of a worker (or its supervisor)."""

    ms: float  # wall clock, from its ``ts``
    name: str
    fields: dict[str, Any]


def owner_host_pid(key: str) -> tuple[str, int]:
    """``host:pid:nonce`` -> (host, pid)."""
    owner = Owner.parse(key)
    assert owner is not None, f"not an owner key: {key!r}"
    return owner.host_id, owner.pid


class HostWorkers:
    """One host's supervised worker processes; ``close()`` always kills them all."""

    def __init__(
        self,
        host: Host,
        settings: Settings,
        *,
        flows: str = "tests.partition.flows",
        processes: int = 2,
        concurrency: int = 2,
    ) -> None:
        self.host = host
        self.processes = processes
        self.log_path = Path(tempfile.mkstemp(prefix=f"rf-part-{host.name}-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        command = [
            *host.exec_prefix(), sys.executable, "-m", "runfleet.ops", "worker",
            "--flows", flows, "--queues", "default", "--concurrency", str(concurrency),
            "--processes", str(processes), "--log-json", "--log-level", "INFO",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            env=settings_env(settings, host_id=host.host_id),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        self.pgid = self.proc.pid

    # ---- reading what it said ------------------------------------------------

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, *names: str) -> list[Event]:
        found = []
        for line in self.text().splitlines():
            if not line.startswith("{"):
                continue
            try:
                data = json.loads(line)
                ms = _ts_ms(data["ts"])
            except (ValueError, KeyError, TypeError):
                continue
            if not names or data.get("event") in names:
                found.append(Event(ms, str(data.get("event")), data))
        return found

    def owners(self) -> list[str]:
        """Owner keys of every worker process this host started (restarts included)."""
        return [str(e.fields["owner"]) for e in self.events("worker.started")]

    async def wait_started(self, timeout: float = 30.0) -> None:
        async def started() -> bool:
            if self.proc.poll() is not None:  # it exited: no point waiting out the deadline
                raise TimeoutError(f"host {self.host.name} workers exited while starting")
            return len(self.owners()) >= self.processes

        try:
            await until(started, timeout, f"host {self.host.name} workers to start", every=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}:\n{self.text()[-3000:]}") from exc

    # ---- signals ---------------------------------------------------------------

    def pids(self) -> list[int]:
        """Every live process of this host's group (supervisor, children, helpers)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.pgid and fields[0] not in ("Z", "X"):
                    found.append(int(stat.parent.name))
        return found

    def freeze(self) -> None:
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_group(signal.SIGCONT)

    def close(self) -> None:
        """SIGKILL the whole group (thawed first, so nothing stays stopped), then reap."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGCONT)
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(KILL_TIMEOUT)
        deadline = time.monotonic() + KILL_TIMEOUT
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._log.close()

    def discard_log(self) -> None:
        self.log_path.unlink(missing_ok=True)

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)


def _ts_ms(ts: str) -> float:
    parsed = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return parsed.timestamp() * 1000
