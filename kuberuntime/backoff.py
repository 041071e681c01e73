"""Jittered exponential backoff, the one rule every retry loop of the manager follows.

Why jitter: replicas (and keys of one work queue) that failed together must not retry in
lockstep against an API server that is just recovering. Why a cap: a loop must come back within
a bounded time once the cause is gone. The delay after `failures` consecutive failures is
`base * 2**failures`, times a random factor in `[low, high]`, capped at `cap`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

# Jitter from a generator of our own: drawing from the `random` module's shared state would change
# what other code (a test framework, say) sees from it.
JITTER = random.Random()


def delay(
    failures: int,
    *,
    base: float,
    cap: float,
    jitter: tuple[float, float] = (1.0, 1.0),
    rand: Callable[[], float] = JITTER.random,
) -> float:
    """The wait after `failures` consecutive failures (0 gives about `base`)."""
    low, high = jitter
    raw = base * 2.0 ** min(max(failures, 0), 64)
    return min(cap, raw * (low + (high - low) * rand()))


class Backoff:
    """A failure count with `delay`'s rule: `next()` after a failure, `reset()` after a success."""

    def __init__(
        self,
        *,
        base: float,
        cap: float,
        jitter: tuple[float, float] = (1.0, 1.0),
        rand: Callable[[], float] = JITTER.random,
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError(f"need 0 < base <= cap, got base={base} cap={cap}")
        low, high = jitter
        if not 0 <= low <= high:
            raise ValueError(f"jitter must be 0 <= low <= high, got {jitter}")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self._rand = rand
        self.failures = 0

    def peek(self) -> float:
        """The delay the next failure would get, without counting one."""
        return delay(self.failures, base=self.base, cap=self.cap, jitter=self.jitter, rand=self._rand)

    def next(self) -> float:
        """Count a failure and return how long to wait before trying again."""
        wait = self.peek()
        self.failures += 1
        return wait

    def reset(self) -> None:
        self.failures = 0
