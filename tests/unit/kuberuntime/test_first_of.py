"""kuberuntime.clock.first_of: returns at the first of several waits and leaves no task behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from kuberuntime.clock import first_of

# Bounds elapsed time, so it runs alone; a wait that never ends fails at 30 s instead of stalling.
pytestmark = [pytest.mark.serial, pytest.mark.timeout(30)]


def _others() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_the_first_to_finish_ends_the_wait_and_the_others_are_reaped() -> None:
    async def main() -> None:
        fired, never = asyncio.Event(), asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, fired.set)
        await first_of(never.wait(), fired.wait())
        assert fired.is_set() and not never.is_set()
        assert _others() == set(), "a loser is still pending"

    asyncio.run(main())


def test_a_timeout_ends_the_wait_when_nothing_finishes() -> None:
    async def main() -> float:
        started = time.monotonic()
        await first_of(asyncio.Event().wait(), asyncio.Event().wait(), timeout=0.05)
        assert _others() == set()
        return time.monotonic() - started

    assert 0.04 <= asyncio.run(main()) < 2.0


def test_a_negative_timeout_returns_at_once() -> None:
    started = time.monotonic()
    asyncio.run(first_of(asyncio.Event().wait(), timeout=-3.0))
    assert time.monotonic() - started < 1.0


def test_an_error_of_the_one_that_finished_is_raised() -> None:
    async def broken() -> None:
        raise ValueError("the loop broke")

    async def main() -> None:
        with pytest.raises(ValueError, match="the loop broke"):
            await first_of(broken(), asyncio.Event().wait())
        assert _others() == set()

    asyncio.run(main())


def test_cancelling_the_waiter_cancels_every_wait() -> None:
    async def main() -> None:
        cancelled: list[str] = []

        async def wait(name: str) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        waiter = asyncio.create_task(first_of(wait("a"), wait("b")))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert sorted(cancelled) == ["a", "b"]
        assert _others() == set()

    asyncio.run(main())
