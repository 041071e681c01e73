"""The API server's optional APIs as the control role uses them: found by discovery, followed per term.

MutatingAdmissionPolicy v1 (GA in Kubernetes 1.36) and `pods/resize` (1.33, GA in 1.35) are used only
while discovery lists them. A watch of an unserved resource fails with 404 for ever, so the policy
watches run only while the API is served, started or stopped inside the running term when that
changes (an upgraded control plane, a beta turned on or off); the controller never waits for them.
"""

from __future__ import annotations

import asyncio

from injector.policysync import support
from injector.policysync.sync import MANAGED_SELECTOR, PolicySync
from kuberuntime import kubeapi
from kuberuntime.clock import first_of
from kuberuntime.discovery import Served
from kuberuntime.informer import Handler, Informer
from kuberuntime.jsontypes import JsonObj
from kuberuntime.metrics import API_SERVED, APISERVER_INFO
from sidecarsets.controller.controller import NSS_PATH, Controller
from sidecarsets.rollout.resize import RESIZE_SUBRESOURCE

# The optional resources whose availability is exported (sidecarctl_api_served) and acted on.
OPTIONAL = (
    *((gv, r) for gv in support.GROUP_VERSIONS for r in support.POLICY_RESOURCES),
    RESIZE_SUBRESOURCE,
)
DISCOVERED = tuple(dict.fromkeys(gv for gv, _ in OPTIONAL))


def tenant_informers(client: kubeapi.KubeClient, handler: Handler, enabled: bool) -> list[Informer[JsonObj]]:
    """The NamespacedSidecarSet watch (none with --no-namespaced-sidecarsets): optional, since a cluster
    without its CRD has none, and nothing may wait for its first list there."""
    if not enabled:
        return []
    return [
        Informer(client, NSS_PATH, name="namespacedsidecarsets", transform=_identity, handler=handler, optional=True)
    ]


def export(old: Served | None, new: Served) -> None:
    """sidecarctl_apiserver_info and sidecarctl_api_served, as discovery now reads."""
    if old is not None and old.git_version != new.git_version:
        APISERVER_INFO.labels(old.git_version).set(0)  # (removing a series is not possible across processes)
    APISERVER_INFO.labels(new.git_version).set(1)
    for gv, resource in OPTIONAL:
        API_SERVED.labels(gv, resource).set(1 if new.has(gv, resource) else 0)


def _used(served: Served) -> tuple[support.PolicyApi | None, bool]:
    return support.served_api(served), served.has(*RESIZE_SUBRESOURCE)


def describe(old: Served | None, new: Served, *, injection: str) -> str | None:
    """The log line saying what the manager uses on this server; None when that did not change."""
    if old is not None and _used(old) == _used(new):
        return None
    policy_api, resize = _used(new)
    if policy_api is None and injection != "webhook":
        how = f"injection as with --injection=webhook ({support.not_served(new)})"
    else:
        how = f"--injection={injection}"
    sizes = "served: sidecar resources change in place" if resize else "not served: resources changes are not rolled"
    return f"API server {new.git_version or '(no version)'}: {how}; pods/resize {sizes}"


class PolicyWatches:
    """The watches of our policies and bindings in one served version of the API, fed to the sync."""

    def __init__(self, client: kubeapi.KubeClient, api: support.PolicyApi, sync: PolicySync, timeout: int) -> None:
        self.api = api
        self.informers: list[Informer[JsonObj]] = [
            Informer(client, path, name=name, transform=_identity, handler=handler, label_selector=MANAGED_SELECTOR)
            for path, name, handler in (
                (api.policies, "policies", sync.on_policy),
                (api.bindings, "policybindings", sync.on_binding),
            )
        ]
        for informer in self.informers:
            informer.watch_timeout = timeout
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(i.run(self.stop), name=f"informer-{i.name}") for i in self.informers]

    async def synced(self) -> None:
        for informer in self.informers:
            await informer.synced.wait()

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _identity(obj: JsonObj) -> JsonObj:
    return obj


class OptionalApis:
    """One term's use of the optional APIs: `adopt(served)` after each discovery change, `close()` at its end."""

    def __init__(
        self, client: kubeapi.KubeClient, controller: Controller, sync: PolicySync, *, watch_timeout: int
    ) -> None:
        self.client = client
        self.controller = controller
        self.sync = sync
        self.watch_timeout = watch_timeout
        self.policy_watches: PolicyWatches | None = None
        self._handing_over: asyncio.Task[None] | None = None

    async def adopt(self, served: Served, stop: asyncio.Event) -> None:
        """Use what `served` lists from now on. The policy API goes to the sync only once its watches
        have listed what is stored (the sync compares with it); until then the sync hears that it
        is not served yet. A kube-apiserver of an older minor behind the same load balancer answers
        those lists with 404, so that may take a while: nothing else waits for it."""
        self.controller.resize_served = served.has(*RESIZE_SUBRESOURCE)
        wanted = support.served_api(served)
        watching = None if self.policy_watches is None else self.policy_watches.api
        if wanted == watching:
            if wanted is None:
                self.sync.set_served(None, support.not_served(served))
            return
        await self.close()
        if wanted is None:
            self.sync.set_served(None, support.not_served(served))
            return
        watches = self.policy_watches = PolicyWatches(self.client, wanted, self.sync, self.watch_timeout)
        self.sync.set_served(None, support.NOT_LISTED)
        self._handing_over = asyncio.create_task(self._hand_over(watches, stop), name="policy-watches-synced")

    async def _hand_over(self, watches: PolicyWatches, stop: asyncio.Event) -> None:
        await first_of(watches.synced(), stop.wait())
        if not stop.is_set() and watches is self.policy_watches:
            self.sync.set_served(watches.api)

    async def close(self) -> None:
        if self._handing_over is not None:
            self._handing_over.cancel()
            await asyncio.gather(self._handing_over, return_exceptions=True)
            self._handing_over = None
        if self.policy_watches is not None:
            await self.policy_watches.close()
            self.policy_watches = None
