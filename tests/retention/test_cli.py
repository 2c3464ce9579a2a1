"""``runfleet prune``: exact dry-run counts, real deletion, dead consumers, one-line errors."""

from __future__ import annotations

from redis.asyncio import Redis

import tests.retention.flows as flows
from runfleet.broker.keys import GROUP
from runfleet.broker.streams import Streams
from runfleet.ops.models import PruneResult
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.worker.process import Worker
from tests.ops.conftest import Cli
from tests.retention.test_prune import runs_by_status, wait_for


async def test_prune_dry_run_then_real(
    worker: Worker, queue: AsyncQueue, store: Store, cli: Cli, settings: Settings
) -> None:
    for i in range(5):
        await (await queue.enqueue(flows.leaf, i)).result(timeout=20)
    held = await queue.enqueue(flows.waits)
    await wait_for(store, lambda s: s.get(held.id) == "suspended", "the held run to park")
    before = await runs_by_status(store)

    dry = await cli("prune", "--settled-before", "0s", "--dry-run", "--batch", "2", "--json")
    assert dry.code == 0, dry.stderr
    counted = PruneResult.model_validate_json(dry.stdout)
    assert counted.dry_run and counted.runs == 5 and counted.journal > 0
    assert counted.consumers_pruned is None
    assert await runs_by_status(store) == before

    redis = Redis.from_url(settings.redis_url)
    key = Streams(redis, settings.redis_prefix).stream_key("default")
    await redis.xgroup_createconsumer(key, GROUP, "ghost:1:dead")
    try:
        real = await cli(
            "prune", "--settled-before", "0s", "--json",
            "--queues", "default", "--consumer-idle", "0s",
        )  # fmt: skip
        assert real.code == 0, real.stderr
        done = PruneResult.model_validate_json(real.stdout)
        assert not done.dry_run
        assert (done.runs, done.journal, done.steps) == (
            counted.runs, counted.journal, counted.steps,
        )  # fmt: skip
        assert done.consumers_pruned is not None and done.consumers_pruned >= 1
        names = [c["name"] for c in await redis.xinfo_consumers(key, GROUP)]
        assert b"ghost:1:dead" not in names
    finally:
        await redis.aclose()
    assert await runs_by_status(store) == {held.id: "suspended"}

    text = await cli("prune", "--settled-before", "30d")
    assert text.code == 0 and "deleted 0 run(s)" in text.stdout


async def test_prune_bad_duration_is_one_line(cli: Cli) -> None:
    bad = await cli("prune", "--settled-before", "soon")  # a usage error, as a missing one
    assert bad.code == 2 and bad.clean
    assert "Invalid value for '--settled-before'" in bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout
    missing = await cli("prune")
    assert missing.code == 2 and missing.clean
