"""A class-bound flow with one instance per tenant, each declared for its tenant's scope
(tests/security/test_instance_scopes.py). Run by real ``runfleet worker`` processes."""

from __future__ import annotations

import os
from pathlib import Path

from runfleet.worker import Context, FlowInstance, flow


class Connection(FlowInstance):
    """A tenant's connection: what its flow reads from ``self``."""

    def __init__(self, name: str, dsn: str, scopes: list[str]) -> None:
        super().__init__(instance_name=name, scopes=scopes)
        self.dsn = dsn

    @flow(name="sec.connection.use")
    async def use(self, ctx: Context, ledger: str) -> str:
        _mark(ledger, f"{os.getpid()} {ctx.run_id} {self.instance_name}")
        return self.dsn


def _mark(ledger: str, line: str) -> None:
    with Path(ledger).open("a") as f:
        f.write(line + "\n")


ACME = Connection("acme", "postgres://acme:secret@acme-db/acme", scopes=["acme"])
GLOBEX = Connection("globex", "postgres://globex:secret@globex-db/globex", scopes=["globex"])
