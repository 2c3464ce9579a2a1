"""The wake-mark rule (``worker.wake_marks``): a run is lost only when no reader will
still deliver its message, whatever its age.

Samples are built by hand here (the rule is arithmetic over positions); the fleet tests
(tests/fleet/test_backlog_wakes.py) read them from a real Redis under real workers.
"""

from __future__ import annotations

from runfleet.broker.streams import ZERO_ID, EntryId, Lane, LanePosition
from runfleet.worker.wake_marks import MAX_SAMPLES, MarkBook, Sample, covers

GRACE = 1000


def at(
    ms: int, written: int, delivered: int | None, recovery: int = 0, first: int | None = 1
) -> Sample:
    """A sample at database time ``ms``: the normal lane written/delivered up to those
    entry ids (their ms part) and still holding every entry from ``first`` (None: empty),
    the recovery lane written and delivered up to ``recovery``."""
    normal = LanePosition(
        EntryId(written) if written else ZERO_ID,
        None if delivered is None else (EntryId(delivered) if delivered else ZERO_ID),
        None if first is None or not written else EntryId(first),
    )
    rec = EntryId(recovery) if recovery else ZERO_ID
    rec_first = EntryId(1) if recovery else None
    return Sample(ms, {Lane.NORMAL: normal, Lane.RECOVERY: LanePosition(rec, rec, rec_first)})


def book() -> MarkBook:
    return MarkBook(publish_grace_ms=GRACE, claim_grace_ms=GRACE)


def test_entry_ids_compare_as_numbers_not_text() -> None:
    assert EntryId.parse(b"10-0") > EntryId.parse("9-5")
    assert EntryId.parse("5-10") > EntryId.parse("5-9")
    assert EntryId.parse(None) == ZERO_ID
    assert str(EntryId.parse("17-3")) == "17-3"


def test_a_sample_is_covered_once_the_group_delivered_past_what_it_had_written() -> None:
    then = at(0, written=500, delivered=100)
    assert not covers(at(10, written=900, delivered=499), then)
    assert covers(at(10, written=900, delivered=500), then)


def test_a_recreated_or_deleted_stream_covers_what_it_held() -> None:
    then = at(0, written=500, delivered=100)
    assert covers(at(10, written=0, delivered=None), then)  # DEL, FLUSHALL: no stream
    assert covers(at(10, written=0, delivered=0), then)  # recreated empty with its group
    assert covers(at(10, written=300, delivered=0), then)  # recreated, ids from a slower clock


def test_a_stream_trimmed_past_what_it_held_covers_it_though_nothing_was_delivered() -> None:
    """XTRIM (or MAXLEN) removed the undelivered entries of an idle queue: the group's
    delivered id never moves again, yet no reader will deliver them."""
    then = at(0, written=500, delivered=100)
    assert covers(at(10, written=500, delivered=100, first=None), then)  # emptied
    assert covers(at(10, written=900, delivered=100, first=501), then)  # trimmed up to 500
    assert not covers(at(10, written=900, delivered=100, first=500), then)  # 500 still held
    assert not covers(at(10, written=900, delivered=100, first=101), then)


def test_a_stream_without_its_group_covers_nothing_it_still_holds() -> None:
    then = at(0, written=500, delivered=100)
    assert not covers(at(10, written=900, delivered=None), then)  # the group comes back at 0


def test_every_lane_must_be_covered() -> None:
    then = at(0, written=500, delivered=500, recovery=40)
    now = Sample(
        10,
        {
            Lane.NORMAL: LanePosition(EntryId(900), EntryId(900), EntryId(1)),
            Lane.RECOVERY: LanePosition(EntryId(40), EntryId(39), EntryId(1)),
        },
    )
    assert not covers(now, then)


def test_a_deep_backlog_the_readers_have_not_reached_gets_no_mark() -> None:
    """Admissions keep coming faster than the drain: no sample is ever covered, so no run
    of the backlog counts as lost, however long it has waited."""
    marks = book()
    delivered = 0
    for tick in range(200):
        delivered += 10  # the readers drain ten entries a tick
        sample = at(tick * 100, written=10_000 + tick * 20, delivered=delivered)
        assert marks.observe(sample) is None, tick
    assert marks.mark_ms is None


def test_the_mark_follows_the_readers_and_waits_out_the_claim_grace() -> None:
    marks = book()
    assert marks.observe(at(0, written=500, delivered=0)) is None
    assert marks.observe(at(500, written=800, delivered=500)) is None  # a witness too young
    # At 1500 the 500 ms reading is a settled witness: it covers the sample at 0.
    assert marks.observe(at(1500, written=900, delivered=600)) == 0 - GRACE
    assert marks.observe(at(2000, written=900, delivered=800)) is None  # same witness
    # At 3000 the 2000 ms witness delivered 800: the 500 ms sample (written 800) is covered.
    assert marks.observe(at(3000, written=900, delivered=900)) == 500 - GRACE
    assert marks.mark_ms == 500 - GRACE


def test_an_idle_queue_marks_up_to_both_graces_ago() -> None:
    """Everything written was delivered: the witness covers itself, one claim grace old."""
    marks = book()
    assert marks.observe(at(0, written=50, delivered=50)) is None
    assert marks.observe(at(GRACE, written=50, delivered=50)) == GRACE - GRACE - GRACE


def test_a_flush_mid_backlog_marks_everything_before_it() -> None:
    """FLUSHALL: the stream held 10,000 undelivered entries and now holds none."""
    marks = book()
    for tick in range(5):
        assert marks.observe(at(tick * 100, written=10_000, delivered=tick)) is None
    assert marks.observe(at(600, written=0, delivered=None)) is None  # too young to witness
    assert marks.observe(at(1600, written=0, delivered=0)) == 600 - GRACE


def test_the_mark_never_moves_back() -> None:
    marks = book()
    marks.observe(at(0, written=10, delivered=10))
    marks.observe(at(4000, written=10, delivered=10))
    assert marks.observe(at(5000, written=10, delivered=10)) == 4000 - GRACE
    # A later reading that can cover only an older sample says nothing.
    marks.samples[:] = [at(100, written=10, delivered=10)]
    assert marks.observe(at(5001, written=10, delivered=10)) is None
    assert marks.mark_ms == 4000 - GRACE


def test_a_long_history_is_thinned_not_grown() -> None:
    marks = book()
    for tick in range(3 * MAX_SAMPLES):
        marks.observe(at(tick, written=1_000_000, delivered=0))
    assert len(marks.samples) <= MAX_SAMPLES + 1
    assert marks.samples[-1].at_ms == 3 * MAX_SAMPLES - 1  # the newest is always kept
