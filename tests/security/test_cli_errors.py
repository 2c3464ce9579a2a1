"""Errors are printed literally, and odd numbers are refused by name.

An error message is text, never rich markup: a ``[...]`` in it (an install hint, a run
id a tenant chose) must print as typed. A duration or count past what the CLI can
hold is a usage error (exit 2) naming the option and its limit, never a traceback.
"""

from __future__ import annotations

import sys

import pytest

from runfleet.store.roles import GroupRole
from tests.ops.conftest import Cli, CliResult, cli_env, invoke
from tests.security.conftest import MakeLogin

HUGE_DAYS = "99999999999999999999999d"
"""The issue's reproduction: 8.6e30 ms, past any timestamp (an OverflowError once)."""
INFINITE = "9" * 400 + "s"
"""A float() of it is infinity (``int(inf)`` raised OverflowError)."""


@pytest.fixture
async def cli(login: MakeLogin) -> Cli:
    """The real CLI as an operator login (read-only, scope s1) would run it."""
    env = cli_env((await login(GroupRole.OPERATOR, "s1")).settings)

    async def run(*args: str, **overrides: str) -> CliResult:
        extra = {f"RUNFLEET_{k.upper()}": v for k, v in overrides.items()}
        return await invoke({**env, **extra}, *args)

    return run


def _error_line(out: CliResult) -> str:
    """The one line of a refusal that says what is wrong (typer frames usage errors)."""
    assert out.clean, f"raised {out.exception!r}"
    assert "Traceback" not in out.stdout + out.stderr
    said = [
        line
        for line in out.stderr.splitlines()
        if "Invalid value" in line or line.startswith("error:")
    ]
    assert said, out.stderr
    return said[-1]


async def test_error_messages_are_printed_literally(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = await cli("show", "[red]gone[/red] :warning:")
    assert missing.code == 1, missing
    assert missing.stderr.strip() == "error: no run with id '[red]gone[/red] :warning:'"

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # the dashboard extra not installed
    no_extra = await cli("dashboard")
    assert no_extra.code == 1 and no_extra.clean, no_extra
    assert no_extra.stderr.strip() == (
        "error: the dashboard needs its extra (uvicorn is missing): "
        "pip install 'runfleet[dashboard]'"
    )


@pytest.mark.parametrize(
    ("argv", "option", "limit"),
    [
        (["prune", "--settled-before", HUGE_DAYS], "--settled-before", "36500d"),
        (["prune", "--settled-before", INFINITE], "--settled-before", "36500d"),
        (["prune", "--settled-before", "0001-01-01"], "--settled-before", "year"),
        (
            ["prune", "--settled-before", "1d", "--consumer-idle", HUGE_DAYS],
            "--consumer-idle",
            "36500d",
        ),
        (["runs", "--since", HUGE_DAYS], "--since", "36500d"),
        (["stuck", "--pending-for", INFINITE], "--pending-for", "36500d"),
        (["stuck", "--overdue", "soon"], "--overdue", "90s"),
        (["stuck", "--reactivated-over", str(10**30)], "--reactivated-over", "1000000"),
        (["runs", "--limit", str(10**30)], "--limit", "10000"),
        (
            [
                "schedule",
                "add",
                "s",
                "--flow",
                "f",
                "--cron",
                "* * * * *",
                "--catch-up",
                str(10**30),
            ],
            "--catch-up",
            "100000",
        ),
        (["worker", "--concurrency", str(10**30)], "--concurrency", "10000"),
        (["worker", "--processes", str(10**30)], "--processes", "256"),
        (["worker", "--metrics-port", "70000"], "--metrics-port", "65535"),
    ],
)
async def test_odd_durations_and_counts_are_refused_by_name(
    cli: Cli, argv: list[str], option: str, limit: str
) -> None:
    out = await cli(*argv)
    line = _error_line(out)
    assert out.code == 2, out
    assert f"'{option}'" in line and limit in line, line


async def test_a_duration_setting_past_its_limit_is_named(cli: Cli) -> None:
    """RUNFLEET_RETENTION reads the CLI's durations: the same limit, one line (exit 1)."""
    out = await cli("runs", retention=INFINITE)
    assert out.code == 1, out
    assert _error_line(out).startswith("error: bad setting RUNFLEET_RETENTION:"), out.stderr
    assert "36500d" in out.stderr
