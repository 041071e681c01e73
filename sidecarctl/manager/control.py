"""The control role: TLS material, caBundle, leader election and the SidecarSet controller.

It runs in a process of its own (or beside the webhook role in the tests' single process), so no
admission request, however large or slow, can delay a Lease renewal or a reconcile.

Every replica keeps the serving certificate fresh (self-signed mode) and caBundle in sync (both
idempotent and bounded, so replicas do not fight), and keeps the controller's watches running
(sidecarctl.manager.warm): a standby is as warm as the leader. Only the Lease holder plans and
writes, in terms (sidecarctl.manager.term) that start by catching those watches up with a quorum
read and build their planning state afresh, so a replica that loses the Lease and wins it back
never plans from what it saw, or decided, before.

Discovery is read before the first term and every `--discovery-interval`; the policy watches and
the running term follow it (sidecarctl.manager.optionalapis), so nothing here waits on an API the
server does not serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cabundle.syncer import CABundleSyncer, WebhookConfigRef
from certwatcher.reloader import CertReloader
from certwatcher.tls import ServingPair
from kuberuntime import kubeapi, kubeconfig
from kuberuntime.backoff import Backoff
from kuberuntime.clock import first_of, sleep_or_stop
from kuberuntime.discovery import DiscoveryWatch, Served
from kuberuntime.events import EventRecorder
from kuberuntime.leader import LeaderElector
from kuberuntime.metrics import IS_LEADER, LEADER_CATCH_UP
from selfsigned.issuer import SelfSignedConfig, SelfSignedIssuer
from sidecarctl.manager import api_client, optionalapis, user_agent
from sidecarctl.manager import term as term_mod
from sidecarctl.manager.options import ManagerOptions
from sidecarctl.manager.warm import WarmCaches
from sidecarsets.controller.controller import Controller

log = logging.getLogger("sidecarctl.control")


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


class ControlRole:
    def __init__(self, opts: ManagerOptions, cert_dir: Path, *, client: kubeapi.KubeClient | None = None) -> None:
        self.opts = opts
        self.cert_dir = cert_dir
        agent = user_agent("control", opts.leader.effective_identity)
        self.client = client or api_client(kubeconfig.load_config(opts.kubeconfig), agent=agent)
        # The policy canary asks on new connections: every kube-apiserver behind the Service answers.
        self.probe_client = api_client(self.client.config, fresh_connections=True, agent=agent)
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
        self.caches = WarmCaches(self.client, opts)
        self.term: term_mod.Term | None = None
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

    def _discovered(self, old: Served | None, new: Served) -> None:
        """Discovery changed: export it, say what it changes for the manager (once per change, not
        per term), and wake the running term."""
        optionalapis.export(old, new)
        said = optionalapis.describe(old, new, injection=self.opts.injection.injection)
        if said is not None:
            log.info("%s", said)
            self.discovery_changed.set()

    async def _follow_discovery(self, stop: asyncio.Event) -> None:
        """Keep the policy watches, and the running term's use of the optional APIs, in step with discovery."""
        while not stop.is_set():
            self.discovery_changed.clear()
            served = self.discovery.current
            if served is not None:
                await self.caches.follow(served)
                term = self.term
                if term is not None:
                    await term.apis.adopt(served, self.caches.policy)
            await first_of(self.discovery_changed.wait(), stop.wait())

    def _wiring(self) -> term_mod.Wiring:
        may_write = None if self.elector is None else self.elector.confirm
        return term_mod.Wiring(self.opts, self.client, self.probe_client, self.recorder, may_write)

    async def _lead(self, lost: asyncio.Event) -> None:
        """Runs while this replica holds the Lease: catch up, plan, write; its planning state goes with it."""
        self.leading = True
        if not self.opts.leader.leader_elect:
            IS_LEADER.labels(f"{self.opts.namespace}/{self.opts.leader.lease_name}").set(1)
        log.info("became leader; catching the caches up with a quorum read before planning")
        term: term_mod.Term | None = None
        stop = asyncio.Event()
        try:
            term = self.term = await term_mod.start(self._wiring(), self.caches, self.discovery.current)
            self.discovery_changed.set()  # what discovery said while the term started reaches it too
            LEADER_CATCH_UP.set(term.catch_up_seconds)
            log.info(
                "caches caught up in %.2fs (resourceVersions %s); starting the SidecarSet controller",
                term.catch_up_seconds,
                ", ".join(f"{name} {rv}" for name, rv in term.caught_up.items()),
            )
            helpers = [asyncio.create_task(term.policies.run(stop), name="policy-sync")]
            if term.missed.interval > 0:
                helpers.append(asyncio.create_task(term.missed.run(stop), name="missed-scan"))
            try:
                await term.controller.run(stop)
            finally:
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
        finally:
            stop.set()
            self.term = None
            if term is not None:
                await term_mod.end(term, self.caches)
            self.leading = False
            log.info("stopped leading; the caches go on, the planning state is dropped")

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
        start(self.caches.run(stop), "warm-caches")
        start(self._follow_discovery(stop), "discovery-follower")
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
