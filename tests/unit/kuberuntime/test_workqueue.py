"""The work queue's guarantees: collapsing, one worker per key, backoff, delays, shutdown."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from kuberuntime import api
from kuberuntime.workqueue import ShutDown, WorkQueue, run_workers

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=5))


def test_duplicates_collapse_while_queued() -> None:
    async def body() -> list[str]:
        q = WorkQueue()
        for key in ["a", "a", "b", "a", "b", "c"]:
            q.add(key)
        assert len(q) == 3
        return [await q.get() for _ in range(3)]

    assert run(body()) == ["a", "b", "c"]


def test_a_named_queue_exports_its_depth_adds_and_retries() -> None:
    def value(metric: str) -> float:
        return REGISTRY.get_sample_value(metric, {"name": "t-metrics"}) or 0.0

    async def body() -> None:
        q = WorkQueue(name="t-metrics", base_delay=0.001)
        for key in ["a", "a", "b"]:
            q.add(key)
        assert (value("sidecarctl_workqueue_depth"), value("sidecarctl_workqueue_adds_total")) == (2, 2)
        assert await q.get() == "a"
        assert value("sidecarctl_workqueue_depth") == 1
        q.add_rate_limited("a")
        assert value("sidecarctl_workqueue_retries_total") == 1
        q.done("a")
        await asyncio.sleep(0.05)  # the backoff's timer adds it again
        assert (value("sidecarctl_workqueue_depth"), value("sidecarctl_workqueue_adds_total")) == (2, 3)
        q.shutdown()
        assert value("sidecarctl_workqueue_depth") == 0

    run(body())


def test_key_readded_while_processing_is_requeued_on_done_only() -> None:
    async def body() -> None:
        q = WorkQueue()
        q.add("a")
        assert await q.get() == "a"
        q.add("a")
        q.add("a")
        assert len(q) == 0, "a key being processed must not be handed out again"
        q.done("a")
        assert len(q) == 1
        assert await q.get() == "a"
        q.done("a")
        assert len(q) == 0

    run(body())


def test_two_workers_never_run_one_key_together() -> None:
    async def body() -> tuple[int, dict[str, int]]:
        q = WorkQueue()
        active: set[str] = set()
        overlaps = 0
        runs: dict[str, int] = {}
        rng = random.Random(7)

        async def handler(key: str) -> None:
            nonlocal overlaps
            if key in active:
                overlaps += 1
            active.add(key)
            runs[key] = runs.get(key, 0) + 1
            await asyncio.sleep(rng.uniform(0, 0.003))
            active.discard(key)

        stop = asyncio.Event()
        workers = asyncio.create_task(run_workers(q, handler, workers=4, stop=stop))
        for _ in range(300):
            q.add(rng.choice("abc"))
            await asyncio.sleep(rng.uniform(0, 0.001))
        while len(q) or any(active):
            await asyncio.sleep(0.005)
        stop.set()
        await workers
        return overlaps, runs

    overlaps, runs = run(body())
    assert overlaps == 0
    assert set(runs) == {"a", "b", "c"}
    # Re-adds during processing were not lost: each key ran more than once.
    assert all(n > 1 for n in runs.values())


def test_backoff_doubles_per_failure_caps_and_resets_on_forget() -> None:
    async def body() -> None:
        q = WorkQueue(base_delay=0.005, max_delay=0.1, jitter=0.0)
        delays = []
        for _ in range(8):
            delays.append(q.backoff("k"))
            q.add_rate_limited("k")
        assert delays == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1])
        assert q.failures("k") == 8
        assert q.backoff("other") == pytest.approx(0.005), "backoff is per key"
        q.forget("k")
        assert q.failures("k") == 0
        assert q.backoff("k") == pytest.approx(0.005)
        q.shutdown()

    run(body())


@given(failures=st.integers(min_value=0, max_value=80), r=st.floats(min_value=0, max_value=1, exclude_max=True))
def test_backoff_jitter_stays_within_bounds(failures: int, r: float) -> None:
    async def body() -> float:
        q = WorkQueue(base_delay=0.005, max_delay=60.0, jitter=0.1, rand=lambda: r)
        q._failures["k"] = failures  # the count a run of failures leaves behind
        return q.backoff("k")

    delay = asyncio.run(body())
    plain = 0.005 * 2.0**failures
    assert min(plain, 60.0) <= delay <= min(plain * 1.1, 60.0)


def test_rate_limited_key_comes_back_after_its_backoff() -> None:
    async def body() -> float:
        q = WorkQueue(base_delay=0.04, jitter=0.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        q.add_rate_limited("k")
        assert len(q) == 0
        assert await q.get() == "k"
        return loop.time() - start

    assert 0.035 <= run(body()) < 0.5


def test_add_after_hands_keys_out_in_deadline_order() -> None:
    async def body() -> list[str]:
        q = WorkQueue()
        q.add_after("c", 0.06)
        q.add_after("a", 0.02)
        q.add_after("b", 0.04)
        q.add_after("now", 0)
        assert len(q) == 1
        return [await q.get() for _ in range(4)]

    assert run(body()) == ["now", "a", "b", "c"]


def test_add_after_keeps_the_earliest_deadline() -> None:
    async def body() -> tuple[float, float, int]:
        q = WorkQueue()
        loop = asyncio.get_running_loop()
        start = loop.time()
        q.add_after("x", 5.0)
        q.add_after("x", 0.02)  # earlier: replaces the 5 s timer
        assert await q.get() == "x"
        first = loop.time() - start
        q.done("x")
        start = loop.time()
        q.add_after("x", 0.02)
        q.add_after("x", 5.0)  # later: ignored
        assert await q.get() == "x"
        second = loop.time() - start
        q.done("x")
        await asyncio.sleep(0.05)
        return first, second, len(q)

    first, second, left = run(body())
    assert first < 1.0 and second < 1.0
    assert left == 0, "the key must be delivered once"


def test_shutdown_wakes_getters_and_ignores_new_keys() -> None:
    async def body() -> None:
        q = WorkQueue()
        waiting = asyncio.create_task(q.get())
        await asyncio.sleep(0.01)
        q.add_after("later", 0.01)
        q.shutdown()
        with pytest.raises(ShutDown):
            await waiting
        q.add("a")
        q.add_after("b", 0.001)
        assert len(q) == 0
        await asyncio.sleep(0.03)
        assert len(q) == 0
        with pytest.raises(ShutDown):
            await q.get()

    run(body())


def test_run_workers_requeues_failures_with_backoff_and_floats_after_delay() -> None:
    async def body() -> tuple[list[str], WorkQueue]:
        q = WorkQueue(base_delay=0.005, jitter=0.0)
        seen: list[str] = []
        fails = {"bad": 3}

        async def handler(key: str) -> float | None:
            seen.append(key)
            if fails.get(key, 0) > 0:
                fails[key] -= 1
                raise RuntimeError("boom")
            if key == "later" and seen.count("later") == 1:
                return 0.02
            return None

        stop = asyncio.Event()
        task = asyncio.create_task(run_workers(q, handler, workers=2, stop=stop))
        q.add("bad")
        q.add("later")
        q.add("ok")
        while seen.count("bad") < 4 or seen.count("later") < 2:
            await asyncio.sleep(0.005)
        stop.set()
        await task
        return seen, q

    seen, q = run(body())
    assert seen.count("bad") == 4, "three failures then a success"
    assert seen.count("later") == 2, "a returned delay requeues once"
    assert seen.count("ok") == 1
    assert q.failures("bad") == 0, "success forgets the failures"
    assert q.shutting_down


def test_stop_lets_the_running_handler_finish_and_cancel_interrupts_it() -> None:
    async def body() -> tuple[list[str], list[str]]:
        finished: list[str] = []
        q = WorkQueue()

        async def slow(key: str) -> None:
            await asyncio.sleep(0.05)
            finished.append(key)

        stop = asyncio.Event()
        task = asyncio.create_task(run_workers(q, slow, workers=1, stop=stop))
        q.add("a")
        q.add("b")
        await asyncio.sleep(0.01)
        stop.set()
        await task
        graceful = list(finished)

        finished.clear()
        q2 = WorkQueue()
        task2 = asyncio.create_task(run_workers(q2, slow, workers=1, stop=asyncio.Event()))
        q2.add("c")
        await asyncio.sleep(0.01)
        task2.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task2
        return graceful, finished

    graceful, cancelled = run(body())
    assert graceful == ["a"], "the current key completes; queued keys are dropped"
    assert cancelled == []


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="base_delay"):
        WorkQueue(base_delay=0)
    with pytest.raises(ValueError, match="jitter"):
        WorkQueue(jitter=-1)

    async def body() -> None:
        async def handler(key: str) -> None:
            return None

        with pytest.raises(ValueError, match="workers"):
            await run_workers(WorkQueue(), handler, workers=0, stop=asyncio.Event())

    run(body())


def test_api_failures_log_one_line_and_bugs_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A conflict is routine (INFO), an API or connection failure one WARNING line; only an
    unexpected exception carries its traceback. Each is retried alike."""
    errors: dict[str, BaseException] = {
        "conflict": api.Conflict(409, "Conflict", "the object has been modified"),
        "refused": api.ApiError(503, "ServiceUnavailable", "etcd is down"),
        "unreachable": aiohttp.ClientConnectionError("Connect call failed"),
        "silent": TimeoutError(),  # no message: its type is the reason
        "bug": KeyError("spec"),
    }

    async def body() -> list[str]:
        q = WorkQueue(base_delay=0.001, jitter=0.0)
        seen: list[str] = []

        async def handler(key: str) -> None:
            seen.append(key)
            if seen.count(key) == 1:
                raise errors[key]

        stop = asyncio.Event()
        task = asyncio.create_task(run_workers(q, handler, workers=1, stop=stop))
        for key in errors:
            q.add(key)
        while any(seen.count(k) < 2 for k in errors):
            await asyncio.sleep(0.002)
        stop.set()
        await task
        return seen

    with caplog.at_level(logging.INFO, logger="kuberuntime.workqueue"):
        seen = run(body())
    assert all(seen.count(k) == 2 for k in errors), seen
    by_key = {k: [r for r in caplog.records if f"reconcile of {k}" in r.getMessage()] for k in errors}
    assert [(r.levelno, r.exc_info is None) for r in by_key["conflict"]] == [(logging.INFO, True)]
    assert "409 Conflict" in by_key["conflict"][0].getMessage()
    assert [(r.levelno, r.exc_info is None) for r in by_key["refused"]] == [(logging.WARNING, True)]
    assert "503 ServiceUnavailable: etcd is down" in by_key["refused"][0].getMessage()
    assert [(r.levelno, r.exc_info is None) for r in by_key["unreachable"]] == [(logging.WARNING, True)]
    assert [(r.levelno, r.exc_info is None) for r in by_key["silent"]] == [(logging.WARNING, True)]
    assert "failed: TimeoutError; retrying" in by_key["silent"][0].getMessage()
    assert [(r.levelno, r.exc_info is not None) for r in by_key["bug"]] == [(logging.ERROR, True)]
