"""A rate-limited work queue for reconcilers, with client-go's guarantees on asyncio.

Why a queue of keys rather than a queue of events: a reconciler wants the *latest* state of an
object, so a burst of events for one SidecarSet must collapse into one pass, a key must never be
reconciled by two workers at once (their writes would race), and a failing key must back off
exponentially instead of spinning — while other keys keep flowing. client-go's workqueue gives
exactly these rules; this is the same contract on one asyncio loop:

- `add` collapses duplicates while the key waits; a key re-added while a worker holds it is
  queued again only when that worker calls `done`, so the worker never misses the newest change
  and no second worker runs it concurrently.
- `add_after` keeps the earliest pending deadline per key.
- `add_rate_limited` waits `base * 2**failures` (capped), plus jitter so keys that failed
  together do not retry in lockstep; `forget` resets the count after a success.
- `shutdown` drops what is queued: after a stop (or a lost Lease) the next leader re-lists and
  rebuilds the queue, and reconciling stale keys here would only race with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

import aiohttp

from kuberuntime import api, backoff, metrics
from kuberuntime.backoff import JITTER

log = logging.getLogger(__name__)

Handler = Callable[[str], Awaitable[float | None]]


class ShutDown(Exception):
    """Raised by `WorkQueue.get` once the queue is shut down."""


class WorkQueue:
    """Keys waiting to be reconciled; all methods must be called from the queue's event loop."""

    def __init__(
        self,
        *,
        base_delay: float = 0.005,
        max_delay: float = 60.0,
        jitter: float = 0.1,
        rand: Callable[[], float] = JITTER.random,
        name: str | None = None,
    ) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError(f"need 0 < base_delay <= max_delay, got base_delay={base_delay} max_delay={max_delay}")
        if jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {jitter}")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.jitter = jitter
        self._rand = rand
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()  # queued, or re-added while processing
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._ready = asyncio.Event()
        self._shutting_down = False
        # Named queues export their depth, adds and retries (sidecarctl_workqueue_*{name}).
        self._depth = None if name is None else metrics.WORKQUEUE_DEPTH.labels(name)
        self._adds = None if name is None else metrics.WORKQUEUE_ADDS.labels(name)
        self._retries = None if name is None else metrics.WORKQUEUE_RETRIES.labels(name)

    def __len__(self) -> int:
        """Keys ready to be handed out (not those being processed or waiting on a delay)."""
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def add(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if self._adds is not None:
            self._adds.inc()
        if key in self._processing:
            return  # `done` queues it again
        self._queue.append(key)
        self._ready.set()
        self._gauge()

    def _gauge(self) -> None:
        if self._depth is not None:
            self._depth.set(len(self._queue))

    def add_after(self, key: str, delay: float) -> None:
        """Add `key` once `delay` seconds have passed; an earlier pending deadline wins."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= when:
                return
            pending[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key))

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def backoff(self, key: str) -> float:
        """The delay `add_rate_limited` would use for `key` now (without counting a failure)."""
        return backoff.delay(
            self._failures.get(key, 0),
            base=self.base_delay,
            cap=self.max_delay,
            jitter=(1.0, 1.0 + self.jitter),
            rand=self._rand,
        )

    def add_rate_limited(self, key: str) -> None:
        delay = self.backoff(key)
        self._failures[key] = self._failures.get(key, 0) + 1
        if self._retries is not None:
            self._retries.inc()
        self.add_after(key, delay)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    async def get(self) -> str:
        """The next key; the caller owns it until `done(key)`. Raises ShutDown after `shutdown`."""
        while True:
            if self._shutting_down:
                raise ShutDown
            if self._queue:
                key = self._queue.popleft()
                if not self._queue:
                    self._ready.clear()
                self._dirty.discard(key)
                self._processing.add(key)
                self._gauge()
                return key
            await self._ready.wait()

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty and not self._shutting_down:
            self._queue.append(key)
            self._ready.set()
            self._gauge()

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._queue.clear()
        self._dirty.clear()
        self._gauge()
        self._ready.set()  # wake every waiting `get` so it raises ShutDown


async def _worker(queue: WorkQueue, handler: Handler) -> None:
    while True:
        try:
            key = await queue.get()
        except ShutDown:
            return
        try:
            result = await handler(key)
        except asyncio.CancelledError:
            queue.done(key)
            raise
        except api.Conflict as e:  # someone wrote first (often our own status write): routine
            log.info("reconcile of %s: %s; retrying after %.3fs", key, e, queue.backoff(key))
            queue.add_rate_limited(key)
        except (api.ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
            # The API server said no or could not be reached: one line, not a traceback, which says
            # nothing more and at shutdown (the connection goes first) buried the log.
            log.warning("reconcile of %s failed: %s; retrying after %.3fs", key, api.reason(e), queue.backoff(key))
            queue.add_rate_limited(key)
        except Exception:
            log.exception("reconcile of %s failed; retrying after %.3fs", key, queue.backoff(key))
            queue.add_rate_limited(key)
        else:
            # Success or an explicit requeue both reset the backoff (controller-runtime does the same).
            queue.forget(key)
            if result is not None:
                queue.add_after(key, max(0.0, float(result)))
        queue.done(key)


async def run_workers(queue: WorkQueue, handler: Handler, *, workers: int, stop: asyncio.Event) -> None:
    """Run `workers` concurrent consumers of `queue` until `stop` is set.

    The handler returns None when the key is reconciled, a number of seconds to look again later,
    or raises to be retried with backoff. On `stop` the queue is shut down and running handlers
    finish their current key; cancelling this coroutine cancels them instead.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    tasks = [asyncio.create_task(_worker(queue, handler), name=f"worker-{i}") for i in range(workers)]
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        queue.shutdown()
        await asyncio.gather(*tasks)
    finally:
        for t in [stopper, *tasks]:
            t.cancel()
        await asyncio.gather(stopper, *tasks, return_exceptions=True)
