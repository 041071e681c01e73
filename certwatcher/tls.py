"""Checking a certificate/key pair and building the server `SSLContext` that serves it.

A pair is checked with `cryptography` before it gets near the live server: the key must match the
leaf, the leaf must chain to a CA in `ca.crt`, and every certificate on that path must be valid now.
Only then is a *fresh* `SSLContext` built; `load_cert_chain` on a context already in use leaves it
unusable when the pair is wrong (every later handshake fails), so a live context is never reloaded.

Swapping: hypercorn builds its `SSLContext` once and keeps it. `CertSwitch.front` is that stable
context; its `sni_callback` runs on every ClientHello (also without SNI: clients connecting to an IP
address, such as the API server in tests calling `https://127.0.0.1:port`, send none and the callback
gets `None`) and sets `ssl_object.context` to the current validated context. The handshake then uses
that context's certificate and ALPN list (so every context here repeats hypercorn's settings: without
ALPN on the switched-to context, h2 silently falls back to no ALPN at all), while the cipher list stays
the front's; connections already established keep their context. The front
context holds no certificate of its own, so a handshake can never be answered with a stale pair.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from certwatcher import pem

CIPHERS = "ECDHE+AESGCM"
ALPN_PROTOCOLS = ("h2", "http/1.1")
HTTP1_ONLY = ("http/1.1",)

# Reasons a pair is refused; each is a value of the reload-error metric's `reason` label.
REASON_MISSING = "missing"
REASON_PARSE = "parse"
REASON_KEY_MISMATCH = "key_mismatch"
REASON_UNTRUSTED = "untrusted"
REASON_NOT_YET_VALID = "not_yet_valid"
REASON_EXPIRED = "expired"
REASON_SSL = "ssl"


class CertValidationError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ServingPair:
    """A pair that passed every check, with the parsed pieces later steps need."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    leaf: x509.Certificate
    anchor: x509.Certificate  # the certificate in ca.crt the leaf chains to
    cas: tuple[x509.Certificate, ...]  # everything parsed from ca.crt

    @property
    def not_after(self) -> datetime:
        return pem.not_after(self.leaf)

    @property
    def serial(self) -> int:
        return self.leaf.serial_number


def _check_times(cert: x509.Certificate, now: datetime, *, what: str) -> None:
    if pem.not_yet_valid(cert, now):
        raise CertValidationError(
            REASON_NOT_YET_VALID,
            f"{what} {pem.describe(cert)} is not valid before {pem.not_before(cert).isoformat()}",
        )
    if pem.expired(cert, now):
        raise CertValidationError(
            REASON_EXPIRED, f"{what} {pem.describe(cert)} expired at {pem.not_after(cert).isoformat()}"
        )


def validate_pair(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, *, now: datetime) -> ServingPair:
    """Raise `CertValidationError` naming the file and the reason unless the pair may be served."""
    chain = pem.certificates(cert_pem)
    if not chain:
        raise CertValidationError(REASON_PARSE, "tls.crt: no readable PEM certificate")
    leaf = chain[0]
    cas = pem.certificates(ca_pem)
    if not cas:
        raise CertValidationError(REASON_PARSE, "ca.crt: no readable PEM certificate")
    if not key_pem.strip():
        raise CertValidationError(REASON_PARSE, "tls.key: empty")
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise CertValidationError(REASON_PARSE, f"tls.key: cannot load private key: {exc}") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != leaf.public_key().public_bytes(der, spki):
        raise CertValidationError(
            REASON_KEY_MISMATCH, f"tls.key does not match the certificate {pem.describe(leaf)} in tls.crt"
        )
    _check_times(leaf, now, what="tls.crt certificate")

    # Walk leaf -> intermediates (from tls.crt) -> an anchor from ca.crt, checking each signature.
    current = leaf
    intermediates = list(chain[1:])
    for _ in range(len(chain) + 1):
        anchor = next((ca for ca in cas if pem.issued_by(current, ca)), None)
        if anchor is not None:
            _check_times(anchor, now, what="ca.crt certificate")
            return ServingPair(
                cert_pem=cert_pem, key_pem=key_pem, ca_pem=ca_pem, leaf=leaf, anchor=anchor, cas=tuple(cas)
            )
        parent = next((c for c in intermediates if pem.issued_by(current, c)), None)
        if parent is None:
            break
        intermediates.remove(parent)
        _check_times(parent, now, what="tls.crt intermediate")
        current = parent
    raise CertValidationError(
        REASON_UNTRUSTED,
        f"tls.crt certificate {pem.describe(leaf)} does not chain to any of the {len(cas)} certificate(s) in ca.crt",
    )


def base_context(alpn: tuple[str, ...] = ALPN_PROTOCOLS) -> ssl.SSLContext:
    """Server settings as hypercorn's `Config.create_ssl_context` makes them, without a certificate.

    `alpn` is what the server offers; HTTP1_ONLY keeps HTTP/2 (and its stream attacks) off.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.set_alpn_protocols(list(alpn))
    return ctx


@contextlib.contextmanager
def _as_files(cert_pem: bytes, key_pem: bytes) -> Iterator[tuple[str, str]]:
    """`load_cert_chain` reads only paths: hand it the validated bytes, not the (changing) cert dir.

    A memfd keeps the key off any filesystem and works under readOnlyRootFilesystem; elsewhere a
    private temporary directory is used.
    """
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:
            for data in (cert_pem, key_pem):
                fd = memfd("sidecarctl-tls", getattr(os, "MFD_CLOEXEC", 0))
                fds.append(fd)
                with open(fd, "wb", closefd=False) as fh:
                    fh.write(data)
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="sidecarctl-tls-") as tmp:
        paths = []
        for name, data in (("tls.crt", cert_pem), ("tls.key", key_pem)):
            path = Path(tmp) / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "wb") as fh:
                fh.write(data)
            paths.append(str(path))
        yield paths[0], paths[1]


def build_context(pair: ServingPair, alpn: tuple[str, ...] = ALPN_PROTOCOLS) -> ssl.SSLContext:
    """A new server context serving `pair` (leaf plus any intermediates from tls.crt)."""
    ctx = base_context(alpn)
    try:
        with _as_files(pair.cert_pem, pair.key_pem) as (certfile, keyfile):
            ctx.load_cert_chain(certfile, keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise CertValidationError(REASON_SSL, f"OpenSSL refused the pair: {exc}") from None
    return ctx


class CertSwitch:
    """The stable front context plus the reference its `sni_callback` hands every new handshake."""

    def __init__(self, alpn: tuple[str, ...] = ALPN_PROTOCOLS) -> None:
        self._current: ssl.SSLContext | None = None
        self.front = base_context(alpn)
        self.front.sni_callback = self._select

    @property
    def current(self) -> ssl.SSLContext | None:
        return self._current

    def swap(self, ctx: ssl.SSLContext) -> None:
        self._current = ctx

    def _select(self, ssl_obj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> int | None:
        current = self._current
        if current is None:
            # Nothing valid loaded yet: refuse the handshake rather than answer without a cert.
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
        ssl_obj.context = current
        return None
