"""What an admission endpoint answers with, whichever webhook it serves.

The endpoint (injector.http.app) and the wrappers around it (injector.http.wrappers: replay,
metrics) all pass this one value along, so it lives apart from both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import Receive, Scope

JSON_TYPE = b"application/json"
TEXT_TYPE = b"text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Answer:
    result: str  # metrics label
    status: int
    body: bytes
    content_type: bytes
    replayable: bool = False
    close: bool = False  # end the connection after answering (a bound was hit)


RawHandler = Callable[[bytes], Awaitable[Answer]]  # the request body -> the answer
Endpoint = Callable[[Scope, Receive], Awaitable[Answer]]  # the whole request -> the answer
