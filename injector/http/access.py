"""Whether the user writing a NamespacedSidecarSet may create pods in its namespace (SubjectAccessReview).

Why: a tenant's sidecar runs in other people's pods there, with their ServiceAccount and their
volumes. Whoever may create pods in the namespace can already run those containers; nobody else
may hand them to every pod. The review is built from the AdmissionReview's userInfo (user, uid,
groups, extra), so the API server's authorizer (RBAC, or any other) answers for exactly that user.
A review that cannot be made refuses the write (retriable): never fail open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuberuntime import api

SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class ReviewFailed(Exception):
    """The SubjectAccessReview could not be made; the message says why."""


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str  # the authorizer's reason or evaluation error, possibly empty


def review_body(user_info: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The SubjectAccessReview asking `create pods` in `namespace` for this userInfo (bad fields dropped)."""
    spec: dict[str, Any] = {
        "resourceAttributes": {"namespace": namespace, "verb": "create", "group": "", "resource": "pods"}
    }
    user = user_info.get("username")
    if isinstance(user, str) and user:
        spec["user"] = user
    uid = user_info.get("uid")
    if isinstance(uid, str) and uid:
        spec["uid"] = uid
    groups = user_info.get("groups")
    if isinstance(groups, list):
        spec["groups"] = [g for g in groups if isinstance(g, str)]
    extra = user_info.get("extra")
    if isinstance(extra, Mapping):
        spec["extra"] = {
            str(k): [v for v in values if isinstance(v, str)] for k, values in extra.items() if isinstance(values, list)
        }
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


class PodCreateReview:
    """POST a SubjectAccessReview with a timeout; `await review(user_info, namespace)` -> Verdict."""

    def __init__(self, client: api.Client, *, timeout: float = 2.0) -> None:
        self.client = client
        self.timeout = timeout

    async def __call__(self, user_info: Mapping[str, Any], namespace: str) -> Verdict:
        body = review_body(user_info, namespace)
        if "user" not in body["spec"] and "groups" not in body["spec"]:
            return Verdict(False, "the request names no user or group")
        try:
            async with asyncio.timeout(self.timeout):
                answer = await self.client.create(SAR_PATH, body)
        except (TimeoutError, api.ApiError, OSError) as e:
            raise ReviewFailed(f"the SubjectAccessReview failed: {type(e).__name__} {e}".strip()) from None
        status = answer.get("status")
        status = status if isinstance(status, Mapping) else {}
        reason = str(status.get("reason") or status.get("evaluationError") or "")
        return Verdict(status.get("allowed") is True and status.get("denied") is not True, reason)
