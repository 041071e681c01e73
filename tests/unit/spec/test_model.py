"""SidecarSet.from_object: defaults applied when reading, structural errors, matching."""

from __future__ import annotations

import collections
import copy
import dataclasses
import datetime
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecarsets.spec import hashing, names
from sidecarsets.spec.enums import InjectPolicy
from sidecarsets.spec.model import ModelError, SidecarSet
from sidecarsets.values.jsontemplate import JsonTemplate
from tests.kube import builders

BEFORE_APP = InjectPolicy.BEFORE_APP
AFTER_APP = InjectPolicy.AFTER_APP


META = {"resourceVersion": "7", "generation": 3, "creationTimestamp": "2024-01-01T00:00:00Z"}


def sidecarset(**spec: Any) -> dict[str, Any]:
    """The default SidecarSet `mesh`, with the metadata the API server would have given it."""
    return builders.sidecarset("mesh", metadata=dict(META), **spec)


def test_reads_metadata_and_hashes() -> None:
    obj = sidecarset()
    ss = SidecarSet.from_object(obj)
    assert (ss.name, ss.resource_version, ss.generation, ss.creation_timestamp) == (
        "mesh",
        "7",
        3,
        "2024-01-01T00:00:00Z",
    )
    assert ss.obj is obj
    assert ss.hash == hashing.spec_hash(obj["spec"])
    assert ss.hash_without_image == hashing.spec_hash_without_image(obj["spec"])
    assert ss.selector == {"matchLabels": {"app": "web"}}
    assert ss.namespace_selector is None
    assert not ss.injection_paused
    assert ss.latest_revision is None


def test_defaults_are_applied_when_reading() -> None:
    ss = SidecarSet.from_object(sidecarset(initContainers=[{"name": "init", "image": "i"}]))
    (proxy,) = ss.containers
    (init,) = ss.init_containers
    assert proxy.inject_policy == BEFORE_APP
    assert init.inject_policy == AFTER_APP
    assert proxy.upgrade_type == "ColdUpgrade"
    assert not proxy.share_volumes
    assert not proxy.share_volume_devices
    assert ss.patch_pod_metadata == ()


def test_defaulted_and_undefaulted_objects_behave_alike() -> None:
    bare = sidecarset(patchPodMetadata=[{"annotations": {"a": "1"}}])
    defaulted = copy.deepcopy(bare)
    defaulted["spec"]["containers"][0].update(
        podInjectPolicy="BeforeAppContainer",
        shareVolumePolicy={"type": "disabled"},
        upgradeStrategy={"upgradeType": "ColdUpgrade"},
    )
    defaulted["spec"]["patchPodMetadata"][0]["patchPolicy"] = "Retain"
    a, b = SidecarSet.from_object(bare), SidecarSet.from_object(defaulted)
    for field in ("inject_policy", "upgrade_type", "share_volumes", "transfer_env", "native"):
        assert getattr(a.containers[0], field) == getattr(b.containers[0], field)
    assert a.patch_pod_metadata == b.patch_pod_metadata
    # Only corev1.Container fields reach the pod.
    assert b.containers[0].container == {"name": "proxy", "image": "proxy:1"}


def test_native_sidecars_are_listed_with_the_containers() -> None:
    ss = SidecarSet.from_object(
        sidecarset(
            initContainers=[
                {"name": "plain", "image": "a"},
                {"name": "native", "image": "b", "restartPolicy": "Always"},
            ]
        )
    )
    assert ss.container_names == ("proxy", "native")
    assert ss.all_container_names == {"proxy", "native", "plain"}
    assert [c.native for c in ss.init_containers] == [False, True]


def test_namespace_field_overrides_namespace_selector() -> None:
    ss = SidecarSet.from_object(sidecarset(namespace="shop", namespaceSelector={"matchLabels": {"team": "x"}}))
    assert ss.namespace_selector == {"matchLabels": {names.NS_NAME_LABEL: "shop"}}
    assert ss.matches_namespace("shop", None)
    assert ss.matches_namespace("shop", {"team": "y"})
    assert not ss.matches_namespace("other", None)


def test_namespace_selector_with_unknown_labels_only_decides_on_the_name() -> None:
    by_label = SidecarSet.from_object(sidecarset(namespaceSelector={"matchLabels": {"team": "x"}}))
    assert not by_label.matches_namespace("shop", None)
    assert by_label.matches_namespace("shop", {"team": "x"})
    assert not by_label.matches_namespace("shop", {})
    by_name = SidecarSet.from_object(
        sidecarset(
            namespaceSelector={
                "matchExpressions": [{"key": names.NS_NAME_LABEL, "operator": "NotIn", "values": ["kube-system"]}]
            }
        )
    )
    assert by_name.matches_namespace("shop", None)
    assert not by_name.matches_namespace("kube-system", None)


def test_no_namespace_selector_matches_every_namespace() -> None:
    ss = SidecarSet.from_object(sidecarset())
    assert ss.matches_namespace("anything", None)
    assert ss.matches_namespace("anything", {})


def test_name_label_is_implied_when_labels_are_known() -> None:
    ss = SidecarSet.from_object(sidecarset(namespaceSelector={"matchLabels": {names.NS_NAME_LABEL: "shop"}}))
    assert ss.matches_namespace("shop", {"team": "x"})
    assert not ss.matches_namespace("other", {names.NS_NAME_LABEL: "shop"})


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"app": "web"}}, {"app": "web", "x": "y"}, True),
        ({"matchLabels": {"app": "web"}}, {"app": "db"}, False),
        ({}, {"app": "web"}, False),
        (None, {"app": "web"}, False),
        ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, {"app": "x"}, True),
    ],
)
def test_matches_pod(selector: dict[str, Any] | None, labels: dict[str, str], expected: bool) -> None:
    obj = sidecarset()
    if selector is None:
        del obj["spec"]["selector"]
    else:
        obj["spec"]["selector"] = selector
    assert SidecarSet.from_object(obj).matches_pod(labels) is expected


def test_kruise_api_version_and_status() -> None:
    obj = sidecarset(injectionStrategy={"paused": True})
    obj["apiVersion"] = names.KRUISE_API_VERSION
    obj["status"] = {"latestRevision": "mesh-abc"}
    ss = SidecarSet.from_object(obj)
    assert ss.injection_paused
    assert ss.latest_revision == "mesh-abc"


def test_transfer_env_sources() -> None:
    ss = SidecarSet.from_object(
        sidecarset(
            containers=[
                {
                    "name": "proxy",
                    "image": "p",
                    "transferEnv": [
                        {"sourceContainerName": "app", "envName": "B", "envNames": ["C", "A", "B", "A"]},
                        {
                            "sourceContainerNameFrom": {
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels['main']"}
                            },
                            "envNames": ["C"],
                        },
                        {
                            "sourceContainerNameFrom": {
                                "fieldRef": {"fieldPath": "metadata.annotations['example.com/main']"}
                            },
                            "envName": "D",
                        },
                    ],
                }
            ]
        )
    )
    by_name, by_label, by_annotation = ss.containers[0].transfer_env
    # Kruise: envName and envNames together, sorted and without repeats.
    assert by_name.env_names == ("A", "B", "C")
    meta = {"name": "web-1", "labels": {"main": "app"}, "annotations": {"example.com/main": "sidecar"}}
    assert by_name.source_in(meta) == "app"
    assert by_label.source_in(meta) == "app"
    assert by_annotation.source_in(meta) == "sidecar"
    assert by_label.source_in({"labels": {}}) is None


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda o: o.update(metadata={}), "metadata.name"),
        (lambda o: o.update(spec=[]), "spec must be an object"),
        (lambda o: o.update(kind="Deployment"), "kind"),
        (lambda o: o.update(apiVersion="apps/v1"), "apiVersion"),
        (lambda o: o["spec"].update(containers={"name": "x"}), "spec.containers must be a list"),
        (lambda o: o["spec"].update(containers=["x"]), "spec.containers[0] must be an object"),
        (lambda o: o["spec"].update(containers=[{"image": "x"}]), "spec.containers[0].name"),
        (lambda o: o["spec"].update(selector="app=web"), "spec.selector"),
        (lambda o: o["spec"].update(namespaceSelector=[]), "spec.namespaceSelector"),
        (lambda o: o["spec"].update(namespace=3), "spec.namespace"),
        (lambda o: o["spec"]["containers"][0].update(podInjectPolicy="Middle"), "spec.containers[0].podInjectPolicy"),
        (
            lambda o: o["spec"]["containers"][0].update(shareVolumePolicy={"type": "yes"}),
            "spec.containers[0].shareVolumePolicy.type",
        ),
        (
            lambda o: o["spec"]["containers"][0].update(upgradeStrategy={"upgradeType": "Warm"}),
            "upgradeStrategy.upgradeType",
        ),
        (lambda o: o["spec"]["containers"][0].update(env=[{"value": "x"}]), "spec.containers[0].env[0]"),
        (
            lambda o: o["spec"]["containers"][0].update(transferEnv=[{"envName": "A"}]),
            "spec.containers[0].transferEnv[0]",
        ),
        (
            lambda o: o["spec"]["containers"][0].update(
                transferEnv=[{"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
            ),
            "fieldRef.fieldPath",
        ),
        (
            # Kruise refuses metadata.name (TestConvertDownwardAPIFieldLabel).
            lambda o: o["spec"]["containers"][0].update(
                transferEnv=[{"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.name"}}, "envName": "E"}]
            ),
            "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.fieldPath: 'metadata.name'",
        ),
        (
            lambda o: o["spec"].update(initContainers=[{"name": "proxy", "image": "x"}]),
            "spec.initContainers[0].name: container name 'proxy' is already used",
        ),
        (lambda o: o["spec"].update(volumes=[{"emptyDir": {}}]), "spec.volumes[0].name"),
        (lambda o: o["spec"].update(patchPodMetadata=[{"annotations": {"a": 1}}]), "annotations[a]"),
        (
            lambda o: o["spec"].update(patchPodMetadata=[{"annotations": {"a": "1"}, "patchPolicy": "Merge"}]),
            "patchPolicy",
        ),
        (lambda o: o["spec"].update(injectionStrategy={"paused": "yes"}), "injectionStrategy.paused"),
    ],
)
def test_structural_errors_name_the_field(mutate: Any, field: str) -> None:
    obj = sidecarset()
    mutate(obj)
    with pytest.raises(ModelError) as info:
        SidecarSet.from_object(obj)
    assert field in str(info.value)


def test_not_an_object() -> None:
    with pytest.raises(ModelError, match="must be an object, not a list"):
        SidecarSet.from_object([])


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(
    key=st.sampled_from(["selector", "containers", "initContainers", "volumes", "patchPodMetadata", "namespace"]),
    value=_json,
)
def test_any_spec_value_is_read_or_refused_cleanly(key: str, value: Any) -> None:
    obj = sidecarset()
    obj["spec"][key] = value
    try:
        SidecarSet.from_object(obj)
    except ModelError as e:
        assert str(e)


# --- copies for the pod, and what is derived once --------------------------------------------


def _ids(value: Any, out: set[int]) -> set[int]:
    if isinstance(value, dict | list):
        out.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            _ids(item, out)
    return out


def test_fresh_copies_are_equal_and_share_nothing() -> None:
    ss = SidecarSet.from_object(
        sidecarset(
            containers=[
                {
                    "name": "proxy",
                    "image": "proxy:1",
                    "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            volumes=[{"name": "data", "secret": {"secretName": "s", "items": [{"key": "k", "path": "p"}]}}],
            imagePullSecrets=[{"name": "registry"}],
        )
    )
    (proxy,) = ss.containers
    originals = (proxy.container, ss.volumes[0], list(ss.image_pull_secrets))
    snapshot = copy.deepcopy(originals)
    copies = (proxy.fresh_container(), ss.fresh_volume("data"), ss.fresh_image_pull_secrets())
    again = (proxy.fresh_container(), ss.fresh_volume("data"), ss.fresh_image_pull_secrets())
    assert copies == snapshot == again
    assert _ids(copies, set()).isdisjoint(_ids(originals, set()) | _ids(again, set()))
    copies[0]["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] = "changed"
    copies[1]["secret"]["items"].clear()
    assert originals == snapshot
    assert (proxy.fresh_container(), ss.fresh_volume("data")) == snapshot[:2]
    assert ss.fresh_volume("absent") is None
    assert ss.volume("data") is ss.volumes[0]


def test_values_json_cannot_carry_are_deep_copied_with_their_types_and_sharing() -> None:
    limits = {"cpu": "10m"}
    container = {
        "name": "proxy",
        "image": "p",
        "env": [{"name": "SINCE", "value": datetime.date(2024, 1, 1)}, {"name": "NAN", "value": math.nan}],
        "resources": {"requests": limits, "limits": limits},  # what a YAML anchor gives
    }
    (proxy,) = SidecarSet.from_object(sidecarset(containers=[container])).containers
    fresh = proxy.fresh_container()
    assert fresh["env"][0]["value"] == datetime.date(2024, 1, 1)
    assert math.isnan(fresh["env"][1]["value"])
    assert fresh["resources"]["requests"] is fresh["resources"]["limits"] is not limits


@pytest.mark.parametrize(
    "value",
    [
        [{"port": 2**70}],
        {"tuple": (1, 2)},
        collections.OrderedDict(a=1),
        {"key": "value", "nested": [{"deep": [1.5, None, True, "ü"]}]},
    ],
)
def test_a_template_copy_equals_a_deep_copy(value: Any) -> None:
    template = JsonTemplate(value)
    for _ in range(2):
        fresh = template.fresh()
        expected = copy.deepcopy(value)
        assert fresh == expected
        assert repr(fresh) == repr(expected)  # the same types, not just equal values
        assert fresh is not value


def test_derived_data_follows_dataclasses_replace() -> None:
    ss = SidecarSet.from_object(sidecarset(namespaceSelector={"matchLabels": {"team": "x"}}))
    assert not ss.matches_namespace("shop", {"team": "y"})
    widened = dataclasses.replace(ss, namespace_selector=None)
    assert widened.matches_namespace("shop", {"team": "y"})
    assert widened == dataclasses.replace(ss, namespace_selector=None)


@pytest.mark.parametrize(
    "selector",
    [{"matchLabels": ["team"]}, {"matchExpressions": 3}, {"matchExpressions": [{"key": "k", "operator": "Is"}]}],
)
def test_an_ill_formed_namespace_selector_matches_no_namespace(selector: dict[str, Any]) -> None:
    ss = SidecarSet.from_object(sidecarset(namespaceSelector=selector))
    assert not ss.matches_namespace("shop", None)
    assert not ss.matches_namespace("shop", {"team": "x"})
