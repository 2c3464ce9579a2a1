"""Where a service is, and what a person does when it does not answer.

A producer that gives up (``Unavailable``) says which service, at which host:port, why
(the connection error itself, not the pool's ``PoolTimeout`` that only says a connection
was not handed out in time) and what to check. psycopg_pool logs every failed connection
attempt of a pool as a two-line WARNING (``error connecting in 'runfleet-inline': ...``),
eleven seconds of them before a producer gives up; for the producer's pools each one is
kept here as the cause to name instead, and shown only when the ``psycopg.pool`` logger
is set to DEBUG.
"""

from __future__ import annotations

import itertools
import logging
import threading
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

PRODUCER_POOL = "runfleet-producer"
"""The name prefix of the pools whose connection attempts a producer reports itself."""
_numbers = itertools.count(1)

_FIXES = {
    "postgres": "start Postgres there, or point RUNFLEET_DATABASE_URL (or the queue's "
    "database_url) at a server that runs",
    "redis": "start Redis there, or point RUNFLEET_REDIS_URL (or the queue's redis_url) at "
    "a server that runs",
}

_lock = threading.Lock()
_last_attempt: dict[str, BaseException] = {}


class _ProducerPoolAttempts(logging.Filter):
    """Keeps a producer pool's failed connection attempt as its cause; shown at DEBUG only."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or not args or not _producers(args[0]):
            return True
        if len(args) == 2 and isinstance(args[1], psycopg.Error):
            with _lock:
                _last_attempt[str(args[0])] = args[1]
        return logging.getLogger("psycopg.pool").isEnabledFor(logging.DEBUG)


_filter = _ProducerPoolAttempts()
logging.getLogger("psycopg.pool").addFilter(_filter)  # once: addFilter ignores a repeat


def _producers(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PRODUCER_POOL)


def producer_pool_name() -> str:
    """A name of its own for a producer's pool, so each one's last failure is its own."""
    return f"{PRODUCER_POOL}-{next(_numbers)}"


def last_attempt(pool: str) -> BaseException | None:
    """The last failed connection attempt of a producer pool, if one failed since."""
    with _lock:
        return _last_attempt.get(pool)


def address(service: str, url: str) -> str:
    """``host:port`` of a database or Redis URL (``?`` where the URL does not say)."""
    try:
        if service == "postgres":
            parts = conninfo_to_dict(url)
            host = str(parts.get("hostaddr") or parts.get("host") or "local socket")
            return f"{host}:{parts.get('port') or 5432}"
        split = urlsplit(url)
        return f"{split.hostname or 'localhost'}:{split.port or 6379}"
    except (psycopg.Error, ValueError):
        return "?"


def explain(service: str, url: str, error: BaseException, waited: float) -> str:
    """The sentence of an ``Unavailable``: service, host:port, cause, how long, the fix."""
    cause = _first_line(error)
    where = address(service, url)
    fix = _FIXES.get(service, "check the network between this host and its services")
    return f"{service} unavailable at {where} (retried for {waited:.1f} s): {cause}; {fix}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {line}" if line else type(error).__name__
