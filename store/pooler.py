"""Is there a connection pooler between this process and Postgres?

``runfleet doctor`` asks, because a pooler in transaction mode changes what is safe:
psycopg's automatic prepared statements break (PgBouncer < 1.21), and session state
(``SET``, session advisory locks, LISTEN) lands on whichever server connection runs it.
Nothing in the wire protocol says "pooler" (PgBouncer replays the server's parameters),
so the probe watches behaviour:

- **transaction pooling**: one client session that sees its backend pid change between
  two transactions is multiplexed. To make the change happen rather than hope for it, a
  second session holds a transaction open in between: a pooler hands that session the
  server connection the first just released (PgBouncer reuses the most recent one), so
  the first must get another.
- **a middleman** (session pooler or TCP proxy): the backend sees a client port that is
  not this process's socket.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from enum import StrEnum

from psycopg.rows import DictRow

from runfleet.store.config import Settings
from runfleet.store.db import Conn, connect, connection_kwargs
from runfleet.store.queries import q


class Path(StrEnum):
    """What stands between this process and the backend."""

    DIRECT = "direct"
    TRANSACTION_POOLER = "transaction-pooler"
    MIDDLEMAN = "middleman"
    """A session pooler or a TCP proxy: the backend is not talking to this client's socket."""
    UNKNOWN = "unknown"
    """A Unix socket or a backend that hides ``client_port``: nothing to compare."""


@dataclass(frozen=True, slots=True)
class PoolerProbe:
    path: Path
    backend_pids: tuple[int, ...]
    """The first session's backend pid at each of its two transactions."""
    server_port: int | None
    """The port Postgres listens on (``inet_server_port()``), None over a Unix socket."""
    client_port: int | None
    """The client port the backend saw for the first session."""
    local_port: int | None
    """This process's own port for that session."""


async def probe(settings: Settings) -> PoolerProbe:
    """Open two sessions with the store's connection arguments and watch them."""
    kwargs = connection_kwargs(settings)
    kwargs["prepare_threshold"] = None  # the probe must work where prepares do not
    url = settings.database_url
    async with (
        await connect(url, **kwargs) as first,
        await connect(url, **kwargs) as second,
    ):
        before = await _session(first)
        local = _local_port(first)
        async with second.transaction():
            await _session(second)  # takes (and keeps) the connection `first` released
            after = await _session(first)
    pids = (int(before["pid"]), int(after["pid"]))
    server_port = before["server_port"]
    client_port = before["client_port"]
    if pids[0] != pids[1]:
        path = Path.TRANSACTION_POOLER
    elif client_port is None or local is None:
        path = Path.UNKNOWN
    elif int(client_port) != local:
        path = Path.MIDDLEMAN
    else:
        path = Path.DIRECT
    return PoolerProbe(
        path=path,
        backend_pids=pids,
        server_port=None if server_port is None else int(server_port),
        client_port=None if client_port is None else int(client_port),
        local_port=local,
    )


async def _session(conn: Conn) -> DictRow:
    cur = await conn.execute(q("pooler.session"))
    row = await cur.fetchone()
    assert row is not None, "pooler.session always answers one row"
    return row


def _local_port(conn: Conn) -> int | None:
    """This client's end of the session's socket, None for a Unix socket."""
    sock = socket.socket(fileno=conn.pgconn.socket)
    try:
        name = sock.getsockname()
    finally:
        sock.detach()  # the socket belongs to libpq
    return int(name[1]) if isinstance(name, tuple) else None
