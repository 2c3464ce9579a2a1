"""Building the Redis client the broker expects, and refusing one it cannot use.

Stream and liveness values are msgpack bytes, so the client must return raw
bytes (``decode_responses=False``): a decoding client would fail inside the
parser on the first binary value, before the broker could drop it as malformed.
"""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPubSub, RedisCluster

from runfleet.broker.keys import hash_tag
from runfleet.store.config import Settings
from runfleet.store.errors import InvalidInput
from runfleet.store.urls import require

DEFAULT_SOCKET_TIMEOUT = 10.0
"""Above any block the broker asks for (it blocks in slices of at most 1 s)."""

DEFAULT_CONNECT_TIMEOUT = 2.0

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""``RUNFLEET_REDIS_URL`` schemes that select the cluster client (any node as the seed)."""


class _ClusterPubSub(ClusterPubSub):
    """Reloads the cluster's slot map before a subscription picks its node.

    redis-py's async cluster pub/sub picks the node from the client's slot map, which a
    client that has not run a command yet has not loaded (``KeyError`` on the slot), and
    which still names a dead master after a failover: ``Notifier.listen`` would retry the
    dead node for ever. Subscriptions are rare (start, and after each loss), so asking the
    cluster for its map each time costs nothing.
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self.connection is None:  # about to choose a node
            await self.cluster.initialize()  # first use: commands parser and slot map
            await self.cluster.nodes_manager.initialize()  # the map as it is now
        return await super().execute_command(*args, **kwargs)


class _Cluster(RedisCluster):
    def pubsub(
        self,
        node: ClusterNode | None = None,
        host: str | None = None,
        port: int | None = None,
        **kwargs: Any,
    ) -> ClusterPubSub:
        return _ClusterPubSub(self, node=node, host=host, port=port, **kwargs)


def cluster_url(url: str) -> str | None:
    """The plain ``redis://`` seed URL when ``url`` names a cluster, else None."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    return f"{plain}://{rest}" if sep and plain else None


def connect(
    url: str | Settings,
    *,
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    client_name: str | None = None,
) -> Redis:
    """A bytes-returning asyncio client for ``url`` (or ``settings.redis_url``)."""
    redis_url = require(url.redis_url if isinstance(url, Settings) else url, "Redis")
    seed = cluster_url(redis_url)
    if seed is not None:
        if isinstance(url, Settings) and hash_tag(url.redis_prefix) is None:
            raise InvalidInput(
                "redis_prefix",
                f"{url.redis_prefix!r} has no hash tag: with a cluster URL it must put every "
                "key in one slot, e.g. RUNFLEET_REDIS_PREFIX='{runfleet}'",
            )
        # The cluster client has the same command methods (routed by key slot); the
        # broker only calls those, so it is handed over as a ``Redis``.
        return cast(
            Redis,
            _Cluster.from_url(
                seed,
                decode_responses=False,
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
                client_name=client_name,
            ),
        )
    return Redis.from_url(
        redis_url,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        client_name=client_name,
    )


def require_binary(redis: Redis) -> Redis:
    """Return ``redis`` unchanged, or raise ``ValueError`` if it decodes responses."""
    if _connection_kwargs(redis).get("decode_responses", False):
        raise ValueError("runfleet's broker needs a Redis client with decode_responses=False")
    return redis


def socket_timeout_of(redis: Redis) -> float | None:
    """The client's per-read socket timeout, so blocking calls can stay below it."""
    value = _connection_kwargs(redis).get("socket_timeout")
    return float(value) if isinstance(value, int | float) else None


def _connection_kwargs(redis: Redis) -> dict[str, Any]:
    if isinstance(redis, RedisCluster):
        return redis.get_connection_kwargs()
    return dict(redis.connection_pool.connection_kwargs)
