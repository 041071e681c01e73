"""The whole state of a collection, read once: streamed (Kubernetes' WatchList) or listed in pages.

Why stream: a paged LIST makes kube-apiserver build each page as one response (from etcd, or a
snapshot of its cache), and the client hold a page of whole objects before it keeps what it needs.
A WatchList (`watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan`) has the API server
send the state from its watch cache as one ADDED event per object, at a resourceVersion at least as
new as a consistent read, and end it with a bookmark annotated `k8s.io/initial-events-end: "true"`
that carries that resourceVersion. The client transforms each object as it arrives. It is beta and
on by default in every Kubernetes minor this project supports (1.34 to 1.37).

Where the API server refuses it, it says so at once: with the `WatchList` feature gate turned off,
kube-apiserver answers the request 422 Invalid ("sendInitialEvents is forbidden for watch unless the
WatchList feature gate is enabled"). Anything else that does not behave like a WatchList (a proxy or
an aggregated server that drops the parameter and sends a plain watch: an event other than ADDED, or
a bookmark without the annotation, before the end) counts as refused too: the caller lists in pages.

The stream's own deadline is long (`STREAM_SECONDS`: 50,000 pods take this machine about a minute to
stream and project), but the caller's `stall_after` still applies to silence: the server sends the
initial state without pause, so a connection that goes quiet before its end has stalled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj

T = TypeVar("T")

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
STREAM_PARAMS = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
STREAM_SECONDS = 600  # the server ends a WatchList this late at most; client-go asks for 5-10 minutes
REFUSALS = (400, 422)  # BadRequest, Invalid: a request the server does not accept, not a passing fault


class NotOffered(Exception):
    """The API server does not stream the state: list it in pages."""


class Incomplete(Exception):
    """The stream ended before the state did; read it again."""


def object_key(obj: Mapping[str, Any]) -> str:
    """The store key of an object: `namespace/name`, or `name` for a cluster-scoped one."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Reader(Generic[T]):
    """Reads `path` (with `params`: its selectors) into key -> `transform(object)`, with the
    resourceVersion the state is at."""

    def __init__(
        self,
        client: api.ListWatcher,
        path: str,
        params: dict[str, Any],
        *,
        transform: Callable[[JsonObj], T],
        name: str,
    ) -> None:
        self.client = client
        self.path = path
        self.params = params
        self.transform = transform
        self.name = name

    async def pages(self, page_size: int) -> tuple[dict[str, T], str]:
        """A consistent paged LIST (no resourceVersion: the first page is a quorum read)."""
        fresh: dict[str, T] = {}
        cont = ""
        while True:
            params = {**self.params, "limit": page_size}
            if cont:
                params["continue"] = cont
            page = await self.client.get(self.path, params=params)
            for item in page.get("items") or []:
                fresh[object_key(item)] = self.transform(item)
            meta = page.get("metadata") or {}
            cont = str(meta.get("continue") or "")
            if not cont:
                return fresh, str(meta.get("resourceVersion") or "")

    async def stream(self, *, stall_after: float) -> tuple[dict[str, T], str]:
        """A WatchList from the most recent state; NotOffered when the server does not do it."""
        fresh: dict[str, T] = {}
        events = self.client.watch(
            self.path,
            resource_version="",
            timeout_seconds=STREAM_SECONDS,
            params={**self.params, **STREAM_PARAMS},
            stall_after=stall_after,
        )
        try:
            async for event in events:
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ADDED":
                    fresh[object_key(obj)] = self.transform(obj)
                    continue
                meta = obj.get("metadata") or {}
                if kind == "BOOKMARK" and (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                    return fresh, str(meta.get("resourceVersion") or "")
                raise NotOffered(f"a {kind} event came before the end of the initial state")
        except api.ApiError as e:
            if e.status in REFUSALS:
                raise NotOffered(f"{e.status} {e.reason}: {e.message}"[:300]) from e
            raise
        finally:  # the watch goes on after the state; the informer watches again from its end
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()
        raise Incomplete(f"the stream of {self.name} ended after {len(fresh)} objects, before the end of the state")
