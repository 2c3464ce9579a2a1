"""Building the Redis client the broker expects, and refusing one it cannot use.

Stream and liveness values are msgpack bytes, so the client must return raw
bytes (``decode_responses=False``): a decoding client would fail inside the
parser on the first binary value, before the broker could drop it as malformed.
"""

from __future__ import annotations

from redis.asyncio import Redis

from store.config import Settings

DEFAULT_SOCKET_TIMEOUT = 10.0
"""Above any block the broker asks for (it blocks in slices of at most 1 s)."""

DEFAULT_CONNECT_TIMEOUT = 2.0


def connect(
    url: str | Settings,
    *,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    client_name: str | None = None,
) -> Redis:
    """A bytes-returning asyncio client for ``url`` (or ``settings.redis_url``)."""
    redis_url = url.redis_url if isinstance(url, Settings) else url
    return Redis.from_url(
        redis_url,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        client_name=client_name,
    )


def require_binary(redis: Redis) -> Redis:
    """Return ``redis`` unchanged, or raise ``ValueError`` if it decodes responses."""
    if redis.connection_pool.connection_kwargs.get("decode_responses", False):
        raise ValueError("runfleet's broker needs a Redis client with decode_responses=False")
    return redis


def socket_timeout_of(redis: Redis) -> float | None:
    """The client's per-read socket timeout, so blocking calls can stay below it."""
    value = redis.connection_pool.connection_kwargs.get("socket_timeout")
    return float(value) if isinstance(value, int | float) else None
