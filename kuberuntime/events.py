"""Kubernetes Events about SidecarSets and pods, posted the way client-go's recorder does.

Why: `kubectl describe` and `kubectl get events` are where users look first when a rollout
stalls or a pod is not upgradable; the controller must say what it did and why there.

Conventions (client-go's recorder and kopf's poster):
- core/v1 Events with `involvedObject`, `source.component`, `reportingComponent`,
  `reportingInstance`, `firstTimestamp`/`lastTimestamp` and `count`; messages over 1024 characters
  are cut in the middle with a `...` infix so both ends stay readable.
- Repeats of the same event (same object, type, reason and message) within `window` seconds of the
  previous one bump `count` and `lastTimestamp` with a PATCH instead of creating a new object; an
  event that expired meanwhile (the API server keeps them an hour) is created afresh.
- Events about namespaced objects go to the object's namespace. Events about cluster-scoped
  objects (a SidecarSet) go to the recorder's `namespace`, by default `default`: the API server
  only accepts an Event with a cluster-scoped involvedObject in `default` (client-go puts Node
  events there), and `kubectl describe sidecarset` finds them there. With any other namespace
  (e.g. the manager's own) the involvedObject is stamped with that namespace, as kopf does, which
  the API server accepts; `kubectl get events -n <ns>` shows them but `describe` does not.
- Posting is best effort: a failure logs a warning and never raises into the reconciler.
  Events about Events are skipped (they would feed on themselves).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from kuberuntime import api
from kuberuntime.clock import rfc3339, utc_now
from kuberuntime.jsontypes import JsonObj

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024
INFIX = "..."
EVENT_TYPES = ("Normal", "Warning")
CLUSTER_EVENTS_NAMESPACE = "default"
# metadata.name is a DNS subdomain (253); leave room for "." + 16 hex digits.
_MAX_NAME_PREFIX = 253 - 17


def truncate_message(message: str, limit: int = MAX_MESSAGE) -> str:
    """Cut the middle out of a long message, keeping its start and end."""
    if len(message) <= limit:
        return message
    keep = limit - len(INFIX)
    head = (keep + 1) // 2
    return message[:head] + INFIX + message[len(message) - (keep - head) :]


@dataclass
class _Seen:
    namespace: str
    name: str
    count: int
    last: float  # monotonic time of the latest occurrence


class EventRecorder:
    """Posts Events for one component and instance; safe to share across tasks of one loop."""

    def __init__(
        self,
        client: api.Writer,
        *,
        component: str = "sidecarctl",
        namespace: str = CLUSTER_EVENTS_NAMESPACE,
        instance: str | None = None,
        window: float = 600.0,
        cache_size: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utc_now,
    ) -> None:
        if not component:
            raise ValueError("event component must not be empty")
        if not namespace:
            raise ValueError("event namespace for cluster-scoped objects must not be empty")
        self.client = client
        self.component = component
        self.namespace = namespace
        self.instance = (instance or socket.gethostname() or component)[:128]
        self.window = window
        self.cache_size = cache_size
        self._clock = clock
        self._wall_clock = wall_clock
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[tuple[str, ...], asyncio.Lock] = weakref.WeakValueDictionary()

    def _involved(self, obj: JsonObj) -> tuple[JsonObj, str]:
        meta = obj.get("metadata") or {}
        ref: JsonObj = {
            "apiVersion": str(obj.get("apiVersion") or ""),
            "kind": str(obj.get("kind") or ""),
            "name": str(meta.get("name") or ""),
        }
        for field, key in (("uid", "uid"), ("resourceVersion", "resourceVersion")):
            if meta.get(key):
                ref[field] = str(meta[key])
        if meta.get("namespace"):
            ref["namespace"] = str(meta["namespace"])
            return ref, ref["namespace"]
        if self.namespace != CLUSTER_EVENTS_NAMESPACE:
            ref["namespace"] = self.namespace
        return ref, self.namespace

    async def event(self, obj: JsonObj, *, type: str, reason: str, message: str) -> JsonObj | None:
        """Record an event about `obj`; returns the stored Event, or None when skipped or failed."""
        if type not in EVENT_TYPES:
            raise ValueError(f"event type must be one of {', '.join(EVENT_TYPES)}, got {type!r}")
        if not reason:
            raise ValueError("event reason must not be empty")
        if obj.get("kind") == "Event":
            return None
        ref, namespace = self._involved(obj)
        if not ref["name"] or not ref["kind"]:
            log.warning("event %s not recorded: the object has no kind or name", reason)
            return None
        message = truncate_message(message)
        key = (ref.get("uid", ""), ref["kind"], ref.get("namespace", ""), ref["name"], type, reason, message)
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        async with lock:
            try:
                return await self._record(key, ref, namespace, type=type, reason=reason, message=message)
            except Exception as e:
                log.warning("event %s/%s on %s %s not recorded: %s", type, reason, ref["kind"], ref["name"], e)
                return None

    async def _record(
        self, key: tuple[str, ...], ref: JsonObj, namespace: str, *, type: str, reason: str, message: str
    ) -> JsonObj:
        now_mono = self._clock()
        now = rfc3339(self._wall_clock())
        seen = self._seen.get(key)
        if seen is not None and now_mono - seen.last < self.window:
            path = f"/api/v1/namespaces/{seen.namespace}/events/{seen.name}"
            try:
                patched = await self.client.patch(
                    path, {"count": seen.count + 1, "lastTimestamp": now}, patch_type="merge"
                )
            except api.NotFound:
                pass  # expired on the server: record it anew
            else:
                seen.count = int(patched.get("count") or seen.count + 1)
                seen.last = now_mono
                self._seen.move_to_end(key)
                return patched
        body: JsonObj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{ref['name'][:_MAX_NAME_PREFIX]}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": ref,
            "type": type,
            "reason": reason,
            "message": message,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        created = await self.client.create(f"/api/v1/namespaces/{namespace}/events", body)
        self._seen[key] = _Seen(namespace, created["metadata"]["name"], 1, now_mono)
        self._seen.move_to_end(key)
        while len(self._seen) > self.cache_size:
            self._seen.popitem(last=False)
        return created
