"""v1beta1 SidecarSets read and validated as written: the model and validation take both versions.

The fields where the versions differ (namespace scope, custom version) are read from where each
version keeps them, errors name the field of the object's own version, and a field of the other
version is refused instead of being ignored (the API server would prune it silently).
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecarsets.spec import names
from sidecarsets.spec.conversion import convert
from sidecarsets.spec.model import ModelError, SidecarSet
from sidecarsets.validation import validate_sidecarset
from tests.kube import builders

BETA = names.API_VERSION_V1BETA1
SELECTOR = {"matchLabels": {"team": "a"}}


def beta(spec: dict[str, Any] | None = None, api_version: str = BETA, **meta: Any) -> dict[str, Any]:
    return builders.sidecarset(
        api_version=api_version, containers=[builders.container("proxy", "envoy:1")], metadata=meta, **(spec or {})
    )


def errors(obj: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate_sidecarset(obj)]


@pytest.mark.parametrize("api_version", [BETA, names.KRUISE_API_VERSION_V1BETA1])
def test_both_groups_of_v1beta1_are_read(api_version: str) -> None:
    ss = SidecarSet.from_object(beta({"specificNamespace": {"namespace": "shop"}}, api_version))
    assert ss.namespace_selector == {"matchLabels": {names.NS_NAME_LABEL: "shop"}}
    assert errors(beta({"specificNamespace": {"namespace": "shop"}}, api_version)) == []


def test_specific_namespace_scopes_like_the_v1alpha1_fields() -> None:
    one = SidecarSet.from_object(beta({"specificNamespace": {"namespace": "shop", "namespaceSelector": SELECTOR}}))
    assert one.matches_namespace("shop", {}) and not one.matches_namespace("other", {"team": "a"})
    by_labels = SidecarSet.from_object(beta({"specificNamespace": {"namespaceSelector": SELECTOR}}))
    assert by_labels.matches_namespace("x", {"team": "a"}) and not by_labels.matches_namespace("x", {})


def test_kruise_top_level_selector_scopes_too() -> None:
    ss = SidecarSet.from_object(beta({"namespaceSelector": SELECTOR}))
    assert ss.namespace_selector == SELECTOR
    assert errors(beta({"namespaceSelector": SELECTOR})) == []


def test_a_v1beta1_spec_namespace_is_not_read_and_is_refused() -> None:
    obj = beta({"namespace": "shop"})
    assert SidecarSet.from_object(obj).namespace_selector is None
    assert errors(obj) == [
        "spec.namespace: is not a field of sidecarctl.io/v1beta1: use "
        f"spec.namespaceSelector.matchLabels[{names.NS_NAME_LABEL}]"
    ]


def test_v1beta1_fields_in_v1alpha1_are_refused() -> None:
    obj = beta({"customVersion": "v1", "specificNamespace": {"namespace": "shop"}}, names.API_VERSION)
    assert errors(obj) == [
        "spec.specificNamespace: is not a field of sidecarctl.io/v1alpha1: "
        "use spec.namespace and spec.namespaceSelector",
        f"spec.customVersion: is not a field of sidecarctl.io/v1alpha1: use the label {names.SS_LABEL_CUSTOM_VERSION}",
    ]


def test_custom_version_is_spec_custom_version_in_v1beta1() -> None:
    obj = beta({"customVersion": "v2"}, labels={names.SS_LABEL_CUSTOM_VERSION: "label-is-not-it"})
    assert SidecarSet.from_object(obj).custom_version == "v2"
    assert SidecarSet.from_object(convert(obj, names.API_VERSION)).custom_version == "v2"
    assert SidecarSet.from_object(beta()).custom_version == ""


def test_both_namespace_spellings_are_refused() -> None:
    obj = beta({"namespaceSelector": SELECTOR, "specificNamespace": {"namespace": "shop"}})
    with pytest.raises(ModelError, match="mutually exclusive"):
        SidecarSet.from_object(obj)
    assert "spec.namespaceSelector: and spec.specificNamespace are mutually exclusive: set one" in errors(obj)


@pytest.mark.parametrize(
    ("spec", "meta", "expected"),
    [
        ({"specificNamespace": {}}, {}, "spec.specificNamespace: set namespace or namespaceSelector, or leave it out"),
        ({"specificNamespace": "shop"}, {}, "spec.specificNamespace: must be an object, not string"),
        (
            {"specificNamespace": {"namespace": "Shop"}},
            {},
            "spec.specificNamespace.namespace: 'Shop' is not a DNS-1123",
        ),
        ({"specificNamespace": {"namespace": "a", "names": ["b"]}}, {}, "spec.specificNamespace.names: unknown field"),
        (
            {"specificNamespace": {"namespaceSelector": {}}},
            {},
            "spec.specificNamespace.namespaceSelector: empty selector is not valid",
        ),
        ({"namespaceSelector": {}}, {}, "spec.namespaceSelector: empty selector is not valid"),
        ({"customVersion": 3}, {}, "spec.customVersion: must be a string, not number"),
        ({"customVersion": "not a label!"}, {}, "spec.customVersion: label value 'not a label!' is invalid"),
        (
            {},
            {"annotations": {names.ANN_CONVERSION_SELECTOR_AT: "spec.namespaceSelector"}},
            f"metadata.annotations[{names.ANN_CONVERSION_SELECTOR_AT}]: is reserved",
        ),
    ],
)
def test_v1beta1_errors_name_the_v1beta1_field(spec: dict[str, Any], meta: dict[str, Any], expected: str) -> None:
    found = errors(beta(spec, **meta))
    assert any(e.startswith(expected) for e in found), found


def test_conflicts_are_found_across_versions() -> None:
    """A v1beta1 SidecarSet and a stored v1alpha1 one in the same namespace may not both add `proxy`."""
    stored = convert(beta({"specificNamespace": {"namespace": "shop"}}), names.API_VERSION)
    stored["metadata"]["name"] = "other"
    new = beta({"specificNamespace": {"namespace": "shop"}})
    assert errors({**new}) == []
    assert [str(e) for e in validate_sidecarset(new, others=[stored])] == [
        "spec.containers[0].name: container proxy already exists in SidecarSet other"
    ]
    elsewhere = beta({"specificNamespace": {"namespace": "cafe"}})
    assert validate_sidecarset(elsewhere, others=[stored]) == []


def test_the_stashed_label_of_a_v1alpha1_object_must_be_a_label_value() -> None:
    """The conversion turns it back into a v1beta1 label, which the API server would refuse."""
    key = names.ANN_CONVERSION_VERSION_LABEL
    bad = beta({}, names.API_VERSION)
    bad["metadata"]["annotations"] = {key: "not a label value!"}
    assert any(e.startswith(f"metadata.annotations[{key}]") for e in errors(bad))
    good = beta({}, names.API_VERSION)
    good["metadata"]["annotations"] = {key: "v1"}
    assert errors(good) == []
