"""Where a process's Postgres and Redis are: the configured URLs, else the embedded pair.

Every entry point resolves through ``resolve`` before it connects: a worker (``runfleet
worker``), a producer (``Queue``/``AsyncQueue``), every other CLI command and the
dashboard. Both URLs set: they are used as given and nothing is started (production).
Neither set and the ``embedded`` extra installed: the user's one embedded pair
(``runtime.embedded``) is found or started, migrated, and the process says so in one line
on stderr with both URLs. Anything else raises ``NoServers``, which names both ways out;
the connectors (``store.db.open_pool``, ``broker.client.connect``) refuse an empty URL too,
so no path falls back to a default host.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runfleet.runtime import embedded
from runfleet.store.config import Settings
from runfleet.store.errors import NoServers
from runfleet.store.migrate import migrate

_announced: set[tuple[Path, int, int]] = set()
"""Pairs this process has migrated and named: said once, not at every ``Queue()``."""
_lock = threading.Lock()


def resolve(settings: Settings) -> Settings:
    """``settings`` with both URLs set, starting the embedded pair if that is the way."""
    db, redis = settings.database_url, settings.redis_url
    if db and redis:
        return settings
    if db or redis:
        missing = "RUNFLEET_REDIS_URL" if db else "RUNFLEET_DATABASE_URL"
        raise NoServers(f"{missing} is not set (the embedded servers replace both or neither)")
    if not embedded.installed():
        raise NoServers("no database or Redis is configured")
    try:
        with _lock:
            servers = embedded.ensure()
            key = (servers.data_dir, servers.postgres.pid, servers.redis.pid)
            if key not in _announced:
                _migrate(servers.database_url)
                embedded.say(servers)
                _announced.add(key)
    except embedded.EmbeddedUnavailable as exc:
        own = "set RUNFLEET_DATABASE_URL and RUNFLEET_REDIS_URL to use servers of your own"
        raise NoServers(f"the embedded servers did not start ({exc})", own) from exc
    return settings.model_copy(
        update={"database_url": servers.database_url, "redis_url": servers.redis_url}
    )


def require(url: str, what: str) -> str:
    """``url`` if set; ``NoServers`` for an empty one (a connector's last line of defence)."""
    if not url:
        raise NoServers(f"no {what} URL is configured")
    return url


def _migrate(url: str) -> None:
    """Apply the migrations from any caller, sync or inside an event loop (a thread of
    its own runs the coroutine: an ``AsyncQueue`` is built in a running loop)."""
    with ThreadPoolExecutor(1, thread_name_prefix="runfleet-migrate") as pool:
        pool.submit(asyncio.run, migrate(url)).result()
