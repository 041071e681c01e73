"""A plain-HTTP proxy in front of the test API server that can delay or stall watch streams.

Reliability tests put it between the manager and kube-apiserver (the manager's kubeconfig names
the proxy's `http://127.0.0.1:PORT`) to make the network misbehave in ways a real cluster does:

- `delay(resource, seconds)`: every response byte of that resource's *watch* requests reaches the
  manager `seconds` late (each chunk is held that long, in order), so the watch is behind while
  lists, gets and writes stay prompt; the namespace lag of a busy API server or a slow link.
- `stall(resource)`: the watch streams of that resource open right now stop forwarding anything,
  and are never closed by the proxy (the end the API server sends is swallowed too), the way a
  half-dead TCP path or a stuck proxy behaves. Streams opened later pass normally.
- `delay_lists(resource, seconds)`: each *list* (or WatchList) of that resource is answered `seconds` late, as a
  busy API server answers a process that has just started.
- `expire(resource)` (a coroutine, on the proxy's loop): as a kube-apiserver whose watch cache has
  just started (one restarted during a control plane upgrade), every watch of that resource that
  resumes from a resourceVersion older than a write made now is answered 410 Gone until
  `unexpire(resource)`, and the streams open now end: every client reads the whole state again,
  whether its stream was open at that moment or between two watches. `gone_to` lists the
  User-Agent of each watch answered 410 (the manager's name its process, sidecarctl.manager.user_agent).

Requests go upstream with the proxy's own credentials (the admin client certificate), or, when the
manager sends an `Authorization` header (a ServiceAccount token kubeconfig), with that header and
no client certificate, so the API server's audit log still names the manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from tests.kube.controlplane import ControlPlane, free_port

# Headers that belong to one hop, or that aiohttp sets itself.
_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer"}
)
RESOURCES = {
    "namespaces": re.compile(r"^/api/v1/namespaces$"),
    "sidecarsets": re.compile(r"^/apis/sidecarctl\.io/[^/]+/sidecarsets$"),
    "pods": re.compile(r"^/api/v1/pods$"),
    "controllerrevisions": re.compile(r"^/apis/apps/v1/namespaces/[^/]+/controllerrevisions$"),
}


OTHER = "other"  # a watch of a resource not in RESOURCES


def _named(path: str) -> str | None:
    """Which of RESOURCES `path` lists or watches."""
    for name, pattern in RESOURCES.items():
        if pattern.match(path):
            return name
    return None


@dataclass
class WatchStream:
    resource: str
    path: str
    opened: float = field(default_factory=time.monotonic)
    chunks: int = 0
    forwarded_at: float = 0.0  # monotonic time of the last chunk forwarded
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    # (when to forward, bytes; None: the end), filled from upstream; `end` adds the end behind what it holds
    queue: asyncio.Queue[tuple[float, bytes | None]] = field(default_factory=asyncio.Queue)

    def end(self) -> None:
        """End the stream once what it holds is forwarded (the client sees a normal end and resumes)."""
        self.queue.put_nowait((time.monotonic(), None))


class ApiProxy:
    """Runs on the caller's event loop; `url` is what a kubeconfig's `server` should say."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.delays: dict[str, float] = {}
        self.list_delays: dict[str, float] = {}
        self.delayed_lists = 0
        self.expired: dict[str, int] = {}  # resource -> watches resuming from below this revision get 410
        self.gone_to: list[str] = []  # the User-Agent of each watch answered 410
        self.streams: list[WatchStream] = []
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self._cert: aiohttp.ClientSession | None = None
        self._token: aiohttp.ClientSession | None = None
        self._handlers: set[asyncio.Task[object]] = set()  # requests being forwarded

    # -- control --------------------------------------------------------------------------------
    def delay(self, resource: str, seconds: float) -> None:
        if resource not in RESOURCES:
            raise ValueError(f"unknown resource {resource!r}")
        self.delays[resource] = seconds

    def delay_lists(self, resource: str, seconds: float) -> None:
        if resource not in RESOURCES:
            raise ValueError(f"unknown resource {resource!r}")
        self.list_delays[resource] = seconds

    def stall(self, resource: str) -> int:
        """Stall every open watch stream of `resource`; returns how many there were."""
        hit = 0
        for s in self.streams:
            if s.resource == resource and not s.closed and not s.stalled.is_set():
                s.stalled.set()
                hit += 1
        return hit

    async def expire(self, resource: str) -> int:
        """See the module's docstring; returns how many streams were open."""
        if resource not in RESOURCES:
            raise ValueError(f"unknown resource {resource!r}")
        self.expired[resource] = await self._new_revision()
        # No await from here on: a stream opened from now on is checked as it opens (`_stream`).
        streams = [s for s in self.open_streams(resource) if not s.stalled.is_set()]
        for s in streams:
            s.end()
        return len(streams)

    def unexpire(self, resource: str) -> None:
        self.expired.pop(resource, None)

    async def _new_revision(self) -> int:
        """The resourceVersion of a write made now (a ConfigMap created): newer than any a client has
        seen, and no newer than what a read begun after it returns."""
        assert self._cert is not None
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "apiproxy-expire-"}}
        async with self._cert.post(f"{self.cp.url}/api/v1/namespaces/default/configmaps", json=body) as r:
            r.raise_for_status()
            return int((await r.json())["metadata"]["resourceVersion"])

    def _expired(self, request: web.Request, resource: str) -> bool:
        """A watch resuming from a resourceVersion older than `expire`'s write (not a WatchList, which
        reads the state anew)."""
        below = self.expired.get(resource)
        rv = request.query.get("resourceVersion", "")
        if below is None or request.query.get("sendInitialEvents") == "true" or not rv.isdigit():
            return False
        return 0 < int(rv) < below

    def open_streams(self, resource: str) -> list[WatchStream]:
        return [s for s in self.streams if s.resource == resource and not s.closed]

    # -- lifecycle ------------------------------------------------------------------------------
    def _contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        pki = self.cp.workdir / "pki"
        with_cert = ssl.create_default_context(cafile=str(pki / "serving-ca.crt"))
        with_cert.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        bare = ssl.create_default_context(cafile=str(pki / "serving-ca.crt"))
        return with_cert, bare

    async def start(self) -> ApiProxy:
        with_cert, bare = self._contexts()
        self._cert = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=with_cert, limit=0))
        self._token = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=bare, limit=0))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a request whose client has gone is cancelled at once, so a watch stream
        # its client closed (a WatchList read to the end of its first state) is closed here too, not
        # left open, and counted by `stall` and `expire`, until it next forwards something.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        for s in self.streams:
            s.closed = True
        if self._runner is not None:
            await self._runner.cleanup()
        # A request whose client went away can outlive the server's shutdown (its upstream read has a
        # 120 s timeout): end it here, so nothing of this proxy runs, or logs, after it is stopped.
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for session in (self._cert, self._token):
            if session is not None:
                await session.close()

    # -- forwarding -----------------------------------------------------------------------------
    def _resource(self, request: web.Request) -> str | None:
        if request.query.get("watch") not in ("1", "true"):
            return None
        # Every watch is streamed, or one of another resource (the webhook configuration, the policies)
        # would reach its client only once it ended: a WatchList's first state never, as it ends only
        # when the client closes it. Only RESOURCES can be delayed or stalled by name.
        return _named(request.path) or OTHER

    async def _hold_list(self, request: web.Request) -> None:
        # A list, or a WatchList (a watch that sends the initial state first): either is the first state.
        first_state = (
            request.query.get("watch") not in ("1", "true") or request.query.get("sendInitialEvents") == "true"
        )
        if request.method != "GET" or not first_state:
            return
        resource = _named(request.path)
        wait = self.list_delays.get(resource, 0.0) if resource else 0.0
        if wait > 0:
            self.delayed_lists += 1
            await asyncio.sleep(wait)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._forward(request)
        finally:
            self._handlers.discard(task)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        session = self._token if "Authorization" in request.headers else self._cert
        assert session is not None
        body = await request.read()
        await self._hold_list(request)
        resource = self._resource(request)
        if resource is not None and self._expired(request, resource):
            self.gone_to.append(request.headers.get("User-Agent", ""))
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}
            return web.json_response({**status, "message": "too old resource version (proxy: expire)"}, status=410)
        upstream = await session.request(
            request.method,
            self.cp.url + request.path_qs,
            data=body or None,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None if resource else 120),
            auto_decompress=False,
        )
        try:
            reply_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            if resource is None:
                data = await upstream.read()
                return web.Response(status=upstream.status, body=data, headers=reply_headers)
            return await self._stream(request, upstream, resource, reply_headers)
        finally:
            upstream.release()

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, resource: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        out = web.StreamResponse(status=upstream.status, headers=headers)
        try:
            await out.prepare(request)
        except ConnectionError:  # the client went away while its watch was being opened (a manager stopped)
            return out
        stream = WatchStream(resource, request.path_qs)
        self.streams.append(stream)
        if self._expired(request, resource):  # forwarded before an `expire` that began meanwhile
            stream.end()
        queue = stream.queue

        def when() -> float:  # under the delay in force when the bytes came from upstream
            return time.monotonic() + self.delays.get(resource, 0.0)

        async def pump() -> None:
            try:
                async for chunk in upstream.content.iter_any():
                    queue.put_nowait((when(), chunk))
            except (TimeoutError, aiohttp.ClientError):
                pass
            queue.put_nowait((when(), None))

        reader = asyncio.create_task(pump())
        try:
            while True:
                due, chunk = await queue.get()
                if stream.stalled.is_set():
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    stalled = asyncio.create_task(stream.stalled.wait())
                    await asyncio.wait([stalled], timeout=wait)
                    stalled.cancel()
                if stream.stalled.is_set():
                    break
                if chunk is None:
                    await out.write_eof()
                    return out
                await out.write(chunk)
                stream.chunks += 1
                stream.forwarded_at = time.monotonic()
            # Stalled: forward nothing more and never end the response; wait for the client to go.
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.5)
            return out
        except ConnectionError:
            return out
        finally:
            stream.closed = True
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
