"""The slice of the Kubernetes API the cert code needs, as a Protocol.

`certwatcher` depends on nothing else in sidecarctl, so it cannot use the manager's client; the
manager implements this port over its async client, and unit tests use an in-memory fake that
enforces resourceVersion and already-exists the way the API server does.

Paths are API paths, e.g.
`/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sidecarctl-injector` or
`/api/v1/namespaces/sidecarctl-system/secrets/sidecarctl-webhook-certs`. Bodies and results are the
plain JSON objects. Errors other than the ones mapped to `None` (403, 5xx, network) are raised; the
callers log them and retry with backoff.
"""

from __future__ import annotations

from typing import Any, Protocol


class ApiPort(Protocol):
    async def get(self, path: str) -> dict[str, Any] | None:
        """GET an object; None when it does not exist (404)."""
        ...

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST `body` to the *collection* path; None when the name already exists (409)."""
        ...

    async def update(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """PUT the object path; `body.metadata.resourceVersion` guards it; None on conflict (409)."""
        ...

    async def patch_json(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any] | None:
        """RFC 6902 JSON Patch; None on conflict or when a `test` op fails (409/422)."""
        ...
