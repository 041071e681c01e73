"""The in-memory API server of the unit tests, with the runtime's contract (kuberuntime.api).

Objects live under their API paths; every write (a delete too) bumps one global resourceVersion and
notifies listeners (as a watch would, synchronously, so a test decides when a cache sees a write by
when it delivers). Real watches, for tests of the informer itself, are tests/kube/fakewatch.py
(`serve_watches`). Errors follow the real server: NotFound (a missing object; a collection lists empty),
Conflict (AlreadyExists, a stale resourceVersion), Invalid (a failed JSON Patch `test`). `fail`
injects errors for a verb and path, `foreign_write` is another writer's change, and `latency`
makes every call take that long (so that concurrent writers interleave as they would).
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import jsonpatch

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from tests.kube.fakewatch import WatchCache, in_collection, selects

Listener = Callable[[str, JsonObj | None, JsonObj | None], None]  # (path, old, new)


@dataclass
class _Fault:
    verb: str
    path: re.Pattern[str]
    error: api.ApiError
    times: int | None  # None: every time


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _strategic(target: JsonObj, patch: JsonObj) -> JsonObj:
    """Merge patch, except that `status.conditions` merge by `type` as the Pod's strategy says."""
    conditions = ((patch.get("status") or {}).get("conditions")) if isinstance(patch.get("status"), dict) else None
    if conditions is None:
        out: JsonObj = merge_patch(target, patch)
        return out
    rest = {**patch, "status": {k: v for k, v in patch["status"].items() if k != "conditions"}}
    out = merge_patch(target, rest)
    merged = list((target.get("status") or {}).get("conditions") or [])
    for cond in conditions:
        i = next((j for j, c in enumerate(merged) if c.get("type") == cond.get("type")), None)
        if i is None:
            merged.append(cond)
        else:
            merged[i] = {**merged[i], **cond}
    out.setdefault("status", {})["conditions"] = merged
    return out


def is_collection(path: str) -> bool:
    """Whether an API path names a collection (`/api/v1/pods`, `/apis/g/v/namespaces/ns/things`)
    rather than one object (`.../things/name`, `/api/v1/namespaces/name`)."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    return len(rest) == 1


class FakeApiServer:
    def __init__(self, *, latency: float = 0.0) -> None:
        self.latency = latency
        self.objects: dict[str, JsonObj] = {}
        self.calls: list[tuple[str, str]] = []
        self.listeners: list[Listener] = []
        self._rv = 1000
        self._uids = 0
        self._faults: list[_Fault] = []
        self.watches: WatchCache | None = None

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion written: what a consistent read answers."""
        return self._rv

    def serve_watches(self, *, second: float = 1.0) -> WatchCache:
        """Serve `watch` from now on, as kube-apiserver's watch cache would (tests/kube/fakewatch.py)."""
        self.watches = WatchCache(self, second=second)
        return self.watches

    # -- test controls ---------------------------------------------------------------------------
    def fail(self, verb: str, path: str, error: api.ApiError, *, times: int | None = 1) -> None:
        """Make `verb` on paths matching the regex `path` raise `error` (`times` times, None: always)."""
        self._faults.append(_Fault(verb, re.compile(path), error, times))

    def put(self, path: str, obj: JsonObj) -> JsonObj:
        """Store `obj` at `path` as if someone created it (uid, resourceVersion filled in)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("uid"):
            self._uids += 1
            meta["uid"] = f"uid-{self._uids}"
        meta.setdefault("creationTimestamp", "2024-05-01T10:00:00Z")
        return self._store(path, obj)

    def foreign_write(self, path: str, mutate: Callable[[JsonObj], None]) -> JsonObj:
        """Another writer's change to the object at `path` (a new resourceVersion, listeners told)."""
        obj = copy.deepcopy(self._stored(path))
        mutate(obj)
        return self._store(path, obj)

    def writes(self, verb: str | None = None, prefix: str = "") -> list[str]:
        return [p for v, p in self.calls if v != "get" and (verb is None or v == verb) and p.startswith(prefix)]

    # -- internals -------------------------------------------------------------------------------
    def _store(self, path: str, obj: JsonObj | None) -> JsonObj:
        old = self.objects.get(path)
        if obj is None:
            self._rv += 1  # a deletion is a change with a resourceVersion of its own
            self.objects.pop(path, None)
            new: JsonObj = {}
        else:
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self.objects[path] = obj
            new = obj
        for listener in list(self.listeners):
            listener(path, copy.deepcopy(old), copy.deepcopy(obj))
        return copy.deepcopy(new)

    async def _enter(self, verb: str, path: str) -> None:
        if self.latency:
            await asyncio.sleep(self.latency)
        self.calls.append((verb, path))
        for fault in list(self._faults):
            if fault.verb == verb and fault.path.search(path):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                raise fault.error

    def _stored(self, path: str) -> JsonObj:
        obj = self.objects.get(path)
        if obj is None:
            raise api.NotFound(404, "NotFound", f"{path} not found")
        return obj

    # -- the contract ----------------------------------------------------------------------------
    async def get(self, path: str, *, params: api.Params | None = None) -> JsonObj:
        await self._enter("get", path)
        if path in self.objects:
            return copy.deepcopy(self.objects[path])
        if not is_collection(path):
            raise api.NotFound(404, "NotFound", f"{path} not found")
        selected = dict(params or {})
        items = [
            copy.deepcopy(obj)
            for p, obj in sorted(self.objects.items())
            if in_collection(path, p) and selects(selected, obj)
        ]
        return {"metadata": {"resourceVersion": str(self._rv)}, "items": items}

    async def create(self, path: str, body: JsonObj, *, params: api.Params | None = None) -> JsonObj:
        await self._enter("create", path)
        meta = body.get("metadata") or {}
        name = meta.get("name") or f"{meta.get('generateName', 'obj-')}{self._rv}"
        target = f"{path}/{name}"
        if target in self.objects:
            raise api.Conflict(409, "AlreadyExists", f"{target} already exists")
        obj = copy.deepcopy(body)
        obj["metadata"] = {**meta, "name": name}
        obj["metadata"].pop("resourceVersion", None)
        return self.put(target, obj)

    async def update(self, path: str, body: JsonObj, *, params: api.Params | None = None) -> JsonObj:
        await self._enter("update", path)
        stored = self._stored(path)
        if (body.get("metadata") or {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise api.Conflict(409, "Conflict", "the object has been modified")
        return self._store(path, copy.deepcopy(body))

    async def patch(
        self, path: str, body: Any, *, patch_type: api.PatchType = "merge", params: api.Params | None = None
    ) -> JsonObj:
        await self._enter("patch", path)
        sub = next((s for s in ("/status", "/resize") if path.endswith(s)), "")  # subresources: the pod itself
        target = path[: -len(sub)] if sub else path
        stored = copy.deepcopy(self._stored(target))
        if patch_type == "json":
            try:
                patched: JsonObj = jsonpatch.apply_patch(stored, body)
            except jsonpatch.JsonPatchTestFailed as e:
                raise api.Invalid(422, "Invalid", str(e)) from None
        else:
            wanted = ((body.get("metadata") or {}).get("resourceVersion")) if isinstance(body, dict) else None
            if wanted and wanted != stored["metadata"]["resourceVersion"]:
                raise api.Conflict(409, "Conflict", "the object has been modified")
            patched = _strategic(stored, body) if patch_type == "strategic" else merge_patch(stored, body)
        return self._store(target, patched)

    async def delete(self, path: str, *, params: api.Params | None = None) -> Any:
        await self._enter("delete", path)
        self._stored(path)
        self._store(path, None)
        return {"kind": "Status", "status": "Success"}

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        params: api.Params | None = None,
        stall_after: float | None = None,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[JsonObj]:
        if self.watches is None:
            raise NotImplementedError("tests deliver events through `listeners`, or call serve_watches()")
        return self.watches.watch(
            path,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            params=dict(params or {}),
            opened=opened,
        )
