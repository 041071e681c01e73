"""The HTTP side of the webhooks: a bounded read, dispatch by path, and the response.

Plain ASGI rather than starlette's Request/Response: on the hot path of every pod creation those
objects cost more than a replayed answer itself. What each webhook decides lives in
`injector.http.decisions`; replaying repeated requests and counting answers are wrappers around the
endpoint (`injector.http.wrappers`), and what they pass along is an `injector.http.answer.Answer`.

Bad input is answered as such: a denial naming the field, or a 4xx with a message. A fault of the
webhook's own (an exception nobody expected) is not the caller's: once the request is known it is a
well-formed denial with code 500 and a message the user sees in `kubectl` (controller-runtime's
`Errored`), a ConversionReview Failure at /convert; only a fault before the request could be read
is a plain 500. Never a traceback on the wire, and one log line per request.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from injector.http import admission, conversionreview, decisions, wrappers
from injector.http.answer import JSON_TYPE, TEXT_TYPE, Answer, Endpoint, RawHandler
from injector.http.body import Body, BodyLimits, Refused
from injector.http.decisions import Decision, WebhookSettings
from sidecarsets import validation
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore

log = logging.getLogger("injector.app")
_UNEXPECTED = b"the webhook failed before it could read this request; see the manager's log\n"
_POST_ONLY = b"method not allowed: POST an AdmissionReview (a ConversionReview at /convert)\n"


async def send(send: Send, status: int, body: bytes, content_type: bytes, *, close: bool = False) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def parsing(webhook: str, decide: Callable[[admission.Review], Awaitable[Decision]]) -> RawHandler:
    """A body handler: parse the AdmissionReview, then decide; a fault in deciding is a denial with
    code 500 (`admission.errored`), the request being well formed."""

    async def handle(raw: bytes) -> Answer:
        review = admission.parse(raw)
        try:
            decision = await decide(review)
        except admission.ReviewError:
            raise  # bad input found while deciding: the endpoint answers it as such
        except Exception as e:
            _log_fault(webhook, e)
            return Answer("error", 200, admission.errored(review, e), JSON_TYPE)
        return Answer(decision.result, 200, decision.body, JSON_TYPE, decision.replayable)

    return handle


def _log_fault(webhook: str, e: Exception) -> None:
    # One line per request: a flood of requests that meet the fault must not flood the log with tracebacks.
    log.error("%s: unexpected error: %s: %s", webhook, type(e).__name__, e, extra={"webhook": webhook})
    log.debug("%s: unexpected error", webhook, exc_info=True)


def endpoint(webhook: str, handle: RawHandler, limits: BodyLimits) -> Endpoint:
    """Read the body and answer it: bad input is a 4xx with a message; a fault the handler did not
    answer itself (one before the request could be read) is a 500 with a message; never a traceback."""

    async def answer(scope: Scope, receive: Receive) -> Answer:
        body = Body(limits)
        try:
            return await handle(await body.read(scope, receive))
        except Refused as e:
            return Answer(e.reason, e.status, (e.message + "\n").encode(), TEXT_TYPE, close=True)
        except admission.ReviewError as e:
            return Answer("bad_request", e.status, (e.message + "\n").encode(), TEXT_TYPE)
        except Exception as e:
            _log_fault(webhook, e)
            return Answer("error", 500, _UNEXPECTED, TEXT_TYPE)
        finally:
            body.release()

    return answer


# A SidecarSet update carries the object and the old object, each at most etcd's 1.5 MiB.
VALIDATE_MAX_BYTES = 2 * validation.MAX_SIDECARSET_BYTES + 256 * 1024
# A conversion carries a whole list (kubectl asks for 500 objects a page): more bytes and values than a pod.
CONVERT_MAX_BYTES = 16 * 1024 * 1024
CONVERT_VALUES_PER_POD_VALUE = 10


async def convert(raw: bytes) -> Answer:
    """A body handler for /convert: every answer is a ConversionReview (injector.http.conversionreview)."""
    outcome = conversionreview.convert(raw, on_fault=lambda e: _log_fault("convert", e))
    return Answer(outcome.result, outcome.status, outcome.body, JSON_TYPE)


def create_webhook_app(
    store: TemplateStore, settings: WebhookSettings | None = None, limits: BodyLimits | None = None
) -> ASGIApp:
    """The ASGI app served on the TLS port: /inject, /validate-sidecarset and /convert."""
    cfg = settings or WebhookSettings()
    pods = limits or BodyLimits()
    sidecarsets = dataclasses.replace(pods, max_bytes=min(pods.max_bytes, VALIDATE_MAX_BYTES))
    lists = dataclasses.replace(
        pods,
        max_bytes=max(pods.max_bytes, CONVERT_MAX_BYTES),
        max_values=pods.max_values * CONVERT_VALUES_PER_POD_VALUE,
    )

    async def inject(review: admission.Review) -> Decision:
        return await decisions.inject(review, store, cfg)

    async def validate(review: admission.Review) -> Decision:
        return await decisions.validate(review, store, cfg)

    inject_handler = parsing("inject", inject)
    validate_handler = parsing("validate", validate)
    if cfg.replay is not None:
        inject_handler = wrappers.replaying(inject_handler, cfg.replay, version=lambda: store.version)
    routes = {
        names.INJECT_PATH: wrappers.measured("inject", endpoint("inject", inject_handler, pods)),
        names.VALIDATE_PATH: wrappers.measured("validate", endpoint("validate", validate_handler, sidecarsets)),
        names.CONVERT_PATH: wrappers.measured("convert", endpoint("convert", convert, lists)),
    }
    fallback = Starlette()  # 404s, lifespan

    async def app(scope: Scope, receive: Receive, send_: Send) -> None:
        route = routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await fallback(scope, receive, send_)
        elif scope["method"] != "POST":
            await send(send_, 405, _POST_ONLY, TEXT_TYPE)
        else:
            answer = await route(scope, receive)
            await send(send_, answer.status, answer.body, answer.content_type, close=answer.close)

    return app
