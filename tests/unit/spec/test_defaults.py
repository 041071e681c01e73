"""Kruise's SidecarSet defaults: values, idempotence, and agreement with the CRD schema."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecarsets.spec.defaults import apply_defaults
from tests.kube import builders
from tests.unit.install.test_crd_schema import kruise_sample, root_schema

MINIMAL = builders.sidecarset("s", initContainers=[builders.container("setup", "setup:1")])


def test_minimal_object_gets_every_default() -> None:
    assert apply_defaults(MINIMAL)["spec"] == {
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [
            {
                "name": "proxy",
                "image": "proxy:1",
                "podInjectPolicy": "BeforeAppContainer",
                "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
                "shareVolumePolicy": {"type": "disabled"},
            }
        ],
        "initContainers": [
            {
                "name": "setup",
                "image": "setup:1",
                "podInjectPolicy": "AfterAppContainer",
                "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
                "shareVolumePolicy": {"type": "disabled"},
            }
        ],
        "updateStrategy": {"type": "RollingUpdate", "partition": 0, "maxUnavailable": 1},
        "revisionHistoryLimit": 10,
    }


def test_input_is_not_modified() -> None:
    before = copy.deepcopy(MINIMAL)
    out = apply_defaults(MINIMAL)
    assert before == MINIMAL
    out["spec"]["containers"][0]["image"] = "changed"
    assert before == MINIMAL


def test_explicit_values_are_kept() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["containers"][0].update(
        {
            "podInjectPolicy": "AfterAppContainer",
            "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"},
            "shareVolumePolicy": {"type": "enabled"},
        }
    )
    obj["spec"]["updateStrategy"] = {"type": "NotUpdate", "partition": "30%", "maxUnavailable": "10%"}
    obj["spec"]["revisionHistoryLimit"] = 3
    spec = apply_defaults(obj)["spec"]
    assert spec["containers"][0]["podInjectPolicy"] == "AfterAppContainer"
    assert spec["containers"][0]["upgradeStrategy"] == {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}
    assert spec["containers"][0]["shareVolumePolicy"] == {"type": "enabled"}
    assert spec["updateStrategy"] == {"type": "NotUpdate", "partition": "30%", "maxUnavailable": "10%"}
    assert spec["revisionHistoryLimit"] == 3


def test_empty_strings_count_as_unset_like_in_kruise() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["containers"][0].update({"podInjectPolicy": "", "upgradeStrategy": {"upgradeType": ""}})
    container = apply_defaults(obj)["spec"]["containers"][0]
    assert container["podInjectPolicy"] == "BeforeAppContainer"
    assert container["upgradeStrategy"]["upgradeType"] == "ColdUpgrade"


def test_null_fields_are_defaulted_like_missing_ones() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["updateStrategy"] = None
    obj["spec"]["revisionHistoryLimit"] = None
    spec = apply_defaults(obj)["spec"]
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert spec["revisionHistoryLimit"] == 10


def test_revision_policy_only_when_a_revision_is_pinned() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["injectionStrategy"] = {"paused": True}
    assert apply_defaults(obj)["spec"]["injectionStrategy"] == {"paused": True}
    obj["spec"]["injectionStrategy"]["revision"] = {"revisionName": "s-abc"}
    revision = apply_defaults(obj)["spec"]["injectionStrategy"]["revision"]
    assert revision == {"revisionName": "s-abc", "policy": "Always"}


def test_patch_policy_defaults_to_retain() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["patchPodMetadata"] = [
        {"annotations": {"a": "b"}},
        {"annotations": {"c": "d"}, "patchPolicy": "Overwrite"},
    ]
    patches = apply_defaults(obj)["spec"]["patchPodMetadata"]
    assert [p["patchPolicy"] for p in patches] == ["Retain", "Overwrite"]


def test_optional_policies_are_defaulted_only_when_present() -> None:
    obj = copy.deepcopy(MINIMAL)
    container = apply_defaults(obj)["spec"]["containers"][0]
    assert "shareVolumeDevicePolicy" not in container and "resourcesPolicy" not in container
    obj["spec"]["containers"][0]["shareVolumeDevicePolicy"] = {}
    obj["spec"]["containers"][0]["resourcesPolicy"] = {"targetContainersMode": "sum"}
    container = apply_defaults(obj)["spec"]["containers"][0]
    assert container["shareVolumeDevicePolicy"] == {"type": "disabled"}
    assert container["resourcesPolicy"]["targetContainersNameRegex"] == ".*"


def test_wrong_types_are_left_for_validation() -> None:
    obj = copy.deepcopy(MINIMAL)
    obj["spec"]["updateStrategy"] = "fast"
    obj["spec"]["containers"] = [7, {"name": "x", "upgradeStrategy": []}]
    spec = apply_defaults(obj)["spec"]
    assert spec["updateStrategy"] == "fast"
    assert spec["containers"][0] == 7
    assert spec["containers"][1]["upgradeStrategy"] == []
    assert apply_defaults({"spec": 3}) == {"spec": 3}
    assert apply_defaults({}) == {}


# --- agreement with the CRD schema ------------------------------------------------------------


def schema_default(value: Any, schema: dict[str, Any]) -> None:
    """The API server's structural defaulting (apiextensions defaulting.Default), in place."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, prop in props.items():
            if "default" in prop and value.get(key) is None:
                value[key] = copy.deepcopy(prop["default"])
        for key, sub in value.items():
            if key in props:
                schema_default(sub, props[key])
            elif isinstance(schema.get("additionalProperties"), dict):
                schema_default(sub, schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            schema_default(item, schema["items"])


def server_side(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores, plus podInjectPolicy, which the schema cannot default."""
    out = copy.deepcopy(obj)
    schema_default(out, root_schema())
    for key, policy in (("containers", "BeforeAppContainer"), ("initContainers", "AfterAppContainer")):
        for container in out["spec"].get(key) or []:
            container.setdefault("podInjectPolicy", policy)
    return out


def test_agrees_with_the_schema_on_the_minimal_object() -> None:
    assert apply_defaults(MINIMAL) == server_side(MINIMAL)


def test_agrees_with_the_schema_on_the_kruise_sample() -> None:
    sample = kruise_sample()
    assert apply_defaults(sample) == server_side(sample)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(None), strategy)


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def objects(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with each field either absent or drawn from its strategy."""
    return st.fixed_dictionaries({k: maybe(v) for k, v in fields.items()}).map(_drop_none)


containers = st.lists(
    objects(
        name=st.sampled_from(["a", "b", "c"]),
        image=st.just("img:1"),
        podInjectPolicy=st.sampled_from(["BeforeAppContainer", "AfterAppContainer"]),
        upgradeStrategy=objects(
            upgradeType=st.sampled_from(["ColdUpgrade", "HotUpgrade"]), hotUpgradeEmptyImage=st.just("e:1")
        ),
        shareVolumePolicy=objects(type=st.sampled_from(["enabled", "disabled"])),
        shareVolumeDevicePolicy=objects(type=st.sampled_from(["enabled", "disabled"])),
        resourcesPolicy=objects(targetContainersMode=st.just("sum"), targetContainersNameRegex=st.just("^app")),
    ),
    max_size=3,
)
int_or_percent = st.one_of(st.integers(0, 5), st.sampled_from(["10%", "50%"]))
sidecarset_specs = objects(
    selector=st.just({"matchLabels": {"a": "b"}}),
    containers=containers,
    initContainers=containers,
    updateStrategy=objects(
        type=st.sampled_from(["NotUpdate", "RollingUpdate"]),
        partition=int_or_percent,
        maxUnavailable=int_or_percent,
        paused=st.booleans(),
    ),
    injectionStrategy=objects(
        paused=st.booleans(),
        revision=objects(revisionName=st.just("r"), policy=st.sampled_from(["Always", "Partial"])),
    ),
    revisionHistoryLimit=st.integers(0, 20),
    patchPodMetadata=st.lists(
        objects(
            annotations=st.just({"k": "v"}),
            patchPolicy=st.sampled_from(["Retain", "Overwrite", "MergePatchJson"]),
        ),
        max_size=2,
    ),
)
sidecarsets = sidecarset_specs.map(lambda spec: {"metadata": {"name": "s"}, "spec": spec})

VOCABULARY = [
    "spec",
    "containers",
    "initContainers",
    "updateStrategy",
    "upgradeStrategy",
    "shareVolumePolicy",
    "shareVolumeDevicePolicy",
    "resourcesPolicy",
    "injectionStrategy",
    "revision",
    "patchPodMetadata",
    "patchPolicy",
    "podInjectPolicy",
    "type",
]
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(VOCABULARY), st.text(max_size=3)), children, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(sidecarsets)
def test_generated_sidecarsets_agree_with_the_schema(obj: dict[str, Any]) -> None:
    assert apply_defaults(obj) == server_side(obj)


@settings(max_examples=150, deadline=None)
@given(sidecarsets)
def test_idempotent_on_sidecarsets(obj: dict[str, Any]) -> None:
    once = apply_defaults(obj)
    assert apply_defaults(once) == once


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, st.dictionaries(st.just("spec"), json_values)))
def test_idempotent_and_pure_on_any_json(obj: Any) -> None:
    before = copy.deepcopy(obj)
    once = apply_defaults(obj)
    assert obj == before
    assert apply_defaults(once) == once
