"""What caBundle should hold: the bundle policy, and reading the field's base64.

Pure functions of the published bundle, the local `ca.crt` and the time, so the policy is tested
without an API server; cabundle.syncer decides when to apply it and writes the result.

Bundle policy (`desired_bundle`), after cert-manager's CA-injector merging:
- the local CAs from `ca.crt` always go in first, in file order (a self-signed non-CA certificate
  that an operator uses as its own trust anchor counts as local too);
- by default the bundle is exactly the local CAs: a CA removed from `ca.crt` is withdrawn from
  caBundle at the next sync. This is safe across a CA rotation because `ca.crt` itself carries the
  old CA beside the new one until the old one expires (the self-signed issuer keeps it there, as
  cert-manager's CA bundles do), and a `source` read before every write (the Secret itself) keeps a
  replica whose files are behind from writing a withdrawn CA back;
- with `keep_existing` (for clusters that inject further CAs by other means) a certificate already in
  the bundle stays while it is a CA and has not expired, even when no replica holds it locally (the
  merge of cert-manager's cainjector); such a CA then lingers until it expires;
- expired certificates, non-CA certificates, duplicates and unreadable blocks are dropped;
- kept CAs follow the local ones ordered by notAfter (then fingerprint), so the result is deterministic.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from cryptography import x509

from certwatcher import pem


def local_anchors(local_ca_pem: bytes, now: datetime) -> list[x509.Certificate]:
    certs = pem.dedupe(pem.certificates(local_ca_pem))
    return [c for c in certs if not pem.expired(c, now) and (pem.is_ca(c) or pem.is_self_signed(c))]


def desired_bundle(current: bytes, local_ca_pem: bytes, *, now: datetime, keep_existing: bool = True) -> bytes:
    """The bundle to publish given what is published now and our `ca.crt` (policy: module docstring)."""
    local = local_anchors(local_ca_pem, now)
    seen = {pem.fingerprint(c) for c in local}
    kept: list[x509.Certificate] = []
    if keep_existing:
        for cert in pem.certificates(current):
            fp = pem.fingerprint(cert)
            if fp in seen or not pem.is_ca(cert) or pem.expired(cert, now):
                continue
            seen.add(fp)
            kept.append(cert)
        kept.sort(key=lambda c: (pem.not_after(c), pem.fingerprint(c)))
    return pem.to_pem([*local, *kept])


def bundle_differs(current: bytes, desired: bytes) -> bool:
    """True when a write is needed: other certificates, duplicates or unreadable blocks in `current`."""
    now_parsed = pem.parse_bundle(current)
    if now_parsed.bad_blocks:
        return True
    have = sorted(pem.fingerprint(c) for c in now_parsed.certs)
    want = sorted(pem.fingerprint(c) for c in pem.certificates(desired))
    return have != want


def decode_bundle(raw: object) -> bytes | None:
    """caBundle is base64 in JSON; None when the field holds something that is not."""
    if raw is None or raw == "":
        return b""
    if not isinstance(raw, str):
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None
