"""Retention prunes a concurrency key's row once no run of it is open and its per-key bucket
is full again (real Postgres); a key that comes back starts fresh, as a new key."""

from __future__ import annotations

from runfleet.ops.models import PruneResult
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.retention import Retention
from runfleet.store.types import Activated, NewRun, Owner, RunRow, RunStatus, Transitioned
from tests.ops.conftest import cli_env, invoke

FLOW = "tests.queues.flows:nap"
ME = Owner("host-a", 4242, "nonce-a")


async def admit(store: Store, run_id: str, tenant: str, queue: str) -> RunRow:
    created = await store.admission.create(
        NewRun(id=run_id, flow=FLOW, queue=queue, payload={"args": [1], "kwargs": {"t": tenant}})
    )
    return created.row


async def start_and_settle(store: Store, run_id: str) -> None:
    out = (await store.runs.claim_if_fresh(run_id, FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(out, Activated) and out.row.id == run_id, out
    done = await store.lifecycle.transition_owned(run_id, ME, out.row.epoch, RunStatus.COMPLETED)
    assert isinstance(done, Transitioned)


async def keys(store: Store, queue: str) -> dict[str, int]:
    return {k.key: k.last_start_ms for k in await store.queues.keys(queue, limit=1000)}


async def test_retention_prunes_keys_no_open_run_needs(store: Store, settings: Settings) -> None:
    await store.queues.set("rated", key_flow=(FLOW, "kwargs.t"), key_rate_per_s=0.2)
    await store.queues.set("plain", key_concurrency=1)  # the same flow's key, another queue
    await admit(store, "b0", "bolt", "rated")
    await start_and_settle(store, "b0")  # settled, but its bucket is 0.2/s from full
    await admit(store, "a0", "acme", "rated")  # stays pending: an open run
    for i in range(5):  # settled keys with no bucket: nothing worth keeping
        await admit(store, f"x{i}", f"x{i}", "plain")
        await start_and_settle(store, f"x{i}")
    await admit(store, "y0", "yak", "plain")
    out = (await store.runs.claim_if_fresh("y0", FLOW, ME, ahead_flows=[FLOW])).outcome
    assert isinstance(out, Activated)  # running: an open run
    retention = Retention(store.db)
    assert await retention.prune_keys(batch=2) == 5  # in batches of 2: a cursor walks them
    assert set(await keys(store, "rated")) == {"acme", "bolt"}
    assert set(await keys(store, "plain")) == {"yak"}
    assert await retention.prune_keys() == 0
    # A key that comes back starts fresh: a new row at the front of the turn, and it runs.
    await admit(store, "x0-again", "x0", "plain")
    assert (await keys(store, "plain"))["x0"] == 0
    await start_and_settle(store, "x0-again")
    # `runfleet prune` prunes them too (not in a dry run), and says how many.
    env = cli_env(settings)
    dry = await invoke(env, "prune", "--settled-before", "30d", "--dry-run", "--json")
    assert PruneResult.model_validate_json(dry.stdout).keys_pruned is None, dry
    real = await invoke(env, "prune", "--settled-before", "30d")
    assert "concurrency keys deleted: 1" in real.stdout, real  # x0, settled again
