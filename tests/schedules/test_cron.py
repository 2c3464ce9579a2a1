"""Next-tick arithmetic, pure: DST transitions, cadences vs fixed hours, validation, outages."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runfleet.store.cron import Cron, InvalidSchedule, iso

PARIS = ZoneInfo("Europe/Paris")


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def ticks(cron: Cron, start: str, end: str) -> list[datetime]:
    """Every tick in [start, end) as Paris wall-clock datetimes (aware)."""
    found: list[datetime] = []
    t = cron.next_after(ms(start) - 1)
    while t < ms(end):
        found.append(datetime.fromtimestamp(t / 1000, PARIS))
        t = cron.next_after(t)
    return found


def test_daily_0230_fires_once_on_the_spring_forward_day_shifted_by_the_gap() -> None:
    # 2026-03-29: Paris clocks jump from 02:00 CET to 03:00 CEST; 02:30 does not exist.
    daily = Cron("30 2 * * *", "Europe/Paris")
    fired = ticks(daily, "2026-03-28T00:00:00+01:00", "2026-03-31T00:00:00+02:00")
    assert [(t.day, t.hour, t.minute) for t in fired] == [(28, 2, 30), (29, 3, 30), (30, 2, 30)]
    assert [t.utcoffset() for t in fired] == [timedelta(hours=1)] + [timedelta(hours=2)] * 2


def test_daily_0230_fires_once_on_the_fall_back_day_at_its_first_occurrence() -> None:
    # 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    daily = Cron("30 2 * * *", "Europe/Paris")
    fired = ticks(daily, "2026-10-24T00:00:00+02:00", "2026-10-27T00:00:00+01:00")
    assert [(t.day, t.hour, t.minute) for t in fired] == [(24, 2, 30), (25, 2, 30), (26, 2, 30)]
    assert fired[1].utcoffset() == timedelta(hours=2)  # the first 02:30 (CEST), not the second
    assert [iso(int(t.timestamp() * 1000)) for t in fired] == [
        "2026-10-24T00:30:00Z",
        "2026-10-25T00:30:00Z",
        "2026-10-26T01:30:00Z",
    ]


def test_a_cadence_skips_the_missing_hour_and_keeps_real_time_through_the_repeated_one() -> None:
    every30 = Cron("*/30 * * * *", "Europe/Paris")
    spring = ticks(every30, "2026-03-29T01:00:00+01:00", "2026-03-29T04:00:00+02:00")
    assert [t.strftime("%H:%M%z") for t in spring] == [
        "01:00+0100", "01:30+0100", "03:00+0200", "03:30+0200",
    ]  # fmt: skip
    fall = ticks(every30, "2026-10-25T01:30:00+02:00", "2026-10-25T03:30:00+01:00")
    assert [t.strftime("%H:%M%z") for t in fall] == [
        "01:30+0200", "02:00+0200", "02:30+0200", "02:00+0100", "02:30+0100", "03:00+0100",
    ]  # fmt: skip
    gaps = {b.timestamp() - a.timestamp() for a, b in itertools.pairwise(fall)}
    assert gaps == {1800.0}  # every 30 real minutes, the repeated hour included


def test_fixed_hours_fire_once_in_the_repeated_hour() -> None:
    two_hourly = Cron("0 */2 * * *", "Europe/Paris")
    fall = ticks(two_hourly, "2026-10-25T00:00:00+02:00", "2026-10-25T05:00:00+01:00")
    assert [t.strftime("%H:%M%z") for t in fall] == ["00:00+0200", "02:00+0200", "04:00+0100"]


def test_ticks_strictly_increase_across_a_year_of_transitions() -> None:
    for expression in ("30 2 * * *", "*/20 * * * *", "0 1-3 * * *", "15 2 * * 0"):
        cron = Cron(expression, "Europe/Paris")
        t = ms("2026-01-01T00:00:00+00:00")
        for _ in range(400):
            following = cron.next_after(t)
            assert following > t
            t = following


def test_seconds_field_first_and_utc_default() -> None:
    every_second = Cron("* * * * * *")
    assert every_second.timezone == "UTC"
    start = ms("2026-06-01T12:00:00+00:00")
    assert every_second.next_after(start) == start + 1000
    assert Cron("*/15 * * * * *").next_after(start) == start + 15_000
    assert Cron("@hourly", "Asia/Kolkata").next_after(start) == ms("2026-06-01T12:30:00+00:00")


def test_due_keeps_the_latest_and_counts_all() -> None:
    cron = Cron("* * * * * *")
    start = ms("2026-06-01T12:00:00+00:00")
    due = cron.due(start, start + 9_500, keep=3)
    assert due.ticks == [start + 7000, start + 8000, start + 9000]
    assert due.count == 10 and due.next_tick_ms == start + 10_000 and due.exact


def test_due_after_a_very_long_outage_jumps_instead_of_walking_every_tick() -> None:
    cron = Cron("* * * * * *")
    start = ms("2026-06-01T00:00:00+00:00")
    now = start + 30 * 86_400_000  # 30 days of one-second ticks: 2.6 million
    due = cron.due(start, now, keep=4)
    assert due.ticks == [now - 3000, now - 2000, now - 1000, now]
    assert due.next_tick_ms == now + 1000
    assert not due.exact and abs(due.count - 30 * 86_400 - 1) <= 10


@pytest.mark.parametrize(
    ("expression", "timezone", "field", "words"),
    [
        ("61 * * * *", "UTC", "schedule", "not a cron expression"),
        ("* * *", "UTC", "schedule", "3 field(s)"),
        ("", "UTC", "schedule", "must be a cron expression"),
        ("0 0 31 2 *", "UTC", "schedule", "never fires"),
        ("* * * * *", "Europe/Pariss", "timezone", "not a known IANA time zone"),
        ("* * * * *", "../../etc/passwd", "timezone", "not a known IANA time zone"),
        ("* * * * *", "", "timezone", "IANA time zone name"),
    ],
)
def test_bad_expressions_and_zones_are_typed_errors(
    expression: str, timezone: str, field: str, words: str
) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        Cron(expression, timezone)
    assert caught.value.field == field and words in str(caught.value)
    assert isinstance(caught.value, ValueError)  # an InvalidInput, as every caller error


def test_iso_names_ticks_in_utc() -> None:
    assert iso(ms("2026-03-29T03:30:00+02:00")) == "2026-03-29T01:30:00Z"
    assert (
        iso(1_000_000_000_123)
        == datetime.fromtimestamp(1e9, UTC).isoformat().replace("+00:00", "") + ".123Z"
    )


ZONES = ["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "UTC"]


@settings(max_examples=25, deadline=None)
@given(
    hour=st.integers(0, 23),
    minute=st.sampled_from([0, 15, 30, 45]),
    zone=st.sampled_from(ZONES),
)
def test_a_daily_time_fires_exactly_once_every_local_day_of_the_year(
    hour: int, minute: int, zone: str
) -> None:
    """Lord Howe shifts by 30 minutes, Santiago at midnight: any daily wall time, in any
    of these zones, fires on every local calendar day of 2026 and never twice on one."""
    cron = Cron(f"{minute} {hour} * * *", zone)
    tz = ZoneInfo(zone)
    start = datetime(2026, 1, 1, tzinfo=tz)
    t = int(start.timestamp() * 1000) - 1
    days = []
    for _ in range(365):
        t = cron.next_after(t)
        days.append(datetime.fromtimestamp(t / 1000, tz).date())
    assert days == [start.date() + timedelta(days=n) for n in range(365)]
