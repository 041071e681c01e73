"""Validation rules that compare: an update against the stored object, and SidecarSets among themselves."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sidecarsets.validation import validate_sidecarset
from tests.kube import builders
from tests.unit.validation.test_validation import Obj, assert_error, base, container, spec

# --- updates ----------------------------------------------------------------------------------


def test_unchanged_update_is_valid() -> None:
    assert validate_sidecarset(base(), old=base()) == []


def test_image_change_is_valid() -> None:
    new = base()
    container(new)["image"] = "agent:2"
    assert validate_sidecarset(new, old=base()) == []


def test_container_cannot_be_added_on_update() -> None:
    new = base()
    spec(new)["containers"].append({"name": "proxy", "image": "proxy:1"})
    errs = validate_sidecarset(new, old=base())
    assert_error(errs, "spec.containers[1].name", "container proxy is not found")


def test_container_cannot_be_renamed_on_update() -> None:
    new = base()
    container(new)["name"] = "agent2"
    assert_error(validate_sidecarset(new, old=base()), "spec.containers[0].name", "cannot be added or renamed")


def test_container_can_be_removed_on_update() -> None:
    old = base()
    spec(old)["containers"].append({"name": "proxy", "image": "proxy:1"})
    assert validate_sidecarset(base(), old=old) == []


def test_upgrade_type_is_immutable() -> None:
    new = base()
    container(new)["upgradeStrategy"] = {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}
    errs = validate_sidecarset(new, old=base())  # old defaults to ColdUpgrade
    assert_error(errs, "spec.containers[0].upgradeStrategy.upgradeType", "container agent upgradeType is immutable")


def test_upgrade_type_written_out_is_not_a_change() -> None:
    new = base()
    container(new)["upgradeStrategy"] = {"upgradeType": "ColdUpgrade"}
    assert validate_sidecarset(new, old=base()) == []


def native(obj: Obj, image: str) -> Obj:
    spec(obj)["initContainers"][0].update(restartPolicy="Always", image=image)
    return obj


def test_native_sidecar_can_be_created_under_rolling_update() -> None:
    assert validate_sidecarset(native(base(), "setup:1")) == []


def test_native_sidecar_image_change_under_rolling_update_is_rolled_in_place() -> None:
    # Kruise refuses it; here the native sidecar's image is rolled like a container's.
    assert validate_sidecarset(native(base(), "setup:2"), old=native(base(), "setup:1")) == []


def test_native_sidecar_image_change_under_not_update() -> None:
    new = native(base(), "setup:2")
    spec(new)["updateStrategy"] = {"type": "NotUpdate"}
    assert validate_sidecarset(new, old=native(base(), "setup:1")) == []


def test_native_sidecar_other_changes_under_rolling_update() -> None:
    new = native(base(), "setup:1")
    spec(new)["initContainers"][0]["args"] = ["--verbose"]
    assert validate_sidecarset(new, old=native(base(), "setup:1")) == []


def test_plain_init_container_image_change_is_valid() -> None:
    new = base()
    spec(new)["initContainers"][0]["image"] = "setup:2"
    assert validate_sidecarset(new, old=base()) == []


def test_malformed_old_object_is_tolerated() -> None:
    assert validate_sidecarset(base(), old={}) == []
    assert validate_sidecarset(base(), old={"spec": 3}) == []
    errs = validate_sidecarset(base(), old={"spec": {"containers": "x"}})
    assert [e.field for e in errs] == ["spec.containers[0].name"]


# --- conflicts with other SidecarSets ---------------------------------------------------------


def other(name: str = "other", *, containers: Any = None, **spec_fields: Any) -> Obj:
    """Another SidecarSet for the same pods, whose sidecar (unless `containers`) has the name of `base()`'s."""
    if containers is None:
        containers = [builders.container("agent", "other:1")]
    return builders.sidecarset(name, containers=containers, **spec_fields)


def test_same_container_name_with_overlapping_selectors() -> None:
    errs = validate_sidecarset(base(), others=[other()])
    assert_error(errs, "spec.containers[0].name", "container agent already exists in SidecarSet other")


def test_same_init_container_name() -> None:
    errs = validate_sidecarset(base(), others=[other(initContainers=[{"name": "setup", "image": "s:1"}])])
    assert_error(errs, "spec.initContainers[0].name", "container setup already exists in SidecarSet other")


def test_container_name_against_an_init_container_of_another() -> None:
    rival = other(containers=[], initContainers=[{"name": "agent", "image": "s:1"}])
    assert_error(validate_sidecarset(base(), others=[rival]), "spec.containers[0].name", "already exists")


HOT = {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}


def test_a_hot_sidecar_clashes_with_another_sidecarsets_container_named_like_its_pair() -> None:
    own = base()
    container(own)["upgradeStrategy"] = HOT  # injected as agent-1 and agent-2
    rival = other(containers=[builders.container("agent-2", "other:1")])
    assert_error(validate_sidecarset(own, others=[rival]), "spec.containers[0].name", "takes the name agent-2 in a pod")


def test_a_container_named_like_another_sidecarsets_hot_pair_clashes() -> None:
    own = base()
    container(own)["name"] = "agent-1"
    rival = other(containers=[{**builders.container("agent", "other:1"), "upgradeStrategy": HOT}])
    assert_error(validate_sidecarset(own, others=[rival]), "spec.containers[0].name", "takes the name agent-1 in a pod")


def test_a_hot_native_sidecar_pair_clashes_and_names_beside_a_pair_do_not() -> None:
    own = base()
    container(own)["name"] = "agent-1"
    native = {**builders.container("agent", "other:1"), "restartPolicy": "Always", "upgradeStrategy": HOT}
    rival = other(containers=[], initContainers=[native])
    assert_error(validate_sidecarset(own, others=[rival]), "spec.containers[0].name", "takes the name agent-1")
    container(own)["name"] = "agent-3"
    assert validate_sidecarset(own, others=[rival]) == []


def test_one_sidecarset_cannot_hold_a_hot_sidecar_and_a_container_named_like_its_pair() -> None:
    own = base()
    container(own)["upgradeStrategy"] = HOT
    spec(own)["containers"].append(builders.container("agent-1", "other:1"))
    assert_error(validate_sidecarset(own), "spec.containers[0].name", "another container named agent-1")


def test_the_sidecarset_itself_is_skipped() -> None:
    assert validate_sidecarset(base(), others=[base(), other("log-agent")]) == []


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {"app": "db"}},
        {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]},
        {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
    ],
)
def test_disjoint_pod_selectors_do_not_conflict(selector: Obj) -> None:
    assert validate_sidecarset(base(), others=[other(selector=selector)]) == []


def test_overlapping_selector_on_another_key_conflicts() -> None:
    rival = other(selector={"matchLabels": {"tier": "frontend"}})
    assert_error(validate_sidecarset(base(), others=[rival]), "spec.containers[0].name", "already exists")


def test_disjoint_namespaces_do_not_conflict() -> None:
    mine = base()
    spec(mine)["namespace"] = "shop"
    assert validate_sidecarset(mine, others=[other(namespace="bank")]) == []
    selector = {"matchLabels": {"kubernetes.io/metadata.name": "bank"}}
    assert validate_sidecarset(mine, others=[other(namespaceSelector=selector)]) == []


def test_all_namespaces_overlap_with_one() -> None:
    mine = base()
    spec(mine)["namespace"] = "shop"
    assert_error(validate_sidecarset(mine, others=[other()]), "spec.containers[0].name", "already exists")


def test_same_namespace_conflicts() -> None:
    mine = base()
    spec(mine)["namespace"] = "shop"
    errs = validate_sidecarset(mine, others=[other(namespace="shop")])
    assert_error(errs, "spec.containers[0].name", "already exists")


def test_namespace_overrides_namespace_selector() -> None:
    mine = base()
    spec(mine)["namespace"] = "shop"
    spec(mine)["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": "bank"}}
    assert_error(validate_sidecarset(mine, others=[other(namespace="shop")]), "spec.containers[0].name", "exists")


def test_identical_volume_is_shared() -> None:
    rival = other(
        containers=[], initContainers=[{"name": "x", "image": "x:1"}], volumes=[{"name": "logs", "emptyDir": {}}]
    )
    assert validate_sidecarset(base(), others=[rival]) == []


def test_different_volume_with_the_same_name() -> None:
    rival = other(containers=[{"name": "x", "image": "x:1"}], volumes=[{"name": "logs", "hostPath": {"path": "/l"}}])
    errs = validate_sidecarset(base(), others=[rival])
    assert_error(errs, "spec.volumes[0]", "volume logs is in conflict with SidecarSet other")


def with_patch(obj: Obj, policy: str | None) -> Obj:
    patch: Obj = {"annotations": {"example.com/owner": "x"}}
    if policy is not None:
        patch["patchPolicy"] = policy
    spec(obj)["patchPodMetadata"] = [patch]
    return obj


@pytest.mark.parametrize(
    ("mine", "theirs", "conflict"),
    [
        ("Overwrite", "Overwrite", True),
        ("Overwrite", "Retain", True),
        (None, "Overwrite", True),  # Retain by default
        ("MergePatchJson", "Overwrite", True),
        ("Retain", "Retain", False),
        ("Retain", "MergePatchJson", False),
    ],
)
def test_annotation_conflicts(mine: str | None, theirs: str, conflict: bool) -> None:
    rival = with_patch(other(containers=[{"name": "x", "image": "x:1"}]), theirs)
    obj = with_patch(base(), mine)
    if "MergePatchJson" in (mine, theirs):
        for o in (obj, rival):
            o["spec"]["patchPodMetadata"][0]["annotations"]["example.com/owner"] = "{}"
    errs = validate_sidecarset(obj, others=[rival])
    if conflict:
        field = "spec.patchPodMetadata[0].annotations[example.com/owner]"
        assert_error(errs, field, "annotation example.com/owner is in conflict with SidecarSet other")
    else:
        assert errs == []


def test_malformed_others_are_skipped() -> None:
    junk: list[Any] = [None, 3, "x", {"spec": []}, {"metadata": "m", "spec": {"selector": "s"}}]
    assert validate_sidecarset(base(), others=junk) == []


def test_others_are_not_modified() -> None:
    rival = other()
    before = copy.deepcopy(rival)
    validate_sidecarset(base(), others=[rival])
    assert rival == before
