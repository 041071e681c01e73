"""A pod waits, briefly, for the SidecarSet watches to be current before it is decided.

Why: the pod webhook decides from its own snapshot of the SidecarSets, kept by watches
(kuberuntime.informer). While a watch reconnects (an error, a stall, or a 410 from a kube-apiserver
whose watch cache started after the snapshot's resourceVersion, as during a control plane upgrade
behind a load balancer) the snapshot may lack a SidecarSet created meanwhile, and a pod decided
from it would be admitted without that SidecarSet's sidecars. The informer knows when it is in
that state (`Informer.current`), so the pod waits for it, up to the admission budget of reads from
the API server (`--namespace-lookup-timeout`, 2 s by default). A reconnect with a fresh read takes
a fraction of that; past it (the API server unreachable from this worker, though it can call it),
the pod is decided from the snapshot as it is, with a warning: refusing every pod because a watch is
reconnecting would turn a flapping connection into an outage of pod creation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from injector.http.metrics import SNAPSHOT_WAITS

BEHIND_WARNING = (
    "sidecarctl: decided from a SidecarSet snapshot whose watch is reconnecting; a SidecarSet created "
    "in the last seconds may be missing from this pod"
)


class SnapshotWait:
    """`await wait()`: True once every watch is current (at once in the steady state), False after `timeout`."""

    def __init__(self, current: Sequence[asyncio.Event], *, timeout: float) -> None:
        self.current = list(current)
        self.timeout = timeout

    async def __call__(self) -> bool:
        if all(e.is_set() for e in self.current):
            return True
        try:
            async with asyncio.timeout(self.timeout):
                while not all(e.is_set() for e in self.current):  # one may fail again meanwhile
                    await next(e for e in self.current if not e.is_set()).wait()
        except TimeoutError:
            SNAPSHOT_WAITS.labels("behind").inc()
            return False
        SNAPSHOT_WAITS.labels("caught_up").inc()
        return True
