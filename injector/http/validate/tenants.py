"""What /validate-sidecarset decides for a NamespacedSidecarSet (a tenant's), beyond a SidecarSet's rules.

The same validation as a SidecarSet (sidecarsets.validation, against the other sets of its
namespace), then the tenant rules in the order a user fixes them: the kind is served at all
(--namespaced-sidecarsets) and in this namespace (its label), the shape (sidecarsets.validation.tenancy),
the right to create pods there (a SubjectAccessReview for the requesting user), the namespace's
enforced Pod Security level, and no name a cluster SidecarSet injecting the same pods owns. Each
refusal is a 4xx whose message names what is missing; a review that cannot be made is a 503 to retry.

The right to create pods: a tenant's sidecar runs in other people's pods there, with their
ServiceAccount and their volumes. Whoever may create pods in the namespace can already run those
containers; nobody else may hand them to every pod. The SubjectAccessReview is built from the
AdmissionReview's userInfo (user, uid, groups, extra), so the API server's authorizer (RBAC or any
other) answers for exactly that user; one that cannot be made refuses the write: never fail open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from injector.http import admission
from injector.http.namespaces import LookupFailed
from injector.policy import servable
from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from sidecarsets import validation
from sidecarsets.spec import names
from sidecarsets.spec.model import ModelError, SidecarSet, object_key
from sidecarsets.store import Snapshot
from sidecarsets.validation import tenancy

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


AccessReview = Callable[[Mapping[str, Any], str], Awaitable[Verdict]]
Lookup = Callable[[str], Awaitable[Mapping[str, str] | None]]
KIND = names.NAMESPACED_KIND


def refused(review: admission.Review, message: str, code: int) -> bytes:
    return admission.response(review, denied=f"{KIND} rejected: {message}", code=code)


async def labels_of(snapshot: Snapshot, namespace: str, lookup: Lookup | None) -> Mapping[str, str] | None:
    """The namespace's labels: from the watch, else read once (None: it does not exist)."""
    known = snapshot.namespaces.get(namespace)
    if known is not None or lookup is None:
        return known
    return await lookup(namespace)


def _object(review: admission.Review) -> JsonObj:
    """The object with its namespace set (the API server sets it; a bare review may not)."""
    obj = dict(review.object or {})
    meta = obj.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta["namespace"] = review.namespace
    obj["metadata"] = meta
    return obj


async def validate(
    review: admission.Review,
    snapshot: Snapshot,
    *,
    enabled: bool,
    policy_only: bool = False,
    manager_namespace: str,
    lookup: Lookup | None,
    access_review: AccessReview | None,
) -> tuple[str, bytes]:
    """(metrics result, AdmissionReview response) for a NamespacedSidecarSet create or update."""
    if not enabled:
        message = f"{KIND}s are turned off in this cluster (the manager runs with --no-namespaced-sidecarsets)"
        return "denied", refused(review, message, 403)
    namespace = review.namespace
    if not namespace:
        raise admission.ReviewError(400, f"request.namespace is required for a {KIND}")
    try:
        labels = await labels_of(snapshot, namespace, lookup)
    except LookupFailed as e:
        return "denied", refused(review, f"the labels of namespace {namespace} are not known ({e}); retry", 503)
    why = tenancy.refusal_for_namespace(namespace, labels, manager_namespace=manager_namespace)
    if why is not None or labels is None:
        return "denied", refused(review, why or "", 403)
    obj = _object(review)
    size = len(orjson.dumps(obj))
    if size > validation.MAX_SIDECARSET_BYTES:
        return "denied", refused(
            review, f"{size} bytes is more than the {validation.MAX_SIDECARSET_BYTES} etcd stores", 413
        )
    prefix = f"{namespace}/"
    neighbours = [o for key, o in snapshot.objects.items() if key.startswith(prefix)]
    errors = [str(e) for e in validation.validate_sidecarset(obj, old=review.old_object, others=neighbours)]
    if not errors and policy_only:  # no pod webhook: only what a policy can serve
        refusal = servable.policy_only_refusal(obj, snapshot.sidecarsets, manager_namespace=manager_namespace)
        if refusal is not None:
            errors.append(refusal)
    if errors:
        return "denied", refused(review, "; ".join(errors), 422)
    verdict = await _may_create_pods(review, namespace, access_review)
    if isinstance(verdict, bytes):
        return "denied", verdict
    try:
        ss = SidecarSet.from_object(obj)
    except ModelError as e:
        return "denied", refused(review, str(e), 422)
    security = tenancy.pod_security_refusal(ss, labels)
    if security is not None:
        return "denied", refused(review, security, 403)
    cluster = [s for s in snapshot.sidecarsets if not s.namespaced and s.name != object_key(obj)]
    clashes = tenancy.cluster_clashes(ss, cluster, labels)
    if clashes:
        message = "a cluster SidecarSet injecting the same pods owns these names: " + tenancy.clash_message(clashes)
        return "denied", refused(review, message, 409)
    return "allowed", admission.response(review)


async def _may_create_pods(
    review: admission.Review, namespace: str, access_review: AccessReview | None
) -> bytes | None:
    """None when the requesting user may create pods in `namespace`; else the refusal."""
    user = str(review.user_info.get("username") or "(no user)")
    if access_review is None:
        return refused(review, "the manager cannot check the requesting user's rights (no API access); retry", 503)
    try:
        verdict = await access_review(review.user_info, namespace)
    except ReviewFailed as e:
        return refused(review, f"cannot check whether {user} may create pods in {namespace}: {e}; retry", 503)
    if verdict.allowed:
        return None
    because = f" ({verdict.reason})" if verdict.reason else ""
    message = (
        f'user "{user}" may not create pods in namespace {namespace}{because}: a {KIND}\'s sidecars run in '
        f"that namespace's pods, so writing one needs the right to create pods there (verb create, resource pods)"
    )
    return refused(review, message, 403)
