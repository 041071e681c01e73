"""Making the self-signed CA and the serving leaf, and deciding when each is due for renewal.

The CA and the leaf are separate certificates: `caBundle` carries the CA, so renewing the leaf under
the same CA needs no webhook-configuration write (controller-runtime PR #3050). The leaf has SANs and a
CN only for readability (Go rejects CN-only serving certs, F12), EKU serverAuth and `ca=False`; the CA
has `ca=True, path_length=0` and keyCertSign. Keys are EC P-256. Both are backdated a little so that a
peer whose clock lags ours still accepts them.

Renewal arithmetic: renew once less than `fraction` of the lifetime is left, i.e. at
`not_after - (not_after - not_before) * fraction`, which is always *before* `not_after`. cert-manager
computed the lifetime as `not_before - not_after` (negative), so its renewal time fell after expiry
and the CA never rotated; `renewal_time` refuses a non-positive lifetime instead.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_CA_LIFETIME = timedelta(days=5 * 365)
DEFAULT_LEAF_LIFETIME = timedelta(days=90)
DEFAULT_BACKDATE = timedelta(minutes=5)
DEFAULT_RENEW_FRACTION = 1 / 3


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _require_aware(**values: datetime) -> None:
    for name, value in values.items():
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{name}: must be timezone-aware (UTC), got naive {value.isoformat()}")


def renewal_time(not_before: datetime, not_after: datetime, *, fraction: float = DEFAULT_RENEW_FRACTION) -> datetime:
    """The moment less than `fraction` of the lifetime remains; always at or before `not_after`."""
    _require_aware(not_before=not_before, not_after=not_after)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: must be in (0, 1], got {fraction}")
    lifetime = not_after - not_before
    if lifetime <= timedelta(0):
        raise ValueError(f"not_after: {not_after.isoformat()} is not after not_before {not_before.isoformat()}")
    return not_after - lifetime * fraction


def renewal_due(
    not_before: datetime, not_after: datetime, now: datetime, *, fraction: float = DEFAULT_RENEW_FRACTION
) -> bool:
    """True once less than `fraction` of the lifetime is left (and for an expired certificate).

    A certificate that is not valid yet has all its lifetime ahead, so renewal is not due; whether it can
    be served now is a separate check. A certificate whose notAfter is not after its notBefore is due.
    """
    _require_aware(not_before=not_before, not_after=not_after, now=now)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: must be in (0, 1], got {fraction}")
    if not_after <= not_before:
        return True
    return now >= renewal_time(not_before, not_after, fraction=fraction)


def service_dns_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _seconds(value: datetime) -> datetime:
    # X.509 times have one-second resolution; truncating keeps notBefore <= now exactly.
    return value.replace(microsecond=0)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """digitalSignature for both (EC keys sign the TLS handshake); certSign and CRL sign for the CA."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def generate_ca(
    *,
    now: datetime,
    lifetime: timedelta = DEFAULT_CA_LIFETIME,
    common_name: str = "sidecarctl-webhook-ca",
    backdate: timedelta = DEFAULT_BACKDATE,
) -> Issued:
    _require_aware(now=now)
    if lifetime <= timedelta(0):
        raise ValueError(f"ca lifetime: must be positive, got {lifetime}")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_seconds(now - backdate))
        .not_valid_after(_seconds(now + lifetime))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def issue_leaf(
    ca: Issued,
    *,
    now: datetime,
    dns_names: list[str],
    ip_addresses: list[str] | None = None,
    lifetime: timedelta = DEFAULT_LEAF_LIFETIME,
    backdate: timedelta = DEFAULT_BACKDATE,
) -> Issued:
    """A serving leaf signed by `ca`; its notAfter never passes the CA's."""
    _require_aware(now=now)
    if lifetime <= timedelta(0):
        raise ValueError(f"leaf lifetime: must be positive, got {lifetime}")
    if not dns_names:
        raise ValueError("dns_names: at least one DNS name is needed")
    ips = []
    for raw in ip_addresses or []:
        try:
            ips.append(ipaddress.ip_address(raw))
        except ValueError:
            raise ValueError(f"ip_addresses: {raw!r} is not an IP address") from None
    ca_cert = ca.cert
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("ca key: only EC keys are supported for signing")
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(_seconds(now + lifetime), ca_cert.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0][:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_seconds(now - backdate))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))
