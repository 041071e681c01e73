"""The informer's first state (streamed as a WatchList, or listed when the server refuses that) and its
catch-up to a quorum read, against watches served as kube-apiserver's watch cache serves them
(tests/kube/fakewatch.py), with its durations scaled down 100 times.

Why these matter: a standby's cache may be behind by a stream that stalled minutes ago, and the
replica that wins the Lease plans from it. `catch_up` must not return before the store holds every
change up to a read made after it was called, must not wait for the stall to be noticed (a minute),
and must not list again when a bookmark can do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kuberuntime import api
from kuberuntime.informer import CATCH_UP_TIMEOUT, Informer
from tests.kube.fakeapi import FakeApiServer
from tests.kube.fakewatch import INITIAL_EVENTS_END

PODS = "/api/v1/pods"
SECOND = 0.01  # one watch-cache second, in real seconds
# Long enough (4,000 scaled seconds: 40 s) that no bookmark of the normal watch comes during a test:
# whatever a test sees come sooner came from the catch-up.
LONG_WATCH = 4000


def pod(name: str, injected: bool = True, image: str = "proxy:1") -> dict[str, Any]:
    labels = {"sidecarctl.io/injected": "true"} if injected else {}
    return {"metadata": {"name": name, "namespace": "shop", "labels": labels}, "spec": {"image": image}}


def put_pod(server: FakeApiServer, p: dict[str, Any]) -> None:
    server.put(f"/api/v1/namespaces/shop/pods/{p['metadata']['name']}", p)


Seen = list[tuple[str, str]]


async def running(
    client: Any, body: Callable[[Informer[dict[str, Any]], Seen], Awaitable[None]], **kw: Any
) -> tuple[Informer[dict[str, Any]], Seen]:
    """An informer of injected pods on `client`, synced, while `body` runs; stopped after."""
    seen: Seen = []

    def handler(kind: str, old: Any, new: Any) -> None:
        seen.append((kind, (new or old)["metadata"]["name"]))

    inf: Informer[dict[str, Any]] = Informer(
        client,
        PODS,
        name="pods",
        transform=lambda o: o,
        handler=handler,
        label_selector="sidecarctl.io/injected=true",
        watch_timeout=LONG_WATCH,
        max_backoff=0.01,
        **kw,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(inf.run(stop))
    try:
        await asyncio.wait_for(inf.synced.wait(), timeout=5)
        await body(inf, seen)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=1)
    return inf, seen


def serving(*pods: dict[str, Any]) -> FakeApiServer:
    server = FakeApiServer()
    server.serve_watches(second=SECOND)
    for p in pods:
        put_pod(server, p)
    return server


def lists(server: FakeApiServer) -> int:
    """Whole-state lists of the pods (a quorum read, `limit=1`, is not one)."""
    return sum(1 for verb, path in server.calls if verb == "get" and path == PODS) - server_quorum_reads(server)


def server_quorum_reads(server: FakeApiServer) -> int:
    return getattr(server, "quorum_reads", 0)


def counting_quorum_reads(server: FakeApiServer) -> FakeApiServer:
    get = server.get

    async def counted(path: str, *, params: api.Params | None = None) -> Any:
        if (params or {}).get("limit") == 1:
            server.quorum_reads = server_quorum_reads(server) + 1  # type: ignore[attr-defined]
        return await get(path, params=params)

    server.get = counted  # type: ignore[method-assign]
    return server


# -- the first state --------------------------------------------------------------------------------------
def test_the_first_state_is_streamed_where_the_server_offers_it() -> None:
    server = counting_quorum_reads(serving(pod("a"), pod("b"), pod("plain", injected=False)))
    assert server.watches is not None

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        assert set(inf.store) == {"shop/a", "shop/b"}
        assert inf.version == server.resource_version
        put_pod(server, pod("c"))
        while ("ADDED", "c") not in seen:
            await asyncio.sleep(SECOND)

    inf, seen = asyncio.run(running(server, body))
    assert lists(server) == 0, "listed although the server streams the state"
    first = server.watches.requests[0]
    assert first.params["sendInitialEvents"] == "true" and first.params["resourceVersionMatch"] == "NotOlderThan"
    assert first.resource_version == ""  # the most recent state: a consistent read
    assert inf.watch_list
    assert sorted(seen) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]


def test_a_server_that_refuses_the_stream_is_listed_in_pages_and_never_asked_again() -> None:
    server = counting_quorum_reads(serving(pod("a")))
    assert server.watches is not None
    server.watches.watch_list = False  # as kube-apiserver --feature-gates=WatchList=false

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        assert set(inf.store) == {"shop/a"}
        assert server.watches is not None
        put_pod(server, pod("b"))
        server.watches.compact()  # the next watch gets 410 Gone: the state is read again
        await asyncio.wait_for(inf.catch_up(), timeout=2)
        assert inf.relists == 2 and set(inf.store) == {"shop/a", "shop/b"}

    inf, _ = asyncio.run(running(server, body))
    asked = [r for r in server.watches.requests if r.params.get("sendInitialEvents")]
    assert len(asked) == 1, "asked for a stream again after the server refused one"
    assert lists(server) == 2
    assert not inf.watch_list


class PlainWatchServer:
    """A server (or a proxy in front of one) that drops `sendInitialEvents` and answers a plain
    watch from "now": the objects as ADDED, then a bookmark without the end annotation."""

    def __init__(self) -> None:
        self.lists = 0

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": "20"}, "items": [pod("a")]}

    async def watch(self, path: str, *, resource_version: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        if resource_version == "":
            yield {
                "type": "ADDED",
                "object": {**pod("a"), "metadata": {**pod("a")["metadata"], "resourceVersion": "7"}},
            }
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}
            return
        await asyncio.Event().wait()


def test_a_plain_watch_in_place_of_the_stream_counts_as_refused() -> None:
    server = PlainWatchServer()

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        pass

    inf, seen = asyncio.run(running(server, body))
    assert server.lists == 1 and not inf.watch_list
    assert seen == [("ADDED", "a")], "the half-read stream leaked into the store"


class CutStreamServer:
    """Streams the state, but the first stream breaks off after one object."""

    def __init__(self) -> None:
        self.streams = 0

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        raise AssertionError("listed although the server streams the state")

    async def watch(self, path: str, *, resource_version: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        if resource_version == "":
            self.streams += 1
            for name in ("a", "b") if self.streams > 1 else ("a",):
                yield {"type": "ADDED", "object": pod(name)}
            if self.streams > 1:
                end = {"resourceVersion": "30", "annotations": {INITIAL_EVENTS_END: "true"}}
                yield {"type": "BOOKMARK", "object": {"metadata": end}}
            return
        await asyncio.Event().wait()


def test_a_stream_cut_before_the_end_of_the_state_is_read_again_whole() -> None:
    server = CutStreamServer()

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        pass

    inf, seen = asyncio.run(running(server, body))
    assert server.streams == 2
    assert sorted(seen) == [("ADDED", "a"), ("ADDED", "b")], "an object of the cut stream was handed on twice"
    assert inf.resource_version == "30"


# -- catching up ---------------------------------------------------------------------------------------------
def test_a_quiet_cache_catches_up_by_a_bookmark_without_listing_again() -> None:
    server = counting_quorum_reads(serving(pod("a")))
    assert server.watches is not None
    reached: list[int] = []

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        for i in range(3):  # writes elsewhere move the revision on; nothing this watch selects changes
            server.put(f"/api/v1/namespaces/shop/configmaps/c{i}", {"metadata": {"name": f"c{i}"}})
        assert inf.version < server.resource_version
        reached.append(await asyncio.wait_for(inf.catch_up(), timeout=2))
        assert inf.version >= reached[0]

    asyncio.run(running(server, body))
    assert reached == [server.resource_version]
    assert lists(server) == 0 and server_quorum_reads(server) == 1
    short = [r for r in server.watches.requests if r.timeout == CATCH_UP_TIMEOUT]
    assert short, "no short watch: the catch-up waited for a bookmark of the long one"


def test_catch_up_applies_what_a_stalled_stream_missed_before_it_returns() -> None:
    server = counting_quorum_reads(serving(pod("a"), pod("b")))
    assert server.watches is not None

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        assert server.watches is not None
        while not server.watches.open(PODS):
            await asyncio.sleep(SECOND)
        assert server.watches.stall(PODS) == 1
        put_pod(server, pod("a", image="proxy:2"))
        await server.delete("/api/v1/namespaces/shop/pods/b")
        put_pod(server, pod("c"))
        await asyncio.sleep(20 * SECOND)
        assert inf.store["shop/a"]["spec"]["image"] == "proxy:1", "the stall did not hold the cache back"
        await asyncio.wait_for(inf.catch_up(), timeout=2)  # the stalled stream never ends by itself
        assert inf.store["shop/a"]["spec"]["image"] == "proxy:2"
        assert set(inf.store) == {"shop/a", "shop/c"}

    _, seen = asyncio.run(running(server, body))
    assert seen[-3:] == [("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "c")]
    assert lists(server) == 0


def test_a_cache_whose_bookmarks_do_not_come_reads_the_state_again_after_its_bound() -> None:
    server = counting_quorum_reads(serving(pod("a")))
    assert server.watches is not None
    server.watches.bookmarks = False  # a watch cache that cannot vouch for the target (turned off)
    server.watches.watch_list = False

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        server.put("/api/v1/namespaces/shop/configmaps/c", {"metadata": {"name": "c"}})
        target = server.resource_version
        page = await server.get(PODS, params={"limit": 1})
        assert api.rv_number(page["metadata"]["resourceVersion"]) == target
        await asyncio.wait_for(inf.reach(target, reread_after=0.1), timeout=2)
        assert inf.version >= target

    asyncio.run(running(server, body))
    assert lists(server) == 2, "the state was not read again when bookmarks could not bring it there"


def test_a_cache_at_the_target_already_returns_at_once() -> None:
    server = counting_quorum_reads(serving(pod("a")))
    assert server.watches is not None

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        put_pod(server, pod("a", image="proxy:2"))  # the newest write is one this watch delivers
        while inf.version < server.resource_version:
            await asyncio.sleep(SECOND)
        before = len(server.watches.requests) if server.watches else 0
        await asyncio.wait_for(inf.catch_up(), timeout=2)
        assert server.watches is not None and len(server.watches.requests) == before

    asyncio.run(running(server, body))


def test_a_catch_up_from_a_version_the_server_forgot_reads_the_state_again() -> None:
    server = counting_quorum_reads(serving(pod("a")))
    assert server.watches is not None

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        assert server.watches is not None
        server.watches.stall(PODS)
        put_pod(server, pod("b"))
        server.watches.compact()  # what the stalled stream missed is no longer in the window
        await asyncio.wait_for(inf.catch_up(), timeout=2)
        assert set(inf.store) == {"shop/a", "shop/b"}

    asyncio.run(running(server, body))
    streams = [r for r in server.watches.requests if r.params.get("sendInitialEvents")]
    assert len(streams) == 2, "the state was not read again after 410 Gone"


def test_a_small_cache_catches_up_by_reading_its_state_again_without_a_quorum_read() -> None:
    server = counting_quorum_reads(serving(pod("a")))
    assert server.watches is not None

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        assert server.watches is not None
        server.watches.stall(PODS)  # what the stream missed comes only with the read
        put_pod(server, pod("b"))
        server.put("/api/v1/namespaces/shop/configmaps/c", {"metadata": {"name": "c"}})
        target = server.resource_version
        reached = await asyncio.wait_for(inf.catch_up(), timeout=2)
        assert reached >= target and inf.version >= target
        assert set(inf.store) == {"shop/a", "shop/b"}

    _, seen = asyncio.run(running(server, body, reread_up_to=5))
    assert server_quorum_reads(server) == 0, "a quorum read although the read of the state is one"
    streams = [r for r in server.watches.requests if r.params.get("sendInitialEvents")]
    assert len(streams) == 2
    assert short_watches(server) == [], "waited for a bookmark although the state was read again"
    assert seen.count(("ADDED", "b")) == 1 and seen.count(("ADDED", "a")) == 1, "unchanged objects handed on again"


def test_a_cache_larger_than_its_reread_bound_waits_for_a_bookmark() -> None:
    server = counting_quorum_reads(serving(pod("a"), pod("b")))
    assert server.watches is not None

    async def body(inf: Informer[dict[str, Any]], seen: Seen) -> None:
        server.put("/api/v1/namespaces/shop/configmaps/c", {"metadata": {"name": "c"}})
        await asyncio.wait_for(inf.catch_up(), timeout=2)

    asyncio.run(running(server, body, reread_up_to=1))
    assert server_quorum_reads(server) == 1 and lists(server) == 0
    assert short_watches(server), "no short watch: the large cache did not catch up by a bookmark"


class SlowStateServer:
    """Streams the state, the first time slowly: a catch-up asked for while that first read is on its
    way must be answered by a read begun after it was asked for, not by the one in flight."""

    def __init__(self) -> None:
        self.streams = 0
        self.first_begun = asyncio.Event()
        self.release_first = asyncio.Event()

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        raise AssertionError("listed although the server streams the state")

    async def watch(self, path: str, *, resource_version: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        if resource_version == "":
            self.streams += 1
            n = self.streams
            if n == 1:
                self.first_begun.set()
                await self.release_first.wait()
            yield {"type": "ADDED", "object": pod(f"p{n}")}
            end = {"resourceVersion": str(10 * n), "annotations": {INITIAL_EVENTS_END: "true"}}
            yield {"type": "BOOKMARK", "object": {"metadata": end}}
            return
        await asyncio.Event().wait()


def test_a_reread_asked_for_during_a_read_is_answered_by_the_next_one() -> None:
    server = SlowStateServer()

    async def scenario() -> tuple[int, Informer[dict[str, Any]]]:
        inf: Informer[dict[str, Any]] = Informer(
            server, PODS, name="pods", transform=lambda o: o, max_backoff=0.01, reread_up_to=5
        )
        stop = asyncio.Event()
        task = asyncio.create_task(inf.run(stop))
        await server.first_begun.wait()
        inf.synced.set()  # as if an earlier state were held: the catch-up asks while a read is in flight
        catching = asyncio.create_task(inf.catch_up())
        await asyncio.sleep(0.05)
        server.release_first.set()
        try:
            reached = await asyncio.wait_for(catching, timeout=2)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=1)
        return reached, inf

    reached, inf = asyncio.run(scenario())
    assert server.streams == 2, "the read in flight when the catch-up began was taken for a fresh one"
    assert reached == 20 and set(inf.store) == {"shop/p2"}


def short_watches(server: FakeApiServer) -> list[Any]:
    assert server.watches is not None
    return [r for r in server.watches.requests if r.timeout == CATCH_UP_TIMEOUT]


class GoneServer:
    """An optional resource whose CRD is deleted between the first read and the catch-up's reread."""

    def __init__(self) -> None:
        self.gone = False

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        if self.gone:
            raise api.NotFound(404, "NotFound", "the server could not find the requested resource")
        return {"metadata": {"resourceVersion": "5"}, "items": [pod("a")]}

    async def watch(self, path: str, *, resource_version: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        if self.gone:
            raise api.NotFound(404, "NotFound", "the server could not find the requested resource")
        await asyncio.Event().wait()
        yield {}  # never reached


def test_a_small_catch_up_of_a_resource_that_is_no_longer_served_returns() -> None:
    server = GoneServer()

    async def scenario() -> int:
        inf: Informer[dict[str, Any]] = Informer(
            server, PODS, name="tenants", transform=lambda o: o, watch_list=False, optional=True, reread_up_to=5
        )
        stop = asyncio.Event()
        task = asyncio.create_task(inf.run(stop))
        try:
            await asyncio.wait_for(inf.synced.wait(), timeout=2)
            server.gone = True  # the CRD deleted as the catch-up begins
            return await asyncio.wait_for(inf.catch_up(), timeout=2)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=1)

    assert asyncio.run(scenario()) == 5, "the catch-up waited for a read of a resource no longer served"
