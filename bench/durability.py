"""Where the fsync rows run: Postgres servers whose durability settings the bench may choose.

The fsync rows compare the same drain with the server flushing every commit to disk
(``fsync``, ``synchronous_commit`` and ``full_page_writes`` on: a production server's
defaults) and with none of that (a throwaway test server's settings). The bench never
changes the settings of a server it did not start: when the user named the server
(``--database-url`` or ``RUNFLEET_DATABASE_URL``), the rows are that server alone, as it
is configured, and say so. Otherwise it starts two throwaway servers of its own, one
each way (the settings are given on the server's command line, which ``ALTER SYSTEM``
could not override, so two servers rather than one reloaded) and stops them afterwards.
The backlog benchmark drains on one server that pays for durable commits (``durable``):
the named one as it is, else a throwaway started with all three on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from bench.drain import durability
from bench.servers import Servers

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
NOT_DURABLE = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@dataclass(frozen=True, slots=True)
class Target:
    """A server to drain on: its admin URL and durability settings as it reports them."""

    admin_url: str
    fsync: str
    synchronous_commit: str
    full_page_writes: str
    owned: bool
    """Started by the bench with these settings (False: the user's server, untouched)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "fsync": self.fsync,
            "synchronous_commit": self.synchronous_commit,
            "full_page_writes": self.full_page_writes,
            "server_started_by_bench": self.owned,
        }

    @property
    def label(self) -> str:
        source = "bench's throwaway" if self.owned else "not started by the bench: as found"
        return f"fsync {self.fsync}, synchronous_commit {self.synchronous_commit} ({source})"


@asynccontextmanager
async def targets(servers: Servers) -> AsyncIterator[list[Target]]:
    """Two throwaway servers (fsync on, then off), or the given server alone."""
    if servers.database_given:
        found = await durability(servers.database_url)
        yield [Target(servers.database_url, *found, owned=False)]
        return
    from runfleet.ops.servers.postgres import ThrowawayPostgres
    from runfleet.ops.servers.throwaway import ServicesUnavailable

    started: list[ThrowawayPostgres] = []
    try:
        for settings in (DURABLE, NOT_DURABLE):
            server = ThrowawayPostgres(
                durable_commits=settings["synchronous_commit"] == "on", extra_settings=settings
            )
            await asyncio.to_thread(server.start)
            started.append(server)
    except ServicesUnavailable:
        # No local binaries (the servers came from Docker): the resolved server only.
        for server in started:
            await asyncio.to_thread(server.stop)
        found = await durability(servers.database_url)
        yield [Target(servers.database_url, *found, owned=False)]
        return
    try:
        found_all = [await durability(s.url) for s in started]
        yield [Target(s.url, *f, owned=True) for s, f in zip(started, found_all, strict=True)]
    finally:
        for server in started:
            await asyncio.to_thread(server.stop)


@asynccontextmanager
async def durable(
    servers: Servers, extra_settings: dict[str, str] | None = None
) -> AsyncIterator[Target]:
    """The server a benchmark that must pay for durable commits runs on.

    The user's server as it is configured (``--database-url`` or ``RUNFLEET_DATABASE_URL``:
    the bench changes no setting of a server it did not start); else a throwaway of the
    bench's own with ``fsync``, ``synchronous_commit`` and ``full_page_writes`` on (a
    production server's defaults) and ``extra_settings`` (e.g. ``pg_stat_statements``
    preloaded), stopped afterwards; else, without local server binaries, the resolved
    server as it is. The target reports what the server says.
    """
    if servers.database_given:
        yield Target(servers.database_url, *await durability(servers.database_url), owned=False)
        return
    from runfleet.ops.servers.postgres import ThrowawayPostgres
    from runfleet.ops.servers.throwaway import ServicesUnavailable

    try:
        server = ThrowawayPostgres(
            durable_commits=True, extra_settings={**(extra_settings or {}), **DURABLE}
        )
        await asyncio.to_thread(server.start)
    except ServicesUnavailable:
        yield Target(servers.database_url, *await durability(servers.database_url), owned=False)
        return
    try:
        yield Target(server.url, *await durability(server.url), owned=True)
    finally:
        await asyncio.to_thread(server.stop)
