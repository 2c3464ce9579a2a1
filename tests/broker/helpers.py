"""Small Redis helpers for broker tests (polling lives in tests.support.polling)."""

from __future__ import annotations

from redis.asyncio import Redis


async def acl(redis: Redis, *args: str) -> None:
    """Run an ACL command (redis-py leaves ``execute_command`` untyped)."""
    await redis.execute_command("ACL", *args)  # type: ignore[no-untyped-call]  # redis-py's execute_command is unannotated
