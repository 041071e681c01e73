"""Tiny ASGI apps for tests of the webhook's server layer (injector.http.server.Listener)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any


async def ok_app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
) -> None:
    """Answers every HTTP request `200 ok`."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
