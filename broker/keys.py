"""Every Redis key and channel name runfleet uses, derived from one prefix.

Names live in one place so that two processes configured with the same
``redis_prefix`` always agree on them, and so that a test (or a second fleet on
the same Redis) isolates itself completely by choosing another prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from runfleet.store.errors import InvalidInput
from runfleet.store.types import Owner

DEFAULT_PREFIX = "runfleet"
GROUP = "workers"
"""The one consumer group on every queue stream: each worker process is a consumer in it."""

_GLOB_SPECIAL = frozenset("*?[]\\")


def hash_tag(key: str) -> str | None:
    """Redis Cluster's hash tag of ``key``: the text between its first ``{`` and the next
    ``}``, when non-empty; only that part is hashed to choose the key's slot."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if end > start + 1 else None


def glob_escape(text: str) -> str:
    """Escape ``text`` for a Redis MATCH pattern, so a prefix like ``a[1]`` matches literally."""
    return "".join("\\" + ch if ch in _GLOB_SPECIAL else ch for ch in text)


@dataclass(frozen=True, slots=True)
class Keys:
    """Key and channel names under one prefix.

    Every name starts with the prefix, so a prefix that carries a hash tag (``{runfleet}``)
    puts all of a fleet's keys in one Redis Cluster slot: the read script over a worker's
    streams, ``XREAD`` over several streams and the liveness pipelines are then single-slot
    as the cluster requires. The price is that one fleet's keys live on one master (a
    cluster buys failover and managed-service compatibility, not sharding of one fleet).
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix:
            raise InvalidInput("redis_prefix", "must be non-empty")

    def stream(self, queue: str) -> str:
        """The stream that carries schedule/wake messages for ``queue``."""
        if not queue:
            raise InvalidInput("queue", "must be non-empty")
        return f"{self.prefix}:q:{queue}"

    def recovery_stream(self, queue: str) -> str:
        """The priority lane of ``queue``: runs that already started (takeovers, releases).

        A separate ``:recovery:`` namespace, so no queue name can collide with a lane.
        """
        if not queue:
            raise InvalidInput("queue", "must be non-empty")
        return f"{self.prefix}:recovery:{queue}"

    def alive(self, owner: Owner) -> str:
        """The liveness key a worker process refreshes while it runs."""
        return f"{self.alive_base}{owner.host_id}:{owner.pid}:{owner.nonce}"

    @property
    def alive_base(self) -> str:
        return f"{self.prefix}:alive:"

    @property
    def alive_pattern(self) -> str:
        """SCAN pattern matching every liveness key under this prefix (and nothing else)."""
        return glob_escape(self.alive_base) + "*"

    def owner_of(self, alive_key: str) -> Owner | None:
        """Parse a liveness key back into its owner (``Owner.parse``); ``None`` if it is
        not one of ours."""
        if not alive_key.startswith(self.alive_base):
            return None
        return Owner.parse(alive_key[len(self.alive_base) :])

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    @property
    def settled_channel(self) -> str:
        return f"{self.prefix}:settled"
