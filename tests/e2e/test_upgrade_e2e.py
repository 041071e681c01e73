"""In-place sidecar upgrades on the real API server, with the fake kubelet restarting containers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sidecarsets.spec import names
from tests.e2e.helpers import (
    SS_PATH,
    container_status,
    create_ready_pods,
    image_of,
    pods,
    ready,
    set_image,
    upgradable,
    wait_injecting,
    wait_status,
)
from tests.kube.builders import image_id
from tests.kube.client import Kube, eventually
from tests.kube.fakekubelet import FakeKubelet


def _proxy_only(app: str, sidecarsets: Callable[..., dict[str, Any]], **strategy: Any) -> str:
    ss = sidecarsets(app, initContainers=[], updateStrategy={"type": "RollingUpdate", **strategy})
    return str(ss["metadata"]["name"])


def _setup(
    kube: Kube, ns: str, app: str, sidecarsets: Callable[..., dict[str, Any]], count: int, **strategy: Any
) -> tuple[str, list[dict[str, Any]]]:
    name = _proxy_only(app, sidecarsets, **strategy)
    wait_injecting(kube, ns, app, lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    before = create_ready_pods(kube, ns, app, count)
    wait_status(kube, name, matchedPods=count, updatedPods=count, readyPods=count)
    return name, before


def _updated(pod: dict[str, Any], image: str) -> bool:
    return image_of(pod, "proxy") == image


@pytest.mark.versions
def test_bad_image_stops_at_max_unavailable_and_fixing_it_completes(
    kube: Kube, injected_ns: str, kubelet: FakeKubelet, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name, before = _setup(kube, injected_ns, "bad", sidecarsets, 4, maxUnavailable="50%")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before}
    kubelet.bad_images.add("proxy:bad")
    set_image(kube, name, "proxy:bad")
    eventually(lambda: sum(_updated(p, "proxy:bad") for p in pods(kube, injected_ns, "bad")) == 2, timeout=20)
    time.sleep(3)  # give the controller every chance to overshoot
    now = pods(kube, injected_ns, "bad")
    stuck = [p for p in now if _updated(p, "proxy:bad")]
    untouched = [p for p in now if _updated(p, "proxy:1")]
    assert len(stuck) == 2 and len(untouched) == 2
    assert not any(ready(p) for p in stuck)
    assert all(ready(p) for p in untouched)
    for p in stuck:
        state = orjson.loads(p["metadata"]["annotations"][names.ANN_INPLACE_STATE])[name]
        assert state["lastContainerStatuses"]["proxy"]["imageID"] == image_id("proxy:1")
    wait_status(kube, name, matchedPods=4, updatedPods=2, readyPods=2, updatedReadyPods=0)

    set_image(kube, name, "proxy:2")

    def all_done() -> list[dict[str, Any]] | None:
        got = pods(kube, injected_ns, "bad")
        return got if all(_updated(p, "proxy:2") and ready(p) for p in got) else None

    done = eventually(all_done, timeout=60, what="all 4 pods on proxy:2 and Ready")
    wait_status(kube, name, matchedPods=4, updatedPods=4, readyPods=4, updatedReadyPods=4)
    for p in done:
        assert p["metadata"]["uid"] == uids[p["metadata"]["name"]], "pod was recreated"
        assert container_status(p, "app")["restartCount"] == 0, "app container was restarted"
        assert container_status(p, "proxy")["imageID"] == image_id("proxy:2")
        assert [c["name"] for c in p["spec"]["containers"]] == ["proxy", "app"]


def test_partition_holds_back_exactly_that_many(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name, _ = _setup(kube, injected_ns, "part", sidecarsets, 4, partition=3, maxUnavailable="100%")
    set_image(kube, name, "proxy:2")
    wait_status(kube, name, updatedPods=1, updatedReadyPods=1, readyPods=4)
    time.sleep(2)
    assert sum(_updated(p, "proxy:2") for p in pods(kube, injected_ns, "part")) == 1
    kube.patch(f"{SS_PATH}/{name}", {"spec": {"updateStrategy": {"partition": "50%"}}})
    wait_status(kube, name, updatedPods=2, updatedReadyPods=2)
    time.sleep(2)
    assert sum(_updated(p, "proxy:2") for p in pods(kube, injected_ns, "part")) == 2


def test_update_selector_upgrades_only_matching_pods(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name, before = _setup(
        kube,
        injected_ns,
        "sel",
        sidecarsets,
        4,
        maxUnavailable="100%",
        selector={"matchLabels": {"canary": "true"}},
    )
    for p in before[:2]:
        kube.patch(
            f"/api/v1/namespaces/{injected_ns}/pods/{p['metadata']['name']}",
            {"metadata": {"labels": {"canary": "true"}}},
        )
    set_image(kube, name, "proxy:2")
    wait_status(kube, name, updatedPods=2, updatedReadyPods=2)
    time.sleep(2)
    got = {p["metadata"]["name"]: image_of(p, "proxy") for p in pods(kube, injected_ns, "sel")}
    assert got == {"sel-0": "proxy:2", "sel-1": "proxy:2", "sel-2": "proxy:1", "sel-3": "proxy:1"}


def test_paused_holds_everything_until_resumed(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name, _ = _setup(kube, injected_ns, "pause", sidecarsets, 3, paused=True, maxUnavailable="100%")
    set_image(kube, name, "proxy:2")
    time.sleep(3)
    assert all(_updated(p, "proxy:1") for p in pods(kube, injected_ns, "pause"))
    st = wait_status(kube, name, matchedPods=3, updatedPods=0, readyPods=3)
    assert st["observedGeneration"] == kube.get(f"{SS_PATH}/{name}")["metadata"]["generation"]
    kube.patch(f"{SS_PATH}/{name}", {"spec": {"updateStrategy": {"paused": False}}})
    wait_status(kube, name, updatedPods=3, updatedReadyPods=3, timeout=40)


def test_env_change_is_not_rolled_and_is_reported(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name, _ = _setup(kube, injected_ns, "envc", sidecarsets, 2, maxUnavailable="100%")
    kube.patch(
        f"{SS_PATH}/{name}",
        [
            {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "MODE", "value": "strict"}]},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:2"},
        ],
        patch_type="json",
    )

    def marked() -> list[dict[str, Any]] | None:
        ps = pods(kube, injected_ns, "envc")
        return ps if all(upgradable(p) == "False" for p in ps) else None

    got = eventually(marked, timeout=20, what="pods marked SidecarSetUpgradable=False")
    assert all(_updated(p, "proxy:1") for p in got)
    wait_status(kube, name, matchedPods=2, updatedPods=0)

    def event() -> bool:
        evs = kube.get("/api/v1/events", fieldSelector=f"involvedObject.name={name}")["items"]
        return any(e["reason"] == "NotUpgradablePods" for e in evs)

    eventually(event, timeout=10, what="NotUpgradablePods event")


def test_patch_pod_metadata_is_reapplied_by_the_upgrade(
    kube: Kube, injected_ns: str, kubelet: FakeKubelet, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    """As Kruise: a patchPodMetadata change alone reaches no pod; the next image upgrade brings it,
    in the same patch (Overwrite, MergePatchJson, and Retain for keys the pod lacks)."""
    patches = [
        {"patchPolicy": "Overwrite", "annotations": {"mesh.example/level": "1"}},
        {"patchPolicy": "MergePatchJson", "annotations": {"mesh.example/config": '{"log":"info"}'}},
    ]
    ss = sidecarsets("meta", initContainers=[], updateStrategy={"type": "RollingUpdate"}, patchPodMetadata=patches)
    name = ss["metadata"]["name"]
    wait_injecting(kube, injected_ns, "meta", lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    create_ready_pods(kube, injected_ns, "meta", 2)
    wait_status(kube, name, matchedPods=2, updatedPods=2, readyPods=2)
    changed = [
        {"patchPolicy": "Overwrite", "annotations": {"mesh.example/level": "2"}},
        {"patchPolicy": "MergePatchJson", "annotations": {"mesh.example/config": '{"mesh":"on"}'}},
        {"patchPolicy": "Retain", "annotations": {"mesh.example/added": "yes"}},
    ]
    kube.patch(f"{SS_PATH}/{name}", {"spec": {"patchPodMetadata": changed}})
    time.sleep(2)
    for p in pods(kube, injected_ns, "meta"):  # no image change: nothing rolled
        assert p["metadata"]["annotations"]["mesh.example/level"] == "1"
    set_image(kube, name, "proxy:2")

    def upgraded() -> list[dict[str, Any]] | None:
        got = pods(kube, injected_ns, "meta")
        return got if all(_updated(p, "proxy:2") for p in got) else None

    for p in eventually(upgraded, timeout=30, what="both pods on proxy:2"):
        annotations = p["metadata"]["annotations"]
        assert annotations["mesh.example/level"] == "2"
        assert annotations["mesh.example/config"] == '{"log":"info","mesh":"on"}'
        assert annotations["mesh.example/added"] == "yes"


@pytest.mark.versions
def test_a_native_sidecar_is_rolled_in_place(
    kube: Kube, injected_ns: str, kubelet: FakeKubelet, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    """An init container with restartPolicy Always gets its new image in place (Kruise refuses):
    same pods, the app untouched, the status counting it, maxUnavailable respected."""
    agent = {"name": "mesh-agent", "image": "agent:1", "restartPolicy": "Always"}
    ss = sidecarsets("native", initContainers=[agent], updateStrategy={"type": "RollingUpdate", "maxUnavailable": 1})
    name = ss["metadata"]["name"]
    wait_injecting(
        kube,
        injected_ns,
        "native",
        lambda p: "mesh-agent" in [c["name"] for c in p["spec"].get("initContainers") or []],
    )
    before = create_ready_pods(kube, injected_ns, "native", 3)
    wait_status(kube, name, matchedPods=3, updatedPods=3, readyPods=3)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before}
    kube.patch(f"{SS_PATH}/{name}", {"spec": {"initContainers": [{**agent, "image": "agent:2"}]}})

    def agent_image(p: dict[str, Any]) -> str:
        return str(next(c["image"] for c in p["spec"]["initContainers"] if c["name"] == "mesh-agent"))

    def agent_running(p: dict[str, Any]) -> str:
        statuses = (p.get("status") or {}).get("initContainerStatuses") or []
        return str(next((c.get("image") for c in statuses if c["name"] == "mesh-agent"), ""))

    most_down = 0

    def rolled() -> list[dict[str, Any]] | None:
        nonlocal most_down
        got = pods(kube, injected_ns, "native")
        most_down = max(most_down, sum(1 for p in got if not ready(p)))
        # The spec's image alone is not enough: a pod patched a moment ago is still Ready on agent:1
        # until the kubelet restarts it, so its status must report the new image too.
        return got if all(agent_image(p) == "agent:2" == agent_running(p) and ready(p) for p in got) else None

    done = eventually(rolled, timeout=60, interval=0.05, what="the native sidecar rolled to agent:2")
    wait_status(kube, name, matchedPods=3, updatedPods=3, readyPods=3, updatedReadyPods=3)
    assert most_down <= 1, "maxUnavailable 1"
    for p in done:
        assert p["metadata"]["uid"] == uids[p["metadata"]["name"]], "pod was recreated"
        assert container_status(p, "app")["restartCount"] == 0, "the app container was restarted"
        init = next(s for s in p["status"]["initContainerStatuses"] if s["name"] == "mesh-agent")
        assert init["image"] == "agent:2" and init["imageID"] == image_id("agent:2")
        assert init["restartCount"] == 1
