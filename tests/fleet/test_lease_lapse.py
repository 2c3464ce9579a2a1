"""An owner alive in Redis but cut off from Postgres: refused, then lapsed, then moved."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

import tests.fleet.flows as flows
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from tests.fleet.procs import WorkerProc, records, running_on, writes_after_steal
from tests.fleet.tcpproxy import FreezableProxy
from tests.support.polling import until

pytestmark = pytest.mark.chaos


@pytest.fixture
async def proxy(settings: Settings) -> AsyncIterator[FreezableProxy]:
    parts = urlsplit(settings.database_url)
    proxy = await FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield proxy
    await proxy.close()


def via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{port}"
    return urlunsplit(parts._replace(netloc=netloc))


async def test_partitioned_owner_is_refused_then_lapses_and_the_run_moves(
    settings: Settings, store: Store, proxy: FreezableProxy
) -> None:
    # A reaches Postgres only through the proxy. Its stale_after is longer than the
    # observers' so that there is a window in which B sees A's lease as stale while A
    # has not yet lapsed: the window in which only the liveness probe stands between
    # B and a double execution.
    # A has one slot, which the run takes: A reads no stream while it runs, so every wake
    # B's stale sweep dispatches reaches B. With free slots A read them too, and acked each
    # at once (a wake for a run it is itself driving): B's sweep dispatched a wake every tick
    # while A, idle otherwise, won the read of each, until A lapsed and B stole without ever
    # having had the probe's refusal to make (a CI failure; about one run in ten here).
    a = WorkerProc(
        settings,
        database_url=via(settings.database_url, proxy.port),
        concurrency=1,
        stale_after=3.0,
    )
    b = None
    try:
        await a.wait_started()
        async with AsyncQueue("default", settings=settings) as queue:
            run = await queue.enqueue(flows.sleepy, 6000, "p")
            first = await until(lambda: running_on(store, run.id, a.pid), 10, "run on A")
            b = WorkerProc(settings)
            await b.wait_started()
            proxy.freeze()
            refusal = await until(
                lambda: records(store, run.id, "steal-refused-owner-alive"),
                10,
                "B to refuse the steal while A's key vouches for it",
            )
            stolen = await until(
                lambda: running_on(store, run.id, b.pid), 15, "B to take the run after A lapsed"
            )
            proxy.thaw()
            assert (await run.result(timeout=15))["pid"] == b.pid
        assert len(refusal) == 1
        assert refusal[0].payload["probe"] == "same-host-pid-alive"
        # Still exactly one probe refusal by B: repeats at the same lease are duplicates.
        # (A, reconnected after its lapse, may itself be woken for the run and refuse B's
        # fresh lease: a record of its own, evidence ``lease-fresh``, observer A.)
        by_b = [
            r
            for r in await records(store, run.id, "steal-refused-owner-alive")
            if r.payload["observer"] != first.owner.key  # type: ignore[union-attr]  # the record's payload is a dict; the run has an owner
        ]
        assert len(by_b) == 1, by_b
        (steal,) = await records(store, run.id, "stolen-and-activated")
        assert steal.payload["probe"] == "owner-lapsed"
        assert stolen.epoch > first.epoch
        assert "lease.lapsed" in a.log()
        late = await writes_after_steal(store, run.id, steal, first)
        assert late == [], "the cut-off owner wrote after the steal"
        assert len(await records(store, run.id, "transitioned")) == 1
    except BaseException:
        for r in await store.journal.records(run.id):
            print(r.kind, r.source_id, r.payload, r.at_ms)
        print("A LOG", a.log()[-3000:])
        if b is not None:
            print("B LOG", b.log()[-3000:])
        raise
    finally:
        proxy.thaw()
        a.signal(signal.SIGKILL)
        a.close()
        if b is not None:
            b.close()
