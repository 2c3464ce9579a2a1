"""What the fleet and flows benchmarks share: servers, worker processes, percentiles, RSS.

Workers are real ``python -m ops worker`` processes configured only through ``RUNFLEET_*``
environment variables built from one ``Settings`` (as the fleet tests start them), so
a benchmark measures exactly what an operator would run.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runfleet.broker.client import connect
from runfleet.broker.liveness import Liveness
from runfleet.ops.bench.scratch import BenchError
from runfleet.store.config import Settings

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Servers:
    """An admin Postgres URL (CREATEDB rights) and a Redis URL on this machine."""

    database_url: str
    redis_url: str
    database_given: bool = False
    """The user named the Postgres server: its settings are never changed by the bench."""


@contextmanager
def servers(database_url: str | None, redis_url: str | None) -> Iterator[Servers]:
    """Explicit URLs, else ``RUNFLEET_DATABASE_URL``/``RUNFLEET_REDIS_URL``, else throwaways.

    Throwaway servers (``ops.servers.resolve.resolve("app")``) are stopped on the way out.
    """
    db = database_url or os.environ.get("RUNFLEET_DATABASE_URL")
    rd = redis_url or os.environ.get("RUNFLEET_REDIS_URL")
    if db and rd:
        yield Servers(db, rd, database_given=True)
        return
    from runfleet.ops.servers.resolve import ServicesUnavailable, resolve

    try:
        endpoints = resolve("app")
    except ServicesUnavailable as exc:
        raise BenchError(str(exc)) from exc
    try:
        yield Servers(
            db or endpoints.database_url, rd or endpoints.redis_url, database_given=bool(db)
        )
    finally:
        endpoints.close()


def bench_prefix(kind: str) -> str:
    """A Redis key prefix no other run of any benchmark shares."""
    return f"rf-bench-{kind}-{secrets.token_hex(4)}"


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def settings_env(settings: Settings, **overrides: object) -> dict[str, str]:
    values = {f"RUNFLEET_{k.upper()}": str(v) for k, v in settings.model_dump().items()}
    values.update({f"RUNFLEET_{k.upper()}": str(v) for k, v in overrides.items()})
    return python_env(values)


class Proc:
    """A child process logging to a temp file; ``close()`` kills it if still running."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="rf-bench-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            list(argv), env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> None:
        """SIGTERM (graceful stop), SIGKILL if it is still there after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.kill()
        self._log.close()
        self.log_path.unlink(missing_ok=True)


def runfleet_worker(
    settings: Settings,
    *,
    flows: str,
    queues: str,
    concurrency: int,
    **overrides: object,
) -> Proc:
    """One ``python -m ops worker`` process (its own owner identity)."""
    argv = [
        sys.executable, "-m", "runfleet.ops", "worker", "--flows", flows, "--queues", queues,
        "--concurrency", str(concurrency), "--log-level", "WARNING",
    ]  # fmt: skip
    return Proc(argv, settings_env(settings, **overrides))


async def wait_workers_started(settings: Settings, procs: Sequence[Proc], timeout: float) -> None:
    """Until every process has written its liveness key (it is reading its queues)."""
    redis = connect(settings)
    liveness = Liveness(redis, settings.redis_prefix, settings.host_id)
    wanted = {p.pid for p in procs}
    deadline = time.monotonic() + timeout
    try:
        while True:
            for proc in procs:
                if proc.proc.poll() is not None:
                    raise BenchError(f"worker {proc.pid} exited:\n{proc.tail()}")
            if wanted <= {m.pid for m in await liveness.fleet()}:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"workers {sorted(wanted)} did not start in {timeout:.0f}s")
            await asyncio.sleep(0.05)
    finally:
        await redis.aclose()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (inclusive method); 0 for no values."""
    if not values:
        return 0.0
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident set (``VmRSS``) or peak (``VmHWM``) in MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"/proc/{pid}/status has no {field}")


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")
