"""Certificates for TLS tests, made with the openssl CLI into a test's temporary directory
(never committed): a CA, and certificates it signs for 127.0.0.1 naming an identity."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
    )
    return key, cert


def make_cert(
    directory: Path, ca: tuple[Path, Path], name: str, identity: str | None = None
) -> tuple[Path, Path]:
    identity = identity or name
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    extensions = directory / f"{name}.ext"
    extensions.write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{identity}\n")
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        f"/CN={identity}",
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca[1]),
        "-CAkey",
        str(ca[0]),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(extensions),
    )
    return key, cert
