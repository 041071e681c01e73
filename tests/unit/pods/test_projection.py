"""Pod projections: the right fields, nothing else, no link back to the pod, no exception on junk."""

from __future__ import annotations

import copy
import gc
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecarsets.pods.podrecords import ContainerState, HashEntry, InplaceEntry, Labels, Resources
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.spec import names, selectors
from sidecarsets.spec.names import ANN_HASH, ANN_HASH_WITHOUT_IMAGE, ANN_INJECTED_LIST, ANN_INPLACE_STATE
from tests.kube.builders import T0, image_id, injected_pod, shop_sidecarset


def _reachable(root: object) -> list[object]:
    """Every object reachable from a projection (through its slots, tuples and label maps)."""
    seen: dict[int, object] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen[id(obj)] = obj
        if isinstance(obj, PodProjection):
            stack.extend(getattr(obj, f) for f in obj.__slots__)
        elif isinstance(obj, tuple):
            stack.extend(obj)
        elif not isinstance(obj, (str, int, type)):
            stack.extend(r for r in gc.get_referents(obj) if not isinstance(r, type))
    return list(seen.values())


def test_fields_of_an_injected_pod() -> None:
    raw = injected_pod("web-1", shop_sidecarset(), labels={"zone": "a"}, restarts=2, node="node-7")
    raw["metadata"]["annotations"][ANN_INPLACE_STATE] = orjson.dumps(
        {"mesh": {"revision": "mesh-1", "updateTimestamp": T0, "lastContainerStatuses": {"envoy": {"imageID": "x"}}}}
    ).decode()
    p = project(raw)
    assert (p.namespace, p.name, p.uid, p.resource_version) == ("shop", "web-1", "uid-shop-web-1", "100")
    assert dict(p.labels) == {"app": "shop", "sidecarctl.io/injected": "true", "zone": "a"}
    assert (p.phase, p.ready, p.ready_since, p.deleting, p.node_name) == ("Running", True, T0, False, "node-7")
    assert p.creation_timestamp == T0
    assert p.injected == ("mesh",)
    assert p.containers == (("envoy", "envoy:v1"), ("app", "shop/app:1.0"), ("worker", "shop/worker:1.0"))
    assert p.container_statuses[0] == ContainerState("envoy", "envoy:v1", image_id("envoy:v1"), True, 2)
    assert p.total_restarts == 6
    entry = p.hash_for("mesh")
    assert entry is not None and entry.sidecar_list == ("envoy",) and entry.update_timestamp == T0
    assert p.hash_without_image_for("mesh") is not None
    assert p.inplace_for("mesh") == InplaceEntry("mesh", "mesh-1", T0, (("envoy", "x"),))
    assert p.hash_for("other") is None and p.status_of("nope") is None


def test_legacy_hash_form_and_controller_revision() -> None:
    raw = injected_pod("web-1", shop_sidecarset())
    raw["metadata"]["annotations"][ANN_HASH] = orjson.dumps(
        {"old": "abc", "mesh": {"hash": "h1", "controllerRevision": "mesh-5f", "sidecarList": ["envoy"]}}
    ).decode()
    p = project(raw)
    assert p.hash_for("old") == HashEntry("old", "abc", legacy=True)
    mesh = p.hash_for("mesh")
    assert mesh is not None and (mesh.hash, mesh.controller_revision, mesh.legacy) == ("h1", "mesh-5f", False)


def test_without_image_entries_drop_the_per_pod_time_and_are_shared() -> None:
    a, b = (
        project(injected_pod("a", shop_sidecarset(), created="2024-01-01T00:00:01Z")),
        project(injected_pod("b", shop_sidecarset())),
    )
    assert a.hashes_without_image is b.hashes_without_image
    assert a.hashes_without_image[0].update_timestamp == ""


def test_holds_no_reference_into_the_input() -> None:
    raw = injected_pod("web-1", shop_sidecarset(), labels={"zone": "a"})
    p = project(raw)
    kinds = {type(o) for o in _reachable(p)}
    allowed = {PodProjection, Labels, tuple, HashEntry, InplaceEntry, ContainerState, Resources, str, int, bool}
    assert kinds <= allowed | {type(None)}  # None: an absent overrides annotation


def test_mutating_the_input_afterwards_changes_nothing() -> None:
    raw = injected_pod("web-1", shop_sidecarset())
    p = project(raw)
    before = copy.deepcopy(p)
    raw["metadata"]["labels"]["app"] = "other"
    raw["spec"]["containers"][0]["image"] = "evil"
    raw["status"]["containerStatuses"].clear()
    assert p == before


def test_the_overrides_annotations_are_kept_as_text_and_replicas_share_it() -> None:
    asked = '{"proxy": {"resources": {"limits": {"cpu": "2"}}}}'
    pods = [injected_pod(f"web-{i}", shop_sidecarset()) for i in range(2)]
    for raw in pods:
        raw["metadata"]["annotations"][names.ANN_OVERRIDES] = "".join(asked)  # a distinct str each
        raw["metadata"]["annotations"][names.ANN_OVERRIDES_ENV_APPLIED] = "{}"
    a, b = (project(raw) for raw in pods)
    assert (a.overrides, a.overrides_env) == (asked, "{}") and a.overrides is b.overrides
    assert project(injected_pod("web-2", shop_sidecarset())).overrides is None


def test_unknown_fields_are_dropped() -> None:
    raw = injected_pod("web-1", shop_sidecarset())
    raw["metadata"]["annotations"]["huge"] = "x" * 10_000
    raw["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    raw["spec"]["containers"][1]["env"] = [{"name": "SECRET", "value": "s3cr3t"}]
    strings = [o for o in _reachable(project(raw)) if isinstance(o, str)]
    assert not any("xxxx" in x or "s3cr3t" in x or "emptyDir" in x or x == "SECRET" for x in strings)
    assert set(PodProjection.__slots__) == {
        "namespace",
        "name",
        "uid",
        "resource_version",
        "labels",
        "creation_timestamp",
        "deleting",
        "phase",
        "ready",
        "ready_since",
        "node_name",
        "hashes",
        "hashes_without_image",
        "injected",
        "inplace_state",
        "containers",
        "init_containers",
        "container_statuses",
        "init_statuses",
        "total_restarts",
        "upgradable_condition",
        "hot_working",
        "hot_versions",
        "resources",
        "applied_resources",
        "resize_conditions",
        "overrides",
        "overrides_env",
    }


def test_resources_as_asked_and_as_applied_and_the_resize_conditions() -> None:
    raw = injected_pod("web-1", shop_sidecarset())
    raw["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}, "limits": {"memory": "1Gi"}}
    raw["spec"]["containers"][0]["resizePolicy"] = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    raw["status"]["containerStatuses"][0]["resources"] = {"requests": {"cpu": "50m"}}
    raw["status"]["conditions"] += [
        {"type": "PodResizePending", "status": "True", "reason": "Deferred", "message": "later"},
        {"type": "PodResizeInProgress", "status": "False"},
    ]
    p = project(raw)
    assert p.resources_of("envoy") == Resources(
        "envoy", (("cpu", "100m"),), (("memory", "1Gi"),), (("memory", "RestartContainer"),)
    )
    assert p.resources_of("envoy", applied=True) == Resources("envoy", (("cpu", "50m"),))
    assert p.resources_of("app", applied=True) is None, "nothing reported: no evidence"
    assert p.resize_conditions == (("PodResizePending", "Deferred", "later"),)


def test_is_frozen_and_hashable() -> None:
    p = project(injected_pod("web-1", shop_sidecarset()))
    with pytest.raises(AttributeError):
        p.name = "x"  # type: ignore[misc]
    assert {p: 1}[project(injected_pod("web-1", shop_sidecarset()))] == 1


def test_repeated_strings_are_shared_between_pods() -> None:
    a, b = project(injected_pod("a", shop_sidecarset())), project(injected_pod("b", shop_sidecarset()))
    assert a.labels is b.labels
    assert a.containers is b.containers
    assert a.container_statuses[0].image_id is b.container_statuses[0].image_id


def test_labels_behave_as_a_read_only_mapping() -> None:
    labels = project(injected_pod("a", shop_sidecarset(), labels={"zone": "a", "tier": "web"})).labels
    assert isinstance(labels, Labels)
    assert labels["zone"] == "a" and "tier" in labels and "nope" not in labels and labels.get("nope") is None
    assert len(labels) == 4 and sorted(labels) == ["app", "sidecarctl.io/injected", "tier", "zone"]
    assert labels == {"app": "shop", "sidecarctl.io/injected": "true", "zone": "a", "tier": "web"}
    with pytest.raises(KeyError):
        labels["nope"]
    assert not hasattr(labels, "__setitem__")
    assert selectors.matches({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, labels)


def test_deleting_pending_and_not_ready() -> None:
    p = project(
        injected_pod("a", shop_sidecarset(), deleting=True, phase="Pending", ready=False, node="", with_statuses=False)
    )
    assert (p.deleting, p.phase, p.ready, p.node_name, p.container_statuses, p.total_restarts) == (
        True,
        "Pending",
        False,
        "",
        (),
        0,
    )


def test_upgradable_condition_is_kept() -> None:
    raw = injected_pod("a", shop_sidecarset())
    raw["status"]["conditions"].append(
        {
            "type": "SidecarSetUpgradable",
            "status": "False",
            "reason": "UpdateImmutableField",
            "message": '{"mesh":false}',
        }
    )
    assert project(raw).upgradable_condition == ("False", "UpdateImmutableField", '{"mesh":false}')


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.update(metadata=None),
        lambda p: p.update(metadata=[]),
        lambda p: p["metadata"].update(labels={"a": 1, 2: "b"}),
        lambda p: p["metadata"].update(annotations="x"),
        lambda p: p["metadata"]["annotations"].update({ANN_HASH: "{not json"}),
        lambda p: p["metadata"]["annotations"].update({ANN_HASH: "[1,2]"}),
        lambda p: p["metadata"]["annotations"].update({ANN_HASH: '{"mesh": 5, "": "x"}'}),
        lambda p: p["metadata"]["annotations"].update({ANN_HASH_WITHOUT_IMAGE: "null"}),
        lambda p: p["metadata"]["annotations"].update({ANN_INJECTED_LIST: 7}),
        lambda p: p["metadata"]["annotations"].update({ANN_INPLACE_STATE: '{"mesh": {"lastContainerStatuses": 3}}'}),
        lambda p: p["metadata"]["annotations"].update({ANN_INPLACE_STATE: '{"mesh": 1}'}),
        lambda p: p["spec"].update(containers={"name": "x"}),
        lambda p: p["spec"].update(containers=[1, None, {"name": 3, "image": ["x"]}]),
        lambda p: p["status"].update(conditions=[None, {"type": "Ready", "status": True}]),
        lambda p: p["status"].update(containerStatuses=[{"name": "envoy", "restartCount": -3, "ready": "yes"}]),
        lambda p: p.update(status=None),
    ],
)
def test_bad_fields_give_empty_values(mutate: Any) -> None:
    raw = injected_pod("a", shop_sidecarset())
    mutate(raw)
    p = project(raw)
    assert isinstance(p, PodProjection)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in p.labels.items())
    assert all(cs.restart_count >= 0 for cs in p.container_statuses)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=20,
)


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "metadata": st.dictionaries(
                st.sampled_from(["name", "namespace", "labels", "annotations", "deletionTimestamp", "uid"]), json_values
            ),
            "spec": st.dictionaries(st.sampled_from(["containers", "initContainers", "nodeName"]), json_values),
            "status": st.dictionaries(st.sampled_from(["phase", "conditions", "containerStatuses"]), json_values),
        },
    )
)
def test_any_json_projects_without_raising(raw: dict[str, Any]) -> None:
    p = project(raw)
    assert isinstance(p.name, str) and isinstance(p.containers, tuple)


def test_non_dict_input() -> None:
    p = project(None)
    assert p.name == "" and p.containers == () and dict(p.labels) == {}
