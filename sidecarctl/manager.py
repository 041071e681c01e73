"""The composition root: one asyncio process that injects, manages SidecarSets and keeps TLS current.

Every replica serves the webhooks (they read the store, which every replica keeps), keeps its
serving certificate fresh and keeps caBundle in sync (both idempotent and bounded, so replicas
do not fight). Only the replica holding the Lease runs the controller. SIGTERM stops the
servers gracefully and releases the Lease so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config

from certwatcher.cabundle import CABundleSyncer, WebhookConfigRef
from certwatcher.reloader import CertReloader
from certwatcher.selfsigned import SelfSignedConfig, SelfSignedIssuer
from certwatcher.tls import ServingPair
from injector.app import WebhookSettings, create_webhook_app
from kuberuntime import kubeapi
from kuberuntime.backoff import Backoff
from kuberuntime.clock import sleep_or_stop
from kuberuntime.events import EventRecorder
from kuberuntime.informer import Informer
from kuberuntime.jsontypes import JsonObj
from kuberuntime.leader import LeaderElector
from kuberuntime.metrics import IS_LEADER
from sidecarctl.options import ManagerOptions
from sidecarctl.probes import create_probe_app
from sidecarsets import names
from sidecarsets.controller import SS_PATH, Controller
from sidecarsets.projection import PodProjection, project
from sidecarsets.store import TemplateStore, namespace_labels

log = logging.getLogger(__name__)

Handler = Callable[[str, Any, Any], None]


class _TLSConfig(Config):
    """hypercorn builds its SSLContext once; hand it the reloader's front context instead."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        return True

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._context


def _fanout(*handlers: Handler) -> Handler:
    def handle(kind: str, old: Any, new: Any) -> None:
        for h in handlers:
            h(kind, old, new)

    return handle


def _identity(obj: JsonObj) -> JsonObj:
    return obj


async def _serve(app: Any, bind: str, stop: asyncio.Event, *, context: ssl.SSLContext | None) -> None:
    config: Config = _TLSConfig(context) if context is not None else Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 5.0
    config.keep_alive_timeout = 75.0  # the API server reuses connections; do not drop them every 5 s
    # hypercorn closes a connection after 1,000 requests by default (over h2 with a GOAWAY that
    # some clients stall on); the API server keeps a few long-lived connections per webhook.
    config.keep_alive_max_requests = 1_000_000
    await serve(app, config, shutdown_trigger=stop.wait)


def _host_port(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    return ("127.0.0.1" if host in ("0.0.0.0", "::") else host), int(port)


class Manager:
    def __init__(self, opts: ManagerOptions, *, client: kubeapi.KubeClient | None = None) -> None:
        self.opts = opts
        self.client = client or kubeapi.KubeClient(kubeapi.load_config(opts.kubeconfig))
        self.store = TemplateStore()
        # Events about cluster-scoped SidecarSets live in `default`, where `kubectl describe` looks.
        self.recorder = EventRecorder(self.client)
        self.controller = Controller(
            self.client,
            namespace=opts.namespace,
            namespaces=lambda: self.store.snapshot.namespaces,
            revisions=lambda: self.store.snapshot.revisions.values(),
            recorder=self.recorder,
            workers=opts.controller.workers,
        )
        self.ss_informer: Informer[JsonObj] = Informer(
            self.client,
            SS_PATH,
            name="sidecarsets",
            transform=_identity,
            handler=_fanout(self.store.on_sidecarset, self.controller.on_sidecarset),
        )
        self.ns_informer: Informer[dict[str, str]] = Informer(
            self.client,
            "/api/v1/namespaces",
            name="namespaces",
            transform=namespace_labels,
            handler=_fanout(self.store.on_namespace, self.controller.on_namespace),
        )
        self.rev_informer: Informer[JsonObj] = Informer(
            self.client,
            f"/apis/apps/v1/namespaces/{opts.namespace}/controllerrevisions",
            name="controllerrevisions",
            transform=_identity,
            handler=self.store.on_revision,
            label_selector=names.REVISION_LABEL_SIDECARSET,
        )
        self.pod_informer: Informer[PodProjection] = Informer(
            self.client,
            "/api/v1/pods",
            name="pods",
            transform=project,
            handler=self.controller.on_pod,
            label_selector=f"{names.POD_INJECTED_LABEL}=true",
            # Pods are large; small pages keep the peak heap (and so the RSS, which Python keeps) low.
            page_size=100,
        )
        self.cert_dir = Path(opts.tls.cert_dir) if opts.tls.cert_dir else None
        self.issuer: SelfSignedIssuer | None = None
        self.syncer: CABundleSyncer | None = None
        self.reloader: CertReloader | None = None
        self.elector: LeaderElector | None = None
        self.leading = False

    # -- TLS -----------------------------------------------------------------------------------
    def _setup_tls(self) -> None:
        opts = self.opts
        if opts.tls.self_signed:
            if self.cert_dir is None:
                self.cert_dir = Path(tempfile.mkdtemp(prefix="sidecarctl-certs-"))
            self.issuer = SelfSignedIssuer(
                self.client,
                SelfSignedConfig(
                    namespace=opts.namespace,
                    service=opts.tls.service_name,
                    secret_name=opts.tls.secret_name,
                    extra_dns=opts.tls.extra_dns,
                    extra_ips=opts.tls.extra_ips,
                ),
                cert_dir=self.cert_dir,
            )
        if self.cert_dir is None:
            raise ValueError("either --cert-dir or --self-signed is required")
        if opts.ca_bundle.sync_ca_bundle:
            self.syncer = CABundleSyncer(
                self.client,
                configs=(
                    WebhookConfigRef("mutating", opts.ca_bundle.mutating_config),
                    WebhookConfigRef("validating", opts.ca_bundle.validating_config),
                ),
                resync_interval=opts.ca_bundle.ca_bundle_resync,
            )
        syncer = self.syncer

        def on_reload(pair: ServingPair) -> None:
            if syncer is not None:
                syncer.set_local_ca(pair.ca_pem)

        self.reloader = CertReloader(
            self.cert_dir,
            poll_interval=opts.tls.cert_poll_interval,
            event_interval=opts.tls.cert_event_interval or None,
            on_reload=on_reload,
        )

    # -- health --------------------------------------------------------------------------------
    async def readiness(self) -> tuple[bool, str]:
        waiting = [
            inf.name for inf in (self.ss_informer, self.ns_informer, self.rev_informer) if not inf.synced.is_set()
        ]
        if waiting:
            return False, "waiting for the first list of " + ", ".join(waiting)
        if self.reloader is None or self.reloader.current is None:
            return False, "no valid serving certificate yet"
        ok, why = await self._tls_self_check(self.reloader.current.ca_pem)
        if not ok:
            return False, why
        return True, "ok"

    async def _tls_self_check(self, ca_pem: bytes) -> tuple[bool, str]:
        """A real handshake on the webhook port, trusting only the CA we publish in caBundle."""
        host, port = _host_port(self.opts.serving.webhook_bind)
        try:
            ctx = ssl.create_default_context(cadata=ca_pem.decode())
            ctx.check_hostname = False  # the API server checks names; here we prove the chain and the key
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), timeout=2)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        except (OSError, ssl.SSLError, TimeoutError, ValueError) as e:
            return False, f"TLS self-check against {host}:{port} failed: {e}"
        return True, "ok"

    # -- run -----------------------------------------------------------------------------------
    async def _lead(self, lost: asyncio.Event) -> None:
        """Runs while this replica holds the Lease."""
        self.leading = True
        if not self.opts.leader.leader_elect:
            IS_LEADER.labels(f"{self.opts.namespace}/{self.opts.leader.lease_name}").set(1)
        log.info("became leader; starting the SidecarSet controller")
        stop = asyncio.Event()
        pods = asyncio.create_task(self.pod_informer.run(stop))
        try:
            await self.pod_informer.synced.wait()
            await self.controller.run(stop)
        finally:
            stop.set()
            pods.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pods
            self.leading = False
            log.info("stopped leading")

    async def run(self, stop: asyncio.Event) -> None:
        self._setup_tls()
        assert self.reloader is not None
        tasks: list[asyncio.Task[Any]] = []

        def start(coro: Awaitable[Any], name: str) -> None:
            tasks.append(asyncio.create_task(coro, name=name))  # type: ignore[arg-type]

        if self.issuer is not None:
            await self._retry("self-signed certificate", self.issuer.reconcile, stop)
            start(self.issuer.run(stop), "self-signed")
        self.reloader.reload_now()
        start(self.reloader.run(stop), "cert-reloader")
        if self.syncer is not None:
            start(self.syncer.run(stop), "cabundle-sync")
        for inf in (self.ss_informer, self.ns_informer, self.rev_informer):
            start(inf.run(stop), f"informer-{inf.name}")
        webhook_app = create_webhook_app(self.store, WebhookSettings(manager_namespace=self.opts.namespace))
        probe_app = create_probe_app(ready=self.readiness)
        start(_serve(webhook_app, self.opts.serving.webhook_bind, stop, context=self.reloader.front_context), "webhook")
        start(_serve(probe_app, self.opts.serving.probe_bind, stop, context=None), "probes")
        if self.opts.leader.leader_elect:
            self.elector = LeaderElector(
                self.client,
                namespace=self.opts.namespace,
                name=self.opts.leader.lease_name,
                identity=self.opts.leader.effective_identity,
                lease_duration=self.opts.leader.lease_duration,
                renew_deadline=self.opts.leader.effective_renew_deadline,
                retry_period=self.opts.leader.effective_retry_period,
            )
            start(self.elector.run(stop, self._lead), "leader-election")
        else:
            start(self._lead(asyncio.Event()), "controller")
        serving = self.opts.serving
        where = f"webhook={serving.webhook_bind} probes={serving.probe_bind} id={self.opts.leader.effective_identity}"
        log.info("manager started", extra={"object": where})
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stopper and t.exception() is not None:
                log.error("%s failed: %s", t.get_name(), t.exception())
        stop.set()
        # Servers and the elector watch `stop` themselves (graceful drain, Lease release); give them time.
        _, pending = await asyncio.wait(tasks, timeout=10)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stopper.cancel()
        await self.client.close()
        log.info("manager stopped")

    async def _retry(self, what: str, fn: Callable[[], Awaitable[Any]], stop: asyncio.Event) -> None:
        backoff = Backoff(base=0.5, cap=30.0)
        while not stop.is_set():
            try:
                await fn()
                return
            except Exception as e:
                wait = backoff.next()
                log.warning("%s failed (%s); retrying in %.1fs", what, e, wait)
                await sleep_or_stop(stop, wait)


def run_forever(opts: ManagerOptions) -> int:
    """Entry point of `sidecarctl run`: runs until SIGTERM or SIGINT."""

    # Listing thousands of pods allocates millions of short-lived objects; the default GC
    # thresholds collect so often that collection dominates the list time.
    gc.set_threshold(100_000, 50, 100)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        started = time.monotonic()
        await Manager(opts).run(stop)
        log.info("ran for %.1fs", time.monotonic() - started)

    asyncio.run(main())
    return 0
