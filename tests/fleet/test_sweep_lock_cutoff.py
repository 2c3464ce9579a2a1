"""A sweep tick cut off from Postgres midway hands its kind back to the fleet in bounded time.

A tick holds its kind's lock for its whole transaction. Left to the server, a worker
partitioned from Postgres in the middle of one would keep the lock for as long as the
server kept its session, which for a silent client is ``idle_in_transaction_timeout`` (a
minute): no other worker would sweep that kind meanwhile, so a stale lease elsewhere in
the fleet would go unswept. The tick's transaction may not sit idle past
``Settings.sweep_lock_idle_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

from runfleet.store import Store, SweepKind
from runfleet.store.config import Settings
from runfleet.store.sweeps import LOCK_HELD, Swept
from tests.fleet.tcpproxy import FreezableProxy
from tests.fleet.test_lease_lapse import via
from tests.support.polling import until

KIND = SweepKind.STALE_RUNNING


async def _nothing() -> None:
    return None


async def test_a_tick_cut_off_from_postgres_hands_its_kind_back_within_the_bound(
    settings: Settings, store: Store
) -> None:
    parts = urlsplit(settings.database_url)
    proxy = await FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    cut = await Store.open(
        settings.model_copy(update={"database_url": via(settings.database_url, proxy.port)}),
        min_size=1,
        max_size=1,
    )
    inside = asyncio.Event()

    async def cut_off_midway() -> None:
        inside.set()
        proxy.freeze()  # a partition between the lock and the tick's next statement
        await cut.sweeps.cursor(KIND)  # never answered: no byte passes the proxy

    tick = asyncio.create_task(cut.sweeps.locked(KIND, cut_off_midway))
    try:
        await asyncio.wait_for(inside.wait(), 10)
        began = time.monotonic()
        assert await store.sweeps.locked(KIND, _nothing) is LOCK_HELD, "the cut-off tick holds it"
        bound = settings.sweep_lock_idle_ms / 1000
        taken = await until(
            lambda: store.sweeps.locked(KIND, _nothing),
            bound + 10,
            "another worker's tick to take the kind",
            accept=lambda answer: isinstance(answer, Swept),
            every=0.05,
        )
        waited = time.monotonic() - began
        assert isinstance(taken, Swept)
        assert waited < bound + 2, f"the kind came back after {waited:.2f} s (bound {bound} s)"
        assert not tick.done(), "the cut-off worker itself is still waiting on its statement"
    finally:
        proxy.thaw()
        tick.cancel()
        with contextlib.suppress(BaseException):
            await tick
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(cut.close(), 10)
        await proxy.close()
