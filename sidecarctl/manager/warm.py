"""The watches every replica's control role keeps, leader or not: the warm standby.

Why: a replica that won the Lease used to start its term from fresh lists, and at 50,000 injected
pods that was 45-65 s before its first reconcile, while the rollout it took over stood still. So
every control process keeps the controller's watches running for its whole life: SidecarSets,
namespaces, the SidecarSets' ControllerRevisions, the webhook configuration, injected pods as
projections (sidecarsets.pods.projection, never whole pods) and, while discovery lists the API,
our MutatingAdmissionPolicies, bindings and parameter objects (`PolicyWatches`). A standby holds
what the leader holds, and writes nothing.

A term (sidecarctl.manager.term) takes over in two steps. First `catch_up`: each watch is brought
up to a quorum read made after the Lease was won (kuberuntime.informer.Informer.catch_up), so the
term plans from nothing older than that, not from what a stalled stream last delivered, and
without listing the pods again (the small caches are read again: `REREAD_UP_TO`). Then `attach`.
The watches outlive the terms, so their handlers cannot be a term's own methods: each is a
`Route`, which passes events on to the handler attached to it (to nobody on a standby). `attach`
points a route at a term's handler and, in the same step (no await in between), hands it what the
watch holds as ADDED events, so the term sees every object once and every change after. Only these
caches outlive a term: the planning state is built anew each time, from them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from injector.policy import params
from injector.policysync import support
from injector.policysync.narrowing import MWC_PATH
from injector.policysync.sync import MANAGED_SELECTOR, PolicySync
from kuberuntime import api, kubeapi
from kuberuntime.discovery import Served
from kuberuntime.informer import Handler, Informer, LabelIndex
from kuberuntime.jsontypes import JsonObj
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.controller.controller import NSS_PATH, SS_PATH
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.spec import names
from sidecarsets.store import namespace_labels

# A takeover catches a cache of at most this many objects up by reading it again (a consistent read)
# instead of waiting up to 2 s for a bookmark (kuberuntime.informer): SidecarSets, their revisions,
# namespaces and the webhook configuration, a few hundred small objects in most clusters; never the
# pods, whose watch moves with the rollout's events.
REREAD_UP_TO = 500


def identity(obj: JsonObj) -> JsonObj:
    return obj


class Route:
    """An informer's handler that passes events on to whoever is attached, if anyone; `keep`, an
    index the caches hold whatever the term, gets every event first."""

    def __init__(self, keep: Handler | None = None) -> None:
        self.to: Handler | None = None
        self.keep = keep

    def __call__(self, kind: str, old: Any, new: Any) -> None:
        if self.keep is not None:
            self.keep(kind, old, new)
        if self.to is not None:
            self.to(kind, old, new)


def pod_informer(client: api.ListWatcher, **kw: Any) -> Informer[PodProjection]:
    """The injected pods as the controller holds them (projections), the largest of its caches;
    bench/bench_initial_state.py times this same informer's first read."""
    return Informer(
        client,
        "/api/v1/pods",
        name="pods",
        transform=project,
        label_selector=f"{names.POD_INJECTED_LABEL}=true",
        # Pods are large; small pages keep the peak heap (and so the RSS, which Python keeps) low.
        page_size=100,
        **kw,
    )


def routed(
    client: api.ListWatcher, path: str, *, name: str, transform: Callable[[JsonObj], Any], **kw: Any
) -> Informer[Any]:
    """An informer whose events go through a Route, attached to nothing yet."""
    return Informer(client, path, name=name, transform=transform, handler=Route(), **kw)


def attach(informer: Informer[Any], handler: Handler | None) -> None:
    """Send `informer`'s events to `handler` from now on (None: to nobody), and first what it holds."""
    route = informer.handler
    if not isinstance(route, Route):
        raise TypeError(f"informer {informer.name} is not routed")
    route.to = handler
    if handler is not None:
        for value in list(informer.store.values()):
            handler("ADDED", None, value)


async def catch_up(informers: Iterable[Informer[Any]]) -> dict[str, int]:
    """Each informer brought up to a quorum read made now, all at once (kuberuntime.informer's
    `catch_up`); informer name -> the resourceVersion it reached."""
    todo = list(informers)
    reached = await asyncio.gather(*(i.catch_up() for i in todo))
    return {i.name: rv for i, rv in zip(todo, reached, strict=True)}


class PolicyWatches:
    """The watches of our policies, bindings and their parameter objects in one served version of the API.

    Kept by every replica, leader or not, while discovery lists the API (`WarmCaches.follow`), and
    handed to a term's policy sync by sidecarctl.manager.optionalapis.TermApis."""

    def __init__(self, client: api.ListWatcher, api_: support.PolicyApi, namespace: str, timeout: int) -> None:
        self.api = api_
        self.informers: list[Informer[JsonObj]] = [
            routed(client, path, name=name, transform=identity, label_selector=MANAGED_SELECTOR)
            for path, name in (
                (api_.policies, "policies"),
                (api_.bindings, "policybindings"),
                (params.path(namespace), "policyparams"),  # in the manager's namespace (--namespace)
            )
        ]
        for informer in self.informers:
            informer.watch_timeout = timeout
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(i.run(self.stop), name=f"informer-{i.name}") for i in self.informers]

    async def synced(self) -> None:
        for informer in self.informers:
            await informer.synced.wait()

    def attach(self, sync: PolicySync | None) -> None:
        """Feed `sync` (None: nobody) from now on, starting with what the watches hold."""
        policies, bindings, params = self.informers
        attach(policies, None if sync is None else sync.on_policy)
        attach(bindings, None if sync is None else sync.on_binding)
        attach(params, None if sync is None else sync.on_params)

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class WarmCaches:
    """The control role's watches, run for the whole life of the process (`run`)."""

    def __init__(self, client: kubeapi.KubeClient, opts: ManagerOptions) -> None:
        self.client = client
        self.namespace = opts.namespace
        self.watch_timeout = opts.watches.watch_timeout
        self.sidecarsets = routed(client, SS_PATH, name="sidecarsets", transform=identity)
        # Cluster-scoped namespaces are keyed by name in the informer's store: name -> labels.
        self.namespaces = routed(client, "/api/v1/namespaces", name="namespaces", transform=namespace_labels)
        # The SidecarSets' revisions, also grouped by SidecarSet: a reconcile reads its own few.
        self.revision_index = LabelIndex(names.REVISION_LABEL_SIDECARSET)
        self.revisions: Informer[JsonObj] = Informer(
            client,
            f"/apis/apps/v1/namespaces/{opts.namespace}/controllerrevisions",
            name="controllerrevisions",
            transform=identity,
            handler=Route(keep=self.revision_index.handle),
            label_selector=names.REVISION_LABEL_SIDECARSET,
        )
        self.webhook_config = routed(
            client,
            MWC_PATH,
            name="webhookconfig",
            transform=identity,
            field_selector=f"metadata.name={opts.ca_bundle.mutating_config}",
        )
        self.pods = pod_informer(client, handler=Route())
        # NamespacedSidecarSets (none with --no-namespaced-sidecarsets): optional, since a cluster
        # without their CRD has none, and nothing may wait for a first list there.
        self.tenant_sets: Informer[JsonObj] | None = (
            routed(client, NSS_PATH, name="namespacedsidecarsets", transform=identity, optional=True)
            if opts.injection.namespaced_sidecarsets
            else None
        )
        # Both kinds of SidecarSet: what the policy sync catches up before it first narrows the webhook.
        self.all_sidecarsets: list[Informer[Any]] = [
            self.sidecarsets,
            *([self.tenant_sets] if self.tenant_sets is not None else []),
        ]
        self.core: list[Informer[Any]] = [
            *self.all_sidecarsets,
            self.namespaces,
            self.revisions,
            self.webhook_config,
            self.pods,
        ]
        for informer in self.core:
            informer.watch_timeout = self.watch_timeout
            if informer is not self.pods:
                informer.reread_up_to = REREAD_UP_TO
        # Our policies and bindings, while discovery lists the API (`follow`).
        self.policy: PolicyWatches | None = None

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(i.run(stop), name=f"informer-{i.name}") for i in self.core]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.follow(None)

    async def synced(self) -> None:
        for informer in self.core:
            await informer.synced.wait()

    async def follow(self, served: Served | None) -> bool:
        """Keep the policy watches in step with discovery (None: stop them); True when they changed."""
        wanted = None if served is None else support.served_api(served)
        if wanted == (None if self.policy is None else self.policy.api):
            return False
        old, self.policy = self.policy, None
        if old is not None:
            await old.close()
        if wanted is not None:
            self.policy = PolicyWatches(self.client, wanted, self.namespace, self.watch_timeout)
        return True
