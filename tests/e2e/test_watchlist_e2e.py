"""The first state of a watch on the real kube-apiserver: streamed where WatchList is served, listed in
pages where it is not, and in both cases followed by a watch that misses nothing.

Every informer of the manager reads its first state through kuberuntime.initialstate: a watch with
`sendInitialEvents=true` first, the paged LIST only once the server refuses that. Both are checked
on the API server itself, by its audit log (which request it was served, and its answer):

- the session's control plane, with the `WatchList` feature gate as each minor ships it (beta and
  on from 1.34 to 1.37): one WatchList request and not a single LIST;
- a control plane of the test's own with `--feature-gates=WatchList=false`: the WatchList refused
  (422, with the message the in-memory API server of the unit tests copies, tests/kube/fakewatch.py),
  then a LIST in pages of `PAGE`.

Marked `versions`: the test command runs it against every supported minor.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from kuberuntime import api, initialstate, kubeapi
from kuberuntime.informer import Informer
from kuberuntime.jsontypes import JsonObj
from sidecarctl.manager import api_client
from tests.kube import builders
from tests.kube.audit import audit_events
from tests.kube.client import Kube, eventually
from tests.kube.cluster import PrivateCluster
from tests.kube.controlplane import ControlPlane
from tests.kube.fakewatch import REFUSED
from tests.kube.loop import BackgroundLoop

pytestmark = pytest.mark.versions

PODS = 230  # three pages of PAGE
PAGE = 100
SELECTOR = "watchlist-e2e=yes"


@pytest.fixture(scope="module")
def gate_off(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[PrivateCluster]:
    c = PrivateCluster(
        aloop,
        bin_dir=control_plane.bin_dir,
        prefix="sidecarctl-watchlist-",
        apiserver_flags=("--feature-gates=WatchList=false",),
    )
    try:
        yield c
    finally:
        c.close()


def with_pods(kube: Kube, aloop: BackgroundLoop, client: kubeapi.KubeClient) -> str:
    """A fresh namespace with PODS pods the informer selects and one it does not."""
    ns = f"watchlist-{os.urandom(3).hex()}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    eventually(
        lambda: kube.get_or_none(f"/api/v1/namespaces/{ns}/serviceaccounts/default") is not None,
        timeout=30,
        what=f"default ServiceAccount in {ns}",
    )

    async def create_all() -> None:
        gate = asyncio.Semaphore(16)

        async def one(name: str, labels: dict[str, str]) -> None:
            async with gate:
                await client.create(f"/api/v1/namespaces/{ns}/pods", builders.pod(name, labels=labels))

        await asyncio.gather(
            *(one(f"p-{i:03d}", {"watchlist-e2e": "yes"}) for i in range(PODS)),
            one("unselected", {"watchlist-e2e": "no"}),
        )

    aloop.run(create_all(), timeout=120)
    return ns


def read_and_follow(aloop: BackgroundLoop, client: kubeapi.KubeClient, kube: Kube, ns: str) -> Informer[JsonObj]:
    """The informer's first state of the namespace's selected pods, then one change it must get by
    its watch (a label on `p-000`), and one delete. It reads as the manager does, without the pods'
    managedFields: each pod it holds is the API server's without them, which checks on every minor
    that kube-apiserver still ends the metadata with them (kuberuntime.jsontypes)."""
    seen: list[tuple[str, str]] = []
    lean = api_client(client.config)
    informer: Informer[JsonObj] = Informer(
        lean,
        f"/api/v1/namespaces/{ns}/pods",
        name="pods",
        transform=lambda obj: obj,
        handler=lambda kind, old, new: seen.append((kind, str((new or old)["metadata"]["name"]))),
        label_selector=SELECTOR,
        page_size=PAGE,
    )
    stop = asyncio.Event()
    task = asyncio.run_coroutine_threadsafe(informer.run(stop), aloop.loop)
    try:
        aloop.run(informer.synced.wait(), timeout=60)
        assert sorted(informer.store) == sorted(f"{ns}/p-{i:03d}" for i in range(PODS))
        seen.clear()
        kube.patch(f"/api/v1/namespaces/{ns}/pods/p-000", {"metadata": {"labels": {"changed": "1"}}})
        kube.delete(f"/api/v1/namespaces/{ns}/pods/p-001", gracePeriodSeconds=0)
        eventually(
            lambda: ("MODIFIED", "p-000") in seen and ("DELETED", "p-001") in seen,
            timeout=15,
            what="the change and the delete after the first state, by the watch",
        )
        assert informer.store[f"{ns}/p-000"]["metadata"]["labels"]["changed"] == "1"
        assert f"{ns}/p-001" not in informer.store
        for name in ("p-000", "p-002", f"p-{PODS - 1:03d}"):  # p-000 as its watch event brought it
            whole = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            assert whole["metadata"].pop("managedFields"), f"{name}: kube-apiserver sent no managedFields"
            held = informer.store[f"{ns}/{name}"]
            assert {**held, "kind": "Pod", "apiVersion": "v1"} == whole  # a listed item has neither
    finally:
        aloop.loop.call_soon_threadsafe(stop.set)
        task.result(timeout=10)
        aloop.run(lean.close())
    return informer


def reads_of(cp: ControlPlane, start: int, ns: str) -> list[dict[str, Any]]:
    """The audit log's requests for the namespace's pods with the informer's selector, in order."""
    out = []
    for e in audit_events(cp, start):
        url = urllib.parse.urlsplit(e["requestURI"])
        q = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        if url.path == f"/api/v1/namespaces/{ns}/pods" and q.get("labelSelector") == SELECTOR:
            out.append({"verb": e["verb"], "code": (e.get("responseStatus") or {}).get("code"), **q})
    return out


def test_the_first_state_is_streamed_as_a_watchlist_where_the_api_server_serves_it(
    aloop: BackgroundLoop, control_plane: ControlPlane, kube: Kube, kube_client: kubeapi.KubeClient
) -> None:
    ns = with_pods(kube, aloop, kube_client)
    start = control_plane.audit_log.stat().st_size
    informer = read_and_follow(aloop, kube_client, kube, ns)
    reads = reads_of(control_plane, start, ns)
    assert informer.watch_list, "the informer gave up the WatchList on a server that serves it"
    assert [r["verb"] for r in reads if r["verb"] == "list"] == [], f"the state was listed: {reads}"
    streamed = [r for r in reads if r.get("sendInitialEvents") == "true"]
    assert len(streamed) == 1, reads
    assert streamed[0]["code"] == 200
    assert streamed[0]["resourceVersionMatch"] == "NotOlderThan" and streamed[0]["resourceVersion"] == ""
    # Then watched on from the state's resourceVersion, never from "" (which would replay it all).
    assert reads[0] is streamed[0] and all(r["verb"] == "watch" and r["resourceVersion"] for r in reads[1:]), reads


def test_the_first_state_is_listed_in_pages_where_the_api_server_refuses_a_watchlist(
    aloop: BackgroundLoop, gate_off: PrivateCluster
) -> None:
    c = gate_off
    ns = with_pods(c.kube, aloop, c.client)

    async def refusal() -> api.ApiError:
        try:
            async for _ in c.client.watch(
                f"/api/v1/namespaces/{ns}/pods",
                resource_version="",
                timeout_seconds=5,
                params=initialstate.STREAM_PARAMS,
            ):
                break
        except api.ApiError as e:
            return e
        raise AssertionError("kube-apiserver with WatchList=false streamed the state")

    refused = aloop.run(refusal())
    assert refused.status == 422 and refused.message == REFUSED, (refused.status, refused.message)

    start = c.cp.audit_log.stat().st_size
    informer = read_and_follow(aloop, c.client, c.kube, ns)
    reads = reads_of(c.cp, start, ns)
    assert not informer.watch_list, "the informer still asks for a WatchList the server refuses"
    assert reads[0]["verb"] == "watch" and reads[0].get("sendInitialEvents") == "true" and reads[0]["code"] == 422
    lists = [r for r in reads if r["verb"] == "list"]
    assert [r["limit"] for r in lists] == [str(PAGE)] * 3, reads
    assert "continue" not in lists[0] and all(r.get("continue") for r in lists[1:]), reads
    assert all(r["code"] == 200 for r in lists)
    assert all(r.get("sendInitialEvents") != "true" for r in reads[1:]), "asked for a WatchList again"
