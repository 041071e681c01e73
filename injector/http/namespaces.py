"""Reading a namespace from the API server when the watch has not delivered it (or its labels) yet.

Why: the API server calls the pod webhook because its namespaceSelector matched the namespace's
labels *now*; a snapshot that does not know the namespace, or knows it without the injection
label, is behind (a namespace created or labelled a moment ago). Guessing "not labelled" would
admit a pod that should have its proxy without it. So the webhook reads the namespace once, with a
short timeout, and when even that fails the pod is refused with a message to retry; it is never
admitted without its sidecars.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from injector.http.metrics import NAMESPACE_LOOKUPS
from kuberuntime import api
from kuberuntime.jsontypes import mapping
from sidecarsets.spec import names


class LookupFailed(Exception):
    """The namespace's labels could not be read; the message says why."""


class NamespaceLookup:
    """GET /api/v1/namespaces/NAME with a timeout, a little concurrency and a one-second memory."""

    def __init__(self, client: api.Reader, *, timeout: float = 2.0, concurrency: int = 8, ttl: float = 1.0) -> None:
        self.client = client
        self.timeout = timeout
        self.ttl = ttl
        self._slots = asyncio.Semaphore(concurrency)
        self._recent: dict[str, tuple[float, Mapping[str, str] | None]] = {}

    async def __call__(self, namespace: str) -> Mapping[str, str] | None:
        """The namespace's labels, None when it does not exist; LookupFailed when it cannot be known."""
        now = time.monotonic()
        cached = self._recent.get(namespace)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            async with asyncio.timeout(self.timeout):
                async with self._slots:
                    obj = await self.client.get(f"/api/v1/namespaces/{namespace}")
        except api.NotFound:
            NAMESPACE_LOOKUPS.labels("not_found").inc()
            self._remember(namespace, None)
            return None
        except (TimeoutError, api.ApiError, OSError) as e:
            NAMESPACE_LOOKUPS.labels("error").inc()
            raise LookupFailed(f"reading it from the API server failed: {type(e).__name__} {e}".strip()) from None
        NAMESPACE_LOOKUPS.labels("found").inc()
        labels = {str(k): str(v) for k, v in mapping(obj, "metadata", "labels").items()}
        labels.setdefault(names.NS_NAME_LABEL, namespace)
        self._remember(namespace, labels)
        return labels

    def _remember(self, namespace: str, labels: Mapping[str, str] | None) -> None:
        if len(self._recent) > 1024:
            self._recent.clear()
        self._recent[namespace] = (time.monotonic() + self.ttl, labels)
