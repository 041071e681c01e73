"""Reading an admission request's body within its bounds: size, time, values, memory.

Every bound is checked before the work it protects: the size from Content-Length before reading,
the time while reading, the number of JSON values (which decides how much parsing allocates) before
parsing, and the bytes held at once in this process (`ByteBudget`) for the whole request. A request
that hits one gets a 4xx naming the bound, and the connection is closed (its body may be unread).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import Receive, Scope

from injector.http import admission
from injector.http.budget import BudgetExhausted, ByteBudget
from injector.http.metrics import REQUESTS_REFUSED

# What parsing allocates per JSON value, at most (an empty object is the worst case: ~64 bytes).
PARSED_BYTES_PER_VALUE = 80


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int = admission.MAX_BODY
    timeout: float = 10.0  # from the request's headers to the end of its body
    max_values: int = 100_000  # a large pod has a few thousand
    budget: ByteBudget | None = None
    budget_wait: float = 1.0


class Refused(admission.ReviewError):
    """A bound was hit: answered with `status` and the connection closed."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(status, message)
        self.reason = reason
        REQUESTS_REFUSED.labels(reason).inc()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def count_values(raw: bytes) -> int:
    """An upper bound of the JSON values in `raw` (commas and openers; strings may add to it)."""
    return raw.count(b",") + raw.count(b"{") + raw.count(b"[") + 1


class Body:
    """The body of one request and the budget it holds until `release`."""

    def __init__(self, limits: BodyLimits) -> None:
        self.limits = limits
        self.held = 0
        self.raw = b""

    async def _take(self, amount: int) -> None:
        budget = self.limits.budget
        if budget is None:
            return
        try:
            self.held += await budget.take(amount, wait=self.limits.budget_wait)
        except BudgetExhausted:
            raise Refused(429, "busy", "too many large admission requests are being read at once; retry") from None

    def release(self) -> None:
        if self.limits.budget is not None and self.held:
            self.limits.budget.give(self.held)
        self.held = 0

    async def read(self, scope: Scope, receive: Receive) -> bytes:
        limits = self.limits
        admission.check_content_type(_header(scope, b"content-type"))
        length = _header(scope, b"content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        if declared is not None and declared > limits.max_bytes:
            too_large = f"body of {declared} bytes is larger than the {limits.max_bytes} byte limit"
            raise Refused(413, "too_large", too_large)
        await self._take(declared if declared is not None else limits.max_bytes)
        chunks: list[bytes] = []
        size = 0
        more = True
        try:
            # One deadline for the whole body; asyncio.timeout_at costs a timer, where a wait_for
            # per message would cost a task each.
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + limits.timeout):
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise admission.ReviewError(400, "client disconnected before the body was read")
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limits.max_bytes:
                        raise Refused(413, "too_large", f"body is larger than the {limits.max_bytes} byte limit")
                    chunks.append(chunk)
                    more = message.get("more_body", False)
        except TimeoutError:
            raise Refused(408, "body_timeout", f"the body was not received within {limits.timeout:g}s") from None
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        values = count_values(raw)
        if values > limits.max_values:
            raise Refused(
                413,
                "too_many_values",
                f"the request holds about {values} JSON values, more than the {limits.max_values} allowed",
            )
        await self._take(values * PARSED_BYTES_PER_VALUE)
        self.raw = raw
        return raw
