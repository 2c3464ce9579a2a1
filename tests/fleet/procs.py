"""Real worker processes for fleet tests: start, signal, and wait on what they wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from store import Store
from store.config import Settings
from store.types import JournalRecord, RunRow
from tests.support.polling import until

ROOT = Path(__file__).resolve().parents[2]
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
        try:
            code = await until(
                self._returncode, timeout, f"worker {self.pid} to exit", accept=_exited, every=0.05
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}:\n{self.log()[-3000:]}") from exc
        assert code is not None
        return code

    async def _returncode(self) -> int | None:
        return self.proc.poll()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        self.log_path.unlink(missing_ok=True)


async def _true_if(value: bool) -> bool:
    return value


def _exited(code: int | None) -> bool:
    return code is not None


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
