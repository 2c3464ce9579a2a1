"""Random operation sequences from three owners over three runs, held to the reference model.

Claims (with current or stale snapshots), forced and default-threshold steals (a run stolen
``max_recoveries`` times in a row is parked dead instead), heartbeats,
guarded settlements, park/wake, suspensions through ``transition_owned``, cancel requests
and acknowledgements, plus races of the same operations on separate connections (claim x3,
steal x3, settle vs cancel, park vs cancel, suspend vs cancel). The database fixture is
shared by every example of a test, so each example works on fresh run ids and owners
instead of a fresh database.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runfleet.store import Store
from tests.store_model.driver import INTENTS, Driver, Intent

# Lengths drawn uniformly-ish (st.lists alone mostly yields a handful of steps, too few to
# reach the interesting states); shrinking still drives the length down to the minimum.
SEQUENCES = st.integers(1, 50).flatmap(lambda n: st.lists(INTENTS, min_size=n, max_size=n))


# Shrinking a failure replays many sequences and may take minutes; the suite's default
# timeout would fire inside the event loop mid-query, and hypothesis would take that
# interruption for one more failure. Hypothesis bounds its own shrinking (5 minutes).
@pytest.mark.timeout(600)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(intents=SEQUENCES)
# A cancel that lands on a running run: the settle must fail its guard, the ack must close it.
@example(
    intents=[
        Intent("claim", 0, 0, 0, True),
        Intent("cancel", 0, 0, 0, True),
        Intent("settle", 0, 0, 1, True),
        Intent("heartbeat", 0, 0, 0, True),
        Intent("ack", 0, 0, 1, True),
        Intent("cancel", 0, 0, 0, True),
    ]
)
# A run parked, woken and resumed by another owner, then stolen: every stale fence (an old
# owner's believed epoch, the current owner's previous epoch) is refused; then races.
@example(
    intents=[
        Intent("claim", 1, 0, 0, True),
        Intent("park", 1, 0, 0, True),
        Intent("claim", 1, 1, 0, True),  # still waiting: not claimable
        Intent("wake", 1, 0, 0, True),
        Intent("claim", 1, 1, 0, True),
        Intent("settle", 1, 0, 0, False),  # owner 0 with the epoch it last held
        Intent("settle", 1, 0, 1, False),  # the current owner with epoch - 1
        Intent("steal", 1, 2, 0, True),
        Intent("ack", 1, 1, 0, False),  # owner 1 with the epoch it last held
        Intent("race_claim", 1, 0, 0, True),
        Intent("race_steal", 1, 0, 0, True),
        Intent("race_cancel_settle", 1, 0, 0, True),
    ]
)
# A poison run: stolen MAX_RECOVERIES (5) times in a row, then three thieves race for it:
# exactly one parks it dead and the others lose (decided under the row lock); a wake and a
# new claim do not reset the count (the next steal buries it at once), a park does.
@example(
    intents=[
        Intent("claim", 2, 0, 0, True),
        *(Intent("steal", 2, i % 3, 0, True) for i in range(1, 6)),
        Intent("race_steal", 2, 0, 0, True),
        Intent("wake", 2, 0, 0, True),
        Intent("claim", 2, 1, 0, True),
        Intent("steal", 2, 2, 0, True),
        Intent("wake", 2, 0, 0, True),
        Intent("claim", 2, 1, 0, True),
        Intent("park", 2, 1, 0, True),
        Intent("wake", 2, 0, 0, True),
        Intent("claim", 2, 0, 0, True),
        Intent("steal", 2, 2, 0, True),
    ]
)
async def test_store_follows_the_model(store: Store, intents: list[Intent]) -> None:
    driver = Driver(store)
    await driver.start()
    for intent in intents:
        await driver.step(intent)
