"""The one settings object: every knob is a ``RUNFLEET_*`` environment variable."""

from __future__ import annotations

import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Runtime configuration shared by producers, workers and the CLI.

    Lease timing lives here (not in each caller) because every process in a
    fleet must agree on it: a worker that renews every ``heartbeat_interval``
    is only stealable after ``stale_after`` of database time without renewal.
    """

    model_config = SettingsConfigDict(env_prefix="RUNFLEET_", extra="ignore")

    database_url: str = "postgresql://postgres@127.0.0.1:5432/runfleet"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "runfleet"
    host_id: str = Field(default_factory=socket.gethostname)
    heartbeat_interval: float = Field(default=1.0, gt=0)
    stale_after: float = Field(default=5.0, gt=0)
    sweep_interval: float = Field(default=1.0, gt=0)
    sweep_batch: int = Field(default=64, gt=0)
    grace_period: float = Field(default=10.0, ge=0)
    pool_min: int = Field(default=1, ge=1)
    pool_max: int = Field(default=8, ge=1)
    max_payload_bytes: int = Field(default=1_000_000, gt=0)
    inline_sleep_max: float = Field(default=2.0, ge=0)
    """A durable sleep whose remainder is at most this is slept in-process, holding its slot."""
    park_backoff_over: float = Field(default=5.0, ge=0)
    """A step retry backoff longer than this parks the run on a timer instead of a slot."""

    @property
    def heartbeat_interval_ms(self) -> int:
        return int(self.heartbeat_interval * 1000)

    @property
    def stale_after_ms(self) -> int:
        return int(self.stale_after * 1000)

    @property
    def lapse_after(self) -> float:
        """Seconds without a confirmed renewal after which a worker stops its runs.

        Two intervals short of ``stale_after`` so that the owner has stopped
        executing before any other process may consider its lease stale.
        """
        return max(self.heartbeat_interval, self.stale_after - 2 * self.heartbeat_interval)
