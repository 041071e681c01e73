"""What the cert e2e tests (`test_certs_*_e2e.py`) share: a per-test rig, load generators, readers.

No tests here. The rig starts managers with names of their own: each has its own Lease, pre-held
by a placeholder holder so that it never leads (its SidecarSet controller stays off and cannot act on
other tests' objects), and its own webhook configurations, scoped by an objectSelector to objects
carrying the rig's label, so nothing else in the cluster is admitted through them.

The checks are made the way the API server sees the manager: dry-run SidecarSet creates through a
ValidatingWebhookConfiguration with `failurePolicy: Fail` succeed only if the webhook answered, and
the handshake load generator trusts exactly the bundle the configuration publishes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from certwatcher import pem
from kuberuntime import api, kubeapi
from sidecarctl.manager.inprocess import Manager
from sidecarctl.manager.options import ManagerOptions
from tests.certutil import (
    Hammer,
    KeyPair,
    Shot,
    client_context,
    close,
    make_leaf,
    peer_serial,
)
from tests.e2e.helpers import SS_PATH, make_sidecarset
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane, free_port
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    ManagerProcess,
    RunningManager,
    ensure_namespace,
    start_process,
    webhook_configs,
)

LABEL = "certs-e2e.sidecarctl.io/run"
PLACEHOLDER = "certs-e2e-placeholder"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases"
SECRETS = f"/api/v1/namespaces/{MANAGER_NS}/secrets"
RESYNC = 2.0  # --ca-bundle-resync for every manager here
SWAPS = 3  # serving-cert swaps per timing run
SLACK = 1.5  # scheduling allowance on a shared 2-core machine, on top of every timing bound


def report(**figures: object) -> None:
    """Measured figures, printed for the README (visible with `pytest -s`)."""
    print("FIGURES " + " ".join(f"{k}={v}" for k, v in figures.items()))


# --- reading what the manager and the API server say -------------------------------------------------


def fingerprints(bundle: bytes) -> frozenset[bytes]:
    return frozenset(pem.fingerprint(c) for c in pem.certificates(bundle))


def fp(pair: KeyPair) -> bytes:
    return pem.fingerprint(pair.cert)


def entry_bundles(obj: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(h["clientConfig"].get("caBundle") or "") for h in obj["webhooks"]]


def published(kube: Kube, path: str) -> frozenset[bytes]:
    """The CA set every webhook entry of `path` publishes; the entries must agree."""
    sets = {fingerprints(b) for b in entry_bundles(kube.get(path))}
    assert len(sets) == 1, f"{path}: webhook entries publish different bundles"
    return next(iter(sets))


def resource_version(kube: Kube, path: str) -> str:
    return str(kube.get(path)["metadata"]["resourceVersion"])


@dataclass(frozen=True)
class Scrape:
    samples: tuple[tuple[str, dict[str, str], float], ...]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels` (0 when there are none)."""
        return sum(v for n, lab, v in self.samples if n == name and all(lab.get(k) == w for k, w in labels.items()))

    def has(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.samples)

    def find(self, name: str, **labels: str) -> float | None:
        """The first sample named `name` whose labels include `labels` (an empty value: the label is
        empty or absent); None when there is none."""
        for n, lab, v in self.samples:
            if n == name and all(lab.get(k, "") == w for k, w in labels.items()):
                return v
        return None


def scrape(probe_url: str) -> Scrape:
    with urllib.request.urlopen(probe_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return Scrape(
        tuple((s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples)
    )


def readyz(probe_url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(probe_url + "/readyz", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code), e.read().decode()


async def served_leaf(port: int, ca_pem: bytes) -> x509.Certificate:
    """One handshake trusting only `ca_pem`; the certificate the server presented."""
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca_pem), server_hostname="127.0.0.1"), 5
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der)
    finally:
        await close(writer)


# --- load: TLS handshakes and admission calls ---------------------------------------------------------


class TLSHammer(Hammer):
    """`Hammer` against an HTTP server: the handshake (chain, name, ALPN) is the whole exchange.

    The echo round-trip of the base class would be a protocol error against hypercorn; the TLS
    handshake is the part a swap can break, and the API server's calls cover the HTTP side.
    """

    async def _one(self, name: str, factory: Callable[[], ssl.SSLContext]) -> None:
        at = time.monotonic()
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.port, ssl=factory(), server_hostname="127.0.0.1"), 3
            )
            try:
                serial = peer_serial(writer)
                alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol()
            finally:
                await close(writer)
        except Exception as exc:
            self.shots.append(Shot(at, None, None, f"{type(exc).__name__}: {exc}", name))
        else:
            self.shots.append(Shot(at, serial, alpn, None, name))


class BundleWatch:
    """Polls the published caBundle; `context()` trusts exactly what was last seen, like the API server.

    Every sample is kept, so a test can say what was published at any moment.
    """

    def __init__(self, client: kubeapi.KubeClient, paths: list[str], *, interval: float = 0.2) -> None:
        self.client = client
        self.paths = paths
        self.interval = interval
        self.samples: list[tuple[datetime, dict[str, frozenset[bytes]]]] = []
        self._bundle = b""
        self._ctx: ssl.SSLContext | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> None:
        seen: dict[str, frozenset[bytes]] = {}
        for path in self.paths:
            obj = await self.client.get(path)
            bundles = entry_bundles(obj)
            union: set[bytes] = set()
            for b in bundles:
                union |= fingerprints(b)
            seen[path] = frozenset(union)
            if path == self.paths[0] and bundles[0] != self._bundle:
                self._bundle = bundles[0]
                self._ctx = client_context(bundles[0]) if bundles[0] else None
        self.samples.append((datetime.now(UTC), seen))

    def context(self) -> ssl.SSLContext:
        if self._ctx is None:
            raise AssertionError("nothing published in caBundle yet")
        return self._ctx

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(api.ApiError, OSError):
                await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    async def start(self) -> None:
        await self.poll()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


@dataclass
class Call:
    at: float
    error: str | None


class AdmissionProber:
    """Dry-run SidecarSet creates, one after another: each needs our webhook's answer (failurePolicy Fail)."""

    def __init__(self, client: kubeapi.KubeClient, body: Callable[[], dict[str, Any]], *, pause: float = 0.05) -> None:
        self.client = client
        self.body = body
        self.pause = pause
        self.calls: list[Call] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            try:
                await self.client.create(SS_PATH, self.body(), params={"dryRun": "All"})
            except (api.ApiError, OSError, TimeoutError) as exc:
                self.calls.append(Call(at, f"{type(exc).__name__}: {exc}"))
            else:
                self.calls.append(Call(at, None))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.pause)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    @property
    def failures(self) -> list[Call]:
        return [c for c in self.calls if c.error is not None]


# --- per-test rig: names, configurations, managers, cleanup -------------------------------------------


@dataclass
class Rig:
    aloop: BackgroundLoop
    cp: ControlPlane
    kube: Kube
    client: kubeapi.KubeClient
    token: str = field(default_factory=lambda: secrets.token_hex(4))
    children: list[ManagerProcess] = field(default_factory=list)
    in_process: list[RunningManager] = field(default_factory=list)
    owned: list[str] = field(default_factory=list)  # API paths deleted at the end
    running: list[Any] = field(default_factory=list)  # hammers, probers, watches to stop
    dirs: list[Path] = field(default_factory=list)  # cert dirs (private keys) removed at the end

    @property
    def lease(self) -> str:
        return f"certs-e2e-{self.token}"

    @property
    def mwc(self) -> str:
        return f"certs-e2e-inject-{self.token}"

    @property
    def vwc(self) -> str:
        return f"certs-e2e-validate-{self.token}"

    @property
    def mwc_path(self) -> str:
        return f"{MWC_PATH}/{self.mwc}"

    @property
    def vwc_path(self) -> str:
        return f"{VWC_PATH}/{self.vwc}"

    def cert_dir(self) -> Path:
        d = Path(tempfile.mkdtemp(prefix="sidecarctl-certs-e2e-"))
        self.dirs.append(d)
        return d

    def create(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = self.kube.create(collection, body)
        self.owned.append(f"{collection}/{body['metadata']['name']}")
        return obj

    def hold_lease(self) -> None:
        """A Lease held by a placeholder for an hour: our managers stay followers (controller off)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": PLACEHOLDER, "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": self.lease}, "spec": spec}
        self.create(LEASES, body)

    def selector(self) -> dict[str, Any]:
        return {"matchLabels": {LABEL: self.token}}

    def configs(self, url: str) -> None:
        """Our MWC and VWC pointed at `url`, caBundle empty (the manager must fill it), scoped to us."""
        mwc, vwc = webhook_configs(url, mutating=self.mwc, validating=self.vwc)
        for cfg in (mwc, vwc):
            for hook in cfg["webhooks"]:
                hook["objectSelector"] = self.selector()
        self.create(MWC_PATH, mwc)
        self.create(VWC_PATH, vwc)

    def sidecarset(self) -> dict[str, Any]:
        body = make_sidecarset(f"certs-{self.token}-{secrets.token_hex(3)}", f"certs-{self.token}")
        body["metadata"]["labels"] = {LABEL: self.token}
        return body

    def admit(self) -> dict[str, Any]:
        """One dry-run create that our webhook must answer; raises when the API server could not call it."""
        return self.kube.create(SS_PATH, self.sidecarset(), dryRun="All")

    def admits(self) -> bool:
        try:
            self.admit()
        except api.ApiError:
            return False
        return True

    def manager_flags(self, *extra: str) -> tuple[str, ...]:
        return (
            f"--lease-name={self.lease}",
            f"--mutating-config={self.mwc}",
            f"--validating-config={self.vwc}",
            "--conversion-crd=",  # the session's manager keeps the CRD's caBundle; these CAs are the test's own
            f"--ca-bundle-resync={RESYNC:g}",
            "--log-format=text",
            "--webhook-workers=1",  # one serving process: reload counts are per swap
            *extra,
        )

    def child(self, cert_dir: Path, *extra: str, webhook_port: int | None = None, tag: str = "") -> ManagerProcess:
        m = start_process(
            self.cp,
            cert_dir,
            identity=f"certs-e2e-{self.token}{tag}",
            webhook_port=webhook_port,
            extra=self.manager_flags(*extra),
        )
        self.children.append(m)
        return m

    def in_process_manager(self, cert_dir: Path, *, webhook_port: int) -> RunningManager:
        """The manager on the test loop, where a test needs its syncer; options as `child` gives them.

        (`managerharness.start_in_process` fixes `ca_bundle_resync` itself, so it is built here.)
        """
        probe_port = free_port()
        opts = ManagerOptions.build(
            kubeconfig=str(self.cp.kubeconfig),
            namespace=MANAGER_NS,
            webhook_bind=f"127.0.0.1:{webhook_port}",
            probe_bind=f"127.0.0.1:{probe_port}",
            cert_dir=str(cert_dir),
            identity=f"certs-e2e-{self.token}",
            lease_name=self.lease,
            mutating_config=self.mwc,
            validating_config=self.vwc,
            conversion_crd="",
            ca_bundle_resync=RESYNC,
        )

        async def build() -> Manager:
            return Manager(opts)  # its HTTP session must belong to the test loop

        m = RunningManager(
            self.aloop,
            self.aloop.run(build()),
            opts,
            f"http://127.0.0.1:{probe_port}",
            f"https://127.0.0.1:{webhook_port}",
        ).start()
        self.in_process.append(m)
        return m

    def wait_called(self, probe_urls: list[str], timeout: float = 30.0) -> None:
        """Until a dry-run create succeeds and every manager in `probe_urls` saw the call.

        The API server learns of the configuration and of its caBundle through an informer, so the
        first calls after creating it may fail or skip it; from here on, calls must succeed.
        """

        def called() -> bool:
            before = [scrape(u).value("sidecarctl_admissions_total", webhook="validate") for u in probe_urls]
            if not self.admits():
                return False
            after = [scrape(u).value("sidecarctl_admissions_total", webhook="validate") for u in probe_urls]
            return all(a > b for a, b in zip(after, before, strict=True))

        eventually(called, timeout=timeout, interval=0.2, what="the API server calls our webhook(s)")

    def hammer(self, port: int, contexts: dict[str, Callable[[], ssl.SSLContext]]) -> TLSHammer:
        h = TLSHammer(port, contexts, rate=20.0)
        self.aloop.run(h.__aenter__())
        self.running.append(h)
        return h

    def prober(self) -> AdmissionProber:
        p = AdmissionProber(self.client, self.sidecarset)
        self.aloop.run(p.start())
        self.running.append(p)
        return p

    def watch(self, *paths: str) -> BundleWatch:
        w = BundleWatch(self.client, list(paths))
        self.aloop.run(w.start())
        self.running.append(w)
        return w

    def stop(self, thing: Any) -> None:
        if thing in self.running:
            self.running.remove(thing)
            if isinstance(thing, Hammer):
                self.aloop.run(thing.__aexit__(None, None, None))
            else:
                self.aloop.run(thing.stop())

    def close(self) -> None:
        for thing in list(self.running):
            with contextlib.suppress(Exception):
                self.stop(thing)
        for m in self.in_process:
            with contextlib.suppress(Exception):
                m.stop()
        for c in self.children:  # SIGTERM to all first: each takes a while to drain
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        for c in self.children:
            try:
                c.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                c.kill()
        for path in reversed(self.owned):
            self.kube.delete(path)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def open_rig(aloop: BackgroundLoop, cp: ControlPlane, kube: Kube, client: kubeapi.KubeClient) -> Iterator[Rig]:
    """A rig whose Lease is held by the placeholder; everything it started or created goes at the end."""
    ensure_namespace(kube, MANAGER_NS)
    r = Rig(aloop, cp, kube, client)
    r.hold_lease()
    try:
        yield r
    finally:
        r.close()


def leaf_for(ca: KeyPair, **kw: Any) -> KeyPair:
    return make_leaf(ca, dns=("localhost",), ips=("127.0.0.1",), **kw)


def failures_text(items: list[Any], limit: int = 5) -> str:
    return "; ".join(str(getattr(i, "error", i)) for i in items[:limit])
