"""The overview shows each configured queue's limits, slots in use and its keys' next turns
(page and JSON; docs/how-to/queues.md)."""

from __future__ import annotations

from runfleet.ops.dashboard.models import OverviewView
from runfleet.store import Store
from runfleet.store.types import NewRun
from tests.dashboard.conftest import Dash

FLOW = "tests.queues.flows:tenant_nap"


async def test_the_overview_lists_limits_and_keys(store: Store, dashboard: Dash) -> None:
    await store.queues.set(
        "tenants", concurrency=4, rate_per_s=2, key_flow=(FLOW, "kwargs.t"), key_concurrency=1
    )
    for i, tenant in enumerate(["acme", "acme", "bolt"]):
        await store.admission.create(
            NewRun(id=f"t{i}", flow=FLOW, queue="tenants",
                   payload={"args": [], "kwargs": {"t": tenant, "ms": 1}})
        )  # fmt: skip
    client = await dashboard()
    view = OverviewView.model_validate_json((await client.get("/api/overview")).text)
    (limits,) = view.limits
    assert (limits.name, limits.concurrency, limits.rate_per_s, limits.key_concurrency) == (
        "tenants",
        4,
        2.0,
        1,
    )
    assert sorted((k.key, k.waiting) for k in limits.keys) == [("acme", 2), ("bolt", 1)]
    page = (await client.get("/")).text
    assert "Queue limits" in page and "0 / 4" in page and "round-robin, 1 per key" in page
    assert "acme 0 / 2" in page, page
