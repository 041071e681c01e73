"""A synchronous facade over the async API client, for test bodies."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kuberuntime import api, kubeapi
from kuberuntime.jsontypes import JsonObj
from tests.kube.loop import BackgroundLoop

T = TypeVar("T")


class Kube:
    """Every call runs on the session loop and blocks the test until it returns."""

    def __init__(self, loop: BackgroundLoop, client: kubeapi.KubeClient) -> None:
        self.loop = loop
        self.client = client

    def get(self, path: str, **params: str | int) -> JsonObj:
        return self.loop.run(self.client.get(path, params=params or None))

    def get_or_none(self, path: str) -> JsonObj | None:
        try:
            return self.get(path)
        except api.NotFound:
            return None

    def create(self, path: str, body: JsonObj, **params: str | int) -> JsonObj:
        return self.loop.run(self.client.create(path, body, params=params or None))

    def update(self, path: str, body: JsonObj) -> JsonObj:
        return self.loop.run(self.client.update(path, body))

    def patch(self, path: str, body: Any, patch_type: api.PatchType = "merge", **params: str | int) -> JsonObj:
        return self.loop.run(self.client.patch(path, body, patch_type=patch_type, params=params or None))

    def delete(self, path: str, **params: str | int) -> Any:
        try:
            return self.loop.run(self.client.delete(path, params=params or None))
        except api.NotFound:
            return None

    def apply(self, path: str, body: JsonObj) -> JsonObj:
        """Create, or replace keeping the server's resourceVersion (a minimal `kubectl apply`).

        `kubectl apply` patches, so a status write by a controller between its read and its write
        never conflicts; the replace here is retried on a conflict for the same effect."""
        name = body["metadata"]["name"]
        try:
            return self.create(path, body)
        except api.Conflict:
            pass
        for attempt in range(5):
            current = self.get(f"{path}/{name}")
            meta = {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
            try:
                return self.update(f"{path}/{name}", {**body, "metadata": meta})
            except api.Conflict:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")


def eventually(
    check: Callable[[], T | None],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "",
    retrying: tuple[type[Exception], ...] = (),
) -> T:
    """Poll `check` until it returns a truthy value; an AssertionError (or one of `retrying`, say an
    API error while a server restarts) counts as not yet. On timeout, an AssertionError naming `what`
    from the last of those errors."""
    deadline = time.monotonic() + timeout
    not_yet: tuple[type[Exception], ...] = (AssertionError, *retrying)
    last: BaseException | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except not_yet as e:
            last = e
        if time.monotonic() >= deadline:
            msg = f"not true within {timeout}s: {what or getattr(check, '__name__', 'condition')}"
            raise AssertionError(msg) from last
        time.sleep(interval)
