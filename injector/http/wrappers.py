"""Wrappers around an admission endpoint: replaying repeated requests, and metrics.

Kept apart from the endpoint so each concern reads on its own and can be left out: the replay
cache only wraps the pod webhook, metrics wrap both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Scope

from injector.http.answer import JSON_TYPE, Answer, Endpoint, RawHandler
from injector.http.metrics import ADMISSION_LATENCY, ADMISSIONS
from injector.http.replay import ReplayCache, request_key


def replaying(handle: RawHandler, cache: ReplayCache, *, version: Callable[[], int]) -> RawHandler:
    """Answer a body seen a moment ago under the same store version from `cache`.

    The version is read before deciding: an answer computed while the store changed is not kept.
    """

    async def replay(raw: bytes) -> Answer:
        key = request_key(raw)
        if key is None:
            return await handle(raw)
        hit = cache.get(key[0], key[1], version())
        if hit is not None:
            return Answer(hit[0], 200, hit[1], JSON_TYPE)
        seen = version()
        answer = await handle(raw)
        if answer.replayable and answer.status == 200 and seen == version():
            cache.put(key[0], key[1], seen, answer.result, answer.body)
        return answer

    return replay


def measured(webhook: str, endpoint: Endpoint) -> Endpoint:
    """Count each answer by result and observe its latency (body read to response built)."""
    latency = ADMISSION_LATENCY.labels(webhook)
    counters: dict[str, Any] = {}

    async def answer(scope: Scope, receive: Receive) -> Answer:
        started = time.perf_counter()
        result = await endpoint(scope, receive)
        counter = counters.get(result.result)
        if counter is None:
            counter = counters[result.result] = ADMISSIONS.labels(webhook, result.result)
        counter.inc()
        latency.observe(time.perf_counter() - started)
        return result

    return answer
