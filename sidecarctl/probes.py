"""The manager's plain-HTTP port: /metrics, /healthz, /readyz. Readiness says what it waits for."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

Check = Callable[[], Awaitable[tuple[bool, str]]]


def create_probe_app(*, ready: Check, live: Check | None = None) -> Starlette:
    async def healthz(request: Request) -> Response:
        if live is not None:
            ok, why = await live()
            if not ok:
                return PlainTextResponse(why + "\n", status_code=503)
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        ok, why = await ready()
        return PlainTextResponse((why or "ok") + "\n", status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ]
    )
