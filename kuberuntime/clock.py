"""The clock, in the forms the API server speaks, a sleep that ends on stop, and a wait for the
first of several things.

Wall-clock reads are injected (`clock: Callable[[], datetime]`) wherever a test needs fixed
dates; `utc_now` is their default. Kubernetes writes two time formats: `metav1.Time` (RFC 3339,
seconds, `Z`) and `metav1.MicroTime` (microseconds) for Leases and Events' series.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from datetime import UTC, datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


def rfc3339(when: datetime) -> str:
    """A metav1.Time: RFC 3339 in UTC, whole seconds."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(when: datetime) -> str:
    """A metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_rfc3339() -> str:
    return rfc3339(utc_now())


async def sleep_or_stop(stop: asyncio.Event, timeout: float) -> bool:
    """Sleep up to `timeout` seconds; True when `stop` was set meanwhile, so loops end at once on shutdown."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, timeout))
    return stop.is_set()


async def first_of(*waits: Awaitable[object], timeout: float | None = None) -> None:
    """Wait until one of `waits` finishes (or `timeout` seconds pass), then cancel the others and
    wait for them to end; an error raised by one that finished is raised here.

    Loops wait for work, a wake-up or `stop` this way. The losers are reaped, not just cancelled:
    a pending `Event.wait` task lives as long as its event, one left behind per loop pass is a leak.
    """
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(
            tasks, timeout=None if timeout is None else max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error
