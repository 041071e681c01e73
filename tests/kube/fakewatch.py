"""Watches of the in-memory API server (tests/kube/fakeapi.py), served the way kube-apiserver's watch
cache serves them, for unit tests of what a long-lived cache does with them (kuberuntime.informer,
the control role's warm standby).

What is modelled, because the code under test depends on it:

- a watch from resourceVersion R gets every change after R to the objects its collection, label
  selector and `metadata.name` field selector select, in resourceVersion order (an object that
  stops matching comes as DELETED, one that starts as ADDED); from before `compact()`: 410 Gone;
- bookmarks: one `BOOKMARK` carrying the server's current resourceVersion 2 s before the watch's
  own end when it asked for at least 3 s (the cache's pre-timeout bookmark), and one a minute;
  the stream ends at its `timeoutSeconds`;
- WatchList (`sendInitialEvents=true`): the selected objects as ADDED events, then the bookmark
  annotated `k8s.io/initial-events-end`; with `watch_list = False` it is refused as kube-apiserver
  with the `WatchList` feature gate off refuses it (422, the same message);
- `stall(collection)`: streams of that collection open now deliver nothing more and never end
  (the proxy of tests/kube/apiproxy.py does this to a real API server).

`second` scales every duration, so a unit test can run a 3 s watch in 30 ms.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj

if TYPE_CHECKING:
    from tests.kube.fakeapi import FakeApiServer

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# kube-apiserver 1.37 with --feature-gates=WatchList=false (tests/e2e/test_watchlist_e2e.py reads it live).
REFUSED = (
    'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for '
    "watch unless the WatchList feature gate is enabled"
)
BOOKMARK_EVERY = 60.0


@dataclass
class Request:
    """One watch request as the server received it."""

    path: str
    resource_version: str
    timeout: int
    params: dict[str, Any]
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False


def label_match(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term not in labels:
            return False
    return True


def in_collection(collection: str, path: str) -> bool:
    """Whether the object at `path` belongs to `collection`: a direct child, or for a cluster-wide
    collection of a namespaced resource (`/api/v1/pods`), one in any namespace."""
    if path.startswith(collection.rstrip("/") + "/") and "/" not in path[len(collection.rstrip("/")) + 1 :]:
        return True
    parts = [p for p in collection.split("/") if p]
    base = parts[:2] if parts[:1] == ["api"] else parts[:3]
    if len(parts) != len(base) + 1:
        return False
    mine = [p for p in path.split("/") if p]
    n = len(base)
    return mine[:n] == base and len(mine) == n + 4 and mine[n] == "namespaces" and mine[n + 2] == parts[-1]


def selects(params: dict[str, Any], obj: JsonObj | None) -> bool:
    """Whether the label and (metadata.name) field selectors of `params` select `obj`."""
    if obj is None:
        return False
    meta = obj.get("metadata") or {}
    if not label_match(meta.get("labels") or {}, str(params.get("labelSelector") or "")):
        return False
    for term in filter(None, str(params.get("fieldSelector") or "").split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name" and meta.get("name") != value:
            return False
    return True


class WatchCache:
    def __init__(self, server: FakeApiServer, *, second: float = 1.0) -> None:
        self.server = server
        self.second = second
        self.watch_list = True
        self.bookmarks = True  # False: a watch cache that cannot vouch for a resourceVersion (turned off)
        self.log: list[tuple[int, str, JsonObj | None, JsonObj | None]] = []  # (rv, path, old, new)
        self.oldest = 0
        self.requests: list[Request] = []
        self._tick = asyncio.Event()
        server.listeners.append(self._record)

    def _record(self, path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        self.log.append((self.server.resource_version, path, old, new))
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    def compact(self) -> None:
        """Forget the changes so far: a watch from before now gets 410 Gone."""
        self.oldest = self.server.resource_version
        self.log.clear()

    def stall(self, collection: str) -> int:
        """Stall every open watch of `collection`; how many there were."""
        hit = [r for r in self.requests if r.path == collection and not r.closed and not r.stalled.is_set()]
        for r in hit:
            r.stalled.set()
        return len(hit)

    def open(self, collection: str) -> list[Request]:
        return [r for r in self.requests if r.path == collection and not r.closed]

    def _initial(self, path: str, params: dict[str, Any]) -> list[JsonObj]:
        objects = self.server.objects
        return [copy.deepcopy(o) for p, o in sorted(objects.items()) if in_collection(path, p) and selects(params, o)]

    def _event(self, path: str, params: dict[str, Any], rv: int, old: JsonObj | None, new: JsonObj | None) -> JsonObj:
        """The event this change is for a watch of `path` with `params` (an empty dict: none)."""
        was, now = selects(params, old), selects(params, new)
        if now and was:
            return {"type": "MODIFIED", "object": copy.deepcopy(new)}
        if now:
            return {"type": "ADDED", "object": copy.deepcopy(new)}
        if was and old is not None:
            gone = copy.deepcopy(old)
            gone["metadata"]["resourceVersion"] = str(rv)
            return {"type": "DELETED", "object": gone}
        return {}

    def _bookmark(self, *, end: bool = False) -> JsonObj:
        meta: JsonObj = {"resourceVersion": str(self.server.resource_version)}
        if end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        return {"type": "BOOKMARK", "object": {"metadata": meta}}

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        params: dict[str, Any],
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[JsonObj]:
        req = Request(path, resource_version, timeout_seconds, dict(params))
        self.requests.append(req)
        try:
            if params.get("sendInitialEvents") == "true":
                if not self.watch_list:
                    raise api.Invalid(422, "Invalid", REFUSED)
                for obj in self._initial(path, params):
                    yield {"type": "ADDED", "object": obj}
                start = self.server.resource_version
                yield self._bookmark(end=True)
            else:
                start = api.rv_number(resource_version) if resource_version else self.server.resource_version
                if start < self.oldest:
                    raise api.Gone(410, "Expired", f"too old resource version: {start} ({self.oldest})")
                if opened is not None:
                    opened()
            async for event in self._follow(req, start):
                yield event
        finally:
            req.closed = True

    async def _follow(self, req: Request, start: int) -> AsyncIterator[JsonObj]:
        loop = asyncio.get_running_loop()
        began = loop.time()
        end = began + req.timeout * self.second
        pre_end = end - 2 * self.second if req.timeout >= 3 else None
        next_bookmark = min(t for t in (pre_end, began + BOOKMARK_EVERY * self.second) if t is not None)
        sent = start
        while True:
            if req.stalled.is_set():
                await asyncio.Event().wait()  # delivers nothing, never ends: the client gives up
            for rv, path, old, new in [e for e in self.log if e[0] > sent]:
                sent = rv
                event = self._event(req.path, req.params, rv, old, new) if in_collection(req.path, path) else {}
                if event:
                    yield event
            now = loop.time()
            if now >= end:
                return
            if now >= next_bookmark:
                if self.bookmarks:
                    yield self._bookmark()
                next_bookmark = (
                    end + 1 if pre_end is not None and now >= pre_end else now + BOOKMARK_EVERY * self.second
                )
            tick = self._tick
            waits = [asyncio.ensure_future(tick.wait()), asyncio.ensure_future(req.stalled.wait())]
            try:
                await asyncio.wait(
                    waits, timeout=max(0.0, min(end, next_bookmark) - now), return_when="FIRST_COMPLETED"
                )
            finally:
                for w in waits:
                    w.cancel()
