"""A ledger of step executions on a Postgres of its own, for fleet-sized chaos tests.

Sixteen worker processes' ledger pools (up to 8 connections each) would crowd the
machine's shared server, and the server under test is not the place for it either.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from runfleet.ops.servers.postgres import ThrowawayPostgres


@pytest.fixture
def own_ledger() -> Iterator[str]:
    with ThrowawayPostgres() as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE chaos_ledger (run_id text, step int, epoch int, "
                "at timestamptz DEFAULT clock_timestamp())"
            )
        yield server.url
