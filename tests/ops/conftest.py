"""CLI harness: the real ``runfleet`` typer app against the session's real services.

Commands run in ``typer.testing.CliRunner`` with ``RUNFLEET_*`` taken from the test's
settings (its own database and Redis prefix), in a worker thread because each
command runs its own event loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from runfleet.ops.cli.app import app
from runfleet.store.config import Settings


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str
    exception: BaseException | None

    @property
    def clean(self) -> bool:
        """Ended through an exit, not a stray exception (a traceback a user would see)."""
        return self.exception is None or isinstance(self.exception, SystemExit)


Cli = Callable[..., Awaitable[CliResult]]


def cli_env(settings: Settings) -> dict[str, str]:
    env = {f"RUNFLEET_{k.upper()}": str(v) for k, v in settings.model_dump().items()}
    env["COLUMNS"] = "400"  # rich wraps tables to the terminal width; keep rows whole
    return env


async def invoke(env: dict[str, str], *args: str) -> CliResult:
    runner = CliRunner()
    result = await asyncio.to_thread(runner.invoke, app, list(args), env=env)
    return CliResult(result.exit_code, result.stdout, result.stderr, result.exception)


@pytest.fixture
def cli(settings: Settings) -> Cli:
    env = cli_env(settings)

    async def run(*args: str, **overrides: str) -> CliResult:
        extra = {f"RUNFLEET_{k.upper()}": v for k, v in overrides.items()}
        return await invoke({**env, **extra}, *args)

    return run
