"""``runfleet stuck`` lists runs whose body keeps being restarted, and ``explain`` says so.

A run that fails the same way at every attempt loops through takeovers: every one is a
fresh, healthy-looking lease, so no other ``stuck`` rule sees it. The takeovers here are
real fenced steals through the store (``stale_after_ms=0`` stands for "the lease went
stale"), exactly what the stale-running sweep does to such a run.
"""

from __future__ import annotations

import asyncio
import uuid

from runfleet.ops.models import Explanation, StuckView
from runfleet.store import Store
from runfleet.store import journal_records as jr
from runfleet.store.types import Activated, NewRun, Owner, RunRow, Stolen
from tests.ops.conftest import Cli

OWNERS = [Owner("host-a", 4_100_001, "aaaa00000001"), Owner("host-b", 4_100_002, "bbbb00000002")]


async def _taken_over(store: Store, times: int) -> RunRow:
    """A running run taken over ``times`` times, alternating between two owners."""
    run_id = f"loop-{uuid.uuid4().hex[:8]}"
    await store.admission.create(NewRun(id=run_id, flow="tests.forever", payload={"args": []}))
    row = await store.runs.get(run_id)
    assert row is not None
    activated = await store.runs.claim_and_activate(run_id, row.snapshot, OWNERS[0])
    assert isinstance(activated, Activated)
    row = activated.row
    for n in range(times):
        await asyncio.sleep(0.005)  # the lease must be older than 0 ms by database time
        stolen = await store.runs.steal(
            run_id,
            row.snapshot,
            OWNERS[(n + 1) % 2],
            jr.ProbeEvidence(probe="self-orphaned"),
            stale_after_ms=0,
        )
        assert isinstance(stolen, Stolen), stolen
        row = stolen.row
    assert row.epoch == times + 1
    return row


def _reactivated(view: StuckView) -> set[str]:
    return {i.run.id for i in view.items if i.kind == "reactivated-often"}


async def test_stuck_lists_reactivated_runs(store: Store, cli: Cli) -> None:
    looping = await _taken_over(store, 5)
    fine = await _taken_over(store, 2)

    raw = await cli("stuck", "--json")
    assert raw.code == 0 and raw.clean, raw
    view = StuckView.model_validate_json(raw.stdout)
    assert looping.id in _reactivated(view)
    assert fine.id not in _reactivated(view)  # two takeovers are what recovery looks like
    (item,) = [i for i in view.items if i.run.id == looping.id and i.kind == "reactivated-often"]
    assert "restarted 5 times (takeovers: 5, releases: 0; epoch 6)" in item.detail
    assert "run.drive_failed" in item.action

    # By kind: under load the fake owners' leases also turn stale (they have no liveness
    # key), and `stuck` rightly lists the runs for that too.
    stricter = StuckView.model_validate_json(
        (await cli("stuck", "--json", "--reactivated-over", "1")).stdout
    )
    assert {looping.id, fine.id} <= _reactivated(stricter)
    looser = StuckView.model_validate_json(
        (await cli("stuck", "--json", "--reactivated-over", "5")).stdout
    )
    assert looping.id not in _reactivated(looser)

    text = await cli("stuck")
    assert text.code == 0 and looping.id in text.stdout and "reactivated-often" in text.stdout

    explained = Explanation.model_validate_json((await cli("explain", looping.id, "--json")).stdout)
    (line,) = [x for x in explained.lines if x.startswith("restarts:")]
    assert "restarted 5 time(s)" in line and "`runfleet stuck` lists it" in line
    calm = Explanation.model_validate_json((await cli("explain", fine.id, "--json")).stdout)
    (line,) = [x for x in calm.lines if x.startswith("restarts:")]
    assert "restarted 2 time(s)" in line and "stuck" not in line
