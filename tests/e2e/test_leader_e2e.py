"""Lease election on the real API server: one leader at a time, fast hand-over on release, expiry on crash."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from kuberuntime import kubeapi
from kuberuntime.leader import JITTER_FACTOR, LeaderElector
from tests.kube.client import Kube, eventually
from tests.kube.loop import BackgroundLoop

LEASE = 3
RETRY = 0.25
RENEW = 2.0


@dataclass
class Candidate:
    """An elector running on the session loop, with what it saw while leading."""

    aloop: BackgroundLoop
    elector: LeaderElector
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    terms: int = 0
    future: concurrent.futures.Future[None] | None = None

    def start(self) -> Candidate:
        async def lead(lost: asyncio.Event) -> None:
            self.terms += 1
            await asyncio.Event().wait()

        self.future = asyncio.run_coroutine_threadsafe(self.elector.run(self.stop, lead), self.aloop.loop)
        return self

    def request_stop(self) -> None:
        self.aloop.loop.call_soon_threadsafe(self.stop.set)

    def stop_and_wait(self) -> None:
        self.request_stop()
        assert self.future is not None
        self.future.result(timeout=10)

    def kill(self) -> None:
        """Cancel the election task: no release, like a crashed process."""
        assert self.future is not None
        self.future.cancel()
        eventually(lambda: not self.elector.is_leader, timeout=5, what="killed candidate stops leading")


MakeCandidate = Callable[[str], Candidate]


@pytest.fixture
def candidates(aloop: BackgroundLoop, kube_client: kubeapi.KubeClient, namespace: str) -> Iterator[MakeCandidate]:
    made: list[Candidate] = []

    def make(identity: str) -> Candidate:
        elector = LeaderElector(
            kube_client,
            namespace=namespace,
            identity=identity,
            lease_duration=LEASE,
            renew_deadline=RENEW,
            retry_period=RETRY,
        )
        c = Candidate(aloop, elector).start()
        made.append(c)
        return c

    yield make
    for c in made:
        if c.future is not None and not c.future.done():
            c.request_stop()
    for c in made:
        if c.future is not None:
            with contextlib.suppress(concurrent.futures.CancelledError):
                c.future.result(timeout=10)


def lease(kube: Kube, namespace: str) -> dict[str, object]:
    spec: dict[str, object] = kube.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/sidecarctl-controller"
    )["spec"]
    return spec


def leaders(*cs: Candidate) -> list[Candidate]:
    return [c for c in cs if c.elector.is_leader]


def test_exactly_one_of_two_candidates_leads(candidates: MakeCandidate, kube: Kube, namespace: str) -> None:
    make = candidates
    a, b = make("replica-a"), make("replica-b")
    first = eventually(lambda: leaders(a, b), timeout=10, what="a leader is elected")
    assert len(first) == 1
    samples = 0
    deadline = time.monotonic() + LEASE
    while time.monotonic() < deadline:
        assert len(leaders(a, b)) == 1, "exactly one candidate leads at every sample"
        samples += 1
        time.sleep(0.05)
    assert samples > 30
    (leader,) = leaders(a, b)
    assert leader is first[0], "the leader keeps renewing; no spurious hand-over"
    spec = lease(kube, namespace)
    assert spec["holderIdentity"] == leader.elector.identity
    assert spec["leaseDurationSeconds"] == LEASE
    assert leader.terms == 1
    assert (a.terms, b.terms).count(0) == 1


def test_released_lease_is_taken_over_at_once(candidates: MakeCandidate, kube: Kube, namespace: str) -> None:
    make = candidates
    a = make("replica-a")
    eventually(lambda: a.elector.is_leader, timeout=10, what="a leads")
    b = make("replica-b")
    time.sleep(4 * RETRY)  # b has observed a's lease and is waiting
    assert not b.elector.is_leader
    t0 = time.monotonic()
    a.stop_and_wait()
    eventually(lambda: b.elector.is_leader, timeout=5, interval=0.01, what="b takes over")
    handover = time.monotonic() - t0
    print(f"\nhand-over after release: {handover:.3f}s")
    assert handover < 3.0
    assert handover < RETRY * (1 + JITTER_FACTOR) + 1.0, "well before the lease would have expired"
    spec = lease(kube, namespace)
    assert spec["holderIdentity"] == "replica-b"
    assert spec["leaseTransitions"] == 1
    assert not a.elector.is_leader


def test_crashed_leader_is_replaced_after_the_lease_expires(
    candidates: MakeCandidate, kube: Kube, namespace: str
) -> None:
    make = candidates
    a = make("replica-a")
    eventually(lambda: a.elector.is_leader, timeout=10, what="a leads")
    b = make("replica-b")
    time.sleep(4 * RETRY)
    t0 = time.monotonic()
    a.kill()
    assert lease(kube, namespace)["holderIdentity"] == "replica-a", "no release on a crash"
    eventually(lambda: b.elector.is_leader, timeout=LEASE + 5, interval=0.01, what="b takes over after expiry")
    takeover = time.monotonic() - t0
    print(f"\ntake-over after a crash (lease {LEASE}s, retry {RETRY}s): {takeover:.3f}s")
    slack = 2 * RETRY * (1 + JITTER_FACTOR)
    assert LEASE - slack <= takeover <= LEASE + slack + 0.5
    assert lease(kube, namespace)["holderIdentity"] == "replica-b"
