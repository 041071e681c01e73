"""The control role: TLS material, caBundle, leader election and the SidecarSet controller.

It runs in a process of its own (or beside the webhook role in the tests' single process), so no
admission request, however large or slow, can delay a Lease renewal or a reconcile.

Every replica keeps the serving certificate fresh (self-signed mode) and caBundle in sync (both
idempotent and bounded, so replicas do not fight). Only the Lease holder runs the controller, and
each leadership term starts from nothing: fresh watches and a fresh controller, so a replica that
loses the Lease and wins it back never plans from what it saw before.

Discovery is read before the first term and every `--discovery-interval`; each term follows it
(sidecarctl.manager.optionalapis), so nothing here waits on an API the server does not serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cabundle.syncer import CABundleSyncer, WebhookConfigRef
from certwatcher.reloader import CertReloader
from certwatcher.tls import ServingPair
from injector.policy import plan as policy_plan
from injector.policysync import support
from injector.policysync.narrowing import MWC_PATH
from injector.policysync.sync import PolicySync
from kuberuntime import kubeapi, kubeconfig
from kuberuntime.backoff import Backoff
from kuberuntime.clock import first_of, sleep_or_stop
from kuberuntime.discovery import DiscoveryWatch, Served
from kuberuntime.events import EventRecorder
from kuberuntime.informer import Informer
from kuberuntime.jsontypes import JsonObj
from kuberuntime.leader import LeaderElector
from kuberuntime.metrics import IS_LEADER
from selfsigned.issuer import SelfSignedConfig, SelfSignedIssuer
from sidecarctl.manager import optionalapis
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.controller import metrics as ss_metrics
from sidecarsets.controller.controller import SS_PATH, Controller
from sidecarsets.controller.missedscan import MissedScan
from sidecarsets.controller.podsecurity import PodSecurityView
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.store import namespace_labels

log = logging.getLogger("sidecarctl.control")

Handler = Callable[[str, Any, Any], None]


def _identity(obj: JsonObj) -> JsonObj:
    return obj


def _both(*handlers: Handler) -> Handler:
    def handle(kind: str, old: Any, new: Any) -> None:
        for h in handlers:
            h(kind, old, new)

    return handle


def _conditions(
    sync: PolicySync, scan: MissedScan, security: PodSecurityView, sidecarsets: Callable[[], Mapping[str, SidecarSet]]
) -> Callable[[str], list[dict[str, str]]]:
    """The status conditions other parts own: PolicyInjection (the policy sync), PodsMissingSidecars, PodSecurity."""

    def conditions(name: str) -> list[dict[str, str]]:
        out = []
        ss = sidecarsets().get(name)
        if ss is not None:
            out.append(security.condition(ss))
        route = sync.routes.get(name)
        if route is not None:
            status, reason, message = route.condition()
            out.append(
                {"type": names.CONDITION_POLICY_INJECTION, "status": status, "reason": reason, "message": message}
            )
        missing = scan.condition_of(name)
        if missing is not None:
            out.append(missing)
        return out

    return conditions


def _merges(opts: ManagerOptions) -> bool:
    """Whether caBundle keeps valid CAs our ca.crt lacks (sidecarctl.manager.options: --ca-bundle-policy)."""
    policy = opts.ca_bundle.ca_bundle_policy
    if policy not in ("auto", "exact", "merge"):
        raise ValueError(f"--ca-bundle-policy {policy!r}: use exact, merge or auto")
    # Our issuer keeps a rotated-out CA in ca.crt until it expires, so exact is safe with it.
    return policy == "merge" or (policy == "auto" and not opts.tls.self_signed)


def _bundle_owners(opts: ManagerOptions) -> tuple[WebhookConfigRef, ...]:
    """The objects whose caBundle the manager keeps: both webhook configurations and the CRD's conversion."""
    refs = [
        WebhookConfigRef("mutating", opts.ca_bundle.mutating_config),
        WebhookConfigRef("validating", opts.ca_bundle.validating_config),
    ]
    if opts.ca_bundle.conversion_crd:
        refs.append(WebhookConfigRef("conversion", opts.ca_bundle.conversion_crd))
    return tuple(refs)


@dataclass
class Term:
    """One leadership term: its controller and the watches that feed it, discarded at its end.

    `informers` are the watches every term needs; `apis` keeps those of the optional APIs, running
    only while discovery lists them."""

    controller: Controller
    policies: PolicySync
    informers: list[Informer[Any]]
    apis: optionalapis.OptionalApis
    missed: MissedScan | None = None

    @property
    def pod_informer(self) -> Informer[Any]:
        return self.informers[-1]


class ControlRole:
    def __init__(self, opts: ManagerOptions, cert_dir: Path, *, client: kubeapi.KubeClient | None = None) -> None:
        self.opts = opts
        self.cert_dir = cert_dir
        self.client = client or kubeapi.KubeClient(kubeconfig.load_config(opts.kubeconfig))
        # The policy canary asks on new connections: every kube-apiserver behind the Service answers.
        self.probe_client = kubeapi.KubeClient(self.client.config, fresh_connections=True)
        # Events about cluster-scoped SidecarSets live in `default`, where `kubectl describe` looks.
        self.recorder = EventRecorder(self.client)
        self.issuer: SelfSignedIssuer | None = None
        if opts.tls.self_signed:
            self.issuer = SelfSignedIssuer(
                self.client,
                SelfSignedConfig(
                    namespace=opts.namespace,
                    service=opts.tls.service_name,
                    secret_name=opts.tls.secret_name,
                    extra_dns=opts.tls.extra_dns,
                    extra_ips=opts.tls.extra_ips,
                ),
                cert_dir=cert_dir,
            )
        self.syncer: CABundleSyncer | None = None
        if opts.ca_bundle.sync_ca_bundle:
            self.syncer = CABundleSyncer(
                self.client,
                configs=_bundle_owners(opts),
                resync_interval=opts.ca_bundle.ca_bundle_resync,
                keep_existing=_merges(opts),
                source=None if self.issuer is None else self.issuer.secret_ca,
            )
        syncer = self.syncer

        self.cert_ready = asyncio.Event()

        def on_reload(pair: ServingPair) -> None:
            self.cert_ready.set()
            if syncer is not None:
                syncer.set_local_ca(pair.ca_pem)

        # Only to learn the CA that caBundle must hold; the webhook role serves (and counts) certificates.
        self.reloader = CertReloader(
            cert_dir,
            serving=False,
            poll_interval=opts.tls.cert_poll_interval,
            event_interval=opts.tls.cert_event_interval or None,
            on_reload=on_reload,
        )
        self.elector: LeaderElector | None = None
        self.term: Term | None = None
        self.leading = False
        self.discovery = DiscoveryWatch(
            self.client, optionalapis.DISCOVERED, interval=opts.watches.discovery_interval, on_change=self._discovered
        )
        self.discovery_changed = asyncio.Event()

    @property
    def controller(self) -> Controller | None:
        return None if self.term is None else self.term.controller

    def readiness(self) -> tuple[bool, str]:
        if not self.cert_ready.is_set():
            return False, "no valid serving certificate yet"
        return True, "ok"

    def _new_term(self) -> Term:
        # Cluster-scoped namespaces are keyed by name in the informer's store: name -> labels.
        ns_informer: Informer[dict[str, str]] = Informer(
            self.client, "/api/v1/namespaces", name="namespaces", transform=namespace_labels
        )
        rev_informer: Informer[JsonObj] = Informer(
            self.client,
            f"/apis/apps/v1/namespaces/{self.opts.namespace}/controllerrevisions",
            name="controllerrevisions",
            transform=_identity,
            label_selector=names.REVISION_LABEL_SIDECARSET,
        )
        may_write = None if self.elector is None else self.elector.confirm
        sync = self._policy_sync(may_write)
        missed_opts = self.opts.missed
        scan = MissedScan(
            self.client,
            manager_namespace=self.opts.namespace,
            sidecarsets=lambda: controller.sidecarsets,
            namespaces=lambda: ns_informer.store,
            injected_pods=lambda: controller.pods.values(),
            recorder=self.recorder,
            interval=missed_opts.missed_scan_interval,
            recreate=missed_opts.recreate_missed,
            recreate_per_minute=missed_opts.recreate_missed_per_minute,
            may_write=may_write,
        )
        security = PodSecurityView(
            manager_namespace=self.opts.namespace, on_change=lambda: controller.refresh(list(controller.sidecarsets))
        )
        controller = Controller(
            self.client,
            namespace=self.opts.namespace,
            namespaces=lambda: ns_informer.store,
            revisions=lambda: rev_informer.store.values(),
            recorder=self.recorder,
            workers=self.opts.controller.workers,
            may_write=may_write,
            conditions=_conditions(sync, scan, security, lambda: controller.sidecarsets),
        )
        sync.on_routes = controller.refresh
        scan.on_change = controller.refresh
        ns_informer.handler = _both(controller.on_namespace, security.on_namespace)
        informers = self._term_informers(controller, sync, ns_informer, rev_informer)
        for informer in informers:
            informer.watch_timeout = self.opts.watches.watch_timeout
        apis = optionalapis.OptionalApis(self.client, controller, sync, watch_timeout=self.opts.watches.watch_timeout)
        return Term(controller, sync, informers, apis, scan)

    def _policy_sync(self, may_write: Callable[[], Awaitable[bool]] | None) -> PolicySync:
        """The term's MutatingAdmissionPolicy sync (injector.policysync.sync), writing only while `may_write`."""
        return PolicySync(
            self.client,
            mode=policy_plan.Mode(self.opts.injection.injection),
            manager_namespace=self.opts.namespace,
            webhook_config=self.opts.ca_bundle.mutating_config,
            settle=self.opts.injection.policy_settle,
            may_write=may_write,
            probe=support.SupportProbe(self.probe_client, namespace=self.opts.namespace),
            unenforced_recheck=self.opts.watches.discovery_interval,
        )

    def _term_informers(
        self,
        controller: Controller,
        sync: PolicySync,
        ns_informer: Informer[dict[str, str]],
        rev_informer: Informer[JsonObj],
    ) -> list[Informer[Any]]:
        """The term's watches, each wired to the parts it feeds; the pods' informer comes last (`Term.pod_informer`)."""
        ss_handler = _both(controller.on_sidecarset, sync.on_sidecarset)
        informers: list[Informer[Any]] = [
            Informer(self.client, SS_PATH, name="sidecarsets", transform=_identity, handler=ss_handler),
            *optionalapis.tenant_informers(self.client, ss_handler, self.opts.injection.namespaced_sidecarsets),
            ns_informer,
            rev_informer,
            Informer(
                self.client,
                MWC_PATH,
                name="webhookconfig",
                transform=_identity,
                handler=sync.on_webhook_config,
                field_selector=f"metadata.name={self.opts.ca_bundle.mutating_config}",
            ),
            Informer[PodProjection](
                self.client,
                "/api/v1/pods",
                name="pods",
                transform=project,
                handler=controller.on_pod,
                label_selector=f"{names.POD_INJECTED_LABEL}=true",
                # Pods are large; small pages keep the peak heap (and so the RSS, which Python keeps) low.
                page_size=100,
            ),
        ]
        return informers

    def _discovered(self, old: Served | None, new: Served) -> None:
        """Discovery changed: export it, say what it changes for the manager (once per change, not
        per term), and wake the running term."""
        optionalapis.export(old, new)
        said = optionalapis.describe(old, new, injection=self.opts.injection.injection)
        if said is not None:
            log.info("%s", said)
            self.discovery_changed.set()

    async def _follow_discovery(self, term: Term, stop: asyncio.Event) -> None:
        """Keep the term's optional watches and switches in step with discovery, for the whole term."""
        while not stop.is_set():
            self.discovery_changed.clear()
            served = self.discovery.current
            if served is not None:
                await term.apis.adopt(served, stop)
            await first_of(self.discovery_changed.wait(), stop.wait())

    async def _lead(self, lost: asyncio.Event) -> None:
        """Runs while this replica holds the Lease; everything it built is dropped when it ends."""
        self.leading = True
        if not self.opts.leader.leader_elect:
            IS_LEADER.labels(f"{self.opts.namespace}/{self.opts.leader.lease_name}").set(1)
        log.info("became leader; starting the SidecarSet controller from fresh lists")
        term = self.term = self._new_term()
        stop = asyncio.Event()
        watches = [asyncio.create_task(inf.run(stop), name=f"informer-{inf.name}") for inf in term.informers]
        try:
            for inf in term.informers:
                await inf.synced.wait()
            helpers = [
                asyncio.create_task(self._follow_discovery(term, stop), name="discovery"),
                asyncio.create_task(term.policies.run(stop), name="policy-sync"),
            ]
            if term.missed is not None and term.missed.interval > 0:
                helpers.append(asyncio.create_task(term.missed.run(stop), name="missed-scan"))
            try:
                await term.controller.run(stop)
            finally:
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
        finally:
            stop.set()
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await term.apis.close()
            self.term = None
            self.leading = False
            ss_metrics.forget()  # the next leader reports them; this replica's values would go stale
            log.info("stopped leading; the controller's caches are dropped")

    async def run(self, stop: asyncio.Event) -> None:
        tasks: list[asyncio.Task[Any]] = []

        def start(coro: Awaitable[Any], name: str) -> None:
            tasks.append(asyncio.create_task(coro, name=name))  # type: ignore[arg-type]

        if self.issuer is not None:
            await self._retry("self-signed certificate", self.issuer.reconcile, stop)
            start(self.issuer.run(stop), "self-signed")
        self.reloader.reload_now()
        start(self.reloader.run(stop), "cert-reloader")
        # What the API server serves, before any term plans with it.
        await self._retry("API discovery", self.discovery.refresh, stop)
        start(self.discovery.run(stop), "discovery")
        if self.syncer is not None:
            start(self.syncer.run(stop), "cabundle-sync")
        if self.opts.leader.leader_elect:
            leader = self.opts.leader
            self.elector = LeaderElector(
                self.client,
                namespace=self.opts.namespace,
                name=leader.lease_name,
                identity=leader.effective_identity,
                lease_duration=leader.lease_duration,
                renew_deadline=leader.effective_renew_deadline,
                retry_period=leader.effective_retry_period,
            )
            start(self.elector.run(stop, self._lead), "leader-election")
        else:
            start(self._lead(asyncio.Event()), "controller")
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stopper and not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %s", t.get_name(), t.exception())
        stop.set()
        # The elector watches `stop` itself (it releases the Lease); give it and the others time.
        _, pending = await asyncio.wait(tasks, timeout=10)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stopper.cancel()
        await self.client.close()
        await self.probe_client.close()

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
