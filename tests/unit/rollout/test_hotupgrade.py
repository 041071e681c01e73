"""HotUpgrade in the planner: Kruise's upgrade, flip and status sequence, on pods as injection leaves them.

Reproduces Kruise's TestUpdateHotUpgradeSidecar (status per round: matched, updated, ready,
updatedReady) and its annotation sequence over two upgrades, and checks that through every
step one container of the pair is running the served version.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.projection import project
from sidecarsets.rollout import hotupgrade
from sidecarsets.rollout.planner import Plan, Stage, plan_upgrade
from sidecarsets.rollout.status import compute_status, matched_pods, pod_verdicts
from sidecarsets.spec import hotsidecars, names
from tests.kube.builders import apply_patch, image_id, injected_pod, kubelet_sync, model, shop_sidecarset

EMPTY = "envoy-empty:1"
NS_LABELS = {"shop": {"kubernetes.io/metadata.name": "shop"}}


def hot_set(image: str, rv: str, **strategy: Any) -> JsonObj:
    ss = shop_sidecarset(
        containers=[
            {
                "name": "envoy",
                "image": image,
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY},
            }
        ]
    )
    ss["metadata"]["resourceVersion"] = rv
    ss["spec"]["updateStrategy"] = {"type": "RollingUpdate", **(strategy or {"maxUnavailable": 1})}
    return ss


V1, V2, V3 = hot_set("envoy:v1", "R1"), hot_set("envoy:v2", "R2"), hot_set("envoy:v3", "R3")


def counts(ss: JsonObj, raws: list[JsonObj]) -> tuple[int, int, int, int]:
    m = model(ss)
    pods = matched_pods(m, [project(r) for r in raws], NS_LABELS)
    st = compute_status(m, pods, latest_revision="r", collision_count=0, verdicts=pod_verdicts(m, pods))
    return st["matchedPods"], st["updatedPods"], st["readyPods"], st["updatedReadyPods"]


def step(ss: JsonObj, raws: list[JsonObj]) -> tuple[Plan, list[JsonObj]]:
    p = plan_upgrade(model(ss), [project(r) for r in raws], revision="r", now="2024-06-01T12:00:00Z")
    by_name = {u.name: u for u in p.upgrades}
    out = [
        apply_patch(r, by_name[r["metadata"]["name"]].patch) if r["metadata"]["name"] in by_name else r for r in raws
    ]
    return p, out


def images(raw: JsonObj) -> tuple[str, str]:
    by = {c["name"]: c["image"] for c in raw["spec"]["containers"]}
    return by["envoy-1"], by["envoy-2"]


def versions(raw: JsonObj) -> tuple[str, str, str, str, str]:
    a = raw["metadata"]["annotations"]
    working = orjson.loads(a[names.ANN_WORKING_HOT])["envoy"]
    return (
        working[-2:],
        a[names.ANN_VERSION_PREFIX + "envoy-1"],
        a[names.ANN_VERSION_ALT_PREFIX + "envoy-1"],
        a[names.ANN_VERSION_PREFIX + "envoy-2"],
        a[names.ANN_VERSION_ALT_PREFIX + "envoy-2"],
    )


def test_injection_leaves_the_pair_with_the_second_on_the_empty_image() -> None:
    pod = injected_pod("p0", V1)
    assert images(pod) == ("envoy:v1", EMPTY)
    assert versions(pod) == ("-1", "1", "0", "0", "1")
    assert counts(V1, [pod]) == (1, 1, 1, 1)


def test_kruise_update_hot_upgrade_sidecar_rounds() -> None:
    pods = [injected_pod("p0", V1)]
    assert counts(V2, pods) == (1, 0, 1, 0)
    p, pods = step(V2, pods)  # round 1: the idle -2 gets v2, and serves from now on
    assert p.stage is Stage.UPGRADING and images(pods[0]) == ("envoy:v1", "envoy:v2")
    assert versions(pods[0]) == ("-2", "1", "R2", "R2", "1")
    assert counts(V2, pods) == (1, 1, 0, 0)
    p, pods = step(V2, pods)  # round 2: the kubelet has not started -2 on v2: no flip
    assert p.upgrades == () and images(pods[0]) == ("envoy:v1", "envoy:v2")
    pods = [kubelet_sync(pods[0])]
    assert counts(V2, pods) == (1, 1, 0, 0), "-1 not yet on the empty image: not ready"
    p, pods = step(V2, pods)  # round 3: -2 runs v2: the flip empties -1
    assert p.stage is Stage.FLIPPING and images(pods[0]) == (EMPTY, "envoy:v2")
    assert versions(pods[0]) == ("-2", "0", "R2", "R2", "0")
    state = orjson.loads(pods[0]["metadata"]["annotations"][names.ANN_INPLACE_STATE])["mesh"]
    assert state["lastContainerStatuses"]["envoy-1"] == {"imageID": image_id("envoy:v1")}
    assert counts(V2, pods) == (1, 1, 0, 0)
    pods = [kubelet_sync(pods[0])]
    assert counts(V2, pods) == (1, 1, 1, 1)
    p, _ = step(V2, pods)
    assert p.stage is Stage.DONE


def test_a_second_upgrade_goes_back_to_the_first_container() -> None:
    pods = [injected_pod("p0", V1)]
    for ss in (V2, V3):
        _, pods = step(ss, pods)
        pods = [kubelet_sync(pods[0])]
        _, pods = step(ss, pods)
        pods = [kubelet_sync(pods[0])]
    assert images(pods[0]) == ("envoy:v3", EMPTY)
    # Kruise: the upgraded container's version is the SidecarSet's resourceVersion, its alt the
    # partner's version before; the partner's alt the new one; the flip zeroes the old pair.
    assert versions(pods[0]) == ("-1", "R3", "0", "0", "R3")
    assert counts(V3, pods) == (1, 1, 1, 1)


def test_one_container_of_the_pair_runs_the_served_image_at_every_step() -> None:
    pods = [injected_pod(f"p{i}", V1) for i in range(5)]
    for _ in range(40):
        p, pods = step(V2, pods)
        for raw in pods:
            running = {s["name"]: s for s in raw["status"]["containerStatuses"]}
            serving = [c for c in ("envoy-1", "envoy-2") if running[c]["image"] != EMPTY and running[c]["ready"]]
            assert serving, f"{raw['metadata']['name']}: no container of the pair runs the sidecar"
        pods = [kubelet_sync(r) for r in pods]
        if p.stage is Stage.DONE and counts(V2, pods) == (5, 5, 5, 5):
            break
    assert all(images(r) == (EMPTY, "envoy:v2") for r in pods)


def test_max_unavailable_holds_until_the_flip_is_done() -> None:
    pods = [injected_pod(f"p{i}", V1) for i in range(3)]
    p, pods = step(V2, pods)
    assert [u.name for u in p.upgrades] == ["p0"]
    p, pods = step(V2, pods)
    assert p.upgrades == (), "p0 is mid hot upgrade: the budget of one is spent"
    pods[0] = kubelet_sync(pods[0])
    p, pods = step(V2, pods)
    assert p.stage is Stage.FLIPPING and [u.name for u in p.upgrades] == ["p0"]
    p, pods = step(V2, pods)
    assert p.upgrades == (), "flipped but the empty container not restarted yet"
    pods[0] = kubelet_sync(pods[0])
    p, _ = step(V2, pods)
    assert [u.name for u in p.upgrades] == ["p1"]


def test_a_pod_without_the_working_annotation_upgrades_the_first_container() -> None:
    """Kruise reads a missing working entry as `-2` serving: `-1` is upgraded, unless one of the
    pair is on the empty image (then that one is)."""
    pod = injected_pod("p0", V1)
    del pod["metadata"]["annotations"][names.ANN_WORKING_HOT]
    h = hotsidecars.hot_sidecars(model(V2))[0]
    assert hotupgrade.working(project(pod), h) == "envoy-2"
    assert hotupgrade.to_upgrade(project(pod), h, consistent=lambda c: True) == "envoy-2", "the empty one first"
    both = copy.deepcopy(pod)
    both["spec"]["containers"][1]["image"] = "envoy:v0"
    assert hotupgrade.to_upgrade(project(both), h, consistent=lambda c: True) == "envoy-1"
