"""Real worker processes for fleet tests: start, signal, and wait on what they wrote."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import JournalRecord, RunRow
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
                "runfleet.ops",
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


async def writes_after_steal(
    store: Store, run_id: str, steal: JournalRecord, previous: RunRow
) -> list[str]:
    """Every write to ``run_id`` after ``steal`` that came from ``previous``'s ownership.

    ``previous`` is the row as the cut-off owner held it (its owner and epoch). A write is
    attributed to that ownership by any of what it carries, not only the journal address
    the owner's own process writes at: its source id, a lease address of its owner
    (``lease:<key>:…``), its owner key as the payload's ``owner``, or its epoch as the
    payload's ``epoch``; a step recorded at its epoch after the steal; or the row itself
    no longer held at the stolen epoch. Evidence it journaled about the new owner's lease
    as an observer (``observer``: its key, a non-owner's record) is not an owned write.
    Returns a description of each such write (empty: the owner wrote nothing).
    """
    assert previous.owner is not None
    key, epoch = previous.owner.key, previous.epoch
    found: list[str] = []
    for record in await store.journal.records(run_id, after_seq=steal.seq):
        payload = record.payload if isinstance(record.payload, dict) else {}
        if (
            record.source_id == key
            or record.source_id.startswith(f"lease:{key}:")
            or payload.get("owner") == key
            or payload.get("epoch") == epoch
        ):
            found.append(f"journal {record.kind} from {record.source_id}: {payload}")
    stolen_epoch = steal.payload["epoch"] if isinstance(steal.payload, dict) else None
    for step in await store.steps.of_run(run_id):
        if step.epoch == epoch and step.recorded_at_ms >= steal.at_ms:
            found.append(f"step {step.key} recorded at epoch {epoch} after the steal")
    row = await store.runs.get(run_id)
    if row is not None and (row.epoch != stolen_epoch or row.owner == previous.owner):
        found.append(f"row left at epoch {row.epoch} owned by {row.owner}")
    return found
