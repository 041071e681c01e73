"""One asyncio loop in a background thread for the whole test session.

The e2e tests are plain synchronous pytest functions; the things they drive (API client,
fake kubelet, webhook servers, managers) are asyncio code. Running all of them on one
long-lived loop lets a session-scoped client and kubelet serve every test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run `coro` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """Start `coro` as a task on the loop and return a concurrent future for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[return-value]

    def close(self) -> None:
        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(_cancel_all(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
