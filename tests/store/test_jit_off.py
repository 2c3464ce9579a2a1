"""Every connection the store opens runs with JIT off (``store.db.connection_kwargs``).

With JIT on, a settle's statement over a 100,000-run table is estimated past
``jit_above_cost`` and pays ~4 s of JIT compilation for 70 ms of work
(docs/explanation/backlogs.md): the drain rate falls with the depth of the backlog.
"""

from __future__ import annotations

import psycopg

from runfleet.store.config import Settings
from runfleet.store.db import connection_kwargs


async def test_store_connections_run_without_jit(settings: Settings) -> None:
    kwargs = connection_kwargs(settings)
    async with await psycopg.AsyncConnection.connect(settings.database_url, **kwargs) as conn:
        row = await (await conn.execute("SHOW jit")).fetchone()
    assert row is not None and row["jit"] == "off"


def test_no_options_are_sent_without_timeouts(settings: Settings) -> None:
    """Behind a PgBouncer that refuses ``options``, both timeouts 0 send none (jit too)."""
    bare = settings.model_copy(update={"statement_timeout": 0, "idle_in_transaction_timeout": 0})
    assert "options" not in connection_kwargs(bare)
