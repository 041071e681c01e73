"""The token bucket that bounds how often the caBundle syncer (cabundle.syncer) writes one configuration.

A rule of its own, driven by the caller's monotonic clock, so it is tested without the syncer.
"""

from __future__ import annotations


class WriteBudget:
    """Token bucket: `burst` writes at once, then one per `refill_interval` seconds."""

    def __init__(self, *, burst: int, refill_interval: float, now: float) -> None:
        self.burst = burst
        self.refill_interval = refill_interval
        self._tokens = float(burst)
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) / self.refill_interval)
            self._at = now

    def available(self, now: float) -> bool:
        self._refill(now)
        return self._tokens >= 1.0

    def take(self, now: float) -> bool:
        self._refill(now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def wait(self, now: float) -> float:
        self._refill(now)
        return max(0.0, (1.0 - self._tokens) * self.refill_interval)
