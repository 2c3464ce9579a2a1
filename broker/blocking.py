"""A blocking Redis client behind the awaitable surface the producer's calls use.

``broker.sync.Queue`` drives its one-statement calls in the caller's thread
(``store.inline.drive``): the queue's own coroutines, which must never suspend. Their
Redis writes (``Streams.publish``/``publish_many`` after an admission, a wake hint)
await ``xadd``, a pipeline, or a script; here each is a blocking redis-py call wrapped in
a coroutine that completes at once. Only those calls exist: anything else (a
subscription, a blocking read) is an attribute error, never a silent event-loop hop.
"""

from __future__ import annotations

from typing import Any, Self

import redis

from runfleet.broker.client import DEFAULT_CONNECT_TIMEOUT, DEFAULT_SOCKET_TIMEOUT
from runfleet.store.config import Settings


class _Script:
    def __init__(self, script: Any) -> None:
        self._script = script

    async def __call__(self, keys: Any = None, args: Any = None) -> Any:
        return self._script(keys=keys, args=args)


class _Pipeline:
    """``async with redis.pipeline() as pipe``: commands queue, ``execute`` sends them."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._pipe.reset()

    def xadd(self, *args: Any, **kwargs: Any) -> Self:
        self._pipe.xadd(*args, **kwargs)
        return self

    async def execute(self) -> list[Any]:
        return list(self._pipe.execute())


class BlockingRedis:
    """The subset of ``redis.asyncio.Redis`` a driven producer call awaits, blocking."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self.connection_pool = client.connection_pool  # require_binary, socket_timeout_of

    @classmethod
    def for_settings(cls, settings: Settings) -> Self:
        """Same options as ``broker.client.connect`` (bytes replies, the same timeouts)."""
        return cls(
            redis.Redis.from_url(
                settings.redis_url,
                decode_responses=False,
                socket_timeout=DEFAULT_SOCKET_TIMEOUT,
                socket_connect_timeout=DEFAULT_CONNECT_TIMEOUT,
            )
        )

    def register_script(self, script: str) -> _Script:
        return _Script(self._client.register_script(script))

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self._client.pipeline(transaction=transaction))

    async def xadd(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.xadd(*args, **kwargs)

    def close(self) -> None:
        self._client.close()
