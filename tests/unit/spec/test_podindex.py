"""sidecarsets.spec.podindex: a pod's candidates always include every SidecarSet that selects it,
and leave out those filed under something the pod does not carry."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.podindex import PodIndex, anchors, label_anchors
from tests.kube.builders import sidecarset

KEYS = ["app", "team", "tier", "zone"]
VALUES = ["a", "b", "c"]
NAMESPACES = ["n1", "n2", "n3"]


def model(name: str, selector: dict[str, Any], namespace_selector: dict[str, Any] | None = None) -> SidecarSet:
    obj = sidecarset(name, selector=selector)
    if namespace_selector is not None:
        obj["spec"]["namespaceSelector"] = namespace_selector
    return SidecarSet.from_object(obj)


expressions = st.builds(
    lambda key, op, values: {"key": key, "operator": op, **({"values": values} if op in ("In", "NotIn") else {})},
    st.sampled_from(KEYS),
    st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=2, unique=True),
)
selectors_ = st.builds(
    lambda ml, me: {**({"matchLabels": ml} if ml else {}), **({"matchExpressions": me} if me else {})},
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    st.lists(expressions, max_size=2),
)
namespace_selectors = st.one_of(
    st.none(),
    st.just({"matchLabels": {names.NS_NAME_LABEL: "n1"}}),
    st.builds(
        lambda values: {"matchExpressions": [{"key": names.NS_NAME_LABEL, "operator": "In", "values": values}]},
        st.lists(st.sampled_from(NAMESPACES), min_size=1, max_size=2, unique=True),
    ),
    st.just({"matchLabels": {"env": "prod"}}),
)
pods = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(selectors_, namespace_selectors), min_size=1, max_size=8),
    pods,
    st.sampled_from(NAMESPACES),
    st.sampled_from([None, {"env": "prod"}, {"env": "dev"}]),
)
def test_every_sidecarset_that_selects_the_pod_is_a_candidate(
    specs: list[tuple[dict[str, Any], dict[str, Any] | None]],
    labels: dict[str, str],
    namespace: str,
    ns_labels: dict[str, str] | None,
) -> None:
    sets = [model(f"s{i}", sel, ns) for i, (sel, ns) in enumerate(specs)]
    index = PodIndex(sets)
    candidates = index.candidates(namespace, labels)
    selecting = [ss for ss in sets if ss.matches_namespace(namespace, ns_labels) and ss.matches_pod(labels)]
    assert set(map(id, selecting)) <= set(map(id, candidates))
    assert [sets.index(c) for c in candidates] == sorted(sets.index(c) for c in candidates), "the given order"


def test_a_sidecarset_is_filed_under_one_requirement() -> None:
    assert label_anchors({"matchLabels": {"team": "t1", "app": "web"}}) == [("label", "app", "web")]
    assert label_anchors({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}) == [
        ("label", "team", "a"),
        ("label", "team", "b"),
    ]
    assert label_anchors({"matchExpressions": [{"key": "team", "operator": "Exists"}]}) == [("key", "team", None)]
    assert label_anchors({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}) is None
    assert label_anchors({}) == [], "an empty selector selects no pod: filed nowhere"
    by_name = model("x", {"matchLabels": {"app": "web"}}, {"matchLabels": {names.NS_NAME_LABEL: "shop"}})
    assert anchors(by_name) == [("ns", "shop", None)]


def test_a_pod_is_only_offered_the_sidecarsets_it_could_match() -> None:
    sets = [model(f"team-{k}", {"matchLabels": {"team": f"t{k}"}}) for k in range(1000)]
    loose = model("loose", {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["t1"]}]})
    shop = model("shop", {"matchLabels": {"app": "web"}}, {"matchLabels": {names.NS_NAME_LABEL: "shop"}})
    index = PodIndex([*sets, loose, shop])
    assert [s.name for s in index.candidates("default", {"team": "t7", "app": "web"})] == ["team-7", "loose"]
    assert [s.name for s in index.candidates("shop", {"app": "web"})] == ["loose", "shop"]
    assert [s.name for s in index.candidates("default", {})] == ["loose"]
