"""Real worker processes for fleet tests: start, signal, and wait on what they wrote."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from store import Store
from store.config import Settings
from store.types import JournalRecord, RunRow

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
Spawn = Callable[..., "WorkerProc"]


def settings_env(settings: Settings, **overrides: object) -> dict[str, str]:
    env = dict(os.environ)
    for field, value in settings.model_dump().items():
        env[f"RUNFLEET_{field.upper()}"] = str(value)
    for field, value in overrides.items():
        env[f"RUNFLEET_{field.upper()}"] = str(value)
    env["PYTHONPATH"] = str(ROOT)
    return env


class WorkerProc:
    """One ``runfleet worker`` process (its own owner identity), logging to a file."""

    def __init__(
        self,
        settings: Settings,
        *,
        flows: str = "tests.fleet.flows",
        queues: str = "default",
        concurrency: int = 4,
        extra_args: Sequence[str] = (),
        **overrides: object,
    ) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="rf-worker-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ops",
                "worker",
                "--flows",
                flows,
                "--queues",
                queues,
                "--concurrency",
                str(concurrency),
                "--log-level",
                "INFO",
                *extra_args,
            ],
            env=settings_env(settings, **overrides),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_started(self, timeout: float = 45.0) -> None:
        await until(
            lambda: _true_if("worker.started" in self.log()),
            timeout,
            f"worker {self.pid} to start:\n{self.log()}",
        )

    async def wait_exit(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.pid} did not exit:\n{self.log()[-3000:]}")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        self.log_path.unlink(missing_ok=True)


async def _true_if(value: bool) -> bool:
    return value


async def until(check: Callable[[], Awaitable[T | bool | None]], timeout: float, what: str) -> T:
    """Poll ``check`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def running_on(store: Store, run_id: str, pid: int | None = None) -> RunRow | None:
    row = await store.runs.get(run_id)
    if (
        row
        and row.status.value == "running"
        and row.owner
        and (pid is None or row.owner.pid == pid)
    ):
        return row
    return None


async def records(store: Store, run_id: str, kind: str) -> list[JournalRecord]:
    return [r for r in await store.journal.records(run_id) if r.kind == kind]
