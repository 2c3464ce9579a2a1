"""Throwaway Postgres and Redis that listen on a bridge address instead of loopback.

They are the ``ops.servers`` throwaway servers (unprivileged, private data dir, same port kept
across restarts) with two differences: they bind the bridge address, so the host
namespaces reach them through links the suite can cut, and they admit clients from the
suite's 10.213.0.0/16 (Postgres trust for that net, Redis protected mode off).
"""

from __future__ import annotations

from pathlib import Path

from runfleet.ops.servers.postgres import ThrowawayPostgres, postgres_answers
from runfleet.ops.servers.redis import ThrowawayRedis, redis_answers

SUITE_NET = "10.213.0.0/16"


class BridgePostgres(ThrowawayPostgres):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/postgres"

    def _prepare(self, workdir: Path) -> None:
        super()._prepare(workdir)
        with (workdir / "data" / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {SUITE_NET} trust\n")

    def _command(self, workdir: Path) -> list[str]:
        command = super()._command(workdir)
        command[command.index("-h") + 1] = self.address
        # Workers cut off mid-query leave backends behind until the heal; keep room.
        return [*command, "-c", "max_connections=400"]

    def _answers(self) -> bool:
        return postgres_answers(self.url)


class BridgeRedis(ThrowawayRedis):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"

    def _command(self, workdir: Path) -> list[str]:
        command = super()._command(workdir)
        command[command.index("--bind") + 1] = self.address
        return [*command, "--protected-mode", "no"]

    def _answers(self) -> bool:
        return redis_answers(self.url)
