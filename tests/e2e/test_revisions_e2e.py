"""ControllerRevision history on the real API server: truncation, rollback reuse, in-use survival, GC."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kuberuntime import kubeapi
from sidecarsets.controller.history import sync_history
from sidecarsets.spec.names import REVISION_LABEL_SIDECARSET, SS_LABEL_CUSTOM_VERSION
from sidecarsets.spec.revisions import resolve_pinned, revision_data
from tests.kube.builders import container, model, sidecarset
from tests.kube.client import Kube
from tests.kube.loop import BackgroundLoop

SS_PATH = "/apis/sidecarctl.io/v1alpha1/sidecarsets"

Apply = Callable[..., dict[str, Any]]


@pytest.fixture
def ss_name(kube: Kube, crd: dict[str, Any]) -> Iterator[str]:
    name = f"rev-{secrets.token_hex(3)}"
    yield name
    kube.delete(f"{SS_PATH}/{name}")


@pytest.fixture
def apply(kube: Kube, ss_name: str) -> Apply:
    def apply(image: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        containers = [container("proxy", image)]
        body = sidecarset(ss_name, containers=containers, labels=labels or {}, revisionHistoryLimit=5, **spec)
        return kube.apply(SS_PATH, body)

    return apply


def stored(kube: Kube, namespace: str, ss_name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get(
        f"/apis/apps/v1/namespaces/{namespace}/controllerrevisions",
        labelSelector=f"{REVISION_LABEL_SIDECARSET}={ss_name}",
    )["items"]
    return sorted(items, key=lambda r: r["revision"])


def image_of(rev: dict[str, Any]) -> str:
    image: str = rev["data"]["spec"]["containers"][0]["image"]
    return image


@pytest.mark.versions
def test_twelve_applies_keep_five_revisions_and_rollback_reuses_one(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, namespace: str, ss_name: str, apply: Apply
) -> None:
    latest = ""
    for i in range(1, 13):
        ss = apply(f"proxy:{i}")
        latest, collisions = aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use=set()))
        assert collisions == 0
    revs = stored(kube, namespace, ss_name)
    assert [image_of(r) for r in revs] == [f"proxy:{i}" for i in range(8, 13)]
    assert [r["revision"] for r in revs] == list(range(8, 13))
    assert revs[-1]["metadata"]["name"] == latest
    assert revs[-1]["data"] == revision_data(model(ss))
    owner = revs[-1]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("SidecarSet", ss_name, ss["metadata"]["uid"])

    # Re-applying an older spec renumbers its revision; no object is created or deleted.
    names_before = {r["metadata"]["name"] for r in revs}
    old = next(r for r in revs if image_of(r) == "proxy:9")
    ss = apply("proxy:9")
    latest, _ = aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use=set()))
    after = stored(kube, namespace, ss_name)
    assert {r["metadata"]["name"] for r in after} == names_before
    assert latest == old["metadata"]["name"]
    assert after[-1]["metadata"]["name"] == latest
    assert after[-1]["revision"] == 13
    assert after[-1]["metadata"]["uid"] == old["metadata"]["uid"], "the same object, renumbered"

    # An unchanged spec (only the update strategy differs) is a no-op.
    ss = apply("proxy:9", updateStrategy={"type": "RollingUpdate", "paused": True})
    assert aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use=set()))[0] == latest
    assert [r["revision"] for r in stored(kube, namespace, ss_name)] == [r["revision"] for r in after]


def test_revisions_in_use_or_pinned_survive_truncation(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, namespace: str, ss_name: str, apply: Apply
) -> None:
    names: dict[int, str] = {}
    for i in range(1, 4):
        ss = apply(f"proxy:{i}")
        names[i] = aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use=set()))[0]
    pin = {"revision": {"revisionName": names[2]}}
    for i in range(4, 13):
        ss = apply(f"proxy:{i}", injectionStrategy=pin)
        aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use={names[1]}))
    revs = stored(kube, namespace, ss_name)
    kept = [image_of(r) for r in revs]
    assert kept == ["proxy:1", "proxy:2", "proxy:10", "proxy:11", "proxy:12"]
    assert resolve_pinned(model(ss), revs) == next(r for r in revs if r["metadata"]["name"] == names[2])


def test_custom_version_label_is_kept_on_the_latest_revision(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, namespace: str, ss_name: str, apply: Apply
) -> None:
    ss = apply("proxy:1", labels={SS_LABEL_CUSTOM_VERSION: "v1"})
    v1, _ = aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use=set()))
    ss = apply("proxy:2", labels={SS_LABEL_CUSTOM_VERSION: "v2"})
    aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use=set()))
    ss = apply("proxy:2", labels={SS_LABEL_CUSTOM_VERSION: "v2b"})  # relabel only: reused, label patched
    v2b, _ = aloop.run(sync_history(kube_client, model(ss), namespace=namespace, in_use=set()))
    revs = stored(kube, namespace, ss_name)
    assert len(revs) == 2
    assert revs[-1]["metadata"]["labels"][SS_LABEL_CUSTOM_VERSION] == "v2b"
    pinned = {**ss, "spec": {**ss["spec"], "injectionStrategy": {"revision": {"customVersion": "v1"}}}}
    resolved = resolve_pinned(model(pinned), revs)
    assert resolved is not None and resolved["metadata"]["name"] == v1
    assert revs[-1]["metadata"]["name"] == v2b
    # Owned by the SidecarSet, so the garbage collector deletes them with it (not waited for here:
    # it notices a freshly installed CRD only on its next discovery pass, ~30 s).
    for r in revs:
        (owner,) = r["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "sidecarctl.io/v1alpha1",
            "kind": "SidecarSet",
            "name": ss_name,
            "uid": ss["metadata"]["uid"],
            "controller": True,
        }
