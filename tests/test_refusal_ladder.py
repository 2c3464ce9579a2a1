"""The steal-refusal ladder: doubling and capped per lease, and bounded in memory."""

from __future__ import annotations

from runfleet.worker.evidence import RefusalLadder


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ladder_doubles_caps_and_restarts_on_a_new_lease() -> None:
    clock = Clock()
    ladder = RefusalLadder(1.0, 5.0, clock=clock)
    assert ladder.due("r", 100)
    assert [ladder.refused("r", 100) for _ in range(4)] == [2.0, 4.0, 5.0, 5.0]
    assert not ladder.due("r", 100)
    clock.now += 5.0
    assert ladder.due("r", 100)
    assert ladder.refused("r", 200) == 2.0, "a later stall is a new lease: bottom rung"
    ladder.forget("r")
    assert ladder.due("r", 200) and len(ladder) == 0


def test_ladder_is_bounded_rows_that_left_the_stale_window_are_dropped() -> None:
    clock = Clock()
    ladder = RefusalLadder(1.0, 5.0, forget_after=30.0, clock=clock)
    for i in range(500):  # refused once, then renewed / stolen elsewhere: never driven here again
        ladder.refused(f"gone-{i}", 1)
    clock.now += 10.0
    for _ in range(10):  # still stale and vouched for: the sweep keeps driving it
        clock.now += 5.0
        ladder.refused("kept", 7)
    assert len(ladder) == 1, "rungs nobody consulted past forget_after are gone"
    assert not ladder.due("kept", 7), "the live rung kept its place on the ladder"

    capped = RefusalLadder(1.0, 5.0, max_rungs=100, clock=clock)
    for i in range(1000):
        capped.refused(f"r{i}", 1)
    assert len(capped) <= 100
    assert not capped.due("r999", 1), "the newest refusals are the ones kept"
