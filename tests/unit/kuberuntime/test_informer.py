"""The list-then-watch loop against a scripted fake API: re-list on 410, resume, stop at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from kuberuntime import api as kube
from kuberuntime.informer import Informer
from tests.kube.fakewatch import REFUSED


def obj(name: str, rv: str, value: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "value": value}


class ScriptedApi:
    """Each list returns the current items; each watch call plays the next scripted stream (what
    goes wrong on the wire: 410s, broken streams, quiet ones), which the watch cache of
    tests/kube/fakewatch.py does not model. It does not stream the state (WatchList): it refuses
    as a server with that feature gate off does, so these tests run the paged list."""

    def __init__(self, items: list[dict[str, Any]], streams: list[list[dict[str, Any]] | Exception | None]) -> None:
        self.items = items
        self.streams = streams
        self.lists = 0
        self.watch_rvs: list[str] = []

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": str(10 * self.lists)}, "items": list(self.items)}

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        params: Any = None,
        stall_after: Any = None,
        opened: Any = None,
    ) -> AsyncIterator[dict[str, Any]]:
        if (params or {}).get("sendInitialEvents"):  # as kube-apiserver with the WatchList gate off
            raise kube.Invalid(422, "Invalid", REFUSED)
        self.watch_rvs.append(resource_version)
        step = self.streams.pop(0) if self.streams else None
        if isinstance(step, Exception):
            raise step
        if opened is not None:  # the server accepted the watch
            opened()
        if step is None:
            await asyncio.Event().wait()  # a quiet watch: blocks until cancelled
            return
        for event in step:
            yield event


def informer(api: ScriptedApi, **kw: Any) -> Informer[dict[str, Any]]:
    """An informer of `/x` on the scripted API, backing off 10 ms at most."""
    return Informer(api, "/x", name="t", transform=lambda o: o, max_backoff=0.01, **kw)  # type: ignore[arg-type]


def run(api: ScriptedApi, until: Any, timeout: float = 2.0) -> tuple[Informer[dict[str, Any]], list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []

    def handler(kind: str, old: Any, new: Any) -> None:
        seen.append((kind, (new or old)["metadata"]["name"]))

    async def main() -> Informer[dict[str, Any]]:
        inf = informer(api, handler=handler)
        stop = asyncio.Event()
        task = asyncio.create_task(inf.run(stop))
        deadline = asyncio.get_running_loop().time() + timeout
        while not until(inf, seen) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.wait_for(task, timeout=0.5)  # stop must not wait for a quiet watch
        return inf

    return asyncio.run(main()), seen


def test_list_then_watch_applies_events_and_resumes_from_the_last_version() -> None:
    api = ScriptedApi(
        [obj("a", "1")],
        [
            [
                {"type": "ADDED", "object": obj("b", "11")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
            ],
            [{"type": "DELETED", "object": obj("a", "16")}],
        ],
    )
    inf, seen = run(api, lambda inf, seen: ("DELETED", "a") in seen)
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    assert api.watch_rvs[:2] == ["10", "15"]  # resumed from the bookmark, no second list
    assert api.lists == 1
    assert set(inf.store) == {"b"}


def test_gone_relists_and_emits_the_difference() -> None:
    api = ScriptedApi([obj("a", "1"), obj("b", "2")], [kube.Gone(410, "Expired", "too old")])
    original_get = api.get

    async def get(path: str, *, params: Any = None) -> dict[str, Any]:
        result = await original_get(path, params=params)
        api.items = [obj("a", "3", "changed"), obj("c", "4")]  # what the second list will see
        return result

    api.get = get  # type: ignore[method-assign]
    inf, seen = run(api, lambda inf, seen: api.lists >= 2 and ("ADDED", "c") in seen)
    assert ("MODIFIED", "a") in seen and ("DELETED", "b") in seen and ("ADDED", "c") in seen
    assert set(inf.store) == {"a", "c"}


def test_errors_back_off_and_recover() -> None:
    api = ScriptedApi([], [OSError("connection reset"), [{"type": "ADDED", "object": obj("x", "5")}]])
    inf, seen = run(api, lambda inf, seen: ("ADDED", "x") in seen)
    assert ("ADDED", "x") in seen
    assert inf.synced.is_set()


def test_error_event_410_in_the_stream_relists() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    # KubeClient.watch turns an ERROR event with code 410 into Gone.
    api = ScriptedApi([obj("a", "1")], [kube.error_from_status(410, status)])
    run(api, lambda inf, seen: api.lists >= 2)
    assert api.lists >= 2


def test_current_from_a_read_or_an_accepted_watch_until_a_watch_fails() -> None:
    """What the webhook waits on (injector.http.snapshotwait): set by the first read, cleared by a
    failed watch (a reset, then a 410), still clear while the state is read again, set once read."""
    api = ScriptedApi([obj("a", "1")], [OSError("connection reset"), kube.Gone(410, "Expired", "too old"), None])
    at_watch: list[bool] = []
    at_list: list[bool] = []
    informers: list[Informer[dict[str, Any]]] = []
    original_get, original_watch = api.get, api.watch

    async def get(path: str, *, params: Any = None) -> dict[str, Any]:
        at_list.append(informers[0].current.is_set())
        return await original_get(path, params=params)

    def watch(path: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        at_watch.append(informers[0].current.is_set())
        return original_watch(path, **kw)

    api.get, api.watch = get, watch  # type: ignore[method-assign]

    async def main() -> bool:
        inf = informer(api)
        informers.append(inf)
        stop = asyncio.Event()
        task = asyncio.create_task(inf.run(stop))
        async with asyncio.timeout(2):
            while len(at_watch) < 4:
                await asyncio.sleep(0.005)
            await inf.current.wait()
        stop.set()
        await task
        return inf.current.is_set()

    assert asyncio.run(main())
    assert at_list == [False, False]  # before the first read, and while reading again after the 410
    # The state streamed (refused: paged instead), then after the read, after the reset, after the read again.
    assert at_watch == [False, True, False, True]


class Unserved(ScriptedApi):
    """A resource whose CRD is not installed until `served` is set: its lists answer 404 until then."""

    served = False

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        if not self.served:
            self.lists += 1
            raise kube.NotFound(404, "NotFound", "the server could not find the requested resource")
        return await super().get(path, params=params)


def test_an_optional_resource_not_served_counts_as_an_empty_synced_list_and_is_listed_again() -> None:
    api = Unserved([obj("a", "1")], [])

    async def main() -> tuple[bool, int, dict[str, Any]]:
        inf = informer(api, optional=True)
        stop = asyncio.Event()
        task = asyncio.create_task(inf.run(stop))
        await asyncio.wait_for(inf.synced.wait(), 1)
        empty_then = not inf.store
        api.served = True  # the CRD installed: the next list finds its objects
        for _ in range(200):
            if inf.store:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task
        return empty_then, api.lists, dict(inf.store)

    empty_then, lists, store = asyncio.run(main())
    assert empty_then and lists >= 2 and set(store) == {"a"}


def test_a_required_resource_not_served_is_never_synced() -> None:
    api = Unserved([], [])

    async def main() -> bool:
        inf = informer(api)
        stop = asyncio.Event()
        task = asyncio.create_task(inf.run(stop))
        await asyncio.sleep(0.2)
        stop.set()
        await task
        return inf.synced.is_set()

    assert asyncio.run(main()) is False
