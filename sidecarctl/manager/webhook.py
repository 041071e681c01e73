"""The admission role: watches feeding a read-only snapshot, and the bounded TLS listener serving it.

One of these runs in every admission worker process (or in the single process the tests start).
It keeps its own watches and its own snapshot, so workers share nothing but the webhook port:
a worker busy with one request never slows another, and one that dies takes only its own
connections with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from certwatcher.reloader import CertReloader
from certwatcher.tls import ALPN_PROTOCOLS, HTTP1_ONLY
from injector.http.app import create_webhook_app
from injector.http.body import BodyLimits
from injector.http.budget import ByteBudget
from injector.http.decisions import WebhookSettings
from injector.http.namespaces import NamespaceLookup
from injector.http.server import Limits, Listener
from injector.http.snapshotwait import SnapshotWait
from injector.http.sources import ConnectionSource
from injector.http.validate.tenants import PodCreateReview
from injector.http.validate.tightened import PodLister
from kuberuntime import kubeapi, kubeconfig
from kuberuntime.clock import first_of
from kuberuntime.informer import Informer
from kuberuntime.jsontypes import JsonObj
from sidecarctl.manager import api_client, user_agent
from sidecarctl.manager.listeners import listen
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.controller.controller import NSS_PATH, SS_PATH
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore, namespace_labels

log = logging.getLogger("sidecarctl.webhook")


def _identity(obj: JsonObj) -> JsonObj:
    return obj


class WebhookRole:
    def __init__(
        self,
        opts: ManagerOptions,
        cert_dir: Path,
        *,
        client: kubeapi.KubeClient | None = None,
        source: ConnectionSource | None = None,
        name: str = "webhook",
    ) -> None:
        self.opts = opts
        agent = user_agent(name, opts.leader.effective_identity)  # `name`: the child's, webhook-0, ...
        self.client = client or api_client(kubeconfig.load_config(opts.kubeconfig), agent=agent)
        self.store = TemplateStore()
        self.informers: list[Informer[Any]] = [
            Informer(self.client, SS_PATH, name="sidecarsets", transform=_identity, handler=self.store.on_sidecarset),
            Informer(
                self.client,
                "/api/v1/namespaces",
                name="namespaces",
                transform=namespace_labels,
                handler=self.store.on_namespace,
            ),
            Informer(
                self.client,
                f"/apis/apps/v1/namespaces/{opts.namespace}/controllerrevisions",
                name="controllerrevisions",
                transform=_identity,
                handler=self.store.on_revision,
                label_selector=names.REVISION_LABEL_SIDECARSET,
            ),
        ]
        if opts.injection.namespaced_sidecarsets:
            # Optional: a cluster without the NamespacedSidecarSet CRD has none to wait for.
            self.informers.append(
                Informer(
                    self.client,
                    NSS_PATH,
                    name="namespacedsidecarsets",
                    transform=_identity,
                    handler=self.store.on_sidecarset,
                    optional=True,
                )
            )
        for informer in self.informers:
            informer.watch_timeout = opts.watches.watch_timeout
        self.reloader = CertReloader(
            cert_dir,
            poll_interval=opts.tls.cert_poll_interval,
            event_interval=opts.tls.cert_event_interval or None,
            alpn=ALPN_PROTOCOLS if opts.serving.enable_http2 else HTTP1_ONLY,
        )
        budgets = opts.budgets
        settings = WebhookSettings(
            manager_namespace=opts.namespace,
            namespace_lookup=NamespaceLookup(self.client, timeout=budgets.namespace_lookup_timeout),
            policy_only=opts.injection.injection == "policy",
            namespaced_sidecarsets=opts.injection.namespaced_sidecarsets,
            access_review=PodCreateReview(self.client, timeout=budgets.namespace_lookup_timeout),
            pod_lister=PodLister(self.client, timeout=budgets.namespace_lookup_timeout),
            snapshot_wait=SnapshotWait(
                [inf.current for inf in self.informers if inf.handler == self.store.on_sidecarset],
                timeout=budgets.namespace_lookup_timeout,
            ),
        )
        body = BodyLimits(
            timeout=budgets.body_timeout,
            max_values=budgets.max_json_values,
            budget=ByteBudget(budgets.body_budget_mib * 1024 * 1024),
        )
        self.app = create_webhook_app(self.store, settings, body)
        self.source = source  # None: a socket of its own on --webhook-bind
        self.listener: Listener | None = None

    @property
    def limits(self) -> Limits:
        b = self.opts.budgets
        return Limits(
            max_connections=b.max_connections,
            max_tls_connections=b.max_tls_connections,
            handshake_timeout=b.handshake_timeout,
            header_timeout=b.header_timeout,
            keep_alive_timeout=b.keep_alive_timeout,
            http2=self.opts.serving.enable_http2,
            h2_max_concurrent_streams=b.h2_max_streams,
            max_requests_per_connection=b.max_requests_per_connection,
        )

    def readiness(self) -> tuple[bool, str]:
        waiting = [inf.name for inf in self.informers if not inf.synced.is_set()]
        if waiting:
            return False, "waiting for the first list of " + ", ".join(waiting)
        if self.reloader.current is None:
            return False, "no valid serving certificate yet"
        if self.listener is None:
            return False, "the webhook port is not listening yet"
        return True, "ok"

    async def _first_lists(self, stop: asyncio.Event) -> bool:
        """Wait for every informer's first list; False when stopped first.

        Until then the store does not know the SidecarSets, and a pod answered from it would be
        admitted without its sidecars: a worker (started or restarted) takes no connection before.
        """
        started = time.monotonic()

        async def all_synced() -> None:
            for inf in self.informers:
                await inf.synced.wait()

        await first_of(all_synced(), stop.wait())
        if stop.is_set():
            return False
        log.info("webhook: first lists in %.2fs; accepting connections", time.monotonic() - started)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(inf.run(stop), name=f"informer-{inf.name}") for inf in self.informers]
        self.reloader.reload_now()
        tasks.append(asyncio.create_task(self.reloader.run(stop), name="cert-reloader"))
        try:
            if await self._first_lists(stop):
                source = self.source or listen(self.opts.serving.webhook_bind)
                self.listener = Listener(self.app, source, self.reloader.front_context, self.limits)
                await self.listener.serve(stop)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.close()
