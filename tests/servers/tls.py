"""The throwaway servers speaking only TLS, with certificates the caller made."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runfleet.ops.servers.postgres import ThrowawayPostgres
from runfleet.ops.servers.redis import ThrowawayRedis
from runfleet.ops.servers.throwaway import nobody


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for a TLS server: the CA that signed it (clients verify against it),
    its certificate and its private key. The certificate should name ``localhost``."""

    ca: Path
    cert: Path
    key: Path


def _install_tls(files: TlsFiles, workdir: Path) -> TlsFiles:
    """Copy the server's files into its data dir, readable by the server user only.

    Postgres refuses a key readable by group or others, and as root the servers run as
    ``nobody``, which cannot read the caller's files where they are.
    """
    tls = workdir / "tls"
    tls.mkdir(mode=0o700, exist_ok=True)
    placed = TlsFiles(ca=tls / "ca.pem", cert=tls / "server.pem", key=tls / "server.key")
    for source, target in ((files.ca, placed.ca), (files.cert, placed.cert),
                           (files.key, placed.key)):  # fmt: skip
        shutil.copyfile(source, target)
        target.chmod(0o600)
    if os.geteuid() == 0:
        for path in (tls, placed.ca, placed.cert, placed.key):
            os.chown(path, *nobody())
    return placed


class TlsPostgres(ThrowawayPostgres):
    """A throwaway Postgres with ``ssl=on`` that admits TCP clients over TLS only.

    ``pg_hba.conf`` has ``hostssl`` lines and no ``host`` line, so a client that does not
    negotiate TLS (``sslmode=disable``) is refused: a test that connects proves TLS was
    used. ``url`` verifies the server fully (``sslmode=verify-full`` against ``tls.ca``,
    host ``localhost``).
    """

    name = "postgres-tls"

    def __init__(self, tls: TlsFiles, *, durable_commits: bool = False) -> None:
        super().__init__(durable_commits=durable_commits)
        self.tls = tls
        self._placed: TlsFiles | None = None

    @property
    def url(self) -> str:
        return self.url_for()

    def url_for(
        self, *, host: str = "localhost", ca: Path | None = None, sslmode: str = "verify-full"
    ) -> str:
        """A URL to this server as ``host`` (connecting to 127.0.0.1 whatever it says)."""
        root = ca or self.tls.ca
        return (
            f"postgresql://postgres@{host}:{self.port}/postgres?hostaddr=127.0.0.1"
            f"&sslmode={sslmode}&sslrootcert={root}"
        )

    def _prepare(self, workdir: Path) -> None:
        super()._prepare(workdir)
        self._placed = _install_tls(self.tls, workdir)
        (workdir / "data" / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostssl all all ::1/128 trust\n"
        )

    def _command(self, workdir: Path) -> list[str]:
        assert self._placed is not None
        return [
            *super()._command(workdir),
            "-c", "ssl=on",
            "-c", f"ssl_cert_file={self._placed.cert}",
            "-c", f"ssl_key_file={self._placed.key}",
            "-c", f"ssl_ca_file={self._placed.ca}",
        ]  # fmt: skip


def redis_tls_supported() -> str | None:
    """None if ``redis-server`` links OpenSSL (built with TLS), else why not (a skip reason).

    Debian's and most distributions' builds do (``BUILD_TLS=yes``); a build without it
    refuses the ``tls-*`` directives at start.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        return "redis-server not found"
    if shutil.which("ldd") is None:
        return None  # cannot tell: try, and let the start fail loudly
    linked = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    if "libssl" not in linked:
        return f"{binary} was built without TLS (it does not link libssl)"
    return None


class TlsRedis(ThrowawayRedis):
    """A throwaway redis-server that listens only on a TLS port (``--port 0``).

    Clients are not asked for certificates (``--tls-auth-clients no``): the test is that
    runfleet verifies the *server*. ``url`` is ``rediss://localhost:PORT/0`` with the CA
    as ``ssl_ca_certs`` and hostname checking on (redis-py's defaults for rediss).
    """

    name = "redis-tls"

    def __init__(self, tls: TlsFiles) -> None:
        super().__init__()
        self.tls = tls
        self._placed: TlsFiles | None = None

    @property
    def url(self) -> str:
        return self.url_for()

    def url_for(self, *, host: str = "localhost", ca: Path | None = None) -> str:
        root = ca or self.tls.ca
        return f"rediss://{host}:{self.port}/0?ssl_ca_certs={root}&ssl_cert_reqs=required"

    def _prepare(self, workdir: Path) -> None:
        self._placed = _install_tls(self.tls, workdir)

    def _command(self, workdir: Path) -> list[str]:
        assert self._placed is not None
        return [
            "redis-server", "--port", "0", "--tls-port", str(self.port),
            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir),
            "--tls-cert-file", str(self._placed.cert), "--tls-key-file", str(self._placed.key),
            "--tls-ca-cert-file", str(self._placed.ca), "--tls-auth-clients", "no",
        ]  # fmt: skip
