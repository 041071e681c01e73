"""Which resources this API server serves, read from discovery, and read again while it runs.

Why: a watch on a resource the server does not serve fails with 404 for ever, and a component that
waits for it never starts. Clusters run several minors (an API one minor serves, the one before may
not, or only as an opt-in beta) and change under a running process (a control plane upgraded, or a
beta API turned on). So every optional resource is looked up here before it is used, and the view is
refreshed on a timer: whoever depends on one subscribes to changes instead of assuming.

Discovery is a handful of small GETs (`/version` and one resource list per group version asked
for), so polling every half minute costs the API server nothing measurable.

During a control plane upgrade the kube-apiservers behind the load balancer are of two minors, and
each read may reach either: a resource the newer one serves comes and goes from read to read. So a
resource that appears counts only once `settle` reads in a row have listed it, and one that a read
does not list is gone at once: the view errs on the side of what every server serves.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp

from kuberuntime import api
from kuberuntime.clock import sleep_or_stop

log = logging.getLogger(__name__)

_MINOR = re.compile(r"^v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class Served:
    """What discovery listed: the server's version and, per group version asked for, its resources
    (subresources as `pods/resize`). A group version the server does not serve has no entry."""

    git_version: str
    resources: frozenset[tuple[str, str]]  # (group version, resource)

    def has(self, group_version: str, resource: str) -> bool:
        return (group_version, resource) in self.resources

    @property
    def minor(self) -> tuple[int, int] | None:
        """(1, 34) for `v1.34.4`; None when the server reports a version in another form."""
        m = _MINOR.match(self.git_version)
        return (int(m.group(1)), int(m.group(2))) if m else None


def path_of(group_version: str) -> str:
    """The discovery path of a group version: `/api/v1` for the core group, `/apis/<g>/<v>` otherwise."""
    return "/api/v1" if group_version == "v1" else f"/apis/{group_version}"


async def read(client: api.Reader, group_versions: Iterable[str]) -> Served:
    """Discovery for these group versions; a 404 means the server does not serve that group version."""
    version = await client.get("/version")
    found: set[tuple[str, str]] = set()
    for gv in group_versions:
        try:
            listing = await client.get(path_of(gv))
        except api.NotFound:
            continue
        for r in listing.get("resources") or []:
            if isinstance(r, dict) and isinstance(r.get("name"), str):
                found.add((gv, r["name"]))
    return Served(str(version.get("gitVersion") or ""), frozenset(found))


class DiscoveryWatch:
    """`current` is the latest discovery; `on_change(old, new)` runs when it differs from the last one.

    `refresh()` reads it now (the first read, and whenever a caller has reason to think it changed);
    `run(stop)` reads it every `interval` seconds. Errors keep the last view: an API server that is
    restarting for an upgrade is read again on the next tick.
    """

    def __init__(
        self,
        client: api.Reader,
        group_versions: Iterable[str],
        *,
        interval: float = 30.0,
        settle: int = 3,
        on_change: Callable[[Served | None, Served], None] | None = None,
    ) -> None:
        self.client = client
        self.group_versions = tuple(group_versions)
        self.interval = interval
        self.settle = settle
        self.on_change = on_change
        self.current: Served | None = None
        self._listed: dict[tuple[str, str], int] = {}  # resource -> reads in a row that listed it
        self._lock = asyncio.Lock()

    def _settled(self, read_now: Served) -> Served:
        """`read_now` with the resources the view did not hold yet kept out until `settle` reads in a
        row have listed them (the first read is taken as it is)."""
        self._listed = {r: self._listed.get(r, 0) + 1 for r in read_now.resources}
        if self.current is None:
            return read_now
        kept = {r for r in read_now.resources if r in self.current.resources or self._listed[r] >= self.settle}
        return Served(read_now.git_version, frozenset(kept))

    async def refresh(self) -> Served:
        """Read discovery now; raises the API or network error when it cannot be read."""
        async with self._lock:
            served = self._settled(await read(self.client, self.group_versions))
            old, self.current = self.current, served
            if served != old and self.on_change is not None:
                try:
                    self.on_change(old, served)
                except Exception:  # a subscriber's bug must not stop discovery
                    log.exception("discovery: a change handler failed")
            return served

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.interval):
            try:
                await self.refresh()
            except (api.ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
                log.info("discovery not read (%s); keeping the last view", api.reason(e))
