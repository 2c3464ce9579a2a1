"""A fleet on a Patroni cluster loses its primary mid-run.

Synchronous replication (Patroni's ``synchronous_mode``): whether the primary's
Postgres alone is SIGKILLed (Patroni restarts it in place) or the whole node is
(the leader key expires and the synchronous standby is promoted), 0 lost, 0 settled
twice, 0 failed, no recorded step executed again, and no producer call raised
``Unavailable`` within its budget. Asynchronous replication: the same fleet, and what
the promoted standby never received is counted (tests/ha/harness.py), not assumed.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from runfleet.ops.cli.doctor import Doctor
from runfleet.ops.models import Check
from runfleet.store.config import Settings
from tests.ha.harness import Failover, run_failover
from tests.servers.patroni import PatroniCluster

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]  # a cluster per test, a failover each


LAG = 1.0
"""How far behind the standby is when the primary dies (its WAL senders paused)."""


def lose_lagging_node(cluster: PatroniCluster) -> tuple[float, str]:
    """The standby has received nothing for LAG seconds when the primary's node dies."""
    old = cluster.primary()
    old.pause_walsenders()
    time.sleep(LAG)
    killed_at = old.kill_node()
    return killed_at, cluster.wait_primary(60, other_than=old.member).member


def kill_postgres(cluster: PatroniCluster) -> tuple[float, str]:
    """SIGKILL the primary's Postgres alone: its Patroni restarts it, still primary."""
    old = cluster.primary()
    killed_at = old.kill_postgres()
    return killed_at, cluster.wait_primary(60).member


async def doctor(settings: Settings, url: str) -> dict[str, Check]:
    view = await Doctor(settings.model_copy(update={"database_url": url}), ["default"]).run()
    return {check.name: check for check in view.checks}


def assert_clean(outcome: Failover) -> None:
    print(f"failover outcome: {outcome}")
    assert outcome.lost == []
    assert outcome.statuses == Counter({"completed": outcome.admitted}), outcome.failures
    assert outcome.settled_twice == {}
    assert outcome.forgotten == []
    assert all(after >= 40.0 for after in outcome.unavailable_after), outcome.unavailable_after
    assert outcome.unavailable_after == []  # a failover fits in the budget
    assert outcome.in_flight_at_kill >= 150, "the kill did not land mid-run"
    assert outcome.first_claim_s is not None


async def test_sync_standby_promoted_when_the_primary_node_dies(
    settings: Settings, sync_cluster: PatroniCluster, ha_ledger_url: str
) -> None:
    """The standby lags LAG s when the node dies: with synchronous replication no commit
    was acknowledged in that time, so nothing is lost."""
    before = sync_cluster.primary().member
    seen = (await doctor(settings, sync_cluster.url()))["topology"]
    assert seen.status == "ok", seen
    assert "n1 sync streaming" in seen.detail and "waits for a synchronous standby" in seen.detail
    outcome = await run_failover(
        settings, sync_cluster, ha_ledger_url, lose_lagging_node, short_budget=(LAG + 1, 2.0)
    )
    assert outcome.promoted != before
    assert_clean(outcome)
    # A producer whose budget the failover outlasts raises Unavailable, and only past it.
    assert outcome.short_budget_after is not None
    assert 2.0 <= outcome.short_budget_after < 2.0 + 3.0, outcome.short_budget_after
    after = await doctor(settings, sync_cluster.url())
    assert after["topology"].detail.startswith("primary, no standby"), after["topology"]
    assert "timeline 2" in after["topology"].detail
    assert after["lost admissions"].status == "ok", after["lost admissions"]


async def test_sync_primary_postgres_sigkilled(
    settings: Settings, sync_cluster: PatroniCluster, ha_ledger_url: str
) -> None:
    outcome = await run_failover(settings, sync_cluster, ha_ledger_url, kill_postgres)
    assert_clean(outcome)


async def test_async_failover_loses_what_the_standby_never_received(
    settings: Settings, async_cluster: PatroniCluster, ha_ledger_url: str
) -> None:
    """Measured, not promised: the counts are printed; what must still hold is that
    nothing the survivor has is failed, stuck or settled twice."""
    before = async_cluster.primary().member
    seen = (await doctor(settings, async_cluster.url()))["topology"]
    assert seen.status == "warn" and "n1 async streaming" in seen.detail, seen
    assert "synchronous_standby_names" in seen.detail
    outcome = await run_failover(settings, async_cluster, ha_ledger_url, lose_lagging_node)
    print(
        f"async failover: {len(outcome.lost)} of {outcome.admitted} acknowledged admissions "
        f"lost, {len(outcome.forgotten)} recorded steps executed again"
    )
    print(f"failover outcome: {outcome}")
    assert outcome.promoted != before
    assert outcome.lost, "a standby LAG s behind lost nothing: the test proved nothing"
    assert set(outcome.statuses) == {"completed"}, outcome.failures
    assert outcome.settled_twice == {}
    assert outcome.unavailable_after == []
    lost = (await doctor(settings, async_cluster.url()))["lost admissions"]
    assert lost.status == "warn", lost
    assert lost.detail.startswith(f"{len(outcome.lost)} run(s) named by wakes"), lost
