"""The servers a peer benchmark runs on, and the Redis prefix that keeps each run's keys apart.

The URLs come from the command line, else ``RUNFLEET_DATABASE_URL``/``RUNFLEET_REDIS_URL``,
else throwaway local servers (``runfleet.ops.servers.resolve``) stopped on the way out.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from runfleet.ops.bench.scratch import BenchError


@dataclass(frozen=True, slots=True)
class Servers:
    """An admin Postgres URL (CREATEDB rights) and a Redis URL on this machine."""

    database_url: str
    redis_url: str
    database_given: bool = False
    """The user named the Postgres server: its settings are never changed by the bench."""


@contextmanager
def servers(database_url: str | None, redis_url: str | None) -> Iterator[Servers]:
    """Explicit URLs, else ``RUNFLEET_DATABASE_URL``/``RUNFLEET_REDIS_URL``, else throwaways.

    Throwaway servers (``ops.servers.resolve.resolve("app")``) are stopped on the way out.
    """
    db = database_url or os.environ.get("RUNFLEET_DATABASE_URL")
    rd = redis_url or os.environ.get("RUNFLEET_REDIS_URL")
    if db and rd:
        yield Servers(db, rd, database_given=True)
        return
    from runfleet.ops.servers.resolve import ServicesUnavailable, resolve

    try:
        endpoints = resolve("app")
    except ServicesUnavailable as exc:
        raise BenchError(str(exc)) from exc
    try:
        yield Servers(
            db or endpoints.database_url, rd or endpoints.redis_url, database_given=bool(db)
        )
    finally:
        endpoints.close()


def bench_prefix(kind: str) -> str:
    """A Redis key prefix no other run of any benchmark shares."""
    return f"rf-bench-{kind}-{secrets.token_hex(4)}"
