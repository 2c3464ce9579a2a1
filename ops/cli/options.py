"""What the CLI's durations, times and counts accept: a value, or a refusal naming the limit.

Typer parses each option before the command runs (``parser=`` for durations and times,
``min``/``max`` for counts), so a value past what the command can hold — a duration
past a century, a count past what a store column or a host's process table holds — is
a usage error (exit 2) whose one sentence names the option and its limit, as typer
refuses ``--limit 0``: never a traceback from deep inside (``prune --settled-before
99999999999999999999999d`` once ended in an OverflowError). The dashboard reads its
filters with the same functions; there a refusal is ``UserError``, a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import typer

from runfleet.store.config import MAX_DURATION_DAYS, DurationTooLong
from runfleet.store.config import parse_duration_ms as _duration_ms
from runfleet.store.errors import RunfleetError

LIST_MAX = 10_000
"""Rows one listing reads (``runs --limit``, ``stuck --limit``)."""
BATCH_MAX = 100_000
"""Runs per ``prune`` batch: one short transaction."""
RESTARTS_MAX = 1_000_000
"""``stuck --reactivated-over``: no run is restarted more often than this and still runs."""
CATCH_UP_MAX = 100_000
"""Missed ticks a schedule admits at once (``schedule add --catch-up``)."""
CONCURRENCY_MAX = 10_000
"""Runs in flight in one worker process."""
PROCESSES_MAX = 256
"""Worker processes one supervisor starts."""
PORT_MAX = 65_535


class UserError(RunfleetError):
    """A mistake in what the user typed (bad JSON, bad duration): message says which."""


@dataclass(frozen=True)
class Since:
    """A lower bound on a time as typed: ``ms`` back from database-now when ``relative``
    (a duration), else the epoch milliseconds of an ISO 8601 time."""

    ms: int
    relative: bool

    def bound_ms(self, now_ms: int) -> int:
        return now_ms - self.ms if self.relative else self.ms


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "…"


def duration_ms(text: str) -> int:
    """``90s``, ``15m``, ``2h``, ``1d`` (a bare number is seconds), at most a century; the
    grammar is ``store.config.parse_duration_ms``, shared with RUNFLEET_RETENTION."""
    try:
        return _duration_ms(text)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def since(text: str) -> Since:
    """A duration back from now, or an ISO 8601 time (local time when it names no zone)."""
    try:
        return Since(_duration_ms(text), relative=True)
    except DurationTooLong as exc:
        raise UserError(str(exc)) from None
    except ValueError:
        pass  # not a duration: an ISO time?
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"{_shown(text)} is neither a duration (15m, 2h, 30d; at most {MAX_DURATION_DAYS}d) "
            "nor an ISO 8601 time"
        ) from None
    try:
        if when.tzinfo is None:
            when = when.astimezone()
        return Since(int(when.astimezone(UTC).timestamp() * 1000), relative=False)
    except (OverflowError, OSError, ValueError):  # year 1 in a zone east of UTC, ...
        raise UserError(
            f"{_shown(text)} is out of range: an ISO time between the years 1 and 9999 UTC"
        ) from None


def duration_option(value: str | int) -> int:
    """``parser=`` of a duration option: milliseconds (a default in ms passes as it is)."""
    if isinstance(value, int):
        return value
    try:
        return duration_ms(value)
    except UserError as exc:
        raise typer.BadParameter(str(exc)) from None


def since_option(value: str | Since) -> Since:
    """``parser=`` of a time-bound option (``--since``, ``--settled-before``)."""
    if isinstance(value, Since):
        return value
    try:
        return since(value)
    except UserError as exc:
        raise typer.BadParameter(str(exc)) from None
