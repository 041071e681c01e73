"""Self-signed mode: a CA and serving leaf kept in a Secret and shared by every replica.

The Secret (`kubernetes.io/tls`) holds `tls.crt`, `tls.key`, `ca.crt` and also `ca.key`, like
cert-manager's CA issuer, so that any replica can re-sign the leaf: whoever can read that Secret can
mint serving certificates the webhook configurations trust, so restrict `get` on it to the manager.
`ca.crt` is a bundle: the signing CA (the one matching `ca.key`) first, then older CAs until they expire.

Replicas that start together on an empty Secret agree on one CA: creation is create-if-absent (the
loser re-reads and adopts), and every change is an update guarded by resourceVersion (on conflict,
re-read, and adopt the winner when it passes the same checks). Each replica then writes the files into
its cert dir with the kubelet's atomic `..data` swap, so the ordinary `CertReloader` serves them.

Rotation, in two phases so that the caBundle always knows a CA before a leaf from it is served:
1. CA renewal due (less than `renew_fraction` of its life left) or CA unusable: a new CA becomes the
   signing CA and goes to the front of `ca.crt`; a leaf that still chains to the old CA keeps serving.
   The reloader sees the new `ca.crt` and the caBundle sync publishes old + new.
2. Once the signing CA is `ca_propagation` old, a leaf not signed by it is re-signed (F4: a CA change
   must re-sign the leaf even when the leaf is still valid).
A leaf that is invalid, not trusted by `ca.crt`, missing a SAN or due for renewal is re-issued at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import ipaddress
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from certwatcher import pem
from certwatcher.atomicdir import write_atomic
from certwatcher.files import CA_FILE, CERT_FILE, KEY_FILE
from certwatcher.tls import CertValidationError, validate_pair
from kuberuntime import api as kube
from kuberuntime.backoff import Backoff
from kuberuntime.clock import sleep_or_stop, utc_now
from kuberuntime.jsontypes import mapping
from selfsigned.issuing import (
    DEFAULT_BACKDATE,
    DEFAULT_CA_LIFETIME,
    DEFAULT_LEAF_LIFETIME,
    DEFAULT_RENEW_FRACTION,
    Issued,
    generate_ca,
    issue_leaf,
    renewal_due,
    renewal_time,
    service_dns_names,
)

log = logging.getLogger(__name__)

CA_KEY_FILE = "ca.key"
SECRET_TYPE_TLS = "kubernetes.io/tls"
MANAGED_BY = ("app.kubernetes.io/managed-by", "sidecarctl")
DEFAULT_SECRET_NAME = "sidecarctl-webhook-certs"


class SelfSignedError(Exception):
    """The Secret could not be brought to a valid state (e.g. conflicts kept winning)."""


@dataclass(frozen=True)
class SelfSignedConfig:
    namespace: str
    service: str
    secret_name: str = DEFAULT_SECRET_NAME
    extra_dns: tuple[str, ...] = ()
    extra_ips: tuple[str, ...] = ()
    ca_lifetime: timedelta = DEFAULT_CA_LIFETIME
    leaf_lifetime: timedelta = DEFAULT_LEAF_LIFETIME
    renew_fraction: float = DEFAULT_RENEW_FRACTION
    ca_propagation: timedelta = timedelta(minutes=5)
    backdate: timedelta = DEFAULT_BACKDATE

    def __post_init__(self) -> None:
        for name in ("namespace", "service", "secret_name"):
            value = getattr(self, name)
            if not value or "/" in value:
                raise ValueError(f"{name}: must be a non-empty object name, got {value!r}")
        for dns in self.extra_dns:
            if not dns or " " in dns:
                raise ValueError(f"extra_dns: {dns!r} is not a DNS name")
        for ip in self.extra_ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"extra_ips: {ip!r} is not an IP address") from None
        for name in ("ca_lifetime", "leaf_lifetime"):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if not 0 < self.renew_fraction < 1:
            raise ValueError(f"renew_fraction: must be between 0 and 1, got {self.renew_fraction}")
        if self.ca_propagation < timedelta(0) or self.backdate < timedelta(0):
            raise ValueError("ca_propagation, backdate: must not be negative")

    @property
    def dns_names(self) -> list[str]:
        names = service_dns_names(self.service, self.namespace)
        return names + [n for n in self.extra_dns if n not in names]

    @property
    def secret_path(self) -> str:
        return f"{self.secrets_path}/{self.secret_name}"

    @property
    def secrets_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets"


@dataclass(frozen=True)
class Material:
    cert_pem: bytes = b""
    key_pem: bytes = b""
    ca_pem: bytes = b""
    ca_key_pem: bytes = b""

    def serving_files(self) -> dict[str, bytes]:
        """What the webhook server needs; `ca.key` stays in the Secret only."""
        return {CERT_FILE: self.cert_pem, KEY_FILE: self.key_pem, CA_FILE: self.ca_pem}

    def secret_data(self) -> dict[str, str]:
        raw = {**self.serving_files(), CA_KEY_FILE: self.ca_key_pem}
        return {k: base64.b64encode(v).decode("ascii") for k, v in raw.items()}


def material_from_secret(secret: dict[str, Any]) -> Material:
    """Whatever the Secret holds; a missing or undecodable key reads as empty (and fails the checks)."""
    data = mapping(secret, "data")

    def get(key: str) -> bytes:
        value = data.get(key)
        if not isinstance(value, str):
            return b""
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return b""

    return Material(cert_pem=get(CERT_FILE), key_pem=get(KEY_FILE), ca_pem=get(CA_FILE), ca_key_pem=get(CA_KEY_FILE))


@dataclass(frozen=True)
class Plan:
    material: Material
    changed: bool
    reasons: tuple[str, ...] = ()
    wake_at: datetime | None = None  # earliest moment the plan may change without outside input
    phase: str = "steady"  # "steady", "ca-rotated" (new CA this time) or "ca-propagating" (old leaf kept)


def _signing_ca(bundle: list[x509.Certificate], ca_key_pem: bytes) -> x509.Certificate | None:
    if not ca_key_pem:
        return None
    try:
        key = serialization.load_pem_private_key(ca_key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    want = key.public_key().public_bytes(*spki)
    for cert in bundle:
        if pem.is_ca(cert) and cert.public_key().public_bytes(*spki) == want:
            return cert
    return None


def _leaf_problem(current: Material, bundle_pem: bytes, config: SelfSignedConfig, now: datetime) -> str | None:
    if not current.cert_pem or not current.key_pem:
        return "no serving certificate yet"
    try:
        pair = validate_pair(current.cert_pem, current.key_pem, bundle_pem, now=now)
    except CertValidationError as exc:
        return f"serving certificate unusable ({exc.reason}): {exc.message}"
    leaf = pair.leaf
    if pem.is_ca(leaf):
        return "serving certificate is a CA certificate"
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "serving certificate has no subjectAltName"
    have_dns = set(san.get_values_for_type(x509.DNSName))
    have_ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    want_ips = {str(ipaddress.ip_address(ip)) for ip in config.extra_ips}
    missing = sorted(set(config.dns_names) - have_dns) + sorted(want_ips - have_ips)
    if missing:
        return f"serving certificate lacks SAN(s) {', '.join(missing)}"
    if renewal_due(pem.not_before(leaf), pem.not_after(leaf), now, fraction=config.renew_fraction):
        return f"serving certificate renewal due (notAfter {pem.not_after(leaf).isoformat()})"
    return None


def plan_material(current: Material | None, config: SelfSignedConfig, *, now: datetime) -> Plan:
    """What the Secret should hold at `now` (pure apart from fresh key generation); policy in the docstring."""
    cur = current or Material()
    reasons: list[str] = []
    bundle = pem.dedupe(pem.certificates(cur.ca_pem))
    signing = _signing_ca(bundle, cur.ca_key_pem)
    phase = "steady"
    if signing is None:
        reasons.append("no usable CA (ca.crt/ca.key missing, unreadable, not a CA or not a pair)")
    elif pem.expired(signing, now):
        reasons.append(f"CA {pem.describe(signing)} expired")
        signing = None
    elif renewal_due(pem.not_before(signing), pem.not_after(signing), now, fraction=config.renew_fraction):
        reasons.append(f"CA {pem.describe(signing)} renewal due (notAfter {pem.not_after(signing).isoformat()})")
        signing = None
    if signing is None:
        ca = generate_ca(now=now, lifetime=config.ca_lifetime, backdate=config.backdate)
        signing = ca.cert
        phase = "ca-rotated"
    else:
        ca = Issued(cert_pem=pem.to_pem([signing]), key_pem=cur.ca_key_pem)
    signing_fp = pem.fingerprint(signing)
    older = [c for c in bundle if pem.is_ca(c) and not pem.expired(c, now) and pem.fingerprint(c) != signing_fp]
    older.sort(key=lambda c: (pem.not_after(c), pem.fingerprint(c)), reverse=True)
    new_bundle = pem.to_pem([signing, *older])

    cert_pem, key_pem = cur.cert_pem, cur.key_pem
    problem = _leaf_problem(cur, new_bundle, config, now)
    ca_issued_at = pem.not_before(signing) + config.backdate
    resign_at = ca_issued_at + config.ca_propagation
    if problem is None:
        leaf = pem.certificates(cur.cert_pem)[0]
        if not pem.issued_by(leaf, signing):
            if now >= resign_at:
                problem = f"serving certificate is not signed by the current CA {pem.describe(signing)}"
            else:
                phase = "ca-propagating"
    if problem is not None:
        reasons.append(problem)
        issued = issue_leaf(
            ca,
            now=now,
            dns_names=config.dns_names,
            ip_addresses=list(config.extra_ips),
            lifetime=config.leaf_lifetime,
            backdate=config.backdate,
        )
        cert_pem, key_pem = issued.cert_pem, issued.key_pem

    material = Material(cert_pem=cert_pem, key_pem=key_pem, ca_pem=new_bundle, ca_key_pem=ca.key_pem)
    leaf = pem.certificates(cert_pem)[0]
    wakes = [
        renewal_time(pem.not_before(leaf), pem.not_after(leaf), fraction=config.renew_fraction),
        renewal_time(pem.not_before(signing), pem.not_after(signing), fraction=config.renew_fraction),
        *(pem.not_after(c) + timedelta(seconds=1) for c in older),
    ]
    if phase == "ca-propagating":
        wakes.append(resign_at)
    future = [w for w in wakes if w > now]
    return Plan(
        material=material,
        changed=material != cur,
        reasons=tuple(reasons),
        wake_at=min(future) if future else None,
        phase=phase,
    )


def _secret_body(config: SelfSignedConfig, material: Material, existing: dict[str, Any] | None) -> dict[str, Any]:
    if existing is None:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": config.secret_name,
                "namespace": config.namespace,
                "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
            },
            "type": SECRET_TYPE_TLS,
            "data": material.secret_data(),
        }
    body = copy.deepcopy(existing)
    body["data"] = {**mapping(body, "data"), **material.secret_data()}
    return body


class SelfSignedIssuer:
    """Keeps the Secret valid and mirrors it into `cert_dir`; one per replica, no leader needed."""

    def __init__(
        self,
        api: kube.Client,
        config: SelfSignedConfig,
        *,
        cert_dir: str | Path | None,
        check_interval: float = 60.0,
        max_attempts: int = 6,
        clock: Callable[[], datetime] = utc_now,
        rng: random.Random | None = None,
    ) -> None:
        if check_interval <= 0:
            raise ValueError(f"check_interval: must be > 0, got {check_interval}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {max_attempts}")
        self._api = api
        self.config = config
        self.cert_dir = None if cert_dir is None else Path(cert_dir)
        self.check_interval = check_interval
        self.max_attempts = max_attempts
        self._clock = clock
        self._rng = rng or random.Random()
        self.material: Material | None = None
        self.secret_writes = 0
        self._wake_at: datetime | None = None

    async def secret_ca(self) -> bytes | None:
        """`ca.crt` as the Secret holds it now (None when it cannot be read): the caBundle's source of truth."""
        try:
            secret = await self._api.get(self.config.secret_path)
        except (kube.ApiError, OSError):
            return None
        data = (secret.get("data") or {}).get(CA_FILE)
        try:
            return base64.b64decode(data) if isinstance(data, str) else None
        except (binascii.Error, ValueError):
            return None

    async def reconcile(self) -> Material:
        """Bring the Secret to a valid state (creating, renewing or adopting) and write the cert dir."""
        path = self.config.secret_path
        for attempt in range(self.max_attempts):
            if attempt:
                await asyncio.sleep(self._rng.uniform(0.0, 0.05 * attempt))
            try:
                secret: dict[str, Any] | None = await self._api.get(path)
            except kube.NotFound:
                secret = None
            current = None if secret is None else material_from_secret(secret)
            now = self._clock()
            plan = await asyncio.to_thread(plan_material, current, self.config, now=now)
            self._wake_at = plan.wake_at
            if not plan.changed:
                return self._adopt(plan.material)
            body = _secret_body(self.config, plan.material, secret)
            try:
                if secret is None:
                    await self._api.create(self.config.secrets_path, body)
                else:
                    await self._api.update(path, body)
            except kube.Conflict:
                log.info("self-signed: Secret %s changed underneath; re-reading", path)
                continue
            self.secret_writes += 1
            log.info("self-signed: wrote Secret %s: %s", path, "; ".join(plan.reasons) or "updated")
            return self._adopt(plan.material)
        raise SelfSignedError(f"Secret {path}: no stable state after {self.max_attempts} attempts (conflicts)")

    def _adopt(self, material: Material) -> Material:
        self.material = material
        if self.cert_dir is not None and write_atomic(self.cert_dir, material.serving_files()):
            log.info("self-signed: wrote serving files into %s", self.cert_dir)
        return material

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff(base=0.5, cap=self.check_interval, jitter=(0.8, 1.2), rand=self._rng.random)
        while not stop.is_set():
            try:
                await self.reconcile()
                backoff.reset()
                delay = self.check_interval
                if self._wake_at is not None:
                    delay = min(delay, max(0.05, (self._wake_at - self._clock()).total_seconds()))
            except Exception as exc:
                delay = backoff.next()
                log.warning("self-signed: reconcile failed (%s); retrying in %.1fs", exc, delay)
            await sleep_or_stop(stop, delay)
