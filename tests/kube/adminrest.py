"""A small synchronous JSON client for the test control plane, as its admin user.

The node tier drives a real kubelet from plain test functions; this keeps its helpers free of the
product's API client (which is being reorganised) and of an event loop: a handful of verbs over
urllib with the admin client certificate that tests/kube/controlplane.py issued.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any, TypeVar

from tests.kube.controlplane import ControlPlane

T = TypeVar("T")
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:500]}")
        self.status = status


class AdminRest:
    def __init__(self, cp: ControlPlane, *, timeout: float = 30) -> None:
        pki = cp.workdir / "pki"
        self.base = cp.url
        self.timeout = timeout
        self.ctx = ssl.create_default_context(cafile=str(pki / "serving-ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, method, path, e.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any, patch_type: str = "merge") -> Any:
        return self.request("PATCH", path, body, PATCH_TYPES[patch_type])

    def delete(self, path: str) -> Any:
        try:
            return self.request("DELETE", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise
