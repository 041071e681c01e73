"""The ConversionReview wire contract (apiextensions.k8s.io/v1) of the CRD's conversion webhook.

The API server posts every SidecarSet it must serve in another version than it stored (a whole list
in one request) and expects them back in `desiredAPIVersion`, in order, or a `result` of Failure
whose message it passes on to its client (`kubectl get` prints it). So anything wrong with a request
that is a ConversionReview is answered with a Failure naming the object and the field, never an HTTP
error: only a body that is not a ConversionReview at all gets a 400, still in the ConversionReview
shape. The mapping itself is sidecarsets.spec.conversion.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from injector.http.admission import fault_message
from kuberuntime.jsontypes import resolve
from sidecarsets.spec import conversion

log = logging.getLogger("injector.conversionreview")

API_VERSION = "apiextensions.k8s.io/v1"
KIND = "ConversionReview"


@dataclass(frozen=True, slots=True)
class Outcome:
    result: str  # metrics label: converted, failed, bad_request
    status: int
    body: bytes


def _failure(uid: str, message: str, *, status: int = 200, result: str = "failed", code: int | None = None) -> Outcome:
    failure: dict[str, Any] = {"status": "Failure", "message": message}
    if code is not None:
        failure |= {"code": code, "reason": "InternalError"}
    response = {"uid": uid, "result": failure}
    body = {"apiVersion": API_VERSION, "kind": KIND, "response": response}
    return Outcome(result, status, orjson.dumps(body))


def _name(obj: Any) -> str:
    name = resolve(obj, "metadata", "name")
    return f"SidecarSet {name}" if isinstance(name, str) and name else "a SidecarSet without a name"


def convert(raw: bytes, *, on_fault: Callable[[Exception], None] = lambda e: None) -> Outcome:
    """The answer to one ConversionReview body. A fault of the webhook's own, once the request's uid
    is known, is a Failure with code 500 (`on_fault` is told of it first); bad input is a Failure
    naming what is wrong."""
    try:
        review = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return _failure("", f"body is not valid JSON: {e}", status=400, result="bad_request")
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(review, dict) or review.get("kind") != KIND or not isinstance(request, dict):
        return _failure("", f"body must be a {KIND} with a request", status=400, result="bad_request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return _failure("", "request.uid must be a non-empty string", status=400, result="bad_request")
    if review.get("apiVersion") != API_VERSION:
        return _failure(uid, f"apiVersion {review.get('apiVersion')!r} is not {API_VERSION}")
    try:
        return _converted(uid, request)
    except Exception as e:
        on_fault(e)
        return _failure(uid, fault_message(e), result="error", code=500)


def _converted(uid: str, request: dict[str, Any]) -> Outcome:
    """The answer to a well-formed request: every object converted, or a Failure naming the first
    that cannot be."""
    desired = request.get("desiredAPIVersion")
    objects = request.get("objects")
    if not isinstance(desired, str) or conversion.version_of(desired) is None:
        return _failure(uid, f"request.desiredAPIVersion {desired!r} is not a SidecarSet version")
    if not isinstance(objects, list):
        return _failure(uid, "request.objects must be a list")
    converted: list[Any] = []
    for i, obj in enumerate(objects):
        try:
            converted.append(conversion.convert(obj, desired))
        except conversion.ConversionError as e:
            message = f"cannot convert {_name(obj)} (request.objects[{i}]) to {desired}: {e}"
            log.info("conversion refused: %s", message)
            return _failure(uid, message)
    response = {"uid": uid, "convertedObjects": converted, "result": {"status": "Success"}}
    return Outcome("converted", 200, orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": response}))
