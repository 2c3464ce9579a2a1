"""Throwaway certificate authorities and server certificates, made with the openssl CLI.

The ``cryptography`` package is not a dependency of runfleet; the ``openssl`` binary is on
every machine that has Postgres or Redis built with TLS, so the tests use it instead.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.servers.tls import TlsFiles

EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl_missing() -> str | None:
    return None if shutil.which("openssl") else "the openssl binary is not installed"


def _run(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _run(
        "req", "-x509", *EC_KEY, "-keyout", key, "-out", cert, "-days", "2",
        "-subj", f"/CN=runfleet test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    return cert, key


def make_server(directory: Path, ca: tuple[Path, Path], dns: str = "localhost") -> TlsFiles:
    """A server certificate for ``dns`` only (no IP address), signed by ``ca``."""
    ca_cert, ca_key = ca
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    ext = directory / "server.ext"
    ext.write_text(
        f"subjectAltName=DNS:{dns}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _run("req", "-new", *EC_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={dns}",
         cwd=directory)  # fmt: skip
    _run(
        "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
        cwd=directory,
    )  # fmt: skip
    return TlsFiles(ca=ca_cert, cert=cert, key=key)
