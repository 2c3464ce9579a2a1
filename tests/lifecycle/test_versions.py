"""Flow versions with real worker processes of two deployments: a run waits for a worker
of its version, and ``ctx.patched`` replays an old history the old way."""

from __future__ import annotations

import signal

import pytest

import tests.lifecycle.versions_v1 as v1
import tests.lifecycle.versions_v2 as v2
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.errors import InvalidInput
from runfleet.store.types import RunStatus
from runfleet.worker import flow
from runfleet.worker.authoring.versions import code_version
from tests.fleet.procs import Spawn
from tests.flows.conftest import parked
from tests.ops.conftest import Cli
from tests.support.polling import until

V1, V2 = "tests.lifecycle.versions_v1", "tests.lifecycle.versions_v2"
pytestmark = pytest.mark.chaos


async def test_a_run_waits_for_a_worker_of_its_version(
    spawn: Spawn, queue: AsyncQueue, store: Store, cli: Cli
) -> None:
    b = spawn(flows=V2)
    await b.wait_started()
    run = await queue.enqueue(v1.strict)  # admitted with v1: B carries only v2
    assert (await store.runs.get(run.id)).state["flow_version"] == "v1"  # type: ignore[union-attr]  # the run exists: it was just enqueued
    await until(lambda: _logged(b.log(), "run.version_not_carried"), 30, "B to leave the run alone")
    row = await store.runs.get(run.id)
    assert row is not None and row.status is RunStatus.PENDING and row.epoch == 0
    text = (await cli("explain", run.id)).stdout
    assert "it waits for a worker of version 'v1'" in text
    # It names the live workers and the versions they carry: B carries only v2.
    assert "workers: no live worker of queue 'default' carries 'v1' (live: " in text
    assert f"pid {b.pid} carries 'v2')" in text
    a = spawn(flows=V1)
    await a.wait_started()
    assert await run.result(timeout=60) == a.pid
    fresh = await queue.enqueue(v2.strict)
    assert await fresh.result(timeout=60) == -b.pid


async def test_patched_replays_an_old_history_the_old_way(
    spawn: Spawn, queue: AsyncQueue, store: Store
) -> None:
    a = spawn(flows=V1)
    await a.wait_started()
    old = await queue.enqueue(v1.versioned, "g")
    await parked(store, old.id, "event", timeout=30)
    await queue.send(old.id, "go", 1)
    await until(
        lambda: _recorded(store, old.id),
        30,
        "v1 to record its first recv",
        accept=lambda kinds: kinds.count("recv") == 1,
    )
    await parked(store, old.id, "event", timeout=30)
    a.signal(signal.SIGTERM)  # the old deployment goes; its run waits on go2
    await a.wait_exit()
    b = spawn(flows=V2)
    await b.wait_started()
    new = await queue.enqueue(v2.versioned, "g")
    await queue.send(old.id, "go2", 2)
    result = await old.result(timeout=60)
    assert result["path"] == "old" and result["pid"] == b.pid
    assert "patch" not in await _recorded(store, old.id)
    await parked(store, new.id, "event", timeout=30)
    await queue.send(new.id, "go", 1)
    await queue.send(new.id, "go2", 2)
    assert (await new.result(timeout=60))["path"] == "new"
    assert (await _recorded(store, new.id))[:3] == ["step", "patch", "step"]


async def test_auto_versions_digest_the_code() -> None:
    async def body(ctx: object) -> int:
        return 1

    async def other(ctx: object) -> int:
        return 2

    assert code_version(body) != code_version(other)
    assert flow(name="lifecycle.auto", version="auto")(body).version == code_version(body)
    with pytest.raises(InvalidInput):
        flow(name="lifecycle.bad_version", version="")(body)


async def _recorded(store: Store, run_id: str) -> list[str]:
    return [r.kind for r in await store.steps.of_run(run_id)]


async def _logged(log: str, event: str) -> bool:
    return event in log


def test_a_versioned_flow_is_never_a_priority_look_ahead() -> None:
    """A claim's look-ahead (docs/how-to/queues.md) may take a fresh run of any flow runnable()
    names in a lower-priority run's place, before its version is read; so a versioned
    flow is left out, and its runs are decided by the path that checks the version."""
    from runfleet.worker.resolver import runnable

    assert v1.versioned.version == "v1"
    assert "lifecycle.versioned" not in runnable()
    assert "lifecycle.strict" not in runnable()

    @flow(name="lifecycle.unversioned_lookahead")
    async def plain(ctx: object) -> None: ...

    assert "lifecycle.unversioned_lookahead" in runnable()
