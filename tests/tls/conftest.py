"""A Postgres and a Redis that speak only TLS, with certificates from a throwaway CA."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runfleet.ops.servers.postgres import postgres_bindir
from runfleet.store.migrate import migrate_blocking
from tests.servers.tls import TlsFiles, TlsPostgres, TlsRedis, redis_tls_supported
from tests.tls.certs import make_ca, make_server, openssl_missing


@dataclass(frozen=True)
class Pki:
    server: TlsFiles
    rogue_ca: Path
    """A CA that signed nothing the servers present: verifying against it must fail."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if reason := openssl_missing():
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("pki")
    server = make_server(root, make_ca(root, "ca"))
    rogue, _ = make_ca(root / "rogue", "rogue")
    return Pki(server=server, rogue_ca=rogue)


@pytest.fixture(scope="module")
def tls_postgres(pki: Pki) -> Iterator[TlsPostgres]:
    if postgres_bindir() is None:
        pytest.skip("PostgreSQL server binaries not found")
    with TlsPostgres(pki.server) as server:
        migrate_blocking(server.url)
        yield server


@pytest.fixture(scope="module")
def tls_redis(pki: Pki) -> Iterator[TlsRedis]:
    if reason := redis_tls_supported():
        pytest.skip(reason)
    with TlsRedis(pki.server) as server:
        yield server
