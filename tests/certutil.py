"""Test helpers for the cert code: CAs and leaves with chosen dates, a local TLS echo server, a
handshake load generator, and webhook configurations to publish a caBundle into (the API server
they live in is tests.kube.fakeapi's).

Certificates here are built independently of `selfsigned.issuing` so that tests of that module do not
grade their own homework, and so that tests can place validity windows anywhere (expired, future).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certwatcher.atomicdir import write_atomic


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class KeyPair:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def serial(self) -> int:
        return self.cert.serial_number


def _window(not_before: datetime | None, not_after: datetime | None, lifetime: timedelta) -> tuple[datetime, datetime]:
    start = not_before or (now() - timedelta(minutes=5))
    return start, not_after or (start + lifetime)


def make_ca(
    cn: str = "test-ca",
    *,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    lifetime: timedelta = timedelta(days=2),
    ca: bool = True,
) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _window(not_before, not_after, lifetime)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert=cert, key=key)


def make_leaf(
    issuer: KeyPair,
    *,
    dns: Iterable[str] = ("localhost",),
    ips: Iterable[str] = ("127.0.0.1",),
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    lifetime: timedelta = timedelta(days=1),
    ca: bool = False,
    cn: str = "leaf",
    client: bool = False,
    organizations: Iterable[str] = (),
) -> KeyPair:
    """A serving leaf (default) or, with `client=True`, a client certificate (e.g. O=system:masters)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _window(not_before, not_after, lifetime)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return KeyPair(cert=builder.sign(issuer.key, hashes.SHA256()), key=key)


def pems(*pairs: KeyPair) -> bytes:
    return b"".join(p.cert_pem for p in pairs)


def write_dir(cert_dir: Path, *, leaf: KeyPair, ca_pem: bytes, chain: bytes = b"") -> None:
    """Publish a pair with the kubelet's `..data` swap."""
    write_atomic(cert_dir, {"tls.crt": leaf.cert_pem + chain, "tls.key": leaf.key_pem, "ca.crt": ca_pem})


# --- TLS ---------------------------------------------------------------------------------------------


def client_context(bundle_pem: bytes, *, alpn: Iterable[str] = ("h2", "http/1.1")) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=bundle_pem.decode("ascii"))
    ctx.set_alpn_protocols(list(alpn))
    return ctx


@dataclass
class Handshake:
    serial: int
    alpn: str | None


@dataclass
class EchoServer:
    port: int
    server_names: list[str | None] = field(default_factory=list)


@contextlib.asynccontextmanager
async def echo_server(front: ssl.SSLContext) -> AsyncIterator[EchoServer]:
    """A line-echo TLS server on 127.0.0.1, an ephemeral port, using `front` as-is (like hypercorn)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=front)
    port = server.sockets[0].getsockname()[1]
    try:
        yield EchoServer(port=port)
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


def peer_serial(writer: asyncio.StreamWriter) -> int:
    ssl_obj = writer.get_extra_info("ssl_object")
    der = ssl_obj.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1)


async def handshake(
    port: int, ctx: ssl.SSLContext, *, server_hostname: str = "127.0.0.1", timeout: float = 3.0
) -> Handshake:
    """Connect, complete TLS, echo one line, close; raises on any failure."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=server_hostname), timeout
    )
    try:
        result = Handshake(
            serial=peer_serial(writer), alpn=writer.get_extra_info("ssl_object").selected_alpn_protocol()
        )
        writer.write(b"ping\n")
        if await asyncio.wait_for(reader.readline(), timeout) != b"ping\n":
            raise AssertionError("echo failed")
        return result
    finally:
        await close(writer)


@dataclass
class Shot:
    at: float
    serial: int | None
    alpn: str | None
    error: str | None
    client: str


class Hammer:
    """Handshakes at a fixed rate from one or more clients, each trusting what its factory returns."""

    def __init__(self, port: int, clients: dict[str, Callable[[], ssl.SSLContext]], *, rate: float = 20.0) -> None:
        self.port = port
        self.clients = clients
        self.interval = 1.0 / rate
        self.shots: list[Shot] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    async def _one(self, name: str, factory: Callable[[], ssl.SSLContext]) -> None:
        at = time.monotonic()
        try:
            hs = await handshake(self.port, factory())
        except Exception as exc:
            self.shots.append(Shot(at, None, None, f"{type(exc).__name__}: {exc}", name))
        else:
            self.shots.append(Shot(at, hs.serial, hs.alpn, None, name))

    async def _loop(self) -> None:
        pending: set[asyncio.Task[None]] = set()
        next_at = time.monotonic()
        while not self._stop.is_set():
            for name, factory in self.clients.items():
                task = asyncio.create_task(self._one(name, factory))
                pending.add(task)
                task.add_done_callback(pending.discard)
            next_at += self.interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, next_at - time.monotonic()))
        if pending:
            await asyncio.gather(*pending)

    async def __aenter__(self) -> Hammer:
        self._tasks.append(asyncio.create_task(self._loop()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    @property
    def failures(self) -> list[Shot]:
        return [s for s in self.shots if s.error is not None]

    def first_seen(self, serial: int) -> float | None:
        times = [s.at for s in self.shots if s.serial == serial]
        return min(times) if times else None

    async def wait_for_serial(self, serial: int, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.first_seen(serial)
            if seen is not None:
                return seen
            await asyncio.sleep(0.02)
        return self.first_seen(serial)


# --- API fake ----------------------------------------------------------------------------------------


MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VWC_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def webhook_config(
    kind: str, name: str, hooks: Iterable[str], *, ca_bundle: bytes | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    entries = []
    for hook in hooks:
        client: dict[str, Any] = {"url": f"https://127.0.0.1:9443/{hook}"}
        if ca_bundle is not None:
            client["caBundle"] = base64.b64encode(ca_bundle).decode("ascii")
        entries.append(
            {
                "name": hook,
                "clientConfig": client,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            }
        )
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": f"{kind.capitalize()}WebhookConfiguration",
        "metadata": meta,
        "webhooks": entries,
    }


def bundle_of(obj: dict[str, Any], index: int = 0) -> bytes:
    raw = obj["webhooks"][index]["clientConfig"].get("caBundle", "")
    return base64.b64decode(raw)
