"""Pods whose in-place patch keeps failing, each backing off on its own.

Why per pod: a patch that is always refused (an admission policy that denies the new image, a
quota, RBAC) must neither be retried in a tight loop nor stall the rollout; the other pods go on
within maxUnavailable while this one waits `base * 2**failures` (capped), and after a few failures
an Event names it and the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kuberuntime import backoff


@dataclass
class Failure:
    count: int
    retry_at: float
    reason: str
    reported: str = ""  # the reason last reported in an Event


class PodFailures:
    def __init__(
        self,
        *,
        base: float = 0.5,
        cap: float = 60.0,
        report_after: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = base
        self.cap = cap
        self.report_after = report_after
        self._clock = clock
        self._failures: dict[str, Failure] = {}

    def failed(self, key: str, reason: str) -> Failure:
        previous = self._failures.get(key)
        count = 1 if previous is None else previous.count + 1
        wait = backoff.delay(count - 1, base=self.base, cap=self.cap, jitter=(0.9, 1.1))
        failure = Failure(count, self._clock() + wait, reason, previous.reported if previous else "")
        self._failures[key] = failure
        return failure

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)

    forget = succeeded

    def held_back(self) -> set[tuple[str, str]]:
        """(namespace, name) of the pods still waiting out their backoff."""
        now = self._clock()
        return {_pair(k) for k, f in self._failures.items() if f.retry_at > now}

    def next_retry(self, keys: Iterable[str]) -> float | None:
        """Seconds until the first of `keys` may be tried again (0 when one may now), or None."""
        times = [f.retry_at for k in keys if (f := self._failures.get(k)) is not None]
        return None if not times else max(0.0, min(times) - self._clock())

    def to_report(self, key: str) -> Failure | None:
        """The failure, once, when it has repeated enough to name it in an Event."""
        failure = self._failures.get(key)
        if failure is None or failure.count < self.report_after or failure.reported == failure.reason:
            return None
        failure.reported = failure.reason
        return failure

    def __contains__(self, key: object) -> bool:
        return key in self._failures


def _pair(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name
