"""Cron expressions in a time zone: validation, and the next tick as an instant, DST-safe.

A schedule fires on *wall-clock* times of its time zone (``30 2 * * *`` is 02:30 in
Paris whatever the offset), but ticks are stored and compared as instants (UTC
milliseconds, database time), so every worker agrees on them. Wall time and instants
disagree twice a year, and the rule for those hours is the one Vixie cron follows:

- A wall time that does not exist (spring forward, 02:00–03:00 in Paris): a schedule
  whose hour field is a wildcard (``*/5 * * * *``: a cadence) skips it, the clock never
  showed it; a schedule with fixed hours (``30 2 * * *``) fires once, shifted forward by
  the gap (02:30 → 03:30 CEST), so a daily job still runs that day.
- A wall time that occurs twice (fall back, 02:00–03:00 again): a cadence fires at both
  (every five minutes stays every five real minutes); a fixed-hour schedule fires once,
  at the first occurrence.

Ticks are strictly increasing instants: two wall times that map to one instant fire once.
Expressions have 5 fields, or 6 with seconds *first* (``*/1 * * * * *``, as Quartz and
Spring write them), or an alias (``@hourly``, ``@daily``...). croniter does the calendar
arithmetic on naive wall times (no time zone, so no DST bugs of its own); this module
maps them to instants.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# croniter ships no type information (no py.typed, no stubs package installed): the two
# names used here are wrapped in typed methods below.
from croniter import CroniterError, croniter  # type: ignore[import-untyped]  # croniter ships no type information (see above)

from runfleet.store.errors import InvalidInput

_WINDOW = timedelta(hours=3)
"""Offsets are sampled this far either side of an instant: wider than any real DST shift."""
_MAX_WALK = 256
"""Due ticks enumerated one by one at most (~40 ms of CPU on the worker's event loop);
beyond, the walk jumps ahead (see ``due``)."""


class InvalidSchedule(InvalidInput):
    """A cron expression or time zone that cannot be scheduled; ``field`` says which."""


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise InvalidSchedule("timezone", "must be an IANA time zone name such as 'Europe/Paris'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(
            "timezone", f"{name!r} is not a known IANA time zone (e.g. 'Europe/Paris', 'UTC')"
        ) from None


@dataclass(frozen=True)
class Cron:
    """A validated cron expression in a time zone; ``next_after`` gives the next tick."""

    expression: str
    timezone: str = "UTC"
    tz: ZoneInfo = field(init=False, repr=False, compare=False)
    cadence: bool = field(init=False, repr=False, compare=False)
    """Hour field is a wildcard: fires at repeated wall times, skips missing ones."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tz", _zone(self.timezone))
        text = self.expression.strip() if isinstance(self.expression, str) else ""
        if not text:
            raise InvalidSchedule("schedule", "must be a cron expression such as '*/5 * * * *'")
        if not text.startswith("@") and len(text.split()) not in (5, 6):
            raise InvalidSchedule(
                "schedule",
                f"{text!r} has {len(text.split())} field(s): use 5 (minute hour day month weekday)"
                " or 6 (seconds first)",
            )
        try:
            probe = self._iter(text, datetime(2000, 1, 1))
        except (CroniterError, ValueError, KeyError, TypeError) as exc:
            raise InvalidSchedule("schedule", f"{text!r} is not a cron expression: {exc}") from None
        object.__setattr__(self, "expression", text)
        object.__setattr__(self, "cadence", probe.expanded[1] == ["*"])
        try:
            probe.get_next(datetime)  # e.g. '0 0 31 2 *' (31 February) never fires
        except (CroniterError, ValueError) as exc:
            raise InvalidSchedule("schedule", f"{text!r} never fires: {exc}") from None

    @staticmethod
    def _iter(expression: str, start: datetime) -> croniter:
        return croniter(expression, start, second_at_beginning=True, max_years_between_matches=50)

    def _instants(self, wall: datetime) -> list[datetime]:
        """The instants (UTC) one wall time of this zone fires at, by the rules above."""
        first = wall.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
        if first == second:
            return [first]
        if first.astimezone(self.tz).replace(tzinfo=None) == wall:  # occurs twice
            return [first, second] if self.cadence else [first]
        # Does not exist. fold=0 reads it with the offset from before the gap: the
        # instant the gap's length later (02:30 -> 03:30 CEST).
        return [] if self.cadence else [first]

    def _offsets(self, at: datetime) -> tuple[timedelta, timedelta]:
        samples = [
            (at + delta).astimezone(self.tz).utcoffset() or timedelta(0)
            for delta in (-_WINDOW, timedelta(0), _WINDOW)
        ]
        return min(samples), max(samples)

    def next_after(self, after_ms: int) -> int:
        """The first tick strictly after ``after_ms`` (UTC ms), in UTC ms.

        Wall times are walked in order from the earliest one that could map after
        ``after`` (its wall time under the smallest offset nearby). Away from a DST
        change instants grow with wall time and the first candidate wins; within a few
        hours of one, candidates are walked until no later wall time could map earlier.
        """
        after = datetime.fromtimestamp(after_ms / 1000, UTC)
        low, high = self._offsets(after)
        start = (after + low).replace(tzinfo=None)
        walk = self._iter(self.expression, start - timedelta(microseconds=1))
        best: datetime | None = None
        while True:
            wall: datetime = walk.get_next(datetime)
            if best is not None and wall - high >= best.replace(tzinfo=None):
                break  # this wall time and every later one map to best or after
            for instant in self._instants(wall):
                if instant > after and (best is None or instant < best):
                    best = instant
            if best is not None and low == high:
                break
        return _ms(best)

    def due(self, next_tick_ms: int, now_ms: int, keep: int) -> Due:
        """Ticks from ``next_tick_ms`` (itself a tick) up to ``now_ms``: the latest ``keep``
        of them, how many there were, and the tick after ``now_ms``.

        After a long outage a one-second schedule has days of due ticks: past
        ``_MAX_WALK`` the walk jumps to ``keep`` periods before now and the count is
        extrapolated from the period it measured (``exact`` is then False).
        """
        latest: deque[int] = deque(maxlen=max(1, keep))
        tick, count, exact = next_tick_ms, 0, True
        while tick <= now_ms:
            latest.append(tick)
            count += 1
            following = self.next_after(tick)
            if count == _MAX_WALK:
                period = max(1, (following - next_tick_ms) // count)
                jump_from = now_ms - (keep + 2) * period
                if following < jump_from:
                    count += (jump_from - following) // period
                    following = self.next_after(jump_from)
                    exact = False
            tick = following
        return Due(ticks=list(latest), count=count, next_tick_ms=tick, exact=exact)


@dataclass(frozen=True)
class Due:
    ticks: list[int]
    """The latest due ticks, oldest first (at most the ``keep`` asked for)."""
    count: int
    """How many ticks were due in all (extrapolated when ``exact`` is False)."""
    next_tick_ms: int
    """The first tick after now: what the schedule's ``next_tick_ms`` advances to."""
    exact: bool


def _ms(instant: datetime) -> int:
    return round(instant.timestamp() * 1000)


def iso(ms: int) -> str:
    """A tick as the run id shows it: UTC, to the second (to the ms if it has any)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    spec = "milliseconds" if ms % 1000 else "seconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")
