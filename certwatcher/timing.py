"""Time helpers shared by the background loops.

The wall clock is injected everywhere (`clock: Callable[[], datetime]`) so that tests can place
certificates at fixed dates; this is its default. `sleep_or_stop` lets every loop end promptly on
shutdown instead of finishing a long sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


async def sleep_or_stop(stop: asyncio.Event, timeout: float) -> bool:
    """Sleep up to `timeout` seconds; True when `stop` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, timeout))
    return stop.is_set()
