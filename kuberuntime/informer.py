"""List-then-watch into an in-memory cache, the way client-go's reflector does it.

Why our own: the official client's Watch retries a 410 once with the same stale resourceVersion
and then gives up, and without a client-side timeout a dead connection hangs forever. Here:
paginated list, watch from the list's resourceVersion with bookmarks, resume from the newest
resourceVersion seen after a normal stream end, re-list on 410 Gone (emitting the difference as
events so consumers converge), finite timeouts, jittered exponential backoff on errors and before
relists. Each watch asks the server to end it after 40-48 s; a connection still silent 10 s after
that has stalled (a proxy or a half-dead TCP path), so it is dropped and watched again, counted as
cause `stalled`: a stalled watch is noticed within a minute, not after the TCP timeout.

Objects pass through `transform` before they are stored, so the controller can keep small pod
projections instead of whole pods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import aiohttp

from kuberuntime import api
from kuberuntime.backoff import JITTER, Backoff
from kuberuntime.clock import first_of, sleep_or_stop
from kuberuntime.jsontypes import JsonObj
from kuberuntime.metrics import WATCH_RESTARTS

T = TypeVar("T")
log = logging.getLogger(__name__)

# (event type, old value or None, new value or None); event type is ADDED, MODIFIED or DELETED.
Handler = Callable[[str, Any, Any], None]


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class _Never(Exception):
    """Raised by nothing: the exception a non-optional informer does not catch on its own."""


class Informer(Generic[T]):
    """Keeps `store` (key → transformed object) in step with the API server."""

    def __init__(
        self,
        client: api.ListWatcher,
        path: str,
        *,
        name: str,
        transform: Callable[[JsonObj], T],
        handler: Handler | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 40,
        max_backoff: float = 30.0,
        optional: bool = False,
    ) -> None:
        self.client = client
        self.path = path
        self.name = name
        self.transform = transform
        self.handler = handler
        self.params: dict[str, str | int] = {}
        if label_selector:
            self.params["labelSelector"] = label_selector
        if field_selector:
            self.params["fieldSelector"] = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        # A resource that may not be served (a CRD not installed): a 404 on the list counts as an
        # empty, synced list, so nothing waits on it, and the list is tried again with backoff.
        self.optional = optional
        self._not_served: type[Exception] = api.NotFound if optional else _Never
        self.store: dict[str, T] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0

    def _emit(self, kind: str, old: T | None, new: T | None) -> None:
        if self.handler is None:
            return
        try:
            self.handler(kind, old, new)
        except Exception:  # a consumer bug must not stop the cache
            log.exception("informer %s: handler failed on %s", self.name, kind)

    async def _list(self) -> None:
        fresh: dict[str, T] = {}
        cont = ""
        rv = ""
        while True:
            params = {**self.params, "limit": self.page_size}
            if cont:
                params["continue"] = cont
            page = await self.client.get(self.path, params=params)
            for item in page.get("items") or []:
                fresh[object_key(item)] = self.transform(item)
            meta = page.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or "")
            cont = str(meta.get("continue") or "")
            if not cont:
                break
        old = self.store
        self.store = fresh
        self.resource_version = rv
        for key, value in fresh.items():
            prev = old.get(key)
            if prev is None:
                self._emit("ADDED", None, value)
            elif prev != value:
                self._emit("MODIFIED", prev, value)
        for key, prev in old.items():
            if key not in fresh:
                self._emit("DELETED", prev, None)
        self.relists += 1
        self.synced.set()

    def _apply(self, event: JsonObj) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if kind == "BOOKMARK":
            return
        key = object_key(obj)
        if kind == "DELETED":
            prev = self.store.pop(key, None)
            self._emit("DELETED", prev, None)
            return
        value = self.transform(obj)
        prev = self.store.get(key)
        self.store[key] = value
        self._emit("ADDED" if prev is None else "MODIFIED", prev, value)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set. Never raises for API or network errors: it backs off and retries.

        A quiet watch can block for minutes, so the loop runs as a task that `stop` cancels at once.
        """
        await first_of(self._loop(stop), stop.wait())

    async def _loop(self, stop: asyncio.Event) -> None:
        backoff = Backoff(base=min(0.2, self.max_backoff), cap=self.max_backoff, jitter=(0.5, 1.5))
        need_list = True
        while not stop.is_set():
            try:
                if need_list:
                    await self._list()
                    need_list = False
                timeout = self.watch_timeout + JITTER.randint(0, max(1, self.watch_timeout // 5))
                async for event in self.client.watch(
                    self.path, resource_version=self.resource_version, timeout_seconds=timeout, params=self.params
                ):
                    self._apply(event)
                    backoff.reset()
                    if stop.is_set():
                        return
                # A normal end of the stream: resume from the newest resourceVersion we saw.
            except api.Gone:
                WATCH_RESTARTS.labels(self.name, "gone").inc()
                wait = backoff.next()  # a flapping API server must not be relisted in a tight loop
                log.info(
                    "informer %s: resourceVersion %s expired, listing again in %.1fs",
                    self.name,
                    self.resource_version,
                    wait,
                )
                await sleep_or_stop(stop, wait)
                need_list = True
            except asyncio.CancelledError:
                raise
            except self._not_served:
                if not self.synced.is_set():
                    log.info(
                        "informer %s: %s is not served; listed again every %.0fs",
                        self.name,
                        self.path,
                        self.max_backoff,
                    )
                self.synced.set()
                await sleep_or_stop(stop, self.max_backoff)
                need_list = True
            except Exception as e:  # network errors, 5xx, timeouts, bad JSON: back off and retry
                stalled = isinstance(e, TimeoutError | aiohttp.ServerTimeoutError)
                WATCH_RESTARTS.labels(self.name, "stalled" if stalled else "error").inc()
                wait = backoff.next()
                log.warning("informer %s: watch failed (%s), retrying in %.1fs", self.name, e, wait)
                await sleep_or_stop(stop, wait)
                if not self.resource_version:
                    need_list = True
