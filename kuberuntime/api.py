"""The API contract every component programs against: the calls, and one error convention.

Components (informer, leader election, events, controller, revisions, cert sync) depend on these
Protocols, not on the aiohttp client, so each is unit-tested against an in-memory fake that keeps
the same contract. The convention: a call returns the object the API server returned, and every
error status raises an `ApiError` subclass named for what the caller may do about it (NotFound,
Conflict, Gone, Invalid); nothing is reported as None.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal, Protocol

from kuberuntime.jsontypes import JsonObj

PatchType = Literal["json", "merge", "strategic", "apply"]
PATCH_TYPES: dict[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}
Params = Mapping[str, str | int]


class ApiError(Exception):
    """An error status from the API server, with the Status object's reason and message."""

    def __init__(self, status: int, reason: str, message: str, body: JsonObj | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


class NotFound(ApiError):
    """404: the object (or its namespace) does not exist."""


class Conflict(ApiError):
    """409: resourceVersion mismatch, or AlreadyExists on create (see `.reason`)."""


class Gone(ApiError):
    """410: the resourceVersion is too old; the caller must list again."""


class Invalid(ApiError):
    """422: the object or patch was rejected (includes a failed JSON Patch `test`)."""


_ERRORS: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone, 422: Invalid}


def error_from_status(status: int, body: Any) -> ApiError:
    reason, message = "", ""
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
    else:
        message = str(body)[:500]
    return _ERRORS.get(status, ApiError)(status, reason, message, body if isinstance(body, dict) else None)


class Reader(Protocol):
    async def get(self, path: str, *, params: Params | None = None) -> JsonObj:
        """GET an object or a list; NotFound when it does not exist."""
        ...


class Writer(Protocol):
    async def create(self, path: str, body: JsonObj, *, params: Params | None = None) -> JsonObj:
        """POST `body` to the collection `path`; Conflict (reason AlreadyExists) when the name is taken."""
        ...

    async def update(self, path: str, body: JsonObj, *, params: Params | None = None) -> JsonObj:
        """PUT the object `path`; Conflict when `body.metadata.resourceVersion` is stale."""
        ...

    async def patch(
        self, path: str, body: Any, *, patch_type: PatchType = "merge", params: Params | None = None
    ) -> JsonObj:
        """PATCH; a failed JSON Patch `test` comes back as Invalid (422), a stale resourceVersion as Conflict."""
        ...

    async def delete(self, path: str, *, params: Params | None = None) -> Any:
        """DELETE; NotFound when already gone."""
        ...


class Watcher(Protocol):
    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        params: Params | None = None,
        stall_after: float | None = None,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[JsonObj]:
        """Watch events after `resource_version`; Gone when it is too old (the caller lists again).
        A stream silent for `stall_after` seconds (default: a little past `timeout_seconds`) has stalled.
        `opened` is called once the server has accepted the watch, before any event."""
        ...


class ListWatcher(Reader, Watcher, Protocol):
    """Lists and watches: what an informer calls."""


class Client(Reader, Writer, Protocol):
    """Reads and writes: what leader election, revisions, events and the cert sync call."""


class Api(Client, Watcher, Protocol):
    """Everything the manager's components call, watches included."""


def rv_number(value: str) -> int:
    """A resourceVersion as a number, to tell which of two is newer (0 for none or a foreign form).

    Kubernetes calls resourceVersions opaque, but every one an etcd-backed API server hands out is
    the revision of the etcd that stores the resource, written in decimal, so "has this cache seen
    that write" is an integer comparison (for resources kept in one etcd: compare versions read
    from the same resource path). Compared as strings, "9" would come after "10".
    """
    try:
        return int(value)
    except ValueError:
        return 0


def reason(e: BaseException) -> str:
    """An exception as one log word or phrase: its message, or its type when it has none (a bare
    `TimeoutError()` or `aiohttp.ServerDisconnectedError()` would otherwise log an empty reason)."""
    return str(e) or type(e).__name__
