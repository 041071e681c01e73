"""The HTTP side of the manager: the admission webhooks (TLS port) and the probes (plain port).

The handlers are thin: read a bounded body, parse the AdmissionReview, take the current
store snapshot, call the pure engine or validator, answer. Whatever goes wrong, the answer is
an AdmissionReview or a 4xx with a message; never a 500 and never a traceback on the wire.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from injector import admission, engine
from injector.metrics import ADMISSION_LATENCY, ADMISSIONS
from injector.replay import ReplayCache, request_key
from kuberuntime.clock import now_rfc3339
from sidecarsets import names, revisions, validation
from sidecarsets.model import ModelError, SidecarSet
from sidecarsets.store import Snapshot, TemplateStore

log = logging.getLogger(__name__)

JSON_TYPE = b"application/json"
TEXT_TYPE = b"text/plain; charset=utf-8"


@dataclass
class WebhookSettings:
    manager_namespace: str = names.DEFAULT_MANAGER_NAMESPACE
    # How long an admission may wait for a namespace the watch has not delivered yet.
    namespace_wait: float = 1.0
    clock: Callable[[], str] = field(default=now_rfc3339)
    # Identical pods admitted within a second are answered from a cache (None turns it off).
    replay: ReplayCache | None = field(default_factory=ReplayCache)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    admission.check_content_type(_header(scope, b"content-type"))
    length = _header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > admission.MAX_BODY:
        raise admission.ReviewError(413, f"body of {length} bytes is larger than the {admission.MAX_BODY} byte limit")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise admission.ReviewError(400, "client disconnected before the body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > admission.MAX_BODY:
            raise admission.ReviewError(413, f"body is larger than the {admission.MAX_BODY} byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _namespace_labels(store: TemplateStore, namespace: str, wait: float) -> dict[str, str] | None:
    """Labels from the watch; a namespace created a moment ago may still be on its way."""
    deadline = time.monotonic() + wait
    while True:
        labels = store.snapshot.namespaces.get(namespace)
        if labels is not None:
            return dict(labels)
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.01)


def pinned_sidecarsets(
    snapshot: Snapshot,
    pod_labels: dict[str, str],
    *,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    rand: Callable[[], float],
) -> tuple[list[SidecarSet], str | None]:
    """The SidecarSets to inject, with `injectionStrategy.revision` pins resolved from history.

    Only SidecarSets that select this pod are resolved. A pin that names no existing revision
    fails the pod (as in Kruise): injecting the latest spec instead would silently break the
    pinning the user asked for.
    """
    result: list[SidecarSet] = []
    for ss in snapshot.sidecarsets:
        revision = ((ss.spec.get("injectionStrategy") or {}).get("revision")) or None
        if (
            not revision
            or not ss.matches_pod(pod_labels)
            or not ss.matches_namespace(namespace, namespace_labels)
            or not revisions.should_use_pinned(ss.obj, pod_labels=pod_labels, rand=rand())
        ):
            result.append(ss)
            continue
        try:
            pinned = revisions.resolve_pinned(ss.obj, list(snapshot.revisions.values()))
            result.append(ss if pinned is None else SidecarSet.from_object(revisions.apply_revision(ss.obj, pinned)))
        except revisions.PinnedRevisionNotFound as e:
            return [], f"SidecarSet {ss.name}: {e}"
        except (revisions.RevisionError, ModelError) as e:
            return [], f"SidecarSet {ss.name}: pinned revision is unusable: {e}"
    return result, None


# (result label for the metrics, AdmissionReview response body, whether it may be replayed)
Decision = tuple[str, bytes, bool]


def _endpoint(
    webhook: str,
    decide: Callable[[admission.Review], Awaitable[Decision]],
    *,
    replay: ReplayCache | None = None,
    version: Callable[[], int] = lambda: 0,
) -> ASGIApp:
    """Wrap `decide` with what every admission endpoint does: a bounded read, parsing, metrics,
    and the rule that no input produces a 5xx or a traceback on the wire. With `replay`, a body
    seen a moment ago under the same store snapshot is answered from the cache.

    Plain ASGI rather than starlette's Request/Response: on the hot path of every pod creation
    those objects cost more than a replayed answer itself."""
    latency = ADMISSION_LATENCY.labels(webhook)
    counters: dict[str, Any] = {}

    async def decide_raw(scope: Scope, receive: Receive) -> tuple[str, int, bytes, bytes]:
        """(result label, HTTP status, body, content type)."""
        try:
            raw = await _read_body(scope, receive)
            key = request_key(raw) if replay is not None else None
            if replay is not None and key is not None:
                hit = replay.get(key[0], key[1], version())
                if hit is not None:
                    return hit[0], 200, hit[1], JSON_TYPE
            seen = version()
            review = admission.parse(raw)
            result, body, replayable = await decide(review)
            if replay is not None and key is not None and replayable and seen == version():
                replay.put(key[0], key[1], seen, result, body)
            return result, 200, body, JSON_TYPE
        except admission.ReviewError as e:
            return "bad_request", e.status, (e.message + "\n").encode(), TEXT_TYPE
        except Exception:
            log.exception("%s: unexpected error", webhook, extra={"webhook": webhook})
            return "error", 400, b"the webhook could not process this request; see the manager's log\n", TEXT_TYPE

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        result, status, body, content_type = await decide_raw(scope, receive)
        counter = counters.get(result)
        if counter is None:
            counter = counters[result] = ADMISSIONS.labels(webhook, result)
        counter.inc()
        latency.observe(time.perf_counter() - started)
        await _send(send, status, body, content_type)

    return endpoint


def create_webhook_app(store: TemplateStore, settings: WebhookSettings | None = None) -> ASGIApp:
    """The ASGI app served on the TLS port: /inject and /validate-sidecarset."""
    cfg = settings or WebhookSettings()

    async def inject(review: admission.Review) -> Decision:
        admission.require_kind(review, group="", kind="Pod", what="pods")
        if review.operation != "CREATE" or review.sub_resource:
            return "skipped", admission.response(review), False
        if review.object is None:
            raise admission.ReviewError(400, "request.object is required for CREATE")
        namespace = review.namespace or "default"
        labels = await _namespace_labels(store, namespace, cfg.namespace_wait)
        pod_labels = ((review.object.get("metadata") or {}).get("labels")) or {}
        snapshot = store.snapshot
        candidates, denied = pinned_sidecarsets(
            snapshot,
            pod_labels if isinstance(pod_labels, dict) else {},
            namespace=namespace,
            namespace_labels=labels,
            rand=random.random,
        )
        if denied is not None:
            return "denied", admission.response(review, denied=denied), False
        # Replaying is exact only when the answer depends on nothing but the body and the snapshot:
        # a namespace still unknown may arrive, and a pinned revision may be chosen at random.
        replayable = labels is not None and not any(
            (ss.spec.get("injectionStrategy") or {}).get("revision") for ss in snapshot.sidecarsets
        )
        outcome = engine.inject(
            review.object,
            namespace=namespace,
            namespace_labels=labels,
            sidecarsets=candidates,
            now=cfg.clock(),
            operation=review.operation,
            manager_namespace=cfg.manager_namespace,
        )
        if outcome.denied is not None:
            return "denied", admission.response(review, denied=outcome.denied, code=400), False
        body = admission.response(review, patch=outcome.patch, warnings=outcome.warnings)
        return ("injected" if outcome.patch else "skipped"), body, replayable

    async def validate(review: admission.Review) -> Decision:
        admission.require_kind(review, group=names.GROUP, kind=names.KIND, what="SidecarSets")
        if review.operation not in ("CREATE", "UPDATE"):
            return "allowed", admission.response(review), False
        if review.object is None:
            raise admission.ReviewError(400, f"request.object is required for {review.operation}")
        snapshot = store.snapshot
        errors = [
            str(e)
            for e in validation.validate_sidecarset(
                review.object, old=review.old_object, others=list(snapshot.objects.values())
            )
        ]
        spec = review.object.get("spec")
        pin = ((spec.get("injectionStrategy") or {}).get("revision")) if isinstance(spec, dict) else None
        if isinstance(pin, dict) and (pin.get("revisionName") or pin.get("customVersion")):
            try:
                revisions.resolve_pinned(review.object, list(snapshot.revisions.values()))
            except revisions.RevisionError as e:
                errors.append(f"spec.injectionStrategy.revision: {e}")
        if errors:
            message = "SidecarSet rejected: " + "; ".join(errors)
            return "denied", admission.response(review, denied=message, code=422), False
        return "allowed", admission.response(review), False

    routes = {
        names.INJECT_PATH: _endpoint("inject", inject, replay=cfg.replay, version=lambda: store.version),
        names.VALIDATE_PATH: _endpoint("validate", validate),
    }
    fallback = Starlette()  # 404s, lifespan

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = routes.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await fallback(scope, receive, send)
        elif scope["method"] != "POST":
            await _send(send, 405, b"method not allowed: POST an AdmissionReview\n", TEXT_TYPE)
        else:
            await endpoint(scope, receive, send)

    return app


Check = Callable[[], Awaitable[tuple[bool, str]]]


def create_probe_app(*, ready: Check, live: Check | None = None) -> Starlette:
    """The plain-HTTP app: /metrics, /healthz, /readyz. Readiness says what it is waiting for."""

    async def healthz(request: Request) -> Response:
        if live is not None:
            ok, why = await live()
            if not ok:
                return PlainTextResponse(why + "\n", status_code=503)
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        ok, why = await ready()
        return PlainTextResponse((why or "ok") + "\n", status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
        ]
    )
