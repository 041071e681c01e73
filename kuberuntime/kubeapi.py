"""A small async Kubernetes API client that speaks raw JSON.

Why not the generated client: its pydantic models cost time and memory per object, drop
fields they do not know, and its watch helper retries a 410 with the stale resourceVersion.
The controller and the webhook's template store need list, watch, get, create, update, patch
and delete on plain JSON, with finite timeouts and typed errors; that fits in one module over
aiohttp. Credentials come from kuberuntime.kubeconfig (in-cluster or a kubeconfig file).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

import aiohttp
import orjson

from kuberuntime.api import PATCH_TYPES, PatchType, error_from_status
from kuberuntime.jsontypes import JsonObj, loads_without_managed_fields
from kuberuntime.kubeconfig import ClusterConfig

STALL_MARGIN = 10  # seconds past a watch's timeoutSeconds after which silence means a stalled stream
# Connections to the API server one client keeps open at once; requests past it wait for one (inside
# their timeout). Shared by everything the process sends: sidecarsets.controller.podwrites takes half.
POOL_SIZE = 64
# Answers kube-apiserver sends before doing anything, asking to be sent again: 429 with Retry-After
# (API Priority and Fairness), 503 "apiserver is shutting down" with Retry-After: 1 (a server
# draining, or a custom resource's storage being replaced after its CRD changed). client-go sends
# them again, up to ten times; so does this client, as long as the wait fits in the request's timeout.
MAX_RETRY_AFTER = 10
RETRY_AFTER_CAP = 10.0  # seconds: a longer Retry-After is treated as this long


class KubeClient:
    """One aiohttp session per process; every call has a finite timeout."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        timeout: float = 30.0,
        user_agent: str = "sidecarctl",
        fresh_connections: bool = False,
        drop_managed_fields: Collection[str] = (),
    ) -> None:
        """`fresh_connections`: one TCP connection per request, so that behind a load balancer (the
        `kubernetes` Service) requests land on any kube-apiserver, not the one a kept connection reached.
        `drop_managed_fields`: core-group resources (plural names, such as "pods") whose objects this client decodes
        without their managedFields, in answers and in watch events (kuberuntime.jsontypes: why)."""
        self.config = config
        self._lean = frozenset(drop_managed_fields)
        self.timeout = timeout
        self._user_agent = user_agent
        self._fresh = fresh_connections
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(ssl=self.config.ssl_context or False, limit=POOL_SIZE, force_close=self._fresh)
            self._session = aiohttp.ClientSession(connector=conn, json_serialize=lambda o: orjson.dumps(o).decode())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": self._user_agent, **self.config.headers()}
        if content_type:
            h["Content-Type"] = content_type
        return h

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """One request; sent again while kube-apiserver answers 429 or 5xx with a Retry-After
        (MAX_RETRY_AFTER times at most, and never past `timeout`)."""
        data = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        deadline = time.monotonic() + (timeout or self.timeout)
        retries = 0
        while True:
            async with self._sess().request(
                method,
                self.config.server + path,
                params={k: str(v) for k, v in (params or {}).items()},
                data=data,
                headers=self._headers(content_type if data is not None else None),
                timeout=aiohttp.ClientTimeout(total=max(deadline - time.monotonic(), 0.001)),
            ) as resp:
                raw = await resp.read()
                decode = self._decoder(path) if resp.status < 400 else orjson.loads
                try:
                    parsed = decode(raw) if raw else None
                except orjson.JSONDecodeError:
                    parsed = raw.decode(errors="replace")
                if resp.status < 400:
                    return parsed
                wait = _retry_after(resp.status, resp.headers.get("Retry-After"))
                if wait is None or retries == MAX_RETRY_AFTER or time.monotonic() + wait >= deadline:
                    raise error_from_status(resp.status, parsed)
            retries += 1
            await asyncio.sleep(wait)

    async def get(self, path: str, *, params: Mapping[str, str | int] | None = None) -> JsonObj:
        result: JsonObj = await self.request("GET", path, params=params)
        return result

    async def create(self, path: str, body: JsonObj, *, params: Mapping[str, str | int] | None = None) -> JsonObj:
        result: JsonObj = await self.request("POST", path, body=body, params=params)
        return result

    async def update(self, path: str, body: JsonObj, *, params: Mapping[str, str | int] | None = None) -> JsonObj:
        result: JsonObj = await self.request("PUT", path, body=body, params=params)
        return result

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        patch_type: PatchType = "merge",
        params: Mapping[str, str | int] | None = None,
    ) -> JsonObj:
        result: JsonObj = await self.request(
            "PATCH", path, body=body, params=params, content_type=PATCH_TYPES[patch_type]
        )
        return result

    async def delete(self, path: str, *, params: Mapping[str, str | int] | None = None) -> Any:
        return await self.request("DELETE", path, params=params)

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        params: Mapping[str, str | int] | None = None,
        stall_after: float | None = None,
        opened: Callable[[], None] | None = None,
    ) -> AsyncIterator[JsonObj]:
        """Yield watch events until the server closes the stream.

        Raises Gone when the server says the resourceVersion is too old (as an HTTP 410 or as
        an ERROR event with code 410), so the caller re-lists. The client-side timeout is a
        little longer than the server-side one: a silent network loss cannot hang us forever.
        `stall_after` shortens it where the server is known to send without pause (a WatchList's
        initial state, kuberuntime.initialstate).
        """
        query = {
            **(params or {}),
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
        }
        # A connection that stops delivering without closing is noticed a little after the server's own end.
        silence = timeout_seconds + STALL_MARGIN if stall_after is None else stall_after
        to = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=silence)
        async with self._sess().get(
            self.config.server + path,
            params={k: str(v) for k, v in query.items()},
            headers=self._headers(),
            timeout=to,
        ) as resp:
            if resp.status >= 400:
                raw = await resp.read()
                try:
                    parsed: Any = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    parsed = raw.decode(errors="replace")
                raise error_from_status(resp.status, parsed)
            if opened is not None:
                opened()
            decode = self._decoder(path)
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event: JsonObj = decode(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise error_from_status(int(status.get("code") or 500), status)
                    yield event

    def _decoder(self, path: str) -> Callable[[bytes], Any]:
        return loads_without_managed_fields if self._lean and core_resource_of(path) in self._lean else orjson.loads


# Subresources a pod answers with itself (pods/status, ...); any other answer (a log, a proxy's, an
# eviction's Status) is not an object of the resource and is decoded as it comes.
OBJECT_SUBRESOURCES = frozenset({"status", "resize", "ephemeralcontainers"})


def core_resource_of(path: str) -> str:
    """The core-group (/api/v1) resource whose object or list a path answers with: "pods" for
    /api/v1/pods, /api/v1/namespaces/n/pods, its pods and their status, resize and ephemeralcontainers;
    "namespaces" for /api/v1/namespaces/n; "" for another API group (which may name a kind alike) and
    for any other subresource (a pod's log or proxy answers with what its container sends)."""
    parts = path.strip("/").split("/")
    if parts[:2] != ["api", "v1"]:
        return ""
    rest = parts[2:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    if not rest or len(rest) > 3 or (len(rest) == 3 and rest[2] not in OBJECT_SUBRESOURCES):
        return ""
    return rest[0]


def _retry_after(status: int, header: str | None) -> float | None:
    """Seconds to wait before sending again, or None: only 429 and 5xx with a Retry-After in seconds."""
    if header is None or not (status == 429 or status >= 500):
        return None
    try:
        seconds = int(header.strip())
    except ValueError:  # an HTTP date: kube-apiserver sends seconds; anything else is not retried
        return None
    return min(max(seconds, 0), RETRY_AFTER_CAP)
