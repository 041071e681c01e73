"""The cert watcher's view of the API server, served by our raw-JSON client.

`certwatcher` depends on nothing of ours; it declares the four calls it needs (`ApiPort`),
with "lost a race" reported as None. This adapter is the only place that knows both sides.
"""

from __future__ import annotations

from typing import Any

from kuberuntime import kubeapi


class KubeApiPort:
    def __init__(self, client: kubeapi.KubeClient) -> None:
        self.client = client

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.client.get(path)
        except kubeapi.NotFound:
            return None

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return await self.client.create(path, body)
        except kubeapi.Conflict:
            return None

    async def update(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return await self.client.update(path, body)
        except kubeapi.Conflict:
            return None

    async def patch_json(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any] | None:
        try:
            return await self.client.patch(path, ops, patch_type="json")
        except (kubeapi.Conflict, kubeapi.Invalid):
            return None  # a failed `test` of resourceVersion comes back as 422 Invalid
