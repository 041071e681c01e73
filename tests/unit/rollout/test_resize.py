"""Sidecar resources rolled in place: the planner's decisions and the counting rules, on pods built as
injection and the API server leave them (requests defaulted from limits, the kubelet reporting what
it applied)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import orjson
import pytest

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import podstate
from sidecarsets.pods.podrecords import Resources
from sidecarsets.pods.projection import project
from sidecarsets.pods.resizestate import same_quantity
from sidecarsets.rollout import deadline, podpatch, resize
from sidecarsets.rollout.planner import Plan, PodUpgrade, plan_upgrade
from sidecarsets.rollout.status import pod_verdicts
from sidecarsets.spec import hashing
from sidecarsets.spec.names import ANN_HASH_WITHOUT_IMAGE
from tests.kube.builders import apply_patch, container, injected_pod, model, shop_sidecarset

NOW = "2024-06-01T12:00:00Z"
SMALL = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}
APP = {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}


def sidecarset(
    resources: JsonObj | None = SMALL, *, image: str = "envoy:v1", generation: int = 1, **fields: Any
) -> JsonObj:
    c = container("envoy", image, **fields)
    if resources is not None:
        c["resources"] = copy.deepcopy(resources)
    return shop_sidecarset(containers=[c], metadata={"generation": generation})


V1 = sidecarset()


def defaulted(resources: JsonObj) -> JsonObj:
    """As the API server stores a container's resources: a limit without a request gives the request."""
    out = copy.deepcopy(resources)
    for k, v in (out.get("limits") or {}).items():
        out.setdefault("requests", {}).setdefault(k, v)
    return out


def pod(name: str, ss: JsonObj = V1, *, app: JsonObj | None = APP, applied: bool = True, **kw: Any) -> JsonObj:
    """A pod injected from `ss`: each container with its resources, the kubelet reporting them applied."""
    p = injected_pod(name, ss, **kw)
    wanted = {c["name"]: c.get("resources") for c in ss["spec"]["containers"]}
    for c in p["spec"]["containers"]:
        res = wanted.get(c["name"]) if c["name"] in wanted else app
        c["resources"] = defaulted(res) if res else {}
        if "resizePolicy" in next((s for s in ss["spec"]["containers"] if s["name"] == c["name"]), {}):
            c["resizePolicy"] = next(s for s in ss["spec"]["containers"] if s["name"] == c["name"])["resizePolicy"]
    if applied:
        by_name = {c["name"]: c["resources"] for c in p["spec"]["containers"]}
        for cs in p["status"]["containerStatuses"]:
            cs["resources"] = copy.deepcopy(by_name[cs["name"]])
    return p


def plan(ss: JsonObj, raws: list[JsonObj], *, revisions: list[JsonObj] = [V1]) -> Plan:  # noqa: B006
    m = model(ss)
    resizable = resize.resizable_hashes(m, [r["spec"] for r in revisions])
    return plan_upgrade(m, [project(r) for r in raws], revision="mesh-2", now=NOW, resizable=resizable)


def api_server(raw: JsonObj, u: PodUpgrade) -> JsonObj:
    """The two writes as the API server applies them: `pods/resize`, then the patch (with the
    without-image entry the controller reads from the live pod)."""
    out = raw
    patch = list(u.patch)
    if u.resize:
        out = apply_patch(out, list(u.resize))
        patch[0] = {**patch[0], "value": out["metadata"]["resourceVersion"]}
    if u.without_image_hash:
        patch.append(resize.resize_record(u, out["metadata"]["annotations"].get(ANN_HASH_WITHOUT_IMAGE), now=NOW))
    return apply_patch(out, patch)


def kubelet_applies(raw: JsonObj) -> JsonObj:
    out = copy.deepcopy(raw)
    by_name = {c["name"]: c["resources"] for c in out["spec"]["containers"]}
    for cs in out["status"]["containerStatuses"]:
        cs["resources"] = copy.deepcopy(by_name[cs["name"]])
    return out


def envoy(raw: JsonObj) -> JsonObj:
    return next(c for c in raw["spec"]["containers"] if c["name"] == "envoy")


BIGGER = {"requests": {"cpu": "300m", "memory": "96Mi"}, "limits": {"cpu": "500m", "memory": "192Mi"}}


class TestDecisions:
    def test_a_resources_only_change_resizes_every_pod_in_place_within_max_unavailable(self) -> None:
        v2 = sidecarset(BIGGER, generation=2)
        v2["spec"]["updateStrategy"] = {"maxUnavailable": 2}
        pods = [pod(f"p{i}") for i in range(4)]
        p = plan(v2, pods)
        assert [u.name for u in p.upgrades] == ["p0", "p1"] and not p.not_upgradable
        u = p.upgrades[0]
        assert {op["path"] for op in u.resize if op["op"] == "add"} == {
            "/spec/containers/0/resources/requests",
            "/spec/containers/0/resources/limits",
        }
        assert not [op for op in u.patch if op["path"].endswith("/image")], "no image changed"
        after = api_server(pods[0], u)
        assert envoy(after)["resources"] == BIGGER
        projected = project(after)
        m = model(v2)
        assert podstate.is_updated(projected, sidecarset="mesh", spec_hash=m.hash)
        assert projected.hash_without_image_for("mesh").hash == m.hash_without_image  # type: ignore[union-attr]
        # Other SidecarSets' entries in the without-image annotation stay as written.
        assert orjson.loads(after["metadata"]["annotations"][ANN_HASH_WITHOUT_IMAGE]).keys() == {"mesh"}

    def test_without_the_old_revision_a_resources_change_is_not_upgradable_as_before(self) -> None:
        p = plan(sidecarset(BIGGER, generation=2), [pod("p0")], revisions=[])
        assert (p.upgrades, p.not_upgradable, p.reasons) == ((), (("shop", "p0"),), {})

    def test_image_and_resources_together_change_both_in_one_step(self) -> None:
        v2 = sidecarset(BIGGER, image="envoy:v2", generation=2)
        p = plan(v2, [pod("p0")])
        (u,) = p.upgrades
        assert u.resize and any(
            op["path"] == "/spec/containers/0/image" and op["value"] == "envoy:v2" for op in u.patch
        )
        after = api_server(pod("p0"), u)
        assert (envoy(after)["image"], envoy(after)["resources"]) == ("envoy:v2", BIGGER)

    def test_a_change_beyond_images_and_resources_stays_not_upgradable(self) -> None:
        v2 = sidecarset(BIGGER, generation=2, env=[{"name": "LEVEL", "value": "debug"}])
        p = plan(v2, [pod("p0")])
        assert (p.upgrades, p.not_upgradable, p.reasons) == ((), (("shop", "p0"),), {})

    def test_equal_values_written_differently_are_no_change(self) -> None:
        same = {"requests": {"cpu": "0.1", "memory": "65536Ki"}, "limits": {"cpu": "200m", "memory": "0.125Gi"}}
        assert resize.decide(model(sidecarset(same)), project(pod("p0"))).steps == ()

    def test_a_qos_class_change_is_refused_before_the_pod_is_touched(self) -> None:
        guaranteed = {"limits": {"cpu": "200m", "memory": "128Mi"}}
        v1 = sidecarset(guaranteed)
        raws = [pod("p0", v1, app={"limits": {"cpu": "1", "memory": "512Mi"}})]
        assert resize.qos_class(project(raws[0]).resources) == "Guaranteed"
        v2 = sidecarset({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}})
        p = plan(v2, raws, revisions=[v1])
        assert p.upgrades == () and p.not_upgradable == (("shop", "p0"),)
        assert p.reasons[("shop", "p0")] == "the pod's QoS class would change from Guaranteed to Burstable"
        # Raising requests and limits together keeps it Guaranteed: resized.
        v3 = sidecarset({"limits": {"cpu": "400m", "memory": "256Mi"}})
        assert len(plan(v3, raws, revisions=[v1]).upgrades) == 1

    def test_a_memory_limit_decrease_needs_a_restarting_resize_policy(self) -> None:
        lower = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "96Mi"}}
        p = plan(sidecarset(lower), [pod("p0")])
        assert p.upgrades == ()
        assert "memory limit would go down (128Mi to 96Mi) with resizePolicy NotRequired" in p.reasons[("shop", "p0")]
        restart = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]
        v1 = sidecarset(resizePolicy=restart)
        v2 = sidecarset(lower, resizePolicy=restart)
        assert len(plan(v2, [pod("p0", v1)], revisions=[v1]).upgrades) == 1

    @pytest.mark.parametrize(
        ("new", "why"),
        [
            ({"requests": {"cpu": "100m", "memory": "64Mi"}}, "resources.limits.cpu would be removed"),
            (
                {**SMALL, "limits": {**SMALL["limits"], "ephemeral-storage": "1Gi"}},
                # the request defaulted from the limit is the first difference
                "resources.requests.ephemeral-storage cannot change in a running pod (only cpu and memory)",
            ),
        ],
    )
    def test_what_the_api_server_refuses_is_refused_with_the_reason(self, new: JsonObj, why: str) -> None:
        p = plan(sidecarset(new), [pod("p0")])
        assert p.upgrades == () and why in p.reasons[("shop", "p0")]

    def test_a_resources_policy_sidecar_is_recomputed_from_the_pods_own_containers(self) -> None:
        def policy(factor: str) -> JsonObj:
            return {
                "targetContainersMode": "sum",
                "targetContainersNameRegex": "^app$",
                "resourcesExpr": {"limits": {"cpu": f"cpu*{factor}", "memory": "memory*50%"}},
            }

        v1 = sidecarset(None, resourcesPolicy=policy("50%"))
        raw = pod("p0", v1)
        # As injection computed it: half the app container's limits.
        envoy(raw)["resources"] = defaulted({"limits": {"cpu": "500m", "memory": "256Mi"}})
        raw = kubelet_applies(raw)
        v2 = sidecarset(None, resourcesPolicy=policy("100%"), generation=2)
        (u,) = plan(v2, [raw], revisions=[v1]).upgrades
        limits = next(op["value"] for op in u.resize if op["path"].endswith("/limits"))
        assert limits["memory"] == "256Mi" and same_quantity(limits["cpu"], "1")


class TestCounting:
    def test_a_resized_pod_is_unavailable_until_the_kubelet_reports_the_new_values(self) -> None:
        v2 = sidecarset(BIGGER, generation=2)
        raws = [pod(f"p{i}") for i in range(3)]
        first = plan(v2, raws)
        (u,) = first.upgrades
        raws[0] = api_server(raws[0], u)
        m = model(v2)
        verdicts = pod_verdicts(m, [project(r) for r in raws])
        assert verdicts.updated == (True, False, False) and verdicts.available == (False, True, True)
        second = plan(v2, raws)
        assert (second.upgrades, second.unavailable) == ((), 1), "maxUnavailable 1 is spent on the resize"
        raws[0] = kubelet_applies(raws[0])
        third = plan(v2, raws)
        assert [u.name for u in third.upgrades] == ["p1"] and third.unavailable == 0
        assert pod_verdicts(m, [project(r) for r in raws]).available[0]

    def test_a_resize_in_progress_keeps_the_pod_unavailable(self) -> None:
        v2 = sidecarset(BIGGER, generation=2)
        raw = kubelet_applies(api_server(pod("p0"), plan(v2, [pod("p0")]).upgrades[0]))
        raw["status"]["conditions"].append({"type": "PodResizeInProgress", "status": "True"})
        assert pod_verdicts(model(v2), [project(raw)]).available == (False,)

    def test_an_infeasible_resize_stops_at_that_pod_and_the_rest_go_on(self) -> None:
        v2 = sidecarset(BIGGER, generation=2)
        v2["spec"]["updateStrategy"] = {"maxUnavailable": 1, "progressDeadlineSeconds": 60}
        raws = [pod(f"p{i}") for i in range(3)]
        raws[0] = api_server(raws[0], plan(v2, raws).upgrades[0])
        message = "Node didn't have enough capacity: cpu, requested: 4300, capacity: 2000"
        raws[0]["status"]["conditions"].append(
            {"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": message}
        )
        p = plan(v2, raws)
        assert [u.name for u in p.upgrades] == ["p1"] and p.unavailable == 0
        assert p.not_upgradable == (("shop", "p0"),)
        assert p.reasons[("shop", "p0")] == f"resize infeasible on node node-1: {message}"
        m = model(v2)
        projected = [project(r) for r in raws]
        progress = deadline.progress(m, projected, pod_verdicts(m, projected), revision="mesh-2", now=_at(NOW))
        assert progress.condition is not None and not progress.stopped
        assert progress.condition["reason"] == "ResizeInfeasible"
        assert "shop/p0 (Node didn't have enough capacity" in progress.condition["message"]

    def test_a_pod_whose_resize_landed_but_not_its_annotations_is_finished_without_a_second_resize(self) -> None:
        v2 = sidecarset(BIGGER, generation=2)
        (u,) = plan(v2, [pod("p0")]).upgrades
        resized_only = kubelet_applies(apply_patch(pod("p0"), list(u.resize)))
        (again,) = plan(v2, [resized_only]).upgrades
        assert again.resize == () and again.without_image_hash == model(v2).hash_without_image
        done = api_server(resized_only, again)
        assert podstate.is_updated(project(done), sidecarset="mesh", spec_hash=model(v2).hash)
        # A later image change proceeds as an image change (the pod records the current hashes).
        v3 = sidecarset(BIGGER, image="envoy:v3", generation=3)
        (third,) = plan(v3, [kubelet_applies(done)], revisions=[]).upgrades
        assert third.resize == () and third.without_image_hash == ""


def test_qos_classes() -> None:
    def r(name: str, requests: dict[str, str], limits: dict[str, str]) -> Resources:
        return Resources(name, tuple(requests.items()), tuple(limits.items()))

    both = {"cpu": "1", "memory": "1Gi"}
    assert resize.qos_class([r("a", {}, {})]) == "BestEffort"
    assert resize.qos_class([r("a", both, both)]) == "Guaranteed"
    assert resize.qos_class([r("a", both, both), r("b", {}, {})]) == "Burstable"
    assert resize.qos_class([r("a", {"cpu": "500m", "memory": "1Gi"}, both)]) == "Burstable"
    assert resize.qos_class([r("a", {"cpu": "1000m", "memory": "1024Mi"}, both)]) == "Guaranteed"


def test_the_resource_blind_hash_ignores_only_resources_and_images() -> None:
    base = sidecarset()["spec"]
    assert hashing.spec_hash_without_image_and_resources(base) == hashing.spec_hash_without_image_and_resources(
        sidecarset(BIGGER, image="envoy:v9")["spec"]
    )
    assert hashing.spec_hash_without_image_and_resources(base) != hashing.spec_hash_without_image_and_resources(
        sidecarset(env=[{"name": "A", "value": "1"}])["spec"]
    )
    assert hashing.spec_hash_without_image(base) != hashing.spec_hash_without_image(sidecarset(BIGGER)["spec"])


def _at(value: str) -> Any:
    parsed = deadline.parse_time(value)
    assert parsed is not None
    return parsed


def test_the_hash_annotation_a_resize_writes_keeps_the_other_sidecarsets_entries() -> None:
    other = {"other": {"updateTimestamp": "2023-01-01T00:00:00Z", "hash": "x", "sidecarSetName": "other"}}
    raw = orjson.dumps({**other, "mesh": {"hash": "old"}}).decode()
    op = podpatch.without_image_op(raw, ss_name="mesh", new_hash="new", sidecars=["envoy"], now=NOW)
    written = orjson.loads(op["value"])
    assert written["other"] == other["other"]
    assert written["mesh"] == {
        "updateTimestamp": NOW,
        "hash": "new",
        "sidecarSetName": "mesh",
        "sidecarList": ["envoy"],
    }
    assert jsonpatch.JsonPointer(op["path"]).parts == ["metadata", "annotations", ANN_HASH_WITHOUT_IMAGE]


def test_preview_simulates_a_resize_batch_by_batch_as_the_controller_runs_it() -> None:
    from sidecarsets.rollout.rolloutsim import simulate_rollout

    v2 = sidecarset(BIGGER, generation=2)
    raws = [pod(f"p{i}") for i in range(3)]
    m = model(v2)
    labels: dict[str, dict[str, str]] = {"shop": {}}
    rollout = simulate_rollout(
        m, raws, labels, revision="mesh-2", now=NOW, resizable=resize.resizable_hashes(m, [V1["spec"]])
    )
    assert [b.pods for b in rollout.batches] == [("shop/p0",), ("shop/p1",), ("shop/p2",)]
    assert rollout.resized == ("shop/p0", "shop/p1", "shop/p2") and rollout.done
    # Without the revision the pods were injected from, nothing is resized: all not upgradable.
    blind = simulate_rollout(m, raws, labels, revision="mesh-2", now=NOW)
    assert (blind.batches, blind.not_upgradable) == ((), ("shop/p0", "shop/p1", "shop/p2"))


def test_status_at_a_glance_says_why_a_pod_cannot_be_resized() -> None:
    from sidecarsets.rollout import glance
    from sidecarsets.spec.names import REVISION_LABEL_SIDECARSET

    revision = {
        "metadata": {"name": "mesh-1", "labels": {REVISION_LABEL_SIDECARSET: "mesh"}},
        "data": {"spec": V1["spec"]},
        "revision": 1,
    }
    lower = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "96Mi"}}
    raws = [pod("p0")]
    at = glance.of(
        model(sidecarset(lower, generation=2)),
        [project(r) for r in raws],
        {"shop/p0": raws[0]},
        {"shop": {}},
        stored_revisions=[revision],
        missing=(),
        now=NOW,
    )
    (blocked,) = at.not_upgradable
    assert blocked.compared_with == "resize" and "memory limit would go down" in blocked.fields[0]


def test_a_pod_whose_kubelet_reports_no_resources_is_not_resized() -> None:
    # The API server refuses a resize of a running pod whose containers report none (an old kubelet).
    p = plan(sidecarset(BIGGER, generation=2), [pod("p0", applied=False)])
    assert p.upgrades == () and "kubelet before 1.33" in p.reasons[("shop", "p0")]
