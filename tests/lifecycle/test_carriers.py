"""What a worker advertises it carries (``worker.carried``) and how ``explain`` names the
live workers from it (``ops.explain.carriers_text``), over a real run row."""

from __future__ import annotations

import json

import tests.lifecycle.tenants_all as tenants
import tests.lifecycle.versions_v1 as v1
from runfleet.broker.liveness import FleetMember
from runfleet.ops.explain.carriers_text import instance_lines, version_lines
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.worker import carried


def _member(pid: int, *, queues: tuple[str, ...] = ("default",), **info: str) -> FleetMember:
    return FleetMember(
        host="h",
        pid=pid,
        nonce=f"n{pid}",
        confirmed_ms=0,
        lapsed=False,
        started_ms=0,
        queues=queues,
        runs=0,
        ttl_ms=1000,
        info=dict(info),
    )


def test_a_worker_advertises_its_versions_and_instances_bounded() -> None:
    fields = carried.advertised()
    versions = carried.read(fields, "versions")
    assert versions["lifecycle.strict"][0] in ("v1", "v2")  # type: ignore[index]  # read() is loosely typed
    made = carried.read(fields, "instances")
    assert made is not None and {"acme", "globex"} <= set(made["lifecycle.tenant.welcome"])
    many = {f"flow-{i:04}": ["v" * 40] for i in range(500)}
    text, cut = carried._bounded(many)
    assert cut and text is not None and len(text) <= carried.LIMIT
    assert carried.read({"versions": "not json"}, "versions") is None
    assert carried.read({"versions": "[1]"}, "versions") is None


async def test_explain_names_who_carries_the_version_and_the_instance(
    queue: AsyncQueue, store: Store
) -> None:
    run = await queue.enqueue(v1.strict)  # no worker here: it stays pending
    row = await store.runs.get(run.id)
    assert row is not None
    taker = _member(1, versions=json.dumps({"lifecycle.strict": ["v2", "v1"]}))
    other = _member(2, versions=json.dumps({"lifecycle.strict": ["v2"]}))
    elsewhere = _member(3, queues=("other",), versions=json.dumps({"lifecycle.strict": ["v1"]}))
    lines = version_lines(row, [taker, other, elsewhere])
    assert lines[1] == "workers: h pid 1 carries 'v2', 'v1' — they take it."
    lines = version_lines(row, [other, elsewhere])  # pid 3 does not serve the run's queue
    assert (
        lines[1]
        == "workers: no live worker of queue 'default' carries 'v1' (live: h pid 2 carries 'v2')."
    )
    assert version_lines(row, None)[1].startswith("workers: which live workers carry it is unknown")

    bound = await queue.enqueue(tenants.ACME.welcome, "/dev/null", "x", 0)
    brow = await store.runs.get(bound.id)
    assert brow is not None
    has = _member(4, instances=json.dumps({"lifecycle.tenant.welcome": ["acme", "globex"]}))
    lacks = _member(5, instances=json.dumps({"lifecycle.tenant.welcome": ["globex"]}))
    assert (
        instance_lines(brow, [has, lacks])[1]
        == "workers: h pid 4 has 'acme', 'globex' — they run it if its scopes allow."
    )
    assert instance_lines(brow, [lacks])[1] == (
        "workers: no live worker has instance 'acme' — it waits for one "
        "(live: h pid 5 has 'globex')."
    )
