"""Lease election against an in-memory Lease API: expiry by our clock, renewal, conflicts, release."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from prometheus_client import REGISTRY

from kuberuntime import api, leader
from kuberuntime.jsontypes import JsonObj
from kuberuntime.leader import DEFAULT_LEASE_NAME, LeaderElector

T = TypeVar("T")
NS = "sidecarctl-system"
PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/sidecarctl-controller"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=8))


class FakeLeases:
    """One Lease with resourceVersion checks, the way the API server treats update."""

    def __init__(self) -> None:
        self.lease: JsonObj | None = None
        self.rv = 0
        self.fail = False
        self.before_update: Callable[[], object] | None = None
        self.updates = 0
        self.gets = 0
        self.hang_updates = 0  # the next this many updates never answer (a loaded API server)

    def _check(self) -> None:
        if self.fail:
            raise api.ApiError(503, "ServiceUnavailable", "etcd is down")

    def store(self, spec: JsonObj) -> JsonObj:
        """Write the Lease as another party would."""
        self.rv += 1
        lease: JsonObj = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "sidecarctl-controller", "namespace": NS, "resourceVersion": str(self.rv)},
            "spec": spec,
        }
        self.lease = lease
        return lease

    async def get(self, path: str, *, params: api.Params | None = None) -> JsonObj:
        self._check()
        assert path == PATH
        self.gets += 1
        if self.lease is None:
            raise api.NotFound(404, "NotFound", "leases not found")
        return copy.deepcopy(self.lease)

    async def create(self, path: str, body: JsonObj, *, params: api.Params | None = None) -> JsonObj:
        self._check()
        assert path == PATH.rsplit("/", 1)[0]
        if self.lease is not None:
            raise api.Conflict(409, "AlreadyExists", "already exists")
        return copy.deepcopy(self.store(body["spec"]))

    async def update(self, path: str, body: JsonObj, *, params: api.Params | None = None) -> JsonObj:
        self._check()
        assert path == PATH
        self.updates += 1
        if self.hang_updates > 0:
            self.hang_updates -= 1
            await asyncio.sleep(3600)
        if self.before_update is not None:
            hook, self.before_update = self.before_update, None
            hook()
        assert self.lease is not None
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise api.Conflict(409, "Conflict", "the object has been modified")
        return copy.deepcopy(self.store(body["spec"]))

    async def patch(
        self, path: str, body: Any, *, patch_type: api.PatchType = "merge", params: api.Params | None = None
    ) -> JsonObj:
        raise AssertionError("leader election never patches")

    async def delete(self, path: str, *, params: api.Params | None = None) -> Any:
        raise AssertionError("leader election never deletes")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(api: FakeLeases, identity: str, clock: Callable[[], float] | None = None, **kw: Any) -> LeaderElector:
    if clock is not None:
        kw["clock"] = clock
    return LeaderElector(api, namespace=NS, identity=identity, **kw)


def leading(e: LeaderElector) -> bool:
    return e.is_leader


def spec(api: FakeLeases) -> JsonObj:
    assert api.lease is not None
    result: JsonObj = api.lease["spec"]
    return result


def test_absent_lease_is_created_and_held() -> None:
    api = FakeLeases()
    a = elector(api, "a", wall_clock=lambda: datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC))
    assert run(a.try_acquire_or_renew())
    assert spec(api) == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "leaseTransitions": 0,
        "acquireTime": "2030-01-02T03:04:05.678901Z",
        "renewTime": "2030-01-02T03:04:05.678901Z",
    }


def test_foreign_lease_is_taken_only_after_we_saw_it_unchanged_for_its_duration() -> None:
    api = FakeLeases()
    # The remote renewTime is decades old: a skewed clock must not make it look expired.
    api.store({"holderIdentity": "b", "leaseDurationSeconds": 15, "renewTime": "2000-01-01T00:00:00.000000Z"})
    clock = Clock()
    a = elector(api, "a", clock)

    assert not run(a.try_acquire_or_renew())
    clock.now += 14.9
    assert not run(a.try_acquire_or_renew())
    # b renews: the record changed, so our observation restarts.
    api.store({**spec(api), "renewTime": "2000-01-01T00:00:14.000000Z"})
    clock.now += 10
    assert not run(a.try_acquire_or_renew())
    clock.now += 14.9
    assert not run(a.try_acquire_or_renew())
    clock.now += 0.2
    assert run(a.try_acquire_or_renew())
    assert spec(api)["holderIdentity"] == "a"
    assert spec(api)["leaseTransitions"] == 1
    assert a.observed_holder == "a"


def test_a_standby_tries_again_at_the_expiry_of_the_lease_it_saw_not_a_whole_retry_later() -> None:
    api = FakeLeases()
    api.store({"holderIdentity": "b", "leaseDurationSeconds": 15})
    clock = Clock()
    # rand 1.0: client-go's longest wait, 2 s x (1 + 1.2) = 4.4 s, and the whole expiry jitter.
    a = elector(api, "a", clock, rand=lambda: 1.0)
    assert not run(a.try_acquire_or_renew())
    assert a.next_attempt_in() == pytest.approx(4.4), "15 s from expiry: the usual jittered retry"
    clock.now += 13.0
    assert not run(a.try_acquire_or_renew())
    assert a.next_attempt_in() == pytest.approx(2.0 + leader.EXPIRY_JITTER), "2 s from expiry: then"
    clock.now += 2.0 + leader.EXPIRY_JITTER
    assert run(a.try_acquire_or_renew()), "taken at the first attempt past the expiry"

    # b renewed meanwhile: the attempt at the old expiry reads the new record and waits again.
    api.store({"holderIdentity": "b", "leaseDurationSeconds": 15})
    c = elector(api, "c", clock, rand=lambda: 0.0)
    assert not run(c.try_acquire_or_renew())
    clock.now += 14.0
    assert c.next_attempt_in() == pytest.approx(1.0)
    api.store({"holderIdentity": "b", "leaseDurationSeconds": 15, "renewTime": "2030-01-01T00:00:14.000000Z"})
    clock.now += 1.0
    assert not run(c.try_acquire_or_renew()), "renewed: seen unchanged for 0 s"
    assert c.next_attempt_in() == pytest.approx(2.0)


@pytest.mark.parametrize(
    "holder", ["", "a"], ids=["released (taken at the next attempt anyway)", "our own (a renewal, not a takeover)"]
)
def test_no_expiry_to_wait_for_gives_the_usual_jittered_retry(holder: str) -> None:
    api = FakeLeases()
    api.store({"holderIdentity": holder, "leaseDurationSeconds": 15})
    a = elector(api, "a", Clock(), rand=lambda: 0.5)
    a._observe(copy.deepcopy(api.lease or {}))
    assert a.next_attempt_in() == pytest.approx(2.0 * (1 + 1.2 * 0.5))


def test_the_campaign_sleeps_until_the_expiry_it_computed() -> None:
    async def body() -> None:
        api = FakeLeases()
        api.store({"holderIdentity": "b", "leaseDurationSeconds": 15})
        clock = Clock()
        a = elector(api, "a", clock, rand=lambda: 1.0)
        pauses: list[float] = []
        stop = asyncio.Event()

        async def pause(delay: float, *wake: object) -> None:
            pauses.append(delay)
            clock.now += delay
            if len(pauses) > 10:
                stop.set()

        a._pause = pause  # type: ignore[method-assign]
        assert await a._acquire(stop)
        # 4.4 s, 4.4 s, 4.4 s: 13.2 s seen; then the 1.8 s left to the expiry (plus its jitter).
        assert pauses == pytest.approx([4.4, 4.4, 4.4, 1.8 + leader.EXPIRY_JITTER])
        assert spec(api)["holderIdentity"] == "a"

    run(body())


def test_renewal_moves_renew_time_and_keeps_acquire_time_and_transitions() -> None:
    api = FakeLeases()
    api.store({"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 4})
    times = iter(datetime(2030, 1, 1, 0, 0, s, tzinfo=UTC) for s in range(10))
    a = elector(api, "a", wall_clock=lambda: next(times))
    assert run(a.try_acquire_or_renew())
    first = dict(spec(api))
    assert first["leaseTransitions"] == 5
    assert run(a.try_acquire_or_renew())
    second = spec(api)
    assert second["acquireTime"] == first["acquireTime"]
    assert second["renewTime"] > first["renewTime"]
    assert second["leaseTransitions"] == 5
    assert second["leaseDurationSeconds"] == 15


def test_conflict_rereads_and_retries_when_the_lease_is_still_ours() -> None:
    api = FakeLeases()
    a = elector(api, "a")
    assert run(a.try_acquire_or_renew())
    # Someone edits the Lease (same election record, new resourceVersion) just before our update.
    api.before_update = lambda: api.store(dict(spec(api)))
    assert run(a.try_acquire_or_renew())
    assert api.updates == 2, "the first update conflicted, the second (after a re-read) succeeded"
    assert spec(api)["holderIdentity"] == "a"


def test_conflict_from_a_new_holder_means_we_do_not_hold_it() -> None:
    api = FakeLeases()
    api.store({"holderIdentity": "", "leaseDurationSeconds": 1})
    a = elector(api, "a")
    api.before_update = lambda: api.store({"holderIdentity": "b", "leaseDurationSeconds": 15})
    assert not run(a.try_acquire_or_renew())
    assert a.observed_holder == "b"
    assert spec(api)["holderIdentity"] == "b"


def test_release_lets_a_standby_take_over_without_waiting() -> None:
    api = FakeLeases()
    clock = Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert run(a.try_acquire_or_renew())
    assert not run(b.try_acquire_or_renew())
    assert run(b.release()), "releasing a lease we do not hold is a no-op"
    assert spec(api)["holderIdentity"] == "a"

    assert run(a.release())
    assert spec(api)["holderIdentity"] == ""
    assert spec(api)["leaseDurationSeconds"] == 1
    assert run(b.try_acquire_or_renew()), "an empty holder is free at once (no clock advance)"
    assert spec(api)["holderIdentity"] == "b"
    assert spec(api)["leaseTransitions"] == 1


def test_release_is_one_update_of_the_lease_last_seen_and_rereads_only_on_a_conflict() -> None:
    api = FakeLeases()
    a = elector(api, "a")
    assert run(a.try_acquire_or_renew())
    gets, updates = api.gets, api.updates
    assert run(a.release())
    assert (api.gets - gets, api.updates - updates) == (0, 1), "on shutdown every request counts"
    assert spec(api)["holderIdentity"] == ""

    assert run(a.try_acquire_or_renew())
    api.store({**spec(api), "renewTime": "2030-01-01T00:00:00.000000Z"})  # written meanwhile: a Conflict
    gets = api.gets
    assert run(a.release())
    assert api.gets - gets == 1
    assert spec(api)["holderIdentity"] == ""


def test_a_release_the_api_server_never_answers_gives_up_within_its_bound_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeLeases()
    a = elector(api, "a")
    assert run(a.try_acquire_or_renew())
    api.hang_updates = 1

    async def timed() -> tuple[bool, float]:
        started = asyncio.get_running_loop().time()
        ok = await a.release(timeout=0.3)
        return ok, asyncio.get_running_loop().time() - started

    ok, took = run(timed())
    assert not ok and 0.3 <= took < 1.0
    assert spec(api)["holderIdentity"] == "a"
    assert any("not done within 0.3s" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_api_errors_are_a_failed_attempt_not_an_exception() -> None:
    api = FakeLeases()
    api.fail = True
    a = elector(api, "a")
    assert not run(a.try_acquire_or_renew())
    assert not run(a.release())


FAST: dict[str, Any] = {"lease_duration": 1, "renew_deadline": 0.5, "retry_period": 0.05}


def leader_gauge(lease: str = DEFAULT_LEASE_NAME) -> float | None:
    return REGISTRY.get_sample_value("sidecarctl_leader", {"lease": f"{NS}/{lease}"})


def acquisitions() -> float:
    labels = {"lease": f"{NS}/{DEFAULT_LEASE_NAME}"}
    return REGISTRY.get_sample_value("sidecarctl_leader_acquisitions_total", labels) or 0.0


def test_run_leads_then_stop_cancels_the_task_and_releases() -> None:
    async def body() -> None:
        taken = acquisitions()
        api = FakeLeases()
        a = elector(api, "a", **FAST)
        stop = asyncio.Event()
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def lead(lost: asyncio.Event) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        task = asyncio.create_task(a.run(stop, lead))
        await asyncio.wait_for(started.wait(), 2)
        assert leading(a)
        assert leader_gauge() == 1
        await asyncio.sleep(0.2)
        assert api.updates >= 2, "the leader renews every retry period"
        assert acquisitions() == taken + 1, "taking the Lease counts once; its renewals do not"
        stop.set()
        await asyncio.wait_for(task, 2)
        assert cancelled.is_set()
        assert not leading(a)
        assert leader_gauge() == 0
        assert spec(api)["holderIdentity"] == ""
        assert spec(api)["leaseDurationSeconds"] == 1

    run(body())


def test_stop_during_a_renewal_that_hangs_releases_at_once() -> None:
    """A renewal stuck on a loaded API server is abandoned on stop, so the release is not held up
    for the rest of the renew deadline."""

    async def body() -> None:
        api = FakeLeases()
        a = elector(api, "a", lease_duration=30, renew_deadline=20, retry_period=0.05)
        stop = asyncio.Event()
        started = asyncio.Event()

        async def lead(lost: asyncio.Event) -> None:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(a.run(stop, lead))
        await asyncio.wait_for(started.wait(), 2)
        updates = api.updates
        api.hang_updates = 1
        while api.updates == updates:  # the next renewal is now hanging
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 1.0)
        assert spec(api)["holderIdentity"] == ""

    run(body())


def test_a_leading_task_that_does_not_end_when_cancelled_does_not_hold_up_the_release(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(leader, "STOP_LEADING_SECONDS", 0.2)

    async def body() -> None:
        api = FakeLeases()
        a = elector(api, "a", **FAST)
        stop = asyncio.Event()
        started = asyncio.Event()
        release_work = asyncio.Event()

        async def lead(lost: asyncio.Event) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await release_work.wait()  # cleanup that outlives the cancellation

        task = asyncio.create_task(a.run(stop, lead))
        await asyncio.wait_for(started.wait(), 2)
        stop.set()
        await asyncio.wait_for(task, 1.0)
        assert spec(api)["holderIdentity"] == ""
        release_work.set()

    run(body())
    assert any("did not end within 0.2s" in r.getMessage() for r in caplog.records)


def test_failed_renewals_past_the_deadline_lose_leadership_then_it_campaigns_again() -> None:
    async def body() -> None:
        api = FakeLeases()
        a = elector(api, "a", **FAST)
        stop = asyncio.Event()
        terms: list[asyncio.Event] = []
        started = asyncio.Event()

        async def lead(lost: asyncio.Event) -> None:
            terms.append(lost)
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(a.run(stop, lead))
        await asyncio.wait_for(started.wait(), 2)
        loop = asyncio.get_running_loop()
        api.fail = True
        t0 = loop.time()
        await asyncio.wait_for(terms[0].wait(), 2)
        elapsed = loop.time() - t0
        assert 0.35 <= elapsed < 1.0, f"lost after {elapsed:.2f}s; renew_deadline is 0.5s"
        assert not leading(a)
        api.fail = False
        started.clear()
        await asyncio.wait_for(started.wait(), 2)
        assert len(terms) == 2
        assert leader_gauge() == 1, "leading again"
        stop.set()
        await asyncio.wait_for(task, 2)

    run(body())


def test_a_new_holder_seen_while_renewing_ends_leadership_at_once() -> None:
    async def body() -> None:
        api = FakeLeases()
        a = elector(api, "a", **FAST)
        stop = asyncio.Event()
        lost_events: list[asyncio.Event] = []

        async def lead(lost: asyncio.Event) -> None:
            lost_events.append(lost)
            await asyncio.sleep(3600)

        task = asyncio.create_task(a.run(stop, lead))
        while not lost_events:
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        api.store({"holderIdentity": "intruder", "leaseDurationSeconds": 15})
        await asyncio.wait_for(lost_events[0].wait(), 2)
        assert loop.time() - t0 < 0.3
        assert not leading(a)
        stop.set()
        await asyncio.wait_for(task, 2)
        assert spec(api)["holderIdentity"] == "intruder", "stop must not release someone else's lease"

    run(body())


def test_cancelling_run_stops_leading_without_releasing() -> None:
    async def body() -> None:
        api = FakeLeases()
        a = elector(api, "a", **FAST)
        inner_cancelled = asyncio.Event()
        started = asyncio.Event()

        async def lead(lost: asyncio.Event) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                inner_cancelled.set()
                raise

        task = asyncio.create_task(a.run(asyncio.Event(), lead))
        await asyncio.wait_for(started.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert inner_cancelled.is_set()
        assert not leading(a)
        assert spec(api)["holderIdentity"] == "a", "a crash leaves the lease to expire"

    run(body())


def test_a_leading_task_that_fails_releases_and_campaigns_again() -> None:
    async def body() -> None:
        api = FakeLeases()
        a = elector(api, "a", **FAST)
        stop = asyncio.Event()
        calls = 0
        again = asyncio.Event()

        async def lead(lost: asyncio.Event) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("controller crashed")
            again.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(a.run(stop, lead))
        await asyncio.wait_for(again.wait(), 2)
        assert spec(api)["leaseTransitions"] == 1, "released after the failure, then acquired again"
        stop.set()
        await asyncio.wait_for(task, 2)

    run(body())


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"identity": ""}, "identity"),
        ({"lease_duration": 0}, "lease_duration"),
        ({"lease_duration": 2.5}, "lease_duration"),
        ({"renew_deadline": 15}, "less than lease_duration"),
        ({"retry_period": 0}, "retry_period"),
        ({"renew_deadline": 2, "retry_period": 2}, "greater than retry_period"),
    ],
)
def test_bad_durations_are_rejected_with_a_clear_message(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"namespace": NS, "identity": "a", **kwargs}
    with pytest.raises(ValueError, match=needle):
        LeaderElector(FakeLeases(), **args)


class AnsweredLater:
    """A client whose GET is a future the test answers: the answer can arrive in the same moment the
    caller is cancelled."""

    def __init__(self, lease: JsonObj) -> None:
        self.lease = lease
        self.answer: asyncio.Future[JsonObj] | None = None

    def get(self, path: str, **kw: Any) -> asyncio.Future[JsonObj]:
        self.answer = asyncio.get_running_loop().create_future()
        return self.answer


def test_a_lease_read_cancelled_as_its_answer_arrives_ends_cancelled() -> None:
    """A reconcile cancelled (its term ended) while its Lease read is answered must end: a read that
    returned its answer instead would let the reconcile go on, and the term would never end."""
    api_ = FakeLeases()
    e = elector(api_, "a")
    assert run(e.try_acquire_or_renew())
    assert api_.lease is not None
    client = AnsweredLater(copy.deepcopy(api_.lease))
    e.client = client  # type: ignore[assignment]
    e._set_leading(True)  # as while its leading task runs

    async def scenario() -> bool:
        task = asyncio.create_task(e.confirm())
        while client.answer is None:
            await asyncio.sleep(0)
        client.answer.set_result(client.lease)  # answered ...
        task.cancel()  # ... as the term ends
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert run(scenario()), "the cancellation was lost: the read returned its answer"
