"""The controller's reconcile against an in-memory API: plan -> patch -> status -> requeue.

A watch is played by the fake API's listener: a test decides when the controller's cache sees a
write (`rig.deliver`), which is how expectations, stale caches and conflicts are exercised.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from kuberuntime import api
from kuberuntime.events import EventRecorder
from kuberuntime.jsontypes import JsonObj
from sidecarsets.controller.controller import REPLAN_SECONDS, RESYNC_SECONDS, SS_PATH, Controller
from sidecarsets.controller.podfailures import PodFailures
from sidecarsets.pods.projection import project
from sidecarsets.spec import names
from tests.kube.builders import injected_pod as pod
from tests.kube.builders import kubelet_sync, with_images
from tests.kube.builders import shop_sidecarset as sidecarset
from tests.kube.fakeapi import FakeApiServer

NS = "shop"
MANAGER_NS = "sidecarctl-system"
V1 = sidecarset()
V2 = with_images(V1, envoy="envoy:v2")


def pod_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}"


def upgrades(result: str) -> float:
    labels = {"sidecarset_namespace": "", "sidecarset": V1["metadata"]["name"], "result": result}
    return REGISTRY.get_sample_value("sidecarctl_inplace_upgrades_total", labels) or 0.0


class Rig:
    def __init__(self, ss: JsonObj, pods: int = 3) -> None:
        self.api = FakeApiServer()
        self.deliver = True
        self.controller = Controller(
            self.api,
            namespace=MANAGER_NS,
            namespaces=lambda: {NS: {"kubernetes.io/metadata.name": NS, names.NS_INJECTION_LABEL: "enabled"}},
            recorder=EventRecorder(self.api),
            clock=lambda: "2024-06-01T12:00:00Z",
            pod_pace=0.0,  # passes are driven one by one here (test_controller_pacing paces them)
        )
        self.api.listeners.append(self._watch)
        self.api.put(f"{SS_PATH}/{ss['metadata']['name']}", ss)
        for i in range(pods):
            self.api.put(pod_path(f"p{i}"), pod(f"p{i}", V1))

    def _watch(self, path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if not self.deliver:
            return
        kind = "DELETED" if new is None else "ADDED" if old is None else "MODIFIED"
        if path.startswith(SS_PATH):
            self.controller.on_sidecarset(kind, old, new)
        elif "/pods/" in path:
            self.controller.on_pod(kind, None if old is None else project(old), None if new is None else project(new))

    def redeliver(self) -> None:
        """The watch catches up: every pod as stored now."""
        for path, obj in self.api.objects.items():
            if "/pods/" in path:
                self.controller.on_pod("MODIFIED", None, project(obj))

    def reconcile(self, name: str = "mesh") -> float | None:
        return asyncio.run(self.controller.reconcile(name))

    def pod(self, name: str) -> JsonObj:
        return self.api.objects[pod_path(name)]

    def kubelet(self, name: str) -> None:
        """The node restarts changed containers on their new images and reports them ready."""
        self.api._store(pod_path(name), kubelet_sync(copy.deepcopy(self.pod(name))))

    def patched_pods(self) -> list[str]:
        return [
            p.rsplit("/", 1)[1] for p in self.api.writes("patch", f"/api/v1/namespaces/{NS}/pods/") if "status" not in p
        ]

    def status_writes(self) -> list[str]:
        return self.api.writes("patch", f"{SS_PATH}/mesh/status")


def envoy_image(obj: JsonObj) -> str:
    return next(str(c["image"]) for c in obj["spec"]["containers"] if c["name"] == "envoy")


def test_one_pod_per_step_within_max_unavailable_then_the_cache_and_the_kubelet_move_it_on() -> None:
    rig = Rig(V2)
    rig.deliver = False
    assert rig.reconcile() is None
    assert rig.patched_pods() == ["p0"], "maxUnavailable 1: one pod"
    assert envoy_image(rig.pod("p0")) == "envoy:v2"
    assert len(rig.status_writes()) == 1
    status = rig.api.objects[f"{SS_PATH}/mesh"]["status"]
    assert (status["matchedPods"], status["updatedPods"], status["readyPods"]) == (3, 0, 3)
    assert set(rig.controller.expected) == {f"{NS}/p0"}

    assert rig.reconcile() == 0.5, "its own write is not in the cache yet: plan nothing"
    assert rig.patched_pods() == ["p0"]

    rig.deliver = True
    rig.redeliver()
    assert rig.controller.expected == {}
    assert rig.reconcile() == RESYNC_SECONDS, "p0 is upgrading: the budget is spent"
    assert rig.patched_pods() == ["p0"]

    rig.kubelet("p0")
    assert rig.reconcile() is None
    assert rig.patched_pods() == ["p0", "p1"]
    status = rig.api.objects[f"{SS_PATH}/mesh"]["status"]
    assert (status["updatedPods"], status["updatedReadyPods"]) == (1, 1)


def test_the_plan_uses_the_pods_the_watch_delivered_while_the_status_was_being_written() -> None:
    rig = Rig(V2, pods=2)
    rig.deliver = False
    assert rig.reconcile() is None
    assert rig.patched_pods() == ["p0"]
    # The status in the cache is stale, so the next pass writes it; the Lease read before that write
    # is when the watch delivers the patch of p0 (upgrading now: unavailable, its budget spent).
    ss = copy.deepcopy(rig.api.objects[f"{SS_PATH}/mesh"])
    ss["status"] = {}
    rig.controller.on_sidecarset("MODIFIED", None, ss)

    async def may_write() -> bool:
        rig.redeliver()
        return True

    rig.controller.lease.may_write = may_write
    before = upgrades("conflict")
    assert rig.reconcile() == RESYNC_SECONDS, "p0 is upgrading: maxUnavailable 1 is spent"
    assert rig.patched_pods() == ["p0"], "neither p0 again (from the older snapshot) nor p1"
    assert upgrades("conflict") == before
    assert rig.controller.expected == {}


def test_a_pod_changed_behind_the_cache_fails_its_resource_version_test_and_is_retried() -> None:
    rig = Rig(V2, pods=1)
    rig.deliver = False
    rig.redeliver()
    # Someone else writes the pod; the controller's cache does not see it.
    stale = copy.deepcopy(rig.pod("p0"))
    stale["metadata"]["labels"]["touched"] = "yes"
    rig.api._store(pod_path("p0"), stale)
    before = upgrades("conflict")
    assert rig.reconcile() == REPLAN_SECONDS, "planned again at once, without the pod"
    retry = rig.reconcile()
    assert retry is not None and 0.4 < retry < 0.7, "the pod backs off on its own, starting near half a second"
    assert upgrades("conflict") == before + 1
    assert envoy_image(rig.pod("p0")) == "envoy:v1", "nothing landed"
    assert rig.controller.expected == {}


def test_a_pod_gone_before_its_patch_is_counted_and_retried() -> None:
    rig = Rig(V2, pods=1)
    rig.api.fail("patch", r"/pods/p0$", api.NotFound(404, "NotFound", "pods p0 not found"))
    before = upgrades("gone")
    assert rig.reconcile() is None, "the watch brings the deletion; nothing to retry"
    assert upgrades("gone") == before + 1
    assert rig.controller.expected == {}


def test_a_status_conflict_raises_so_the_queue_backs_off() -> None:
    rig = Rig(V2, pods=1)
    rig.api.fail("patch", r"/sidecarsets/mesh/status$", api.Conflict(409, "Conflict", "modified"))
    with pytest.raises(api.Conflict):
        rig.reconcile()
    assert rig.patched_pods() == [], "no pod is touched when the status write failed"


def test_a_newer_sidecarset_seen_while_the_status_write_was_on_its_way_back_is_kept() -> None:
    rig = Rig(V1)
    path = f"{SS_PATH}/mesh"

    def edited_meanwhile(p: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if p == path and new is not None and new.get("status") and envoy_image(new) != "envoy:v2":
            rig.api.put(path, {**copy.deepcopy(V2), "status": new["status"]})  # the user's edit, watched first

    rig.api.listeners.append(edited_meanwhile)
    rig.reconcile()
    stored = rig.api.objects[path]
    assert envoy_image(stored) == "envoy:v2"
    cached = rig.controller.sidecarsets["mesh"]
    assert cached.resource_version == stored["metadata"]["resourceVersion"], "the older patch response replaced it"
    assert envoy_image(cached.obj) == "envoy:v2"


def test_status_is_written_only_when_it_changes() -> None:
    rig = Rig(V1)  # nothing to upgrade
    assert rig.reconcile() is None
    assert rig.reconcile() is None
    assert len(rig.status_writes()) == 1
    assert rig.patched_pods() == []


def test_paused_keeps_status_and_touches_no_pod() -> None:
    paused = copy.deepcopy(V2)
    paused["spec"]["updateStrategy"] = {"paused": True}
    rig = Rig(paused)
    assert rig.reconcile() == RESYNC_SECONDS
    assert rig.patched_pods() == []
    assert rig.api.objects[f"{SS_PATH}/mesh"]["status"]["matchedPods"] == 3


def test_a_pod_that_differs_in_more_than_the_image_gets_the_condition_and_one_event() -> None:
    env_changed = copy.deepcopy(V1)
    env_changed["spec"]["containers"][0]["env"] = [{"name": "MODE", "value": "strict"}]
    env_changed["metadata"]["generation"] = 2
    rig = Rig(env_changed, pods=2)
    rig.reconcile()
    status_patches = [p for p in rig.api.writes("patch", f"/api/v1/namespaces/{NS}/pods/") if p.endswith("/status")]
    assert sorted(status_patches) == [pod_path("p0") + "/status", pod_path("p1") + "/status"]
    condition = next(c for c in rig.pod("p0")["status"]["conditions"] if c["type"] == names.POD_CONDITION_UPGRADABLE)
    assert (condition["status"], condition["reason"]) == ("False", "UpdateImmutableField")
    assert orjson.loads(condition["message"]) == {"mesh": False}
    events = [o for p, o in rig.api.objects.items() if "/events/" in p]
    assert [e["reason"] for e in events] == ["NotUpgradablePods"]
    rig.reconcile()
    again = [p for p in rig.api.writes("patch", f"/api/v1/namespaces/{NS}/pods/") if p.endswith("/status")]
    assert again == status_patches, "a condition already in place is not written again"
    assert rig.patched_pods() == []


def test_a_deleted_sidecarset_is_a_no_op() -> None:
    rig = Rig(V2, pods=1)
    rig.controller.on_sidecarset("DELETED", rig.api.objects[f"{SS_PATH}/mesh"], None)
    assert rig.reconcile() is None
    assert rig.patched_pods() == [] and rig.status_writes() == []


def test_a_revision_is_recorded_and_named_in_status_and_on_the_pod() -> None:
    rig = Rig(V2, pods=1)
    rig.reconcile()
    revisions = [o for p, o in rig.api.objects.items() if "/controllerrevisions/" in p]
    assert len(revisions) == 1
    latest = revisions[0]["metadata"]["name"]
    assert rig.api.objects[f"{SS_PATH}/mesh"]["status"]["latestRevision"] == latest
    entry: dict[str, Any] = orjson.loads(rig.pod("p0")["metadata"]["annotations"][names.ANN_HASH])["mesh"]
    assert entry["controllerRevision"] == latest


def test_a_pod_whose_patch_is_always_refused_backs_off_is_named_once_and_does_not_stall_the_rest() -> None:
    clock = [0.0]
    rig = Rig(V2, pods=3)
    rig.controller.failures = PodFailures(clock=lambda: clock[0])
    rig.api.fail("patch", r"/pods/p0$", api.ApiError(403, "Forbidden", "denied by policy"), times=None)
    attempts = 0
    for _ in range(40):  # 40 s of reconciles, one a second
        rig.reconcile()
        attempts = rig.api.calls.count(("patch", pod_path("p0")))
        for name in ("p1", "p2"):
            rig.kubelet(name)
        clock[0] += 1.0
    assert attempts <= 8, f"{attempts} attempts in 40 s: the refused pod must back off"
    assert envoy_image(rig.pod("p1")) == "envoy:v2" and envoy_image(rig.pod("p2")) == "envoy:v2"
    events = [o for p, o in rig.api.objects.items() if "/events/" in p and o["reason"] == "UpgradeFailed"]
    assert len(events) == 1 and "p0" in events[0]["message"] and "denied by policy" in events[0]["message"]


def test_after_a_refused_patch_the_rollout_asks_to_go_on_with_another_pod_at_once() -> None:
    """The requeue the controller asks for, not a test-driven loop: a refused pod must not make the
    whole SidecarSet wait out its backoff (the rollout stood still until the next resync)."""
    clock = [0.0]
    rig = Rig(V2, pods=3)
    rig.controller.failures = PodFailures(clock=lambda: clock[0])
    rig.api.fail("patch", r"/pods/p0$", api.ApiError(422, "Invalid", "denied by policy"), times=None)
    requeue = rig.reconcile()
    assert rig.api.calls.count(("patch", pod_path("p0"))) == 1
    assert requeue is not None and requeue <= 0.1, f"asked to come back after {requeue} s"
    clock[0] += requeue
    rig.reconcile()
    assert rig.patched_pods()[-1] == "p1", "the next plan holds p0 back and takes another pod"
    assert rig.api.calls.count(("patch", pod_path("p0"))) == 1


def test_no_write_once_the_lease_is_held_by_another_replica() -> None:
    rig = Rig(V2, pods=2)
    leading = [True]

    async def may_write() -> bool:
        return leading[0]

    rig.controller.lease.may_write = may_write
    leading[0] = False
    assert rig.reconcile() is None
    assert rig.patched_pods() == [] and rig.status_writes() == []
    leading[0] = True
    rig.reconcile()
    assert rig.patched_pods() == ["p0"]


def _with_metadata_patches(ss: JsonObj) -> JsonObj:
    out = copy.deepcopy(ss)
    out["spec"]["patchPodMetadata"] = [
        {"patchPolicy": "Overwrite", "annotations": {"mesh.example/version": "2"}},
        {"patchPolicy": "MergePatchJson", "annotations": {"mesh.example/config": '{"log":"debug"}'}},
        {"patchPolicy": "Retain", "annotations": {"team": "ignored", "mesh.example/added": "yes"}},
    ]
    return out


def test_an_upgrade_reapplies_patch_pod_metadata_in_the_same_patch() -> None:
    rig = Rig(_with_metadata_patches(V2), pods=1)
    rig.deliver = False
    p0 = copy.deepcopy(rig.pod("p0"))
    p0["metadata"]["annotations"].update(
        {"mesh.example/version": "1", "mesh.example/config": '{"keep":1,"log":"info"}'}
    )
    rig.api._store(pod_path("p0"), p0)
    rig.redeliver()
    assert rig.reconcile() is None
    assert rig.patched_pods() == ["p0"], "one patch: images and metadata together"
    after = rig.pod("p0")
    assert envoy_image(after) == "envoy:v2"
    annotations = after["metadata"]["annotations"]
    assert annotations["mesh.example/version"] == "2"
    assert annotations["mesh.example/config"] == '{"keep":1,"log":"debug"}'
    assert annotations["mesh.example/added"] == "yes", "Retain adds what the pod lacks"
    assert annotations["team"] == p0["metadata"]["annotations"]["team"], "Retain keeps what the pod has"


def test_a_pod_changed_since_it_was_planned_is_not_patched_with_stale_metadata() -> None:
    rig = Rig(_with_metadata_patches(V2), pods=1)
    rig.deliver = False
    rig.redeliver()
    moved = copy.deepcopy(rig.pod("p0"))
    moved["metadata"]["annotations"]["mesh.example/version"] = "changed-meanwhile"
    rig.api._store(pod_path("p0"), moved)  # the cache still has the older version
    before = upgrades("conflict")
    rig.reconcile()
    assert rig.patched_pods() == []
    assert upgrades("conflict") == before + 1
    assert envoy_image(rig.pod("p0")) == "envoy:v1"


def _overridden(ss: JsonObj, asked: JsonObj, record: JsonObj) -> JsonObj:
    """Pod p0 as injected from `ss` for a pod carrying `record`'s overrides, its annotation now `asked`."""
    raw = pod("p0", ss)
    raw["metadata"]["annotations"][names.ANN_OVERRIDES] = orjson.dumps(asked).decode()
    raw["metadata"]["annotations"][names.ANN_OVERRIDES_ENV_APPLIED] = orjson.dumps(record).decode()
    envoy = next(c for c in raw["spec"]["containers"] if c["name"] == "envoy")
    envoy["resources"] = {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}
    for cs in raw["status"]["containerStatuses"]:
        cs["resources"] = copy.deepcopy(envoy["resources"]) if cs["name"] == "envoy" else {}
    return raw


def test_a_changed_override_is_resized_in_place_and_an_env_change_is_said_on_the_pod_once() -> None:
    bounds = [{"containerName": "envoy", "resources": {"cpu": {"max": "1"}}, "env": ["LOG_LEVEL"]}]
    ss = copy.deepcopy(V1)
    ss["spec"]["overrides"] = bounds
    ss["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}
    rig = Rig(ss, pods=0)
    asked = {"envoy": {"resources": {"limits": {"cpu": "500m"}}, "env": [{"name": "LOG_LEVEL", "value": "trace"}]}}
    rig.api.put(pod_path("p0"), _overridden(ss, asked, {"envoy": {"LOG_LEVEL": "debug"}}))
    rig.reconcile()
    assert rig.api.writes("patch", pod_path("p0")) == [pod_path("p0") + "/resize"], "the resize alone"
    envoy = next(c for c in rig.pod("p0")["spec"]["containers"] if c["name"] == "envoy")
    assert envoy["resources"] == {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}
    events = [e for p, e in rig.api.objects.items() if "/events/" in p]
    (said,) = [e for e in events if e["reason"] == "OverridesNeedRecreate"]
    assert said["involvedObject"]["name"] == "p0" and 'envoy env LOG_LEVEL: "debug" -> "trace"' in said["message"]
    rig.redeliver()
    rig.reconcile()
    assert len(rig.api.writes("patch", pod_path("p0"))) == 1, "at its values now: not written again"
    assert len([p for p in rig.api.objects if "/events/" in p]) == len(events), "said once"


def test_a_resize_an_override_asks_for_that_the_api_server_would_refuse_is_said_on_the_pod_and_not_sent() -> None:
    ss = copy.deepcopy(V1)
    ss["spec"]["overrides"] = [{"containerName": "envoy", "resources": {"cpu": {"max": "1"}}}]
    guaranteed = {"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}
    ss["spec"]["containers"][0]["resources"] = guaranteed
    rig = Rig(ss, pods=0)
    raw = _overridden(ss, {"envoy": {"resources": {"requests": {"cpu": "50m"}}}}, {})
    raw["status"]["containerStatuses"] = [cs for cs in raw["status"]["containerStatuses"] if cs["name"] == "envoy"]
    raw["spec"]["containers"] = [c for c in raw["spec"]["containers"] if c["name"] == "envoy"]
    envoy = raw["spec"]["containers"][0]
    envoy["resources"] = copy.deepcopy(guaranteed)
    raw["status"]["containerStatuses"][0]["resources"] = copy.deepcopy(guaranteed)
    rig.api.put(pod_path("p0"), raw)  # Guaranteed; a lower request alone would make it Burstable
    rig.reconcile()
    assert pod_path("p0") + "/resize" not in rig.api.writes("patch", pod_path("p0"))
    (said,) = [e for p, e in rig.api.objects.items() if "/events/" in p and e["reason"] == "OverridesRefused"]
    assert said["involvedObject"]["name"] == "p0" and "QoS class would change" in said["message"]
