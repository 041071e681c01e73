"""Which pods a SidecarSet owns, the status counters, and when the status needs writing."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from sidecarsets.jsontypes import JsonObj
from sidecarsets.names import ANN_INJECTED_LIST, ANN_INPLACE_STATE, NS_NAME_LABEL
from sidecarsets.projection import PodProjection, project
from sidecarsets.status import compute_status, matched_pods, status_changed
from tests.unit.podbuild import T0, image_id, pod, sidecarset, with_images

NS = {"shop": {NS_NAME_LABEL: "shop", "env": "prod"}, "dev": {NS_NAME_LABEL: "dev", "env": "dev"}}


def names(pods: list[PodProjection]) -> list[str]:
    return [p.name for p in pods]


def in_flight(old: JsonObj, new: JsonObj, name: str = "moving") -> JsonObj:
    """A pod patched from `old` to `new` whose kubelet still runs the old sidecar image."""
    raw = pod(name, new)
    old_image = old["spec"]["containers"][0]["image"]
    raw["status"]["containerStatuses"][0].update(image=old_image, imageID=image_id(old_image))
    raw["metadata"]["annotations"][ANN_INPLACE_STATE] = orjson.dumps(
        {
            "mesh": {
                "revision": "r2",
                "updateTimestamp": T0,
                "lastContainerStatuses": {"envoy": {"imageID": image_id(old_image)}},
            }
        }
    ).decode()
    return raw


class TestMatching:
    def test_selector_and_injected_list(self) -> None:
        ss = sidecarset()
        pods = [
            project(pod("in", ss)),
            project(pod("other-app", ss, labels={"app": "blog"})),
        ]
        not_listed = pod("not-listed", ss)
        not_listed["metadata"]["annotations"][ANN_INJECTED_LIST] = "logging"
        pods.append(project(not_listed))
        assert names(matched_pods(ss, pods, NS)) == ["in"]

    def test_inactive_pods_are_not_matched(self) -> None:
        ss = sidecarset()
        pods = [
            project(pod("running", ss)),
            project(pod("pending", ss, phase="Pending")),
            project(pod("done", ss, phase="Succeeded")),
            project(pod("failed", ss, phase="Failed")),
            project(pod("deleting", ss, deleting=True)),
        ]
        assert names(matched_pods(ss, pods, NS)) == ["running", "pending"]

    def test_pod_missing_a_sidecar_is_not_consistent(self) -> None:
        two = sidecarset(containers=[{"name": "envoy", "image": "e:1"}, {"name": "log", "image": "l:1"}])
        one = sidecarset(containers=[{"name": "envoy", "image": "e:1"}])
        assert names(matched_pods(two, [project(pod("a", one)), project(pod("b", two))], NS)) == ["b"]

    def test_hot_upgrade_containers_are_present_as_a_pair(self) -> None:
        hot = sidecarset(
            containers=[{"name": "envoy", "image": "e:1", "upgradeStrategy": {"upgradeType": "HotUpgrade"}}]
        )
        pair = sidecarset(containers=[{"name": "envoy-1", "image": "e:1"}, {"name": "envoy-2", "image": "empty:1"}])
        plain = sidecarset(containers=[{"name": "envoy", "image": "e:1"}])
        pods = [project(pod("pair", pair)), project(pod("plain", plain))]
        assert names(matched_pods(hot, pods, NS)) == ["pair"]

    def test_native_sidecars_must_be_in_init_containers(self) -> None:
        ss = sidecarset(initContainers=[{"name": "proxy", "image": "p:1", "restartPolicy": "Always"}])
        with_init = pod("with", ss)
        with_init["spec"]["initContainers"] = [{"name": "proxy", "image": "p:1", "restartPolicy": "Always"}]
        without = pod("without", ss)
        assert names(matched_pods(ss, [project(with_init), project(without)], NS)) == ["with"]

    def test_plain_init_containers_are_not_required(self) -> None:
        ss = sidecarset(initContainers=[{"name": "setup", "image": "s:1"}])
        assert names(matched_pods(ss, [project(pod("a", ss))], NS)) == ["a"]

    @pytest.mark.parametrize(
        ("extra", "expected"),
        [
            ({}, ["a", "b", "c"]),
            ({"namespaceSelector": {"matchLabels": {"env": "prod"}}}, ["a"]),
            ({"namespaceSelector": {"matchLabels": {NS_NAME_LABEL: "dev"}}}, ["b"]),
            # unknown namespace: a selector on its name alone can still be decided
            ({"namespaceSelector": {"matchLabels": {NS_NAME_LABEL: "new"}}}, ["c"]),
            (
                {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": NS_NAME_LABEL, "operator": "NotIn", "values": ["shop"]}]
                    }
                },
                ["b", "c"],
            ),
            # ... anything else about an unknown namespace is not guessed
            (
                {"namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}},
                ["b"],
            ),
            ({"namespace": "dev"}, ["b"]),
            # spec.namespace overrides namespaceSelector
            ({"namespace": "dev", "namespaceSelector": {"matchLabels": {"env": "prod"}}}, ["b"]),
        ],
    )
    def test_namespaces(self, extra: dict[str, Any], expected: list[str]) -> None:
        ss = sidecarset(**extra)
        pods = [
            project(pod("a", ss, namespace="shop")),
            project(pod("b", ss, namespace="dev")),
            project(pod("c", ss, namespace="new")),
        ]
        assert names(matched_pods(ss, pods, NS)) == expected

    def test_known_namespace_without_the_name_label(self) -> None:
        ss = sidecarset(namespace="legacy")
        assert names(matched_pods(ss, [project(pod("a", ss, namespace="legacy"))], {"legacy": {}})) == ["a"]

    @pytest.mark.parametrize("selector", [{}, {"matchLabels": {}}])
    def test_empty_selector_matches_nothing(self, selector: JsonObj) -> None:
        ss = sidecarset(selector=selector)
        assert matched_pods(ss, [project(pod("a", ss))], NS) == []

    def test_missing_selector_or_name(self) -> None:
        ss = sidecarset()
        del ss["spec"]["selector"]
        assert matched_pods(ss, [project(pod("a", sidecarset()))], NS) == []
        nameless = sidecarset()
        nameless["metadata"] = {}
        assert matched_pods(nameless, [project(pod("a", sidecarset()))], NS) == []


class TestComputeStatus:
    def test_counts(self) -> None:
        v1 = sidecarset(generation=3)
        v2 = with_images(v1, envoy="envoy:v2")
        pods = [
            project(pod("old-ready", v1)),
            project(pod("old-not-ready", v1, ready=False)),
            project(pod("new-ready", v2)),
            project(pod("new-pending", v2, phase="Pending", ready=False, with_statuses=False)),
            project(in_flight(v1, v2)),
        ]
        status = compute_status(v2, pods, latest_revision="mesh-abc", collision_count=0)
        assert status == {
            "observedGeneration": 4,
            "matchedPods": 5,
            "updatedPods": 3,
            "readyPods": 2,  # old-ready, new-ready; the in-flight pod is Ready but not consistent
            "updatedReadyPods": 1,
            "latestRevision": "mesh-abc",
            "collisionCount": 0,
        }

    def test_ready_needs_running_and_not_deleting(self) -> None:
        ss = sidecarset()
        pods = [project(pod("a", ss, phase="Pending")), project(pod("b", ss, deleting=True))]
        assert compute_status(ss, pods, latest_revision=None, collision_count=None)["readyPods"] == 0

    def test_ready_needs_every_container_reported(self) -> None:
        ss = sidecarset()
        raw = pod("a", ss)
        raw["status"]["containerStatuses"].pop()
        assert compute_status(ss, [project(raw)], latest_revision=None, collision_count=None)["readyPods"] == 0

    def test_optional_fields_are_omitted(self) -> None:
        ss = sidecarset()
        del ss["metadata"]["generation"]
        status = compute_status(ss, [], latest_revision=None, collision_count=None)
        assert status == {"matchedPods": 0, "updatedPods": 0, "readyPods": 0, "updatedReadyPods": 0}


class TestStatusChanged:
    NEW = {"observedGeneration": 2, "matchedPods": 3, "updatedPods": 1, "readyPods": 3, "updatedReadyPods": 0}

    def test_no_old_status(self) -> None:
        assert status_changed(None, self.NEW)

    def test_key_order_and_omitted_zero_are_not_changes(self) -> None:
        old = {"readyPods": 3, "updatedPods": 1, "matchedPods": 3, "observedGeneration": 2}
        assert not status_changed(old, self.NEW)
        assert not status_changed({**old, "latestRevision": None}, self.NEW)

    @pytest.mark.parametrize(
        "change", [{"readyPods": 2}, {"observedGeneration": 1}, {"latestRevision": "x"}, {"collisionCount": 1}]
    )
    def test_real_changes(self, change: JsonObj) -> None:
        assert status_changed(self.NEW, {**self.NEW, **change})
