"""PEM certificate bundles as they arrive from cert files and from webhook `caBundle` fields.

`ca.crt` files and `caBundle` values are concatenations written by several tools (cert-manager, Helm,
users, us). One bad block must not hide the good ones, so parsing is block by block and skips what it
cannot read; callers that need strictness check the counts themselves.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization

_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.DOTALL)


@dataclass(frozen=True)
class ParsedBundle:
    """The certificates found in a bundle, plus how many certificate blocks could not be read."""

    certs: tuple[x509.Certificate, ...]
    bad_blocks: int


def parse_bundle(data: bytes) -> ParsedBundle:
    certs: list[x509.Certificate] = []
    bad = 0
    for match in _BLOCK.finditer(data):
        try:
            certs.append(x509.load_pem_x509_certificate(match.group(0)))
        except ValueError:
            bad += 1
    return ParsedBundle(certs=tuple(certs), bad_blocks=bad)


def certificates(data: bytes) -> list[x509.Certificate]:
    return list(parse_bundle(data).certs)


def to_pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certs)


def fingerprint(cert: x509.Certificate) -> bytes:
    """SHA-256 of the DER encoding: two PEM texts of one certificate compare equal by this."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).digest()


def dedupe(certs: Iterable[x509.Certificate]) -> list[x509.Certificate]:
    seen: set[bytes] = set()
    out: list[x509.Certificate] = []
    for cert in certs:
        fp = fingerprint(cert)
        if fp not in seen:
            seen.add(fp)
            out.append(cert)
    return out


def is_ca(cert: x509.Certificate) -> bool:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return constraints.ca


def is_self_signed(cert: x509.Certificate) -> bool:
    if cert.issuer != cert.subject:
        return False
    return issued_by(cert, cert)


def issued_by(child: x509.Certificate, parent: x509.Certificate) -> bool:
    """True when `parent`'s key signed `child` and the names line up (no policy checks)."""
    try:
        child.verify_directly_issued_by(parent)
    except Exception:  # InvalidSignature, ValueError, TypeError: all mean "not this parent"
        return False
    return True


def not_before(cert: x509.Certificate) -> datetime:
    return cert.not_valid_before_utc


def not_after(cert: x509.Certificate) -> datetime:
    return cert.not_valid_after_utc


def expired(cert: x509.Certificate, now: datetime) -> bool:
    """X.509 validity includes notAfter itself, so a certificate is expired only strictly after it."""
    return now > cert.not_valid_after_utc


def not_yet_valid(cert: x509.Certificate, now: datetime) -> bool:
    return now < cert.not_valid_before_utc


def describe(cert: x509.Certificate) -> str:
    """A short, log-friendly name for a certificate: subject CN (or full subject) and serial."""
    cns = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    name = str(cns[0].value) if cns else cert.subject.rfc4514_string() or "<empty subject>"
    return f"{name} (serial {cert.serial_number:x})"
