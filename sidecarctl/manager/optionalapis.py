"""The API server's optional APIs as the control role uses them: found by discovery, followed all along.

MutatingAdmissionPolicy v1 (GA in Kubernetes 1.36) and `pods/resize` (1.33, GA in 1.35) are used only
while discovery lists them. A watch of an unserved resource fails with 404 for ever, so the policy
watches run only while the API is served, started or stopped when that changes (an upgraded control
plane, a beta turned on or off), on every replica (sidecarctl.manager.warm.PolicyWatches); a term's policy sync
gets them once they have caught up (`TermApis`). The controller never waits for them.
"""

from __future__ import annotations

import asyncio

from injector.policysync import support
from injector.policysync.sync import PolicySync
from kuberuntime.discovery import Served
from kuberuntime.metrics import API_SERVED, APISERVER_INFO
from sidecarctl.manager.warm import PolicyWatches, catch_up
from sidecarsets.controller.controller import Controller
from sidecarsets.rollout.resize import RESIZE_SUBRESOURCE

# The optional resources whose availability is exported (sidecarctl_api_served) and acted on.
OPTIONAL = (
    *((gv, r) for gv in support.GROUP_VERSIONS for r in support.POLICY_RESOURCES),
    RESIZE_SUBRESOURCE,
)
DISCOVERED = tuple(dict.fromkeys(gv for gv, _ in OPTIONAL))


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


class TermApis:
    """One term's use of the optional APIs: `adopt(served, watches)` at its start and after each
    discovery change, `close()` at its end."""

    def __init__(self, controller: Controller, sync: PolicySync) -> None:
        self.controller = controller
        self.sync = sync
        self.handed: PolicyWatches | None = None  # the watches feeding the sync
        self.handing: PolicyWatches | None = None
        self._handing_over: asyncio.Task[None] | None = None

    async def adopt(self, served: Served, watches: PolicyWatches | None) -> None:
        """Use what `served` lists from now on. The policy API goes to the sync only once its watches
        have listed what is stored and caught up with a quorum read (the sync compares with it, and
        the watches may have been running, and falling behind, long before this term); until then
        the sync hears that it is not served yet. A kube-apiserver of an older minor behind the same
        load balancer answers those lists with 404, so that may take a while: nothing else waits."""
        self.controller.resize_served = served.has(*RESIZE_SUBRESOURCE)
        wanted = support.served_api(served)
        if wanted is not None and watches is not None and watches.api == wanted:
            if watches in (self.handed, self.handing):
                return
            await self._cancel()
            self.sync.set_served(None, support.NOT_LISTED)
            self.handing = watches
            self._handing_over = asyncio.create_task(self._hand_over(watches), name="policy-watches-caught-up")
            return
        await self._cancel()
        self.sync.set_served(None, support.not_served(served) if wanted is None else support.NOT_LISTED)

    async def _hand_over(self, watches: PolicyWatches) -> None:
        await watches.synced()
        await catch_up(watches.informers)
        watches.attach(self.sync)
        self.handed, self.handing = watches, None
        self.sync.set_served(watches.api)

    async def handed_over(self) -> None:
        """Wait for a hand-over under way (none: return at once)."""
        if self._handing_over is not None:
            await asyncio.shield(self._handing_over)

    async def _cancel(self) -> None:
        if self._handing_over is not None:
            self._handing_over.cancel()
            await asyncio.gather(self._handing_over, return_exceptions=True)
            self._handing_over = None
        if self.handed is not None:
            self.handed.attach(None)
        self.handed = self.handing = None

    async def close(self) -> None:
        await self._cancel()
