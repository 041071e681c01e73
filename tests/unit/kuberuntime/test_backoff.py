"""The one backoff rule and the clock formats the runtime writes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest

from kuberuntime import backoff
from kuberuntime.backoff import Backoff
from kuberuntime.clock import micro_time, rfc3339, sleep_or_stop


def test_delay_doubles_per_failure_and_stops_at_the_cap() -> None:
    delays = [backoff.delay(n, base=0.1, cap=1.0) for n in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_delay_never_overflows_on_huge_failure_counts() -> None:
    assert backoff.delay(10**9, base=0.1, cap=5.0) == 5.0


@pytest.mark.parametrize(("r", "expected"), [(0.0, 0.05), (0.5, 0.1), (1.0, 0.15)])
def test_jitter_spreads_between_low_and_high(r: float, expected: float) -> None:
    assert backoff.delay(0, base=0.1, cap=1.0, jitter=(0.5, 1.5), rand=lambda: r) == pytest.approx(expected)


def test_jitter_never_exceeds_the_cap() -> None:
    assert backoff.delay(3, base=0.1, cap=0.5, jitter=(1.0, 2.0), rand=lambda: 1.0) == 0.5


def test_backoff_counts_failures_and_resets() -> None:
    b = Backoff(base=1.0, cap=10.0)
    assert [b.next(), b.next(), b.next()] == [1.0, 2.0, 4.0]
    assert b.failures == 3
    assert b.peek() == 8.0 and b.failures == 3, "peek does not count"
    b.reset()
    assert b.next() == 1.0


@pytest.mark.parametrize(("base", "cap", "jitter"), [(0, 1, (1, 1)), (2, 1, (1, 1)), (1, 2, (1.5, 1.0))])
def test_backoff_refuses_nonsense(base: float, cap: float, jitter: tuple[float, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(base=base, cap=cap, jitter=jitter)


def test_time_formats_are_utc() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(when) == "2026-01-02T01:04:05Z"
    assert micro_time(when) == "2026-01-02T01:04:05.678901Z"
    assert rfc3339(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00Z"


def test_sleep_or_stop_ends_at_once_when_stopped() -> None:
    async def main() -> tuple[bool, float]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, stop.set)
        started = loop.time()
        stopped = await sleep_or_stop(stop, 10)
        return stopped, loop.time() - started

    stopped, took = asyncio.run(main())
    assert stopped and took < 1.0
    assert asyncio.run(sleep_or_stop(asyncio.Event(), 0.01)) is False
