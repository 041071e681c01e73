"""Delegated authentication and authorization: the API server decides who may read an endpoint.

The way controller-runtime's secure metrics serving (and kube-rbac-proxy) work: the caller's
bearer token is checked with a TokenReview, and the user it names must be allowed the
non-resource request (`get /metrics`) by a SubjectAccessReview. An allowed answer is kept for
`ttl` seconds per token, so a scrape every few seconds costs two API calls a minute, not two per
scrape; a refusal only for `denied_ttl`, so a binding made a moment ago takes effect quickly.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True)
class Verdict:
    status: int  # 200, 401 (who are you?) or 403 (not allowed)
    message: str


class DelegatedAuth:
    def __init__(
        self,
        client: api.Writer,
        *,
        path: str = "/metrics",
        verb: str = "get",
        ttl: float = 60.0,
        denied_ttl: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.path = path
        self.verb = verb
        self.ttl = ttl
        self.denied_ttl = denied_ttl
        self._clock = clock
        self._cache: dict[bytes, tuple[float, Verdict]] = {}

    async def check(self, authorization: str | None) -> Verdict:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(401, "a bearer token is required")
        key = hashlib.sha256(token.strip().encode()).digest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        verdict = await self._review(token.strip())
        if verdict.status != 500:  # an API outage is not remembered
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = (now + (self.ttl if verdict.status == 200 else self.denied_ttl), verdict)
        return verdict

    async def _review(self, token: str) -> Verdict:
        try:
            review = await self.client.create(
                TOKEN_REVIEWS,
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            )
            status = review.get("status") or {}
            if not status.get("authenticated"):
                return Verdict(401, "the token was not accepted")
            user: JsonObj = status.get("user") or {}
            access = await self.client.create(ACCESS_REVIEWS, self._access_review(user))
        except (api.ApiError, OSError) as e:
            log.warning("delegated auth for %s failed: %s", self.path, e)
            return Verdict(500, "the API server could not be asked")
        if (access.get("status") or {}).get("allowed"):
            return Verdict(200, "ok")
        return Verdict(403, f"{user.get('username')} may not {self.verb} {self.path}")

    def _access_review(self, user: JsonObj) -> JsonObj:
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": self.path, "verb": self.verb},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
