"""``Takeover`` decision by decision against the real store: the exact staleness edge, who is
probed and when, what each outcome journals and counts. Other owners exist only as the
owner columns of their rows; the probe is a function the test answers.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from runfleet.broker.liveness import Probe
from runfleet.store import Kind, Store
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.types import Claimed, Owner, RunRow
from runfleet.worker.authoring.flows import flow
from runfleet.worker.outcomes import Decision, DriveOutcome
from runfleet.worker.takeover import UNKNOWN_PROBE, Takeover
from tests.seed_rules import flows as sr
from tests.store.helpers import create, db_now, make_running, must_get
from tests.support.polling import until

ME = Owner("host-me", 7001, "nonce-me")
THEM = Owner("host-them", 7002, "nonce-them")

assert sr.waiter  # registers the flows


class Probes:
    """A probe that answers ``answer`` (or raises ``fail``) and records who it was asked."""

    def __init__(self, answer: Probe = UNKNOWN_PROBE, fail: Exception | None = None) -> None:
        self.answer = answer
        self.fail = fail
        self.asked: list[tuple[Owner, int | None]] = []

    async def __call__(self, owner: Owner, heartbeat_at_ms: int | None) -> Probe:
        self.asked.append((owner, heartbeat_at_ms))
        if self.fail is not None:
            raise self.fail
        return self.answer


DEAD = Probe("dead", "cross-host-unreachable-stale", {"key": "absent"})
ALIVE = Probe("alive", "cross-host-key-fresh", {"key": "consistent"})


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def stale(store: Store, settings: Settings, run_id: str) -> RunRow:
    """The row once its lease is stale by database time (read again at that moment)."""
    row = await must_get(store, run_id)
    mark = row.heartbeat_at_ms if row.heartbeat_at_ms is not None else row.claimed_at_ms
    assert mark is not None
    await until(
        lambda: db_now(store),
        10.0,
        "the lease to turn stale by database time",
        accept=lambda now: now > mark + settings.stale_after_ms,
        every=0.002,
    )
    return await must_get(store, run_id)


async def records(store: Store, run_id: str, kind: str) -> list[dict[str, object]]:
    return [dict(r.payload) for r in await store.journal.records(run_id) if r.kind == kind]


async def test_a_lease_exactly_stale_after_old_is_still_fresh_and_nobody_is_probed(
    store: Store, settings: Settings
) -> None:
    row = await make_running(store, "r", THEM, flow="sr.waiter")
    assert row.heartbeat_at_ms is not None
    probes = Probes(DEAD)
    takeover = Takeover(store, ME, settings, probes)
    edge = replace(row, now_ms=row.heartbeat_at_ms + settings.stale_after_ms)
    assert await takeover.steal(edge, None) == Decision(DriveOutcome.HEARTBEAT_FRESH)
    assert probes.asked == []
    (refusal,) = await records(store, "r", Kind.STEAL_REFUSED_OWNER_ALIVE)
    assert refusal == {
        "evidence": "lease-fresh",
        "observer": ME.key,
        "heartbeat_at_ms": row.heartbeat_at_ms,
    }
    (address,) = [
        r.source_id
        for r in await store.journal.records("r")
        if r.kind == Kind.STEAL_REFUSED_OWNER_ALIVE
    ]
    assert address == (
        f"evidence:r:{THEM.key}:{row.heartbeat_at_ms}:"
        f"{Kind.STEAL_REFUSED_OWNER_ALIVE}:lease-fresh:{ME.key}"
    ), "addressed by the owner whose lease refused it"
    past = replace(row, now_ms=row.heartbeat_at_ms + settings.stale_after_ms + 1)
    # One ms later this process thinks it stale and asks the probe; the database, whose
    # clock decides, still finds the lease fresh: refused, nothing stolen.
    assert await takeover.steal(past, None) == Decision(DriveOutcome.HEARTBEAT_FRESH)
    assert probes.asked == [(THEM, row.heartbeat_at_ms)]
    assert (await must_get(store, "r")).owner == THEM


async def test_a_stale_lease_is_stolen_with_the_probes_evidence_counted_and_logged(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runfleet.worker.takeover")
    await make_running(store, "r", THEM, flow="sr.waiter")
    row = await stale(store, settings, "r")
    probes = Probes(DEAD)
    takeover = Takeover(store, ME, settings, probes)
    earlier = (row.heartbeat_at_ms or 0) - 1
    takeover.ladder.refused("r", earlier)  # a rung from a refusal of an earlier lease
    assert not takeover.ladder.due("r", earlier)
    before = sample("runfleet_steals_total", evidence="cross-host-unreachable-stale")
    decided = await takeover.steal(row, sr.waiter)
    outcome, activated = decided.outcome, decided.activation
    assert outcome == DriveOutcome.STOLEN
    assert activated is not None and activated.row.owner == ME
    assert activated.flow is sr.waiter, "executed as the flow it was decided with"
    assert activated.row.epoch == row.epoch + 1
    assert activated.row.recoveries == row.recoveries + 1, "a lost process: one recovery more"
    assert probes.asked == [(THEM, row.heartbeat_at_ms)]
    (steal,) = await records(store, "r", Kind.STOLEN_AND_ACTIVATED)
    assert steal["probe"] == "cross-host-unreachable-stale"
    assert steal["observer"] == ME.key
    assert steal["probe_detail"] == {"key": "absent"}
    assert steal["previous_owner"] == THEM.key
    assert sample("runfleet_steals_total", evidence="cross-host-unreachable-stale") == before + 1
    assert takeover.ladder.due("r", earlier), "the run's rung is forgotten once stolen"
    (line,) = [r for r in caplog.records if r.getMessage() == "run.stolen"]
    assert (line.__dict__["run_id"], line.__dict__["previous"], line.__dict__["evidence"]) == (
        "r",
        THEM.key,
        "cross-host-unreachable-stale",
    )


async def test_an_own_orphaned_run_is_taken_back_without_asking_the_probe(
    store: Store, settings: Settings
) -> None:
    await make_running(store, "r", ME, flow="sr.waiter")
    row = await stale(store, settings, "r")
    probes = Probes(ALIVE)  # would vouch for us: it must not be asked
    decided = await Takeover(store, ME, settings, probes).steal(row, None)
    outcome, activated = decided.outcome, decided.activation
    assert outcome == DriveOutcome.STOLEN and activated is not None
    assert activated.row.recoveries == row.recoveries, "taking back its own is no recovery"
    assert probes.asked == []
    (steal,) = await records(store, "r", Kind.STOLEN_AND_ACTIVATED)
    assert steal["probe"] == "self-orphaned"
    assert steal["probe_detail"] == {"pid": ME.pid}
    assert steal["observer"] == ME.key
    assert await records(store, "r", Kind.STEAL_REFUSED_OWNER_ALIVE) == []


async def test_a_vouched_for_owner_is_refused_with_the_probe_named_then_backed_off(
    store: Store, settings: Settings
) -> None:
    await make_running(store, "r", THEM, flow="sr.waiter")
    row = await stale(store, settings, "r")
    probes = Probes(ALIVE)
    takeover = Takeover(store, ME, settings, probes)
    before = sample("runfleet_steals_total", evidence="cross-host-key-fresh")
    assert await takeover.steal(row, None) == Decision(DriveOutcome.STEAL_REFUSED_OWNER_ALIVE)
    assert await takeover.steal(row, None) == Decision(DriveOutcome.STEAL_BACKOFF)
    assert len(probes.asked) == 1
    (refusal,) = await records(store, "r", Kind.STEAL_REFUSED_OWNER_ALIVE)
    assert refusal == {
        "evidence": "probe",
        "observer": ME.key,
        "heartbeat_at_ms": row.heartbeat_at_ms,
        "probe": "cross-host-key-fresh",
    }
    (address,) = [
        r.source_id
        for r in await store.journal.records("r")
        if r.kind == Kind.STEAL_REFUSED_OWNER_ALIVE
    ]
    assert address.startswith(f"evidence:r:{THEM.key}:{row.heartbeat_at_ms}:"), address
    assert (await must_get(store, "r")).owner == THEM
    assert sample("runfleet_steals_total", evidence="cross-host-key-fresh") == before


async def test_a_probe_that_fails_or_is_missing_is_unknown_and_the_lease_decides(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="runfleet.worker.takeover")
    for run_id, probe in (("raising", Probes(fail=ConnectionError("redis down"))), ("none", None)):
        await make_running(store, run_id, THEM, flow="sr.waiter")
        row = await stale(store, settings, run_id)
        decided = await Takeover(store, ME, settings, probe).steal(row, None)
        outcome, _ = decided.outcome, decided.activation
        assert outcome == DriveOutcome.STOLEN
        (steal,) = await records(store, run_id, Kind.STOLEN_AND_ACTIVATED)
        assert (steal["probe"], steal["probe_detail"]) == ("lease-expired", {})
    (line,) = [r for r in caplog.records if r.getMessage() == "probe.failed"]
    assert line.__dict__["owner"] == THEM.key


async def test_a_steal_that_lost_the_row_is_activation_lost_and_a_gone_row_not_found(
    store: Store, settings: Settings
) -> None:
    await make_running(store, "r", THEM, flow="sr.waiter")
    row = await stale(store, settings, "r")
    first = Takeover(store, ME, settings, Probes(DEAD))
    assert (await first.steal(row, None)).outcome == DriveOutcome.STOLEN
    late = Takeover(store, Owner("host-late", 7003, "nonce-late"), settings, Probes(DEAD))
    assert await late.steal(row, None) == Decision(DriveOutcome.ACTIVATION_LOST)
    (lost,) = await records(store, "r", "activation-lost")
    assert lost == {
        "observer": "host-late:7003:nonce-late",
        "outcome": "snapshot-changed",
        "expected_epoch": row.epoch,
    }
    ghost = replace(row, id="never-admitted")
    assert await late.steal(ghost, None) == Decision(DriveOutcome.NOT_FOUND)


async def test_a_stranded_claim_is_left_while_recent_or_vouched_for_then_recovered(
    store: Store, settings: Settings
) -> None:
    pending = await create(store, "c", flow="sr.waiter")
    claimed = await store.runs.claim("c", pending.snapshot, THEM)
    assert isinstance(claimed, Claimed)
    row = await must_get(store, "c")
    assert row.claimed_at_ms is not None
    probes = Probes(ALIVE)
    takeover = Takeover(store, ME, settings, probes)
    edge = replace(row, now_ms=row.claimed_at_ms + settings.stale_after_ms)
    assert await takeover.stranded_claim(edge) == DriveOutcome.CLAIM_PENDING
    assert probes.asked == []
    past = await stale(store, settings, "c")
    assert await takeover.stranded_claim(past) == DriveOutcome.CLAIMANT_ALIVE
    assert probes.asked == [(THEM, row.claimed_at_ms)]
    probes.answer = DEAD
    assert await takeover.stranded_claim(past) == DriveOutcome.CLAIM_RECOVERED
    (recovered,) = await records(store, "c", Kind.CLAIM_RECOVERED)
    assert recovered["probe"] == "cross-host-unreachable-stale"
    assert recovered["probe_detail"] == {"key": "absent"}
    assert recovered["claimant"] == THEM.key
    assert (await must_get(store, "c")).claim is None
    # The same (now cleared) claim recovered again: the row changed, the claim is lost.
    assert await takeover.stranded_claim(past) == DriveOutcome.CLAIM_LOST


async def test_a_steal_the_database_finds_fresh_journals_the_lease_it_found(
    store: Store, settings: Settings
) -> None:
    """This process judged the lease stale (a read whose time it misjudged); the steal
    statement, on database time, found it fresh: the refusal names the lease it saw."""
    row = await make_running(store, "r", THEM, flow="sr.waiter")
    assert row.heartbeat_at_ms is not None
    current = await must_get(store, "r")
    old_read = replace(row, now_ms=row.heartbeat_at_ms + settings.stale_after_ms + 1)
    takeover = Takeover(store, ME, settings, Probes(DEAD))
    assert await takeover.steal(old_read, None) == Decision(DriveOutcome.HEARTBEAT_FRESH)
    refusals = [
        r for r in await store.journal.records("r") if r.kind == Kind.STEAL_REFUSED_OWNER_ALIVE
    ]
    assert len(refusals) == 1
    assert refusals[0].payload == {
        "evidence": "lease-fresh",
        "observer": ME.key,
        "heartbeat_at_ms": current.heartbeat_at_ms,
    }
    assert refusals[0].source_id.startswith(f"evidence:r:{THEM.key}:{current.heartbeat_at_ms}:")


async def test_a_stale_run_at_its_recovery_limit_is_dead_lettered_counted_and_logged(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="runfleet.worker.takeover")
    strict = settings.model_copy(update={"max_recoveries": 0})
    limited = await Store.open(strict, min_size=1, max_size=2)
    try:
        await make_running(store, "poison", THEM, flow="sr.waiter")
        row = await stale(store, settings, "poison")
        takeover = Takeover(limited, ME, strict, Probes(DEAD))
        earlier = (row.heartbeat_at_ms or 0) - 1
        takeover.ladder.refused("poison", earlier)
        before = sample("runfleet_dead_lettered_total")
        assert await takeover.steal(row, None) == Decision(DriveOutcome.DEAD_LETTERED)
        assert sample("runfleet_dead_lettered_total") == before + 1
        assert takeover.ladder.due("poison", earlier), "its rung is forgotten once parked"
        parked = await must_get(store, "poison")
        assert parked.owner is None and parked.waiting is not None
        assert parked.waiting.reason.value == "dead"
        (line,) = [r for r in caplog.records if r.getMessage() == "run.dead_lettered"]
        assert line.__dict__["run_id"] == "poison" and line.__dict__["previous"] == THEM.key
        assert line.__dict__["recoveries"] == 0
        assert line.__dict__["lost_owners"] == [THEM.key]
    finally:
        await limited.close()


async def test_a_flows_own_recovery_limit_overrides_the_fleets_and_never_means_never(
    store: Store, settings: Settings
) -> None:
    """``@flow(max_recoveries=0)`` dead-letters at its first lost process though the fleet
    allows five; ``@flow(max_recoveries="never")`` is taken over though the fleet allows
    none; a bad limit is refused where the flow is declared."""
    strict = settings.model_copy(update={"max_recoveries": 0})
    limited = await Store.open(strict, min_size=1, max_size=2)
    try:
        for run_id in ("own-limit", "never"):
            await make_running(store, run_id, THEM, flow="sr.waiter")
        zero = replace(sr.waiter, max_recoveries=0)
        row = await stale(store, settings, "own-limit")
        lenient = Takeover(store, ME, settings, Probes(DEAD))  # the fleet's limit: 5
        assert await lenient.steal(row, zero) == Decision(DriveOutcome.DEAD_LETTERED)
        never = replace(sr.waiter, max_recoveries="never")
        row = await stale(store, settings, "never")
        takeover = Takeover(limited, ME, strict, Probes(DEAD))  # the fleet's limit: 0
        assert (await takeover.steal(row, never)).outcome is DriveOutcome.STOLEN
        stolen = await must_get(store, "never")
        assert stolen.owner == ME and stolen.recoveries == 1
    finally:
        await limited.close()
    with pytest.raises(InvalidInput, match="max_recoveries"):
        flow(name="t.bad_limit", max_recoveries=-1)(lambda ctx: None)
