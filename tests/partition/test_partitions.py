"""Multi-host partitions on network namespaces: one owner at a time, whatever the network does.

Hosts A and B are network namespaces with their own ``RUNFLEET_HOST_ID``; Postgres and
Redis listen on bridge addresses, and a cut takes a host's link to one of them down
(packets dropped silently, connections hang). The flow writes every step and every
stretch of body code to a side-effect ledger no cut can reach. Each scenario asserts,
from the journal and the ledger: no side effect by an old owner after the takeover
(except the documented SIGSTOP window), no steal when only Redis is lost, no run lost,
none settled twice, host B working again after the heal, and the partition -> takeover
time. Every property is evaluated before any is asserted, and the report is printed.
"""

from __future__ import annotations

import pytest

from tests.partition.cluster import Cluster
from tests.partition.net import Service
from tests.partition.scenario import Plan, Steals, run_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.partition, pytest.mark.timeout(150)]

BOTH = (Service.POSTGRES, Service.REDIS)
LONG = 30
"""Steps of 300 ms in the Redis-only plans: B's runs outlast the cut, so a wrong steal or
lapse (at stale_after, 3 s) has every chance to show."""

PLANS = {
    "full": Plan("full partition of host B", Steals.MUST, {"b": BOTH}, lapse_first=True),
    "redis_only": Plan(
        "Redis-only cut of host B", Steals.NEVER, {"b": (Service.REDIS,)}, steps=LONG
    ),
    "postgres_only": Plan(
        "Postgres-only cut of host B", Steals.MUST, {"b": (Service.POSTGRES,)}, lapse_first=True
    ),
    "redis_everywhere": Plan(
        "Redis cut for every host",
        Steals.NEVER,
        {"a": (Service.REDIS,), "b": (Service.REDIS,)},
        steps=LONG,
    ),
    "steps_in_flight": Plan(
        "Postgres+Redis cut of host B with long steps in flight, ledger reachable",
        Steals.MUST,
        {"b": BOTH},
        steps=2,
        step_ms=4500,
        strict=True,
        lapse_first=True,
    ),
    "sigstop": Plan("host B frozen by SIGSTOP, then SIGCONT", Steals.MUST, freeze=True),
}


async def judge(cluster: Cluster, key: str) -> None:
    verdict = await run_scenario(cluster, PLANS[key])
    cluster.keep_logs = bool(verdict.failed)
    report = verdict.report()
    if verdict.failed:
        logs = ", ".join(str(h.log_path) for h in cluster.hosts.values())
        report += f"\n   worker logs kept: {logs}"
    print(report)
    assert not verdict.failed, report


async def test_full_partition(cluster: Cluster) -> None:
    await judge(cluster, "full")


async def test_redis_only_partition_steals_nothing(cluster: Cluster) -> None:
    await judge(cluster, "redis_only")


async def test_postgres_only_partition(cluster: Cluster) -> None:
    await judge(cluster, "postgres_only")


async def test_redis_cut_for_every_host_steals_nothing(cluster: Cluster) -> None:
    await judge(cluster, "redis_everywhere")


async def test_no_side_effect_after_takeover_with_steps_in_flight(cluster: Cluster) -> None:
    await judge(cluster, "steps_in_flight")


async def test_frozen_host_writes_at_most_its_documented_window(cluster: Cluster) -> None:
    await judge(cluster, "sigstop")
