"""Passes asked for by pod events are paced by the last pass's duration (sidecarsets.controller.passpace);
other passes are not.

The controller's clock is a fake that a pass advances by its "duration"; the queue's delays are real
(a few tens of milliseconds), so what is asserted is which keys the queue holds, and when.
"""

from __future__ import annotations

import asyncio
import copy

from kuberuntime.events import EventRecorder
from sidecarsets.controller.controller import Controller
from sidecarsets.controller.passpace import POD_PACE, POD_PACE_CAP
from sidecarsets.pods.projection import project
from tests.kube.builders import injected_pod as pod
from tests.kube.builders import shop_sidecarset as sidecarset
from tests.kube.fakeapi import FakeApiServer

SS = sidecarset()
NAME = SS["metadata"]["name"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rig(*, took: float, during: list[str] | None = None, patching: float = 0.0) -> tuple[Controller, Clock]:
    """A controller whose passes take `took` seconds by its clock, then `patching` seconds patching
    pods; `during` names pods whose event arrives in the middle of the pass."""
    clock = Clock()
    api = FakeApiServer()
    c = Controller(
        api,
        namespace="sidecarctl-system",
        namespaces=lambda: {},
        recorder=EventRecorder(api),
    )
    c.pace.monotonic = clock
    c.on_sidecarset("ADDED", None, SS)

    async def a_pass(ss: object) -> float | None:
        for name in during or ():
            c.on_pod("ADDED", None, project(pod(name, SS)))
        clock.now += took
        if patching:
            c.pace.began_patching(NAME)
            clock.now += patching
        return None

    c._reconcile = a_pass  # type: ignore[method-assign]
    return c, clock


async def drained(c: Controller) -> None:
    """Take the queued key, as a worker would, and run its pass."""
    key = await c.queue.get()
    assert key == NAME
    await c.reconcile(key)
    c.queue.done(key)


def test_the_first_pod_event_after_a_quiet_spell_queues_a_pass_at_once() -> None:
    async def run() -> None:
        c, clock = rig(took=0.01)
        await drained(c)
        clock.now += 10.0  # quiet for longer than any pace
        c.on_pod("ADDED", None, project(pod("p1", SS)))
        assert len(c.queue) == 1

    asyncio.run(run())


def test_a_pod_event_right_after_a_pass_waits_pod_pace_times_its_duration() -> None:
    async def run() -> None:
        took = 0.01
        c, _ = rig(took=took)
        await drained(c)
        c.on_pod("ADDED", None, project(pod("p1", SS)))
        c.on_pod("ADDED", None, project(pod("p2", SS)))
        assert len(c.queue) == 0, "not at once: the last pass has just ended"
        await asyncio.sleep(POD_PACE * took * 0.5)
        assert len(c.queue) == 0
        await asyncio.sleep(POD_PACE * took + 0.05)
        assert len(c.queue) == 1, "both events, one pass"

    asyncio.run(run())


def test_pod_events_during_a_pass_queue_one_pass_paced_by_its_duration() -> None:
    async def run() -> None:
        took = 0.02
        c, _ = rig(took=took, during=["p1", "p2", "p3"])
        await drained(c)
        assert len(c.queue) == 0, "the pass that saw them has just ended"
        await asyncio.sleep(POD_PACE * took + 0.05)
        assert len(c.queue) == 1

    asyncio.run(run())


def test_the_pace_is_capped_whatever_the_pass_took() -> None:
    async def run() -> None:
        c, _ = rig(took=30.0)  # by the fake clock: a pace of 120 s uncapped
        await drained(c)
        c.on_pod("ADDED", None, project(pod("p1", SS)))
        loop = asyncio.get_running_loop()
        when, _ = c.queue._timers[NAME]
        assert abs(when - loop.time() - POD_PACE_CAP) < 0.05

    asyncio.run(run())


def test_the_pace_leaves_out_the_time_the_pass_spent_patching_pods() -> None:
    async def run() -> None:
        took = 0.01
        c, _ = rig(took=took, patching=3.0)  # 300 pods patched: the API server's time, not ours
        await drained(c)
        c.on_pod("ADDED", None, project(pod("p1", SS)))
        assert len(c.queue) == 0
        await asyncio.sleep(POD_PACE * took + 0.05)
        assert len(c.queue) == 1, "paced by the 10 ms of reading and planning, not capped at 1 s"

    asyncio.run(run())


def test_a_spec_change_right_after_a_pass_is_not_paced() -> None:
    async def run() -> None:
        c, _ = rig(took=0.5)
        await drained(c)
        changed = copy.deepcopy(SS)
        changed["metadata"]["generation"] = SS["metadata"].get("generation", 1) + 1
        c.on_sidecarset("MODIFIED", SS, changed)
        assert len(c.queue) == 1

    asyncio.run(run())


def test_no_pacing_when_pod_pace_is_zero() -> None:
    async def run() -> None:
        c, _ = rig(took=0.5)
        c.pace.pace = 0.0
        await drained(c)
        c.on_pod("ADDED", None, project(pod("p1", SS)))
        assert len(c.queue) == 1

    asyncio.run(run())
