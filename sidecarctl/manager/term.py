"""One leadership term: the controller, the policy sync and the missed-pod scan, fed by the warm caches.

Everything a term plans with is built when it starts and dropped when it ends; only the caches
(sidecarctl.manager.warm) outlive it. That is what keeps a replica that loses the Lease and wins
it back from planning wrongly: the controller's expectations of its own pod writes, the per-pod
failure backoffs, the resizable-hash cache, the policy sync's record of what it last wrote and
which SidecarSets it is settling, the missed-pod scan's findings all describe a time when another
replica may have written since, so none of them is carried over. What the caches say is carried
over, because `start` first brings them up to a quorum read made after the Lease was won.

`start` is the only way to a running term: catch up, then build, then attach (each watch replays
what it holds into the new parts, in one step).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from injector.policy import plan as policy_plan
from injector.policysync import support
from injector.policysync.pacing import MAX_QUIET_SECONDS
from injector.policysync.sync import PolicySync
from kuberuntime import kubeapi
from kuberuntime.discovery import Served
from kuberuntime.events import EventRecorder
from sidecarctl.manager import warm
from sidecarctl.manager.optionalapis import TermApis
from sidecarctl.manager.options import ManagerOptions
from sidecarctl.manager.warm import WarmCaches
from sidecarsets.controller import metrics as ss_metrics
from sidecarsets.controller.controller import Controller
from sidecarsets.controller.missedscan import MissedScan
from sidecarsets.controller.podsecurity import PodSecurityView
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

log = logging.getLogger("sidecarctl.control")

Handler = Callable[[str, Any, Any], None]


def _both(*handlers: Handler) -> Handler:
    def handle(kind: str, old: Any, new: Any) -> None:
        for h in handlers:
            h(kind, old, new)

    return handle


def _conditions(
    sync: PolicySync, scan: MissedScan, security: PodSecurityView, sidecarsets: Callable[[], Mapping[str, SidecarSet]]
) -> Callable[[str], list[dict[str, str]]]:
    """The status conditions other parts own: PolicyInjection (the policy sync), PodsMissingSidecars,
    PodSecurity."""

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


@dataclass
class Term:
    """One leadership term's planning state; `apis` hands it the optional APIs' watches."""

    controller: Controller
    policies: PolicySync
    apis: TermApis
    missed: MissedScan
    security: PodSecurityView
    caught_up: dict[str, int]  # informer -> the resourceVersion it reached before the term planned
    catch_up_seconds: float


@dataclass(frozen=True)
class Wiring:
    """What a term is built from: the process's clients and options, and the Lease check."""

    opts: ManagerOptions
    client: kubeapi.KubeClient
    probe_client: kubeapi.KubeClient
    recorder: EventRecorder
    may_write: Callable[[], Awaitable[bool]] | None


def _build(w: Wiring, caches: WarmCaches) -> Term:
    opts = w.opts
    sync = PolicySync(
        w.client,
        mode=policy_plan.Mode(opts.injection.injection),
        manager_namespace=opts.namespace,
        webhook_config=opts.ca_bundle.mutating_config,
        settle=opts.injection.policy_settle,
        pacing=(opts.injection.policy_pace, opts.injection.policy_quiet, MAX_QUIET_SECONDS),
        may_write=w.may_write,
        probe=support.SupportProbe(w.probe_client, namespace=opts.namespace),
        unenforced_recheck=opts.watches.discovery_interval,
        catch_up=lambda: warm.catch_up(caches.all_sidecarsets),
    )
    scan = MissedScan(
        w.client,
        manager_namespace=opts.namespace,
        sidecarsets=lambda: controller.sidecarsets,
        namespaces=lambda: caches.namespaces.store,
        injected_pods=lambda: controller.pods.values(),
        recorder=w.recorder,
        interval=opts.missed.missed_scan_interval,
        recreate=opts.missed.recreate_missed,
        recreate_per_minute=opts.missed.recreate_missed_per_minute,
        may_write=w.may_write,
    )
    security = PodSecurityView(
        manager_namespace=opts.namespace, on_change=lambda: controller.refresh(list(controller.sidecarsets))
    )
    controller = Controller(
        w.client,
        namespace=opts.namespace,
        namespaces=lambda: caches.namespaces.store,
        revisions=caches.revision_index.of,
        recorder=w.recorder,
        workers=opts.controller.workers,
        may_write=w.may_write,
        conditions=_conditions(sync, scan, security, lambda: controller.sidecarsets),
    )
    sync.on_routes = controller.refresh
    scan.on_change = controller.refresh
    return Term(controller, sync, TermApis(controller, sync), scan, security, {}, 0.0)


def _attach(term: Term, caches: WarmCaches) -> None:
    """The caches' events to the term's parts, and what they hold first: SidecarSets before the
    pods, which the controller files under the SidecarSets it knows."""
    sidecarsets = _both(term.controller.on_sidecarset, term.policies.on_sidecarset)
    warm.attach(caches.sidecarsets, sidecarsets)
    if caches.tenant_sets is not None:
        warm.attach(caches.tenant_sets, sidecarsets)
    warm.attach(caches.namespaces, _both(term.controller.on_namespace, term.security.on_namespace))
    warm.attach(caches.webhook_config, term.policies.on_webhook_config)
    warm.attach(caches.pods, term.controller.on_pod)


async def start(w: Wiring, caches: WarmCaches, served: Served | None) -> Term:
    """A term that plans from nothing older than a quorum read made now: the caches caught up first."""
    started = time.monotonic()
    term = _build(w, caches)
    warm_policies = caches.policy is not None and all(i.synced.is_set() for i in caches.policy.informers)
    if served is not None:
        await term.apis.adopt(served, caches.policy)  # their catch-up runs beside the one below
    await caches.synced()  # a replica that has just started may still be reading the first states
    reached = await warm.catch_up(caches.core)
    _attach(term, caches)
    if warm_policies:  # held already, so in a moment: the policy sync then starts with them
        await term.apis.handed_over()
    term.caught_up, term.catch_up_seconds = reached, time.monotonic() - started
    return term


async def end(term: Term, caches: WarmCaches) -> None:
    """Detach the term from the caches (they go on, feeding nobody) and drop what it exported."""
    for informer in caches.core:
        warm.attach(informer, None)
    await term.apis.close()
    ss_metrics.forget()  # the next leader reports them; this replica's values would go stale
