"""The AdmissionReview wire contract: parse a request body, build a response.

Kept free of HTTP so that every rule about bad input can be tested as a pure function: the
body is bytes in, a `Review` or a `ReviewError` (an HTTP status and a message) out.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kuberuntime.jsontypes import JsonObj, mapping

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_BODY = 6 * 1024 * 1024  # the API server's own request limit is 3 MiB; leave room, refuse abuse
MAX_WARNING = 256  # longer warnings are truncated by the API server anyway
# The metav1.StatusReason a denial carries for its code.
_REASONS = {403: "Forbidden", 413: "RequestEntityTooLarge", 500: "InternalError", 503: "ServiceUnavailable"}


class ReviewError(Exception):
    """A request that is not a usable AdmissionReview; answered with `status` and `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Review:
    api_version: str
    uid: str
    operation: str
    namespace: str
    name: str
    kind: Mapping[str, Any]
    resource: Mapping[str, Any]
    sub_resource: str
    dry_run: bool
    object: JsonObj | None
    old_object: JsonObj | None
    user_info: Mapping[str, Any] = dataclasses.field(
        default_factory=dict
    )  # request.userInfo (for a SubjectAccessReview)


def check_content_type(value: str | None) -> None:
    media = (value or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ReviewError(415, f"unsupported content type {value or '(none)'!r}: expected application/json")


def parse(body: bytes) -> Review:
    if not body:
        raise ReviewError(400, "empty body: expected an AdmissionReview")
    if len(body) > MAX_BODY:
        raise ReviewError(413, f"body of {len(body)} bytes is larger than the {MAX_BODY} byte limit")
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ReviewError(400, f"body is not valid JSON: {e}") from None
    if not isinstance(review, dict):
        raise ReviewError(400, "body must be a JSON object (an AdmissionReview)")
    if review.get("kind") != "AdmissionReview":
        raise ReviewError(400, f"kind must be AdmissionReview, not {review.get('kind')!r}")
    api_version = review.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(400, f"apiVersion {api_version!r} is not one of {', '.join(API_VERSIONS)}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError(400, "AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(400, "request.uid must be a non-empty string")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise ReviewError(400, "request.operation must be a non-empty string")
    obj, old = request.get("object"), request.get("oldObject")
    for field, value in (("object", obj), ("oldObject", old)):
        if value is not None and not isinstance(value, dict):
            raise ReviewError(400, f"request.{field} must be a JSON object")
    return Review(
        api_version=str(api_version),
        uid=uid,
        operation=operation,
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        kind=mapping(request, "kind"),
        resource=mapping(request, "resource"),
        sub_resource=str(request.get("subResource") or ""),
        dry_run=bool(request.get("dryRun")),
        object=obj,
        old_object=old,
        user_info=mapping(request, "userInfo"),
    )


def require_kind(review: Review, *, group: str, kind: str, what: str) -> None:
    if review.kind.get("group", "") != group or review.kind.get("kind") != kind:
        got = f"{review.kind.get('group') or 'core'}/{review.kind.get('kind')}"
        raise ReviewError(400, f"this endpoint admits {what}, not {got}")


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 3] + "..."


def fault_message(e: Exception) -> str:
    """What the user reads (in `kubectl`'s error) when the webhook itself failed on a request."""
    return (
        f"sidecarctl: the webhook failed on this request ({_truncate(f'{type(e).__name__}: {e}')}); "
        "the fault is the webhook's, not the request's: see the manager's log"
    )


def errored(review: Review, e: Exception) -> bytes:
    """A denial with code 500 for a fault of the webhook's own (controller-runtime's `Errored`): the
    API server answers its client with that code and the message, and the request is not admitted."""
    return response(review, denied=fault_message(e), code=500)


def response(
    review: Review,
    *,
    patch: list[JsonObj] | None = None,
    warnings: tuple[str, ...] | list[str] = (),
    denied: str | None = None,
    code: int = 403,
) -> bytes:
    resp: dict[str, Any] = {"uid": review.uid, "allowed": denied is None}
    if denied is not None:
        reason = _REASONS.get(code, "Invalid")
        resp["status"] = {"code": code, "message": denied, "reason": reason}
    elif patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if warnings:
        resp["warnings"] = [_truncate(w) for w in warnings]
    return orjson.dumps({"apiVersion": review.api_version, "kind": "AdmissionReview", "response": resp})
