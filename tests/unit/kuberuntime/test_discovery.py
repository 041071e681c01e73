"""Discovery: what an API server serves, read again as it changes, and errors that keep the last view."""

from __future__ import annotations

import asyncio

from kuberuntime import api
from kuberuntime.discovery import DiscoveryWatch, Served, path_of, read
from tests.kube.fakeapi import FakeApiServer

MAP = "admissionregistration.k8s.io/v1"


def _server(version: str, *, policies: bool, resize: bool = True) -> FakeApiServer:
    fake = FakeApiServer()
    fake.put("/version", {"gitVersion": version})
    core = [{"name": "pods"}, *([{"name": "pods/resize"}] if resize else [])]
    fake.put("/api/v1", {"resources": core})
    if policies:
        fake.put(f"/apis/{MAP}", {"resources": [{"name": "mutatingadmissionpolicies"}, {"name": "x"}]})
    return fake


def test_a_group_version_the_server_does_not_serve_has_no_resources() -> None:
    served = asyncio.run(read(_server("v1.34.4", policies=False), ["v1", MAP]))
    assert served.git_version == "v1.34.4" and served.minor == (1, 34)
    assert served.has("v1", "pods/resize") and not served.has(MAP, "mutatingadmissionpolicies")
    assert path_of("v1") == "/api/v1" and path_of(MAP) == f"/apis/{MAP}"


def test_minor_is_none_for_a_version_in_another_form() -> None:
    assert Served("", frozenset()).minor is None
    assert Served("v1.37.2+k3s1", frozenset()).minor == (1, 37)


def test_a_change_is_reported_once_with_the_old_and_new_view() -> None:
    fake = _server("v1.35.4", policies=False)
    changes: list[tuple[Served | None, Served]] = []
    watch = DiscoveryWatch(fake, ["v1", MAP], settle=1, on_change=lambda old, new: changes.append((old, new)))
    first = asyncio.run(watch.refresh())
    asyncio.run(watch.refresh())
    assert changes == [(None, first)], "an unchanged view is not reported again"
    upgraded = _server("v1.36.3", policies=True)
    watch.client = upgraded
    new = asyncio.run(watch.refresh())
    assert changes[-1] == (first, new) and new.has(MAP, "mutatingadmissionpolicies")
    assert watch.current is new


def test_the_loop_keeps_the_last_view_when_discovery_fails_and_reads_again_later() -> None:
    fake = _server("v1.36.3", policies=True)
    watch = DiscoveryWatch(fake, ["v1", MAP], interval=0.01)
    before = asyncio.run(watch.refresh())
    fake.fail("get", "/version", api.ApiError(503, "ServiceUnavailable", "shutting down"), times=2)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(watch.run(stop))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if len([c for c in fake.calls if c == ("get", "/version")]) >= 4:
                break  # two failed reads, then two that worked
        stop.set()
        await task

    asyncio.run(go())
    assert len([c for c in fake.calls if c == ("get", "/version")]) >= 4
    assert watch.current == before


def test_a_handler_that_raises_does_not_stop_discovery() -> None:
    def broken(old: Served | None, new: Served) -> None:
        raise RuntimeError("subscriber bug")

    watch = DiscoveryWatch(_server("v1.37.2", policies=True), ["v1"], on_change=broken)
    assert asyncio.run(watch.refresh()).git_version == "v1.37.2"


def test_a_resource_counts_only_once_reads_in_a_row_list_it_and_is_gone_at_the_first_that_does_not() -> None:
    """Two minors behind one load balancer during an upgrade: reads alternate between them, and the
    policy API the newer one serves never settles; once every read lists it, it does."""
    old, new = _server("v1.35.4", policies=False), _server("v1.36.3", policies=True)
    watch = DiscoveryWatch(old, ["v1", MAP], settle=3)
    seen = []
    for client in (old, new, new, old, new, new, new, new):
        watch.client = client
        seen.append(asyncio.run(watch.refresh()).has(MAP, "mutatingadmissionpolicies"))
    assert seen == [False, False, False, False, False, False, True, True]
    watch.client = old
    assert not asyncio.run(watch.refresh()).has(MAP, "mutatingadmissionpolicies"), "gone at once"
