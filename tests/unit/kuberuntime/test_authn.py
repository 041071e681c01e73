"""Delegated authentication and authorization for /metrics: TokenReview, then SubjectAccessReview."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.testclient import TestClient

from kuberuntime import api
from kuberuntime.authn import ACCESS_REVIEWS, TOKEN_REVIEWS, DelegatedAuth
from sidecarctl.manager.healthport import create_metrics_app


class Reviews:
    """The two review APIs: tokens map to users, users to whether they may `get /metrics`."""

    def __init__(self) -> None:
        self.users = {"good": "system:serviceaccount:monitoring:prometheus", "nosy": "system:serviceaccount:x:y"}
        self.allowed = {"system:serviceaccount:monitoring:prometheus"}
        self.calls: list[tuple[str, Any]] = []
        self.down = False

    async def create(self, path: str, body: Any, *, params: Any = None) -> dict[str, Any]:
        self.calls.append((path, body["spec"]))
        if self.down:
            raise api.ApiError(503, "ServiceUnavailable", "etcd is down")
        if path == TOKEN_REVIEWS:
            user = self.users.get(body["spec"]["token"])
            return {"status": {"authenticated": user is not None, "user": {"username": user, "groups": ["g"]}}}
        assert path == ACCESS_REVIEWS
        spec = body["spec"]
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"} and spec["groups"] == ["g"]
        return {"status": {"allowed": spec["user"] in self.allowed}}


def client(reviews: Reviews) -> TestClient:
    registry = CollectorRegistry()
    Counter("probe_total", "a counter", registry=registry).inc()
    return TestClient(create_metrics_app(registry, DelegatedAuth(reviews).check))  # type: ignore[arg-type]


def test_only_a_token_the_api_server_allows_reads_metrics() -> None:
    reviews = Reviews()
    c = client(reviews)
    assert c.get("/metrics").status_code == 401
    assert c.get("/metrics", headers={"authorization": "Basic abc"}).status_code == 401
    assert c.get("/metrics", headers={"authorization": "Bearer unknown"}).status_code == 401
    denied = c.get("/metrics", headers={"authorization": "Bearer nosy"})
    assert denied.status_code == 403 and "system:serviceaccount:x:y" in denied.text
    ok = c.get("/metrics", headers={"authorization": "Bearer good"})
    assert ok.status_code == 200 and "probe_total 1.0" in ok.text
    assert c.get("/healthz").status_code == 404, "the secure port serves /metrics only"


def test_answers_are_cached_per_token_but_an_outage_is_not() -> None:
    reviews = Reviews()
    auth = DelegatedAuth(reviews)  # type: ignore[arg-type]

    async def main() -> list[int]:
        return [(await auth.check("Bearer good")).status for _ in range(3)]

    assert asyncio.run(main()) == [200, 200, 200]
    assert len(reviews.calls) == 2, "one TokenReview and one SubjectAccessReview for three scrapes"
    reviews.down = True
    outage = DelegatedAuth(reviews)  # type: ignore[arg-type]
    assert asyncio.run(outage.check("Bearer good")).status == 500
    reviews.down = False
    assert asyncio.run(outage.check("Bearer good")).status == 200
