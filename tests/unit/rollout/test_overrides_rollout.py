"""Per-pod overrides on running pods: rollouts keep them, a changed one resizes the pod in place,
tightened bounds leave a pod as it is (counted not upgradable, with the refusal), an env change is
reported as needing a new pod. On pods built as injection and the API server leave them."""

from __future__ import annotations

import copy
import json
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.projection import project
from sidecarsets.rollout import podoverrides, resize
from sidecarsets.rollout.planner import plan_upgrade
from sidecarsets.spec import names
from tests.kube.builders import apply_patch, model
from tests.unit.rollout.test_resize import (
    BIGGER,
    NOW,
    SMALL,
    api_server,
    envoy,
    kubelet_applies,
    plan,
    pod,
    sidecarset,
)

BOUNDS = [{"containerName": "envoy", "resources": {"cpu": {"min": "50m", "max": "2"}}, "env": ["LOG_LEVEL"]}]


def with_bounds(ss: JsonObj, bounds: Any = BOUNDS) -> JsonObj:
    out = copy.deepcopy(ss)
    out["spec"]["overrides"] = bounds
    return out


V1 = with_bounds(sidecarset())


def asking(raw: JsonObj, ask: Any, *, record: Any = None) -> JsonObj:
    """`raw` as the webhook injects it for a pod carrying `ask`: the merged resources (as the API
    server stores them) and the record of the env applied."""
    out = copy.deepcopy(raw)
    anns = out["metadata"]["annotations"]
    anns[names.ANN_OVERRIDES] = json.dumps(ask)
    anns[names.ANN_OVERRIDES_ENV_APPLIED] = json.dumps(record or {})
    for section, values in (ask.get("envoy", {}).get("resources") or {}).items():
        envoy(out).setdefault("resources", {}).setdefault(section, {}).update(values)
    return kubelet_applies(out)


CPU_LIMIT = {"envoy": {"resources": {"limits": {"cpu": "1"}}}}


def test_a_resources_rollout_changes_only_the_fields_the_pod_does_not_override() -> None:
    v2 = with_bounds(sidecarset(BIGGER, generation=2))
    raw = asking(pod("p0", V1), CPU_LIMIT)
    p = plan(v2, [raw], revisions=[V1])
    (u,) = p.upgrades
    after = api_server(raw, u)
    assert envoy(after)["resources"] == {
        "requests": BIGGER["requests"],
        "limits": {"cpu": "1", "memory": BIGGER["limits"]["memory"]},
    }


def test_an_image_rollout_keeps_overridden_resources_and_env() -> None:
    raw = asking(pod("p0", V1), CPU_LIMIT, record={"envoy": {"LOG_LEVEL": "debug"}})
    envoy(raw)["env"] = [{"name": "LOG_LEVEL", "value": "debug"}]
    v2 = with_bounds(sidecarset(image="envoy:v2", generation=2))
    (u,) = plan(v2, [raw], revisions=[V1]).upgrades
    assert u.resize == () and [op["path"] for op in u.patch if "/spec/" in op["path"]] == [
        "/spec/containers/0/name",
        "/spec/containers/0/image",
    ]
    after = api_server(raw, u)
    assert envoy(after)["resources"] == envoy(raw)["resources"] and envoy(after)["env"] == envoy(raw)["env"]


def test_a_changed_override_resizes_a_current_pod_in_place_with_the_merged_values() -> None:
    raw = asking(pod("p0", V1), CPU_LIMIT)
    raw["metadata"]["annotations"][names.ANN_OVERRIDES] = json.dumps({"envoy": {"resources": {"limits": {"cpu": "2"}}}})
    resizes, refused = podoverrides.resizes(model(V1), [project(raw)])
    assert refused == {}
    (u,) = resizes
    assert u.patch == [] and u.without_image_hash == ""
    after = apply_patch(raw, list(u.resize))
    assert envoy(after)["resources"] == {"requests": SMALL["requests"], "limits": {"cpu": "2", "memory": "128Mi"}}


def test_a_removed_override_takes_the_sidecar_back_to_the_sidecarset_values() -> None:
    raw = asking(pod("p0", V1), CPU_LIMIT)
    del raw["metadata"]["annotations"][names.ANN_OVERRIDES]  # the record stays: the pod is still in view
    (u,) = podoverrides.resizes(model(V1), [project(raw)])[0]
    assert envoy(apply_patch(raw, list(u.resize)))["resources"] == SMALL


def test_pods_without_overrides_and_pods_already_at_their_values_are_not_resized() -> None:
    plain, current = pod("p0", V1), asking(pod("p1", V1), CPU_LIMIT)
    handmade = copy.deepcopy(plain)
    envoy(handmade)["resources"]["limits"]["cpu"] = "300m"  # resized by someone else: not ours to undo
    assert podoverrides.resizes(model(V1), [project(p) for p in (plain, current, handmade)]) == ((), {})


def test_a_pod_behind_the_spec_takes_its_override_with_the_rollout_not_before() -> None:
    v2 = with_bounds(sidecarset(BIGGER, generation=2))
    raw = asking(pod("p0", V1), CPU_LIMIT)
    raw["metadata"]["annotations"][names.ANN_OVERRIDES] = json.dumps({"envoy": {"resources": {"limits": {"cpu": "2"}}}})
    assert podoverrides.resizes(model(v2), [project(raw)]) == ((), {})
    (u,) = plan(v2, [raw], revisions=[V1]).upgrades
    assert envoy(api_server(raw, u))["resources"]["limits"]["cpu"] == "2"


def test_a_resize_the_api_server_would_refuse_is_refused_first() -> None:
    guaranteed = {"limits": {"cpu": "200m", "memory": "128Mi"}}
    v1 = with_bounds(sidecarset(guaranteed))
    raw = asking(pod("p0", v1, app={"limits": {"cpu": "1", "memory": "512Mi"}}), {"envoy": {}})
    assert resize.qos_class(project(raw).resources) == "Guaranteed"
    raw["metadata"]["annotations"][names.ANN_OVERRIDES] = json.dumps(
        {"envoy": {"resources": {"requests": {"cpu": "100m"}}}}
    )
    assert podoverrides.resizes(model(v1), [project(raw)]) == (
        (),
        {("shop", "p0"): "the pod's QoS class would change from Guaranteed to Burstable"},
    )
    # Its limit with it (the request follows a limit the SidecarSet sets alone): still Guaranteed, resized.
    raw["metadata"]["annotations"][names.ANN_OVERRIDES] = json.dumps({"envoy": {"resources": {"limits": {"cpu": "1"}}}})
    (u,) = podoverrides.resizes(model(v1), [project(raw)])[0]
    assert envoy(apply_patch(raw, list(u.resize)))["resources"]["requests"]["cpu"] == "1"


def test_tightened_bounds_leave_the_pod_as_it_is_and_count_it_not_upgradable_with_the_refusal() -> None:
    raw = asking(pod("p0", V1), CPU_LIMIT)
    tighter = with_bounds(
        sidecarset(image="envoy:v2", generation=2), [{"containerName": "envoy", "resources": {"cpu": {"max": "500m"}}}]
    )
    p = plan(tighter, [raw, pod("p1", V1)], revisions=[V1])
    assert [u.name for u in p.upgrades] == ["p1"], "the pod within bounds is upgraded, the other is left"
    assert p.not_upgradable == (("shop", "p0"),)
    assert p.reasons[("shop", "p0")] == (
        'sidecarctl.io/overrides[envoy].resources.limits.cpu: Forbidden: "1" is above the maximum SidecarSet mesh '
        "allows for container envoy (allowed: at most 500m)"
    )
    # Even at the current spec (bounds alone changed): counted, not resized.
    same_spec = with_bounds(sidecarset(), [{"containerName": "envoy", "resources": {"cpu": {"max": "500m"}}}])
    m = model(same_spec)
    assert plan_upgrade(m, [project(raw)], revision="r", now=NOW).not_upgradable == (("shop", "p0"),)
    assert podoverrides.resizes(m, [project(raw)], skip={("shop", "p0")}) == ((), {})


def test_a_request_above_its_limit_after_merging_with_a_new_spec_is_refused() -> None:
    raw = asking(pod("p0", V1), {"envoy": {"resources": {"requests": {"cpu": "150m"}}}})
    lower = with_bounds(sidecarset({**SMALL, "limits": {"cpu": "120m", "memory": "128Mi"}}, generation=2))
    p = plan(lower, [raw], revisions=[V1])
    assert p.upgrades == () and "is above the cpu limit" in p.reasons[("shop", "p0")]


def test_an_env_change_is_reported_as_needing_a_new_pod_and_a_resize_is_not_asked_for_it() -> None:
    raw = asking(pod("p0", V1), {"envoy": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]}},
                 record={"envoy": {"LOG_LEVEL": "debug"}})  # fmt: skip
    assert podoverrides.env_changes(model(V1), [project(raw)]) == {}
    raw["metadata"]["annotations"][names.ANN_OVERRIDES] = json.dumps(
        {"envoy": {"env": [{"name": "LOG_LEVEL", "value": "trace"}]}}
    )
    assert podoverrides.env_changes(model(V1), [project(raw)]) == {
        ("shop", "p0"): 'envoy env LOG_LEVEL: "debug" -> "trace"'
    }
    assert podoverrides.resizes(model(V1), [project(raw)]) == ((), {})
    del raw["metadata"]["annotations"][names.ANN_OVERRIDES]
    assert podoverrides.env_changes(model(V1), [project(raw)]) == {
        ("shop", "p0"): 'envoy env LOG_LEVEL: "debug" -> (the SidecarSet\'s)'
    }


def test_the_rollout_resize_merges_overrides_with_a_resources_policy_too() -> None:
    policy = {"targetContainersMode": "sum", "resourcesExpr": {"limits": {"cpu": "cpu*50%"}}}
    v1 = model(with_bounds(sidecarset(None, resourcesPolicy=policy)))
    raw = pod("p0", sidecarset(None, resourcesPolicy=policy))
    computed = resize.wanted(v1.containers[0], project(raw), v1)
    raw = asking(raw, {"envoy": {"resources": {"requests": {"cpu": "100m"}}}})
    requests, limits = resize.wanted(v1.containers[0], project(raw), v1)
    assert limits == computed[1] and requests == {**computed[0], "cpu": "100m"}
