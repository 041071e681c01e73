"""The manager's plain-HTTP port (/healthz, /readyz, /metrics) and its secure metrics port.

Kept light (no Kubernetes client, no roles) so the supervisor process that serves the kubelet's
probes stays small. Readiness says what it waits for. (Container probes in a SidecarSet are checked
by sidecarsets.validation.probes.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from kuberuntime.authn import Verdict

Check = Callable[[], Awaitable[tuple[bool, str]]]
Authorizer = Callable[[str | None], Awaitable[Verdict]]


def create_probe_app(
    *, ready: Check, live: Check | None = None, registry: CollectorRegistry | None = REGISTRY
) -> Starlette:
    """`registry`: where /metrics reads from (the supervisor passes one that reads every process);
    None leaves /metrics off this port (it is served on the secure metrics port instead)."""

    async def healthz(request: Request) -> Response:
        if live is not None:
            ok, why = await live()
            if not ok:
                return PlainTextResponse(why + "\n", status_code=503)
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        ok, why = await ready()
        return PlainTextResponse((why or "ok") + "\n", status_code=200 if ok else 503)

    routes = [Route("/healthz", healthz), Route("/readyz", readyz)]
    if registry is not None:
        routes.append(Route("/metrics", metrics_endpoint(registry)))
    return Starlette(routes=routes)


def metrics_endpoint(
    registry: CollectorRegistry, auth: Authorizer | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """/metrics; with `auth`, only for callers the API server authenticates and authorizes."""

    async def metrics(request: Request) -> Response:
        if auth is not None:
            verdict = await auth(request.headers.get("authorization"))
            if verdict.status != 200:
                status = 503 if verdict.status == 500 else verdict.status
                return PlainTextResponse(verdict.message + "\n", status_code=status)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def create_metrics_app(registry: CollectorRegistry, auth: Authorizer) -> Starlette:
    """The secure metrics port: /metrics only, behind delegated authentication and authorization."""
    return Starlette(routes=[Route("/metrics", metrics_endpoint(registry, auth))])


async def serve_plain(app: Any, bind: str, stop: asyncio.Event, sock: socket.socket | None = None) -> None:
    """The probe port: plain HTTP/1.1, graceful on stop; on `sock` when given (already bound)."""
    config = Config()
    config.bind = [bind] if sock is None else [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 2.0
    config.alpn_protocols = ["http/1.1"]
    await serve(app, config, shutdown_trigger=stop.wait)


def host_port(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    return ("127.0.0.1" if host in ("0.0.0.0", "::") else host), int(port)


async def tls_self_check(bind: str, ca_pem: bytes) -> tuple[bool, str]:
    """A real handshake on the webhook port, trusting only the CA we publish in caBundle."""
    host, port = host_port(bind)
    try:
        ctx = ssl.create_default_context(cadata=ca_pem.decode())
        ctx.check_hostname = False  # the API server checks names; here we prove the chain and the key
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ctx), timeout=2)
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    except (OSError, ssl.SSLError, TimeoutError, ValueError) as e:
        return False, f"TLS self-check against {host}:{port} failed: {e}"
    return True, "ok"
