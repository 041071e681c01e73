"""The SidecarSet API and controller on the real API server: validation, status, history, pinning."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from kuberuntime import api
from sidecarsets.spec import names
from tests.e2e.helpers import (
    SS_PATH,
    create_ready_pods,
    make_pod,
    make_sidecarset,
    pods,
    set_image,
    wait_injecting,
    wait_status,
)
from tests.kube.client import Kube, eventually
from tests.kube.managerharness import MANAGER_NS, RunningManager

CR_PATH = f"/apis/apps/v1/namespaces/{MANAGER_NS}/controllerrevisions"

pytestmark = pytest.mark.versions


def _rejected(kube: Kube, body: dict[str, Any]) -> str:
    with pytest.raises(api.ApiError) as err:
        kube.create(SS_PATH, body)
    assert err.value.status in (400, 403, 422), err.value
    return err.value.message


def test_schema_rejects_malformed_sidecarsets(kube: Kube, manager: RunningManager) -> None:
    msg = _rejected(kube, make_sidecarset("bad-types", "x", containers="nope"))
    assert "spec.containers" in msg
    msg = _rejected(
        kube, make_sidecarset("bad-enum", "x", containers=[{"name": "p", "image": "p", "podInjectPolicy": "Sideways"}])
    )
    assert "podInjectPolicy" in msg and "Sideways" in msg
    msg = _rejected(kube, make_sidecarset("empty-selector", "x", selector={}))
    assert "selector" in msg
    msg = _rejected(
        kube,
        make_sidecarset(
            "both-partition-and-selector",
            "x",
            updateStrategy={"partition": 1, "selector": {"matchLabels": {"a": "b"}}},
        ),
    )
    assert "artition" in msg


def test_webhook_rejects_what_the_schema_cannot_express(kube: Kube, manager: RunningManager) -> None:
    dup = make_sidecarset(
        "dup-names",
        "x",
        containers=[{"name": "proxy", "image": "p:1"}, {"name": "proxy", "image": "p:2"}],
    )
    msg = _rejected(kube, dup)
    assert "denied the request" in msg and "proxy" in msg
    bad_transfer = make_sidecarset(
        "bad-transfer",
        "x",
        containers=[
            {
                "name": "proxy",
                "image": "p:1",
                "transferEnv": [
                    {
                        "sourceContainerNameFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
                        "envName": "X",
                    }
                ],
            }
        ],
    )
    msg = _rejected(kube, bad_transfer)
    assert "fieldPath" in msg or "transferEnv" in msg


def test_overlapping_sidecarset_with_same_container_name_is_rejected(
    kube: Kube, manager: RunningManager, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    first = sidecarsets("overlap")
    second = make_sidecarset("overlap-second", "overlap")

    # Each admission worker checks against its own watch of the SidecarSets, which may lag the first
    # create by a moment: a dry run until one rejects it, then every real create is rejected.
    def rejected_now() -> str | None:
        try:
            kube.create(SS_PATH, second, dryRun="All")
        except api.ApiError as e:
            return e.message
        return None

    try:
        eventually(rejected_now, timeout=10, what="the validating webhook sees the first SidecarSet")
        time.sleep(0.5)  # every worker's watch
        msg = _rejected(kube, second)
    finally:
        if kube.get_or_none(f"{SS_PATH}/overlap-second") is not None:
            kube.delete(f"{SS_PATH}/overlap-second")
    assert first["metadata"]["name"] in msg and "proxy" in msg
    # Disjoint selectors do not conflict.
    disjoint = make_sidecarset("overlap-disjoint", "other-app")
    kube.create(SS_PATH, disjoint)
    kube.delete(f"{SS_PATH}/overlap-disjoint")


def test_containers_cannot_be_added_on_update(
    kube: Kube, manager: RunningManager, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    ss = sidecarsets("noadd")
    with pytest.raises(api.ApiError) as err:
        kube.patch(
            f"{SS_PATH}/{ss['metadata']['name']}",
            [{"op": "add", "path": "/spec/containers/-", "value": {"name": "extra", "image": "e:1"}}],
            patch_type="json",
        )
    assert "extra" in err.value.message


def test_status_follows_pods_through_create_ready_and_delete(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    ss = sidecarsets("stat", initContainers=[])
    name = ss["metadata"]["name"]
    wait_injecting(kube, injected_ns, "stat", lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    st = wait_status(kube, name, matchedPods=0, updatedPods=0, readyPods=0)
    assert st["observedGeneration"] == ss["metadata"]["generation"]
    assert st["latestRevision"].startswith(name + "-")
    create_ready_pods(kube, injected_ns, "stat", 3)
    wait_status(kube, name, matchedPods=3, updatedPods=3, readyPods=3, updatedReadyPods=3)
    kube.delete(f"/api/v1/namespaces/{injected_ns}/pods/stat-0", gracePeriodSeconds=0)
    wait_status(kube, name, matchedPods=2, updatedPods=2, readyPods=2)
    # A pod whose sidecar was injected by another SidecarSet is not counted.
    kube.create(f"/api/v1/namespaces/{injected_ns}/pods", make_pod("other", "unmatched"))
    time.sleep(1)
    wait_status(kube, name, matchedPods=2)


def test_history_is_truncated_to_the_limit_and_rollback_reuses_a_revision(
    kube: Kube, manager: RunningManager, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    ss = sidecarsets("hist", revisionHistoryLimit=3)
    name = ss["metadata"]["name"]

    def revisions() -> list[dict[str, Any]]:
        items = kube.get(CR_PATH, labelSelector=f"{names.REVISION_LABEL_SIDECARSET}={name}")["items"]
        return sorted(items, key=lambda r: r["revision"])

    first = eventually(lambda: revisions() or None, what="first revision")[0]

    def has_revision_for(image: str) -> bool:
        return any(r["data"]["spec"]["containers"][0]["image"] == image for r in revisions())

    for i in range(2, 7):
        set_image(kube, name, f"proxy:{i}")
        image = f"proxy:{i}"
        eventually(lambda: has_revision_for(image), what=f"revision for {image}")  # noqa: B023
    eventually(lambda: len(revisions()) == 3, what="history truncated to 3")
    kept = revisions()
    assert [r["data"]["spec"]["containers"][0]["image"] for r in kept] == ["proxy:4", "proxy:5", "proxy:6"]
    # The status is written after the revision, in the same reconcile (or its retry after a conflict).
    eventually(
        lambda: kube.get(f"{SS_PATH}/{name}").get("status", {}).get("latestRevision") == kept[-1]["metadata"]["name"],
        what="status names the newest revision",
    )
    assert first["metadata"]["name"] not in {r["metadata"]["name"] for r in kept}
    # Rolling back to proxy:5 reuses its revision object and makes it the newest.
    reused = kept[1]["metadata"]["name"]
    set_image(kube, name, "proxy:5")
    eventually(
        lambda: kube.get(f"{SS_PATH}/{name}").get("status", {}).get("latestRevision") == reused,
        what="rollback reuses the proxy:5 revision",
    )
    after = revisions()
    assert len(after) == 3
    assert after[-1]["metadata"]["name"] == reused


def test_pinned_revision_is_injected_into_new_pods(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    ss = sidecarsets("pin", initContainers=[])
    name = ss["metadata"]["name"]
    v1 = eventually(lambda: wait_status(kube, name).get("latestRevision"), what="revision of proxy:1")
    eventually(lambda: kube.get_or_none(f"{CR_PATH}/{v1}"), what="revision object exists")
    # New image, but new pods pinned to the first revision.
    kube.patch(
        f"{SS_PATH}/{name}",
        {
            "spec": {
                "containers": [{"name": "proxy", "image": "proxy:2"}],
                "injectionStrategy": {"revision": {"revisionName": v1, "policy": "Always"}},
                "updateStrategy": {"paused": True},
            }
        },
    )
    wait_injecting(kube, injected_ns, "pin", lambda p: p["spec"]["containers"][0]["image"] == "proxy:1")
    create_ready_pods(kube, injected_ns, "pin", 2)
    assert [p["spec"]["containers"][0]["image"] for p in pods(kube, injected_ns, "pin")] == ["proxy:1", "proxy:1"]
    # A pin to a revision that does not exist is refused at the SidecarSet, not at pod creation.
    with pytest.raises(api.ApiError) as err:
        kube.patch(
            f"{SS_PATH}/{name}",
            {"spec": {"injectionStrategy": {"revision": {"revisionName": "no-such-revision"}}}},
        )
    assert "no-such-revision" in err.value.message
