"""List-then-watch into an in-memory cache, the way client-go's reflector does it.

Why our own: the official client's Watch retries a 410 once with the same stale resourceVersion
and then gives up, and without a client-side timeout a dead connection hangs forever. Here: the
whole state read first (kuberuntime.initialstate: streamed as a WatchList where the API server
offers it, else a paged LIST), watch from its resourceVersion with bookmarks, resume from the
newest resourceVersion seen after a normal stream end, re-read on 410 Gone (emitting the
difference as events so consumers converge), finite timeouts, jittered exponential backoff on
errors and before re-reads. Each watch asks the server to end it after 40-48 s; a connection still
silent 10 s after that has stalled (a proxy or a half-dead TCP path), so it is dropped and watched
again, counted as cause `stalled`: a stalled watch is noticed within a minute, not after the TCP
timeout.

Catching up (`catch_up`): a cache kept for a long time (a standby's, kuberuntime.leader) may be
behind, by an event still on its way or by a stream that stalled minutes ago, and the one who
plans from it must know it is not. A quorum read tells what "now" is: a LIST of the informer's own
path and selectors with `limit=1` and no `resourceVersion`, which the API server answers with a
consistent read (from etcd, or from its watch cache once that has caught up with etcd), so its
resourceVersion R is at least etcd's revision when the read began. The cache has caught up once
its own resourceVersion reaches R (compared as integers, kuberuntime.api.rv_number): events of one
watch come in resourceVersion order and a bookmark at B says none at or below B is still to come,
so every change to the watched objects up to R, and so every write finished before the read, is in
the store. That resourceVersion moves with events and with bookmarks; a quiet resource (no change
to what this watch selects) moves only with bookmarks, which kube-apiserver sends a watch once a
minute and 2 s before the watch's own end. So `catch_up` ends the stream being read (which may be
the stalled one) and watches again from where the store is, with `CATCH_UP_TIMEOUT`: the changes
missed come first, then the server's bookmark about a second in, carrying the watch cache's
resourceVersion, which the quorum read has just brought up to R. Nothing is listed again; if the
target is still not reached after `CATCH_UP_RELIST_AFTER` (a watch cache that cannot vouch for R:
one turned off for this resource, which takes etcd's own progress notices, minutes apart), the
informer reads the whole state again, a consistent read that reaches R by itself.

A small cache (`reread_up_to`: SidecarSets, their revisions, namespaces, the webhook configuration)
does not wait for that bookmark: reading a few hundred objects again costs the API server less than
the second or two the bookmark takes to come, and a whole-state read begun after the call is itself
a consistent read at least as new as a quorum read would be, so it needs no quorum read either. A
takeover waits for the slowest of its caches: with the small ones read again, that is the pods',
which during a rollout moves with the rollout's own events.

Current (`current`): set while the store is as new as a watch keeps it, from a finished state read
or a watch the server accepted, until a watch fails (an error, a 410, a stall). In between, changes
may have been made that the store has not seen: a SidecarSet created while a watch reconnects to
a kube-apiserver whose watch cache started after the store's resourceVersion (a 410, then a read
of the whole state) is missing from the store for that long. The webhook waits for it
(injector.http.decisions) rather than admit a pod from a store it knows is behind.

Objects pass through `transform` before they are stored, so the controller can keep small pod
projections instead of whole pods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import aiohttp

from kuberuntime import api, initialstate
from kuberuntime.backoff import JITTER, Backoff
from kuberuntime.clock import first_of, sleep_or_stop
from kuberuntime.initialstate import object_key
from kuberuntime.jsontypes import JsonObj
from kuberuntime.metrics import CACHED_OBJECTS, WATCH_RESTARTS

T = TypeVar("T")
log = logging.getLogger(__name__)

# (event type, old value or None, new value or None); event type is ADDED, MODIFIED or DELETED.
Handler = Callable[[str, Any, Any], None]

# A watch asking to end this soon gets the server's pre-end bookmark (sent 2 s before the end, at the
# cache's next one-second tick) about a second in; 2 s or less would get none.
CATCH_UP_TIMEOUT = 3
# Seconds a catch-up waits for bookmarks before it reads the whole state again: five short watches.
CATCH_UP_RELIST_AFTER = 5 * CATCH_UP_TIMEOUT


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
        watch_list: bool = True,
        optional: bool = False,
        reread_up_to: int = 0,
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
        # Whether to ask for the state as a WatchList stream; False once the server refused one.
        self.watch_list = watch_list
        # A resource that may not be served (a CRD not installed): a 404 on the list counts as an
        # empty, synced list, so nothing waits on it, and the list is tried again with backoff.
        self.optional = optional
        self._not_served: type[Exception] = api.NotFound if optional else _Never
        # A catch-up reads the whole state again, rather than wait for a bookmark, while the store
        # holds at most this many objects (0: never; see the module's docstring).
        self.reread_up_to = reread_up_to
        self._unserved = False  # the last read of an optional resource was a 404
        self.store: dict[str, T] = {}
        self.synced = asyncio.Event()
        self.current = asyncio.Event()  # see the module's docstring
        self.resource_version = ""
        self.relists = 0
        self._target = 0  # a catch-up's resourceVersion: watches stay short until the store reaches it
        self._nudge = asyncio.Event()  # end the stream being read now and watch again
        self._moved = asyncio.Event()  # the resourceVersion moved (an event, a bookmark, a new state)
        # Whole-state reads begun, finished, and wanted (the loop reads while done < wanted).
        self._reads_started = self._reads_done = self._reads_wanted = 0
        self._held = CACHED_OBJECTS.labels(name)  # len(store): what a standby holds, for its operator

    @property
    def version(self) -> int:
        """The store's resourceVersion as a number (0 before the first state is read)."""
        return api.rv_number(self.resource_version)

    def _emit(self, kind: str, old: T | None, new: T | None) -> None:
        if self.handler is None:
            return
        try:
            self.handler(kind, old, new)
        except Exception:  # a consumer bug must not stop the cache
            log.exception("informer %s: handler failed on %s", self.name, kind)

    async def _read_state(self) -> None:
        """The whole state, streamed or listed (kuberuntime.initialstate), swapped in as one change."""
        self._reads_started += 1
        reader = initialstate.Reader(self.client, self.path, self.params, transform=self.transform, name=self.name)
        if self.watch_list:
            try:
                fresh, rv = await reader.stream(stall_after=self.watch_timeout)
            except initialstate.NotOffered as e:
                log.info("informer %s: the API server does not stream the state (%s); listing in pages", self.name, e)
                self.watch_list = False
        if not self.watch_list:
            fresh, rv = await reader.pages(self.page_size)
        self._replace(fresh, rv)

    def _replace(self, fresh: dict[str, T], rv: str) -> None:
        old = self.store
        self.store = fresh
        self.resource_version = rv
        self._reads_done = self._reads_started  # one loop reads, so the read in flight is this one
        self._unserved = False
        self._moved.set()
        self._held.set(len(fresh))
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
        self.current.set()

    def _apply(self, event: JsonObj) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
            self._moved.set()
        if kind == "BOOKMARK":
            return
        key = object_key(obj)
        if kind == "DELETED":
            prev = self.store.pop(key, None)
            self._held.set(len(self.store))
            self._emit("DELETED", prev, None)
            return
        value = self.transform(obj)
        prev = self.store.get(key)
        self.store[key] = value
        if prev is None:
            self._held.set(len(self.store))
        self._emit("ADDED" if prev is None else "MODIFIED", prev, value)

    async def catch_up(self) -> int:
        """Return once the store holds every change up to a quorum read made now (see the module's
        docstring), and the resourceVersion it reached. Never lists the objects again unless the
        store is small (`reread_up_to`) or the server's bookmarks cannot bring it there; retries
        until it gets there (the caller cancels it when it no longer needs it)."""
        await self.synced.wait()
        if len(self.store) <= self.reread_up_to and not self._unserved:
            wanted = self._read_again()
            log.debug("informer %s: catching up by reading the state again", self.name)
            while self._reads_done < wanted and not self._unserved:  # a resource gone meanwhile: nothing to wait for
                self._moved.clear()
                await self._moved.wait()
            return self.version
        backoff = Backoff(base=min(0.2, self.max_backoff), cap=self.max_backoff, jitter=(0.5, 1.5))
        while True:
            try:
                page = await self.client.get(self.path, params={**self.params, "limit": 1})
                break
            except self._not_served:
                return self.version  # nothing served, nothing to catch up with
            except (api.ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
                wait = backoff.next()
                log.warning("informer %s: quorum read failed (%s), retrying in %.1fs", self.name, api.reason(e), wait)
                await asyncio.sleep(wait)
        target = api.rv_number(str((page.get("metadata") or {}).get("resourceVersion") or ""))
        log.debug("informer %s: catching up from %s to the quorum read's %d", self.name, self.resource_version, target)
        await self.reach(target)
        log.debug("informer %s: caught up at %s", self.name, self.resource_version)
        return target

    def _read_again(self) -> int:
        """Have the loop read the whole state again, in a read begun from now on (the stream being
        read ends at once); returns the count of finished reads to wait for."""
        self._reads_wanted = max(self._reads_wanted, self._reads_started + 1)
        self._nudge.set()
        return self._reads_wanted

    async def reach(self, target: int, *, reread_after: float = CATCH_UP_RELIST_AFTER) -> None:
        """Wait until the store's resourceVersion is at least `target`, watching briefly meanwhile
        (and reading the whole state again after `reread_after` seconds without getting there)."""
        self._target = max(self._target, target)
        if self.version >= target:
            return
        self._nudge.set()  # the stream being read may be the stalled one: replace it now
        loop = asyncio.get_running_loop()
        reread_at = loop.time() + reread_after
        asked = False
        while self.version < target:
            self._moved.clear()
            wait = reread_at - loop.time()
            if wait <= 0 and not asked:
                log.warning(
                    "informer %s: no bookmark reached resourceVersion %d within %.0fs (at %s): reading the state again",
                    self.name,
                    target,
                    reread_after,
                    self.resource_version,
                )
                asked = True
                self._read_again()
            await first_of(self._moved.wait(), timeout=None if asked else max(0.0, wait))

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set. Never raises for API or network errors: it backs off and retries.

        A quiet watch can block for minutes, so the loop runs as a task that `stop` cancels at once.
        """
        await first_of(self._loop(stop), stop.wait())

    async def _watch(self, timeout: int, backoff: Backoff) -> None:
        async for event in self.client.watch(
            self.path,
            resource_version=self.resource_version,
            timeout_seconds=timeout,
            params=self.params,
            opened=self.current.set,
        ):
            self._apply(event)
            backoff.reset()

    def _next_timeout(self) -> int:
        if self.version < self._target:
            return CATCH_UP_TIMEOUT
        return self.watch_timeout + JITTER.randint(0, max(1, self.watch_timeout // 5))

    async def _loop(self, stop: asyncio.Event) -> None:
        backoff = Backoff(base=min(0.2, self.max_backoff), cap=self.max_backoff, jitter=(0.5, 1.5))
        need_state = True
        while not stop.is_set():
            try:
                while need_state or self._reads_done < self._reads_wanted:  # one asked for mid-read too
                    await self._read_state()
                    need_state = False
                self._nudge.clear()
                await first_of(self._watch(self._next_timeout(), backoff), self._nudge.wait())
                if self._nudge.is_set():
                    WATCH_RESTARTS.labels(self.name, "catchup").inc()
                # A normal end of the stream: resume from the newest resourceVersion we saw.
            except api.Gone:
                self.current.clear()
                WATCH_RESTARTS.labels(self.name, "gone").inc()
                wait = backoff.next()  # a flapping API server must not be relisted in a tight loop
                log.info(
                    "informer %s: resourceVersion %s expired, listing again in %.1fs",
                    self.name,
                    self.resource_version,
                    wait,
                )
                await sleep_or_stop(stop, wait)
                need_state = True
            except asyncio.CancelledError:
                raise
            except self._not_served:
                self._unserved = True
                self._moved.set()  # a catch-up waiting for a read: none is coming
                if not self.synced.is_set():
                    log.info(
                        "informer %s: %s is not served; listed again every %.0fs",
                        self.name,
                        self.path,
                        self.max_backoff,
                    )
                self.synced.set()
                self.current.set()  # nothing is served, so nothing can be missed
                await sleep_or_stop(stop, self.max_backoff)
                need_state = True
            except Exception as e:  # network errors, 5xx, timeouts, bad JSON: back off and retry
                self.current.clear()
                stalled = isinstance(e, TimeoutError | aiohttp.ServerTimeoutError)
                WATCH_RESTARTS.labels(self.name, "stalled" if stalled else "error").inc()
                wait = backoff.next()
                log.warning("informer %s: watch failed (%s), retrying in %.1fs", self.name, e, wait)
                await sleep_or_stop(stop, wait)
                if not self.resource_version:
                    need_state = True


# -- an index over an informer's objects ------------------------------------------------------------
# Why: the controller reads a SidecarSet's ControllerRevisions on every reconcile, and walking the
# whole watch cache for them made each reconcile cost as much as every SidecarSet's history together
# (a burst of 600 SidecarSets spent 12 % of the control process's CPU in that walk). Grouped by the
# revision's SidecarSet label, a reconcile reads its own few.


def _label(obj: JsonObj | None, label: str) -> str | None:
    if obj is None:
        return None
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
    return None if value is None else str(value)


class LabelIndex:
    """`handle` is an informer's handler (of untransformed objects); `of(value)` the objects whose
    `label` has that value now. An object whose label changes moves between groups."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._groups: dict[str, dict[str, JsonObj]] = {}

    def handle(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        before, after = _label(old, self.label), _label(None if kind == "DELETED" else new, self.label)
        if before is not None and old is not None and before != after:
            group = self._groups.get(before, {})
            group.pop(object_key(old), None)
            if not group:
                self._groups.pop(before, None)
        if after is not None and new is not None:
            self._groups.setdefault(after, {})[object_key(new)] = new

    def of(self, value: str) -> list[JsonObj]:
        return list(self._groups.get(value, {}).values())
