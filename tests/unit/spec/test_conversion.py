"""v1alpha1 <-> v1beta1 conversion (sidecarsets.spec.conversion): Kruise 1.9's mapping, and what it keeps.

The properties run over generated SidecarSets. Both versions of one object always mean the same to
the model (the same namespaces, the same custom version). Any v1beta1 object in Kruise's shape
converted to v1alpha1 and back is the same object; a v1alpha1 object comes back with its namespace
spelled as Kruise spells it (an alpha `namespace` as a `kubernetes.io/metadata.name` selector), and
from then on round trips unchanged. The conversion refuses only objects with a ConversionError
naming why. tests/kruise compares the mapping with Kruise's own code.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecarsets.spec import names
from sidecarsets.spec.conversion import ConversionError, convert, is_v1beta1, version_of
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import validate_sidecarset
from tests.kube import builders

ALPHA = names.API_VERSION
BETA = names.API_VERSION_V1BETA1
LABEL = names.SS_LABEL_CUSTOM_VERSION
AT = names.ANN_CONVERSION_SELECTOR_AT
STASHED = names.ANN_CONVERSION_VERSION_LABEL
NS_LABEL = names.NS_NAME_LABEL


def sidecarset(api_version: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return builders.sidecarset(
        api_version=api_version, containers=[builders.container("proxy", "p:1")], metadata=meta, **spec
    )


def round_trip(obj: dict[str, Any], via: str) -> dict[str, Any]:
    return convert(convert(obj, via), obj["apiVersion"])


# ---------------------------------------------------------------------------------------------
# The mapping


def test_alpha_namespace_becomes_a_metadata_name_selector_as_in_kruise() -> None:
    selector = {"matchLabels": {"team": "a"}}
    alpha = sidecarset(ALPHA, {"namespace": "shop", "namespaceSelector": selector})
    beta = convert(alpha, BETA)
    assert beta["apiVersion"] == BETA
    assert "namespace" not in beta["spec"] and "specificNamespace" not in beta["spec"]
    assert beta["spec"]["namespaceSelector"] == {"matchLabels": {NS_LABEL: "shop"}}, "namespace wins, as before"
    back = convert(beta, ALPHA)
    assert back["spec"]["namespaceSelector"] == {"matchLabels": {NS_LABEL: "shop"}}
    assert "namespace" not in back["spec"]
    assert convert(convert(back, BETA), ALPHA) == back


def test_an_alpha_selector_is_the_top_level_selector() -> None:
    selector = {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]}
    alpha = sidecarset(ALPHA, {"namespaceSelector": selector, "namespace": ""})
    beta = convert(alpha, BETA)
    assert beta["spec"]["namespaceSelector"] == selector
    assert convert(beta, ALPHA) == sidecarset(ALPHA, {"namespaceSelector": selector})


def test_no_namespace_fields_no_namespace_selector() -> None:
    beta = convert(sidecarset(ALPHA, {}), BETA)
    assert "specificNamespace" not in beta["spec"]
    assert "namespaceSelector" not in beta["spec"]


def test_the_custom_version_label_becomes_spec_custom_version() -> None:
    alpha = sidecarset(ALPHA, {}, labels={LABEL: "v2", "team": "a"})
    beta = convert(alpha, BETA)
    assert beta["spec"]["customVersion"] == "v2"
    assert beta["metadata"]["labels"] == {"team": "a"}
    assert convert(beta, ALPHA) == alpha


def test_an_empty_custom_version_is_none_and_dropped_as_in_kruise() -> None:
    alpha = sidecarset(ALPHA, {}, labels={LABEL: ""})
    beta = convert(alpha, BETA)
    assert "customVersion" not in beta["spec"]
    assert "labels" not in beta["metadata"], "no empty label map is left behind"
    back = convert(sidecarset(BETA, {"customVersion": ""}), ALPHA)
    assert "labels" not in back["metadata"]


def test_nulls_are_absent() -> None:
    beta = sidecarset(BETA, {"specificNamespace": None, "customVersion": None, "namespaceSelector": None})
    alpha = convert(beta, ALPHA)
    assert "labels" not in alpha["metadata"] and "specificNamespace" not in alpha["spec"]
    both = sidecarset(BETA, {"specificNamespace": {"namespace": "shop"}, "namespaceSelector": None})
    assert convert(both, ALPHA)["spec"]["namespace"] == "shop"


def test_kruise_top_level_selector_in_v1beta1_needs_no_annotation() -> None:
    selector = {"matchExpressions": [{"key": NS_LABEL, "operator": "NotIn", "values": ["legacy"]}]}
    beta = sidecarset(BETA, {"namespaceSelector": selector})
    alpha = convert(beta, ALPHA)
    assert alpha["spec"]["namespaceSelector"] == selector
    assert "annotations" not in alpha["metadata"]
    assert convert(alpha, BETA) == beta


def test_an_earlier_versions_selector_marker_is_dropped() -> None:
    selector = {"matchLabels": {"team": "a"}}
    alpha = sidecarset(ALPHA, {"namespaceSelector": selector}, annotations={AT: "spec.namespaceSelector"})
    beta = convert(alpha, BETA)
    assert beta["spec"]["namespaceSelector"] == selector
    assert "annotations" not in beta["metadata"]


def test_specific_namespace_is_read_and_never_written() -> None:
    selector = {"matchLabels": {"team": "a"}}
    beta = sidecarset(BETA, {"specificNamespace": {"namespaceSelector": selector}})
    alpha = convert(beta, ALPHA)
    assert alpha["spec"]["namespaceSelector"] == selector
    assert "annotations" not in alpha["metadata"]
    assert convert(alpha, BETA) == sidecarset(BETA, {"namespaceSelector": selector})
    alpha = convert(sidecarset(BETA, {"specificNamespace": {"namespace": "shop"}}), ALPHA)
    assert alpha["spec"]["namespace"] == "shop"
    assert (
        convert(alpha, BETA)["spec"]
        == sidecarset(BETA, {"namespaceSelector": {"matchLabels": {NS_LABEL: "shop"}}})["spec"]
    )


def test_a_v1beta1_label_of_the_custom_version_key_is_kept_by_an_annotation() -> None:
    beta = sidecarset(BETA, {"customVersion": "v3"}, labels={LABEL: "old"})
    alpha = convert(beta, ALPHA)
    assert alpha["metadata"]["labels"] == {LABEL: "v3"}
    assert alpha["metadata"]["annotations"] == {STASHED: "old"}
    assert convert(alpha, BETA) == beta


def test_everything_else_is_the_same_value_and_the_input_is_untouched() -> None:
    alpha = sidecarset(
        ALPHA,
        {"namespace": "shop", "updateStrategy": {"type": "RollingUpdate", "partition": "10%"}, "volumes": []},
        uid="u",
        resourceVersion="12",
        annotations={"a": "b"},
        managedFields=[{"manager": "kubectl", "apiVersion": ALPHA}],
    )
    alpha["status"] = {"matchedPods": 3, "updatedPods": 1, "readyPods": 2, "latestRevision": "mesh-abc"}
    before = copy.deepcopy(alpha)
    beta = convert(alpha, BETA)
    assert alpha == before
    assert beta["status"] == alpha["status"]
    assert beta["metadata"] == alpha["metadata"]
    same = {k: v for k, v in alpha["spec"].items() if k != "namespace"}
    assert {k: v for k, v in beta["spec"].items() if k != "namespaceSelector"} == same


def test_overrides_round_trip_both_ways_unchanged() -> None:
    """spec.overrides (our extension) is in both versions: no conversion drops or rewrites it."""
    overrides = [{"containerName": "proxy", "resources": {"cpu": {"min": "50m", "max": "2"}}, "env": ["LOG_LEVEL"]}]
    alpha = sidecarset(ALPHA, {"overrides": overrides})
    beta = convert(alpha, BETA)
    assert beta["spec"]["overrides"] == overrides
    assert round_trip(alpha, BETA) == alpha and round_trip(beta, ALPHA) == beta
    assert SidecarSet.from_object(alpha).overrides == SidecarSet.from_object(beta).overrides != ()


def test_same_version_is_a_copy_with_the_requested_api_version() -> None:
    alpha = sidecarset(ALPHA, {"namespace": "shop"})
    assert convert(alpha, ALPHA) == alpha
    kruise = {**alpha, "apiVersion": names.KRUISE_API_VERSION}
    assert convert(kruise, ALPHA) == alpha
    assert convert(kruise, BETA)["spec"]["namespaceSelector"] == {"matchLabels": {NS_LABEL: "shop"}}


def test_versions_are_read_from_the_api_version() -> None:
    assert [version_of(v) for v in (ALPHA, BETA, names.KRUISE_API_VERSION, names.KRUISE_API_VERSION_V1BETA1)] == [
        "v1alpha1",
        "v1beta1",
        "v1alpha1",
        "v1beta1",
    ]
    assert version_of("sidecarctl.io/v1") is None and version_of(None) is None
    assert is_v1beta1({"apiVersion": BETA}) and not is_v1beta1({})


@pytest.mark.parametrize(
    ("obj", "desired", "message"),
    [
        (sidecarset(ALPHA, {}), "sidecarctl.io/v2", "cannot convert to 'sidecarctl.io/v2'"),
        (["not", "an", "object"], BETA, "must be an object"),
        ({**sidecarset(ALPHA, {}), "kind": "Pod"}, BETA, "kind: 'Pod' is not SidecarSet"),
        ({**sidecarset(ALPHA, {}), "apiVersion": "v1"}, BETA, "apiVersion: 'v1' is not a SidecarSet version"),
        ({**sidecarset(ALPHA, {}), "spec": "x"}, BETA, "spec must be an object"),
        ({**sidecarset(ALPHA, {}), "metadata": []}, BETA, "metadata must be an object"),
        (sidecarset(ALPHA, {}, labels=[]), BETA, "metadata.labels must be an object"),
        (sidecarset(ALPHA, {"customVersion": "v1"}), BETA, "spec.customVersion is not a field of v1alpha1"),
        (sidecarset(ALPHA, {"specificNamespace": {}}), BETA, "spec.specificNamespace is not a field of v1alpha1"),
        (sidecarset(BETA, {"namespace": "shop"}), ALPHA, "spec.namespace is not a field of v1beta1"),
        (sidecarset(BETA, {"specificNamespace": "shop"}), ALPHA, "spec.specificNamespace must be an object"),
        (sidecarset(BETA, {"specificNamespace": {}}), ALPHA, "spec.specificNamespace is empty"),
        (sidecarset(BETA, {"specificNamespace": {"names": []}}), ALPHA, "spec.specificNamespace.names is not a field"),
        (
            sidecarset(
                BETA, {"specificNamespace": {"namespace": "a"}, "namespaceSelector": {"matchLabels": {"a": "b"}}}
            ),
            ALPHA,
            "mutually exclusive",
        ),
        (sidecarset(BETA, {"customVersion": 2}), ALPHA, "spec.customVersion must be a string"),
        (sidecarset(BETA, {}, annotations={STASHED: "x"}), ALPHA, f"metadata.annotations[{STASHED}] is reserved"),
        (sidecarset(ALPHA, {"namespace": 5}), BETA, "spec.namespace must be a string"),
    ],
)
def test_what_cannot_be_converted_without_loss_is_refused_naming_the_field(
    obj: Any, desired: str, message: str
) -> None:
    with pytest.raises(ConversionError, match=None) as refused:
        convert(obj, desired)
    assert message in str(refused.value)


# ---------------------------------------------------------------------------------------------
# Lossless, over generated SidecarSets

TEXT = st.text(alphabet="abcxyz019-._", max_size=8)
LABEL_VALUES = st.one_of(st.just(""), st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,6}[a-z0-9])?\Z"))
SELECTORS = st.one_of(
    st.builds(lambda k, v: {"matchLabels": {k: v}}, st.sampled_from(["team", NS_LABEL]), LABEL_VALUES),
    st.builds(
        lambda values: {"matchExpressions": [{"key": NS_LABEL, "operator": "In", "values": values}]},
        st.lists(st.sampled_from(["a", "b", "shop"]), min_size=1, max_size=3),
    ),
)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)


def _maps(keys: st.SearchStrategy[str], values: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, str] | None]:
    # The API server keeps no empty label or annotation map: absent, or at least one entry.
    return st.one_of(st.none(), st.dictionaries(keys, values, min_size=1, max_size=3))


def _objects(api_version: str, spec_fields: st.SearchStrategy[dict[str, Any]], annotation_keys: list[str]) -> Any:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": draw(st.sampled_from(["mesh", "log-agent"])), "resourceVersion": "42"}
        labels = draw(_maps(st.sampled_from([LABEL, "team", "app"]), LABEL_VALUES))
        annotations = draw(
            _maps(st.sampled_from(annotation_keys), st.sampled_from(["spec.namespaceSelector", "x", ""]))
        )
        for key, value in (("labels", labels), ("annotations", annotations)):
            if value is not None:
                meta[key] = value
        spec: dict[str, Any] = {
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": "p", "image": "p"}],
        }
        spec.update(draw(spec_fields))
        for key in draw(st.lists(st.sampled_from(["updateStrategy", "volumes", "patchPodMetadata"]), unique=True)):
            spec[key] = draw(JSON)
        obj: dict[str, Any] = {"apiVersion": api_version, "kind": "SidecarSet", "metadata": meta, "spec": spec}
        if draw(st.booleans()):
            obj["status"] = {"matchedPods": draw(st.integers(0, 9)), "latestRevision": draw(TEXT)}
        return obj

    return build()


def _some(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Any subset of `fields`, each with a drawn value."""
    return st.fixed_dictionaries({}, optional=fields)


ALPHA_OBJECTS = _objects(
    ALPHA,
    _some(namespace=st.one_of(st.just(""), st.sampled_from(["shop", "a"])), namespaceSelector=SELECTORS),
    [AT, STASHED, "note"],
)
BETA_SCOPES = st.one_of(st.just({}), st.builds(lambda s: {"namespaceSelector": s}, SELECTORS))
SPECIFIC_SCOPES = st.builds(
    lambda s: {"specificNamespace": s},
    _some(namespace=st.sampled_from(["", "shop"]), namespaceSelector=SELECTORS).filter(bool),
)
BETA_OBJECTS = _objects(
    BETA,
    st.builds(lambda scope, cv: {**scope, **cv}, BETA_SCOPES, _some(customVersion=LABEL_VALUES)),
    ["note", "sidecarctl.io/owner"],
)
SPECIFIC_OBJECTS = _objects(BETA, SPECIFIC_SCOPES, ["note"])
# v1beta1 objects a user may write: reserved annotations, both spellings, empty specificNamespace.
ANY_BETA_OBJECTS = _objects(
    BETA,
    _some(
        namespaceSelector=SELECTORS,
        specificNamespace=_some(namespace=st.sampled_from(["", "shop"]), namespaceSelector=SELECTORS),
        customVersion=LABEL_VALUES,
    ),
    [AT, STASHED, "note"],
)
SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROBES = [
    (ns, {NS_LABEL: ns, **extra})
    for ns in ("shop", "a", "b", "legacy", "")
    for extra in ({}, {"team": "a"}, {"team": ""})
]


def _same_meaning(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The same namespaces selected (probed), the same custom version, the same hashes."""
    one, other = SidecarSet.from_object(a, tolerant=True), SidecarSet.from_object(b, tolerant=True)
    for namespace, labels in PROBES:
        assert one.matches_namespace(namespace, labels) == other.matches_namespace(namespace, labels), namespace
    assert (one.custom_version or None) == (other.custom_version or None)
    assert (one.hash, one.hash_without_image) == (other.hash, other.hash_without_image)


def _kruise_spelling(alpha: dict[str, Any]) -> dict[str, Any]:
    """`alpha` with its namespace spelled as Kruise's conversion leaves it, without the marker an
    earlier version wrote and without an empty custom version (what a v1beta1 read-modify-write
    stores)."""
    out = copy.deepcopy(alpha)
    spec = out["spec"]
    namespace = spec.pop("namespace", None)
    if namespace:
        spec["namespaceSelector"] = {"matchLabels": {NS_LABEL: namespace}}
    for key, drop in (("annotations", (AT, None)), ("labels", (LABEL, ""))):
        found = out["metadata"].get(key) or {}
        if drop[0] in found and (drop[1] is None or found[drop[0]] == drop[1]):
            del found[drop[0]]  # the legacy marker; an empty custom version, which is none
        if key in out["metadata"] and not found:
            del out["metadata"][key]
    return out


@SETTINGS
@given(ALPHA_OBJECTS)
def test_alpha_to_beta_to_alpha_keeps_everything_but_the_namespace_spelling(alpha: dict[str, Any]) -> None:
    before = copy.deepcopy(alpha)
    beta = convert(alpha, BETA)
    assert alpha == before, "the input is never modified"
    back = convert(beta, ALPHA)
    assert back == _kruise_spelling(alpha)
    assert convert(convert(back, BETA), ALPHA) == back, "from then on it round trips unchanged"
    left = {k for k in beta["metadata"].get("annotations", {}) if k.startswith(names.CONVERSION_ANNOTATION_PREFIX)}
    assert not left, "v1beta1 shows no annotation of the conversion"
    _same_meaning(alpha, beta)
    _same_meaning(alpha, back)


@SETTINGS
@given(BETA_OBJECTS)
def test_beta_to_alpha_to_beta_gives_back_the_same_object(beta: dict[str, Any]) -> None:
    before = copy.deepcopy(beta)
    alpha = convert(beta, ALPHA)
    assert beta == before, "the input is never modified"
    expected = copy.deepcopy(beta)
    if expected["spec"].get("customVersion") == "":
        del expected["spec"]["customVersion"]  # none, as in Kruise
    assert convert(alpha, BETA) == expected
    _same_meaning(beta, alpha)


@SETTINGS
@given(SPECIFIC_OBJECTS)
def test_specific_namespace_comes_back_in_kruises_shape_meaning_the_same(beta: dict[str, Any]) -> None:
    back = convert(convert(beta, ALPHA), BETA)
    assert "specificNamespace" not in back["spec"]
    assert {k: v for k, v in back["spec"].items() if k != "namespaceSelector"} == {
        k: v for k, v in beta["spec"].items() if k != "specificNamespace"
    }
    _same_meaning(beta, back)


@SETTINGS
@given(ANY_BETA_OBJECTS)
def test_a_beta_object_is_either_refused_or_means_the_same_after_a_round_trip(beta: dict[str, Any]) -> None:
    try:
        alpha = convert(beta, ALPHA)
    except ConversionError as e:
        assert str(e).startswith(("spec.", "metadata.")), e
        return
    back = convert(alpha, BETA)
    _same_meaning(beta, back)
    plain = "specificNamespace" not in beta["spec"] and AT not in (beta["metadata"].get("annotations") or {})
    if plain and beta["spec"].get("customVersion") != "":
        assert back == beta


@SETTINGS
@given(ANY_BETA_OBJECTS)
def test_what_validation_accepts_in_v1beta1_converts(beta: dict[str, Any]) -> None:
    """An object the webhook admits never fails its conversion to the storage version."""
    if validate_sidecarset(beta):
        return
    convert(beta, ALPHA)


def test_the_round_trip_properties_see_every_shape() -> None:
    """The generators reach the cases that need care (the properties would be weak otherwise)."""
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(BETA_OBJECTS, ALPHA_OBJECTS)
    def probe(beta: dict[str, Any], alpha: dict[str, Any]) -> None:
        annotations = convert(beta, ALPHA)["metadata"].get("annotations", {})
        seen.update(k for k in (STASHED,) if k in annotations)
        seen.update(k for k in ("namespaceSelector", "customVersion") if k in beta["spec"])
        if alpha["spec"].get("namespace") and "namespaceSelector" in alpha["spec"]:
            seen.add("alpha namespace and selector")
        if AT in (alpha["metadata"].get("annotations") or {}):
            seen.add("legacy marker")

    probe()
    assert seen == {STASHED, "namespaceSelector", "customVersion", "alpha namespace and selector", "legacy marker"}
