"""What /validate-sidecarset decides for a NamespacedSidecarSet (a tenant's), beyond a SidecarSet's rules.

The same validation as a SidecarSet (sidecarsets.validation, against the other sets of its
namespace), then the tenant rules in the order a user fixes them: the kind is served at all
(--namespaced-sidecarsets) and in this namespace (its label), the shape (sidecarsets.validation.tenancy),
the right to create pods there (a SubjectAccessReview for the requesting user), the namespace's
enforced Pod Security level, and no name a cluster SidecarSet injecting the same pods owns. Each
refusal is a 4xx whose message names what is missing; a review that cannot be made is a 503 to retry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from injector.http import admission
from injector.http.access import ReviewFailed, Verdict
from injector.http.namespaces import LookupFailed
from kuberuntime.jsontypes import JsonObj
from sidecarsets import validation
from sidecarsets.spec import names
from sidecarsets.spec.model import ModelError, SidecarSet, object_key
from sidecarsets.store import Snapshot
from sidecarsets.validation import tenancy

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
