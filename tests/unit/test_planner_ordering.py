"""Upgrade order: Kubernetes' ActivePods order, then priorityStrategy, then scatterStrategy."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kuberuntime.jsontypes import JsonObj
from sidecarsets.ordering import active_pods_key, priority_key, scatter_groups, spread, upgrade_order
from sidecarsets.planner import plan_upgrade
from sidecarsets.projection import PodProjection, project
from tests.kube.builders import injected_pod, model, shop_sidecarset, with_images

V1 = shop_sidecarset()


def proj(name: str, **kw: Any) -> PodProjection:
    return project(injected_pod(name, V1, **kw))


def order_of(pods: list[PodProjection], strategy: JsonObj | None = None) -> list[str]:
    return [
        p.name for p in upgrade_order(pods, pods, model({"spec": {"updateStrategy": strategy or {}}}).update_strategy)
    ]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (dict(node=""), dict(node="n1")),  # unassigned first
        (dict(phase="Pending", ready=False), dict(phase="Running", ready=False)),
        (dict(phase="Unknown", ready=False), dict(phase="Running", ready=False)),
        (dict(phase="Pending", ready=False), dict(phase="Unknown", ready=False)),
        (dict(ready=False), dict(ready=True)),
        (dict(ready_since="2024-05-02T00:00:00Z"), dict(ready_since="2024-05-01T00:00:00Z")),  # shorter ready
        (dict(ready_since=""), dict(ready_since="2024-05-01T00:00:00Z")),  # unknown ready time first
        (dict(restarts=3), dict(restarts=1)),
        (dict(created="2024-05-02T00:00:00Z"), dict(created="2024-05-01T00:00:00Z")),  # newer first
        (dict(created=""), dict(created="2024-05-01T00:00:00Z")),
    ],
)
def test_active_pods_order(first: dict[str, Any], second: dict[str, Any]) -> None:
    # names chosen so that the name tie-break would put them the other way round
    a, b = proj("z-first", **first), proj("a-second", **second)
    assert order_of([b, a]) == ["z-first", "a-second"]
    assert active_pods_key(a) < active_pods_key(b)


def test_earlier_rules_win() -> None:
    unassigned_ready = proj("u", node="", restarts=0)
    assigned_not_ready = proj("a", ready=False, restarts=9)
    assert order_of([assigned_not_ready, unassigned_ready]) == ["u", "a"]


def test_weight_priority() -> None:
    strategy = {
        "priorityStrategy": {
            "weightPriority": [
                {"weight": 50, "matchSelector": {"matchLabels": {"tier": "canary"}}},
                {"weight": 10, "matchSelector": {"matchLabels": {"zone": "a"}}},
            ]
        }
    }
    pods = [
        proj("none"),
        proj("low", labels={"zone": "a"}),
        proj("high", labels={"tier": "canary"}),
        proj("both", labels={"tier": "canary", "zone": "a"}),
    ]
    assert order_of(pods, strategy) == ["both", "high", "low", "none"]


def test_priority_keeps_active_pods_order_among_equals() -> None:
    strategy = {"priorityStrategy": {"weightPriority": [{"weight": 5, "matchSelector": {"matchLabels": {"x": "1"}}}]}}
    pods = [proj("ready"), proj("not-ready", ready=False), proj("prio", labels={"x": "1"})]
    assert order_of(pods, strategy) == ["prio", "not-ready", "ready"]


def test_order_priority() -> None:
    strategy = {"priorityStrategy": {"orderPriority": [{"orderedKey": "rank"}]}}
    pods = [
        proj("r1", labels={"rank": "r1"}),
        proj("r10", labels={"rank": "r10"}),
        proj("r2", labels={"rank": "2"}),
        proj("none"),
        proj("nodigits", labels={"rank": "abc"}),
    ]
    assert order_of(pods, strategy) == ["r10", "r2", "r1", "nodigits", "none"]


def test_order_priority_several_keys() -> None:
    strategy = {"priorityStrategy": {"orderPriority": [{"orderedKey": "a"}, {"orderedKey": "b"}]}}
    pods = [
        proj("b9", labels={"b": "9"}),
        proj("a1", labels={"a": "1"}),
        proj("a3", labels={"a": "3", "b": "1"}),
        proj("x"),
    ]
    assert order_of(pods, strategy) == ["a3", "a1", "b9", "x"]


def test_ill_formed_priority_orders_nothing() -> None:
    assert priority_key({"weightPriority": [{"weight": "x"}], "orderPriority": "no"}) is None
    assert priority_key(None) is None


def test_scatter_spreads_one_value() -> None:
    pods = [proj(f"{z}{i}", labels={"zone": z}) for z in "ab" for i in range(3)]
    assert order_of(pods) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert order_of(pods, {"scatterStrategy": [{"key": "zone", "value": "a"}]}) == ["a0", "b0", "a1", "b1", "a2", "b2"]
    pods = [proj(f"a{i}", labels={"zone": "a"}) for i in range(2)] + [proj(f"o{i}") for i in range(6)]
    # a at 1/4 and 3/4 of the way, ties going to the pod that was earlier
    assert order_of(pods, {"scatterStrategy": [{"key": "zone", "value": "a"}]}) == [
        "o0",
        "a0",
        "o1",
        "o2",
        "o3",
        "a1",
        "o4",
        "o5",
    ]


def test_scatter_star_interleaves_every_value() -> None:
    pods = [proj(f"{z}{i}", labels={"zone": z}) for z in "abc" for i in range(4)]
    order = order_of(pods, {"scatterStrategy": [{"key": "zone", "value": "*"}]})
    assert order == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"]


def test_scatter_values_only_from_matched_pods_and_bad_terms_ignored() -> None:
    pods = [proj("a0", labels={"zone": "a"}), proj("b0", labels={"zone": "b"})]
    terms = [{"key": "zone", "value": "*"}, {"key": ""}, {"value": "x"}, "junk", {"key": "rack", "value": 3}]
    assert scatter_groups(terms, pods) == [("zone", ["a", "b"])]
    assert scatter_groups("junk", pods) == []


def test_first_scatter_key_has_the_last_word() -> None:
    pods = [proj(f"p{i}", labels={"zone": "ab"[i % 2], "rack": "r1" if i < 4 else "r2"}) for i in range(8)]
    order = order_of(pods, {"scatterStrategy": [{"key": "zone", "value": "*"}, {"key": "rack", "value": "*"}]})
    labels = {p.name: p.labels for p in pods}
    assert all(labels[x]["zone"] != labels[y]["zone"] for x, y in itertools.pairwise(order))


def test_scatter_in_the_planner_picks_spread_pods_first() -> None:
    ss = with_images(V1, envoy="envoy:v2")
    ss["spec"]["updateStrategy"] = {"maxUnavailable": 2, "scatterStrategy": [{"key": "zone", "value": "a"}]}
    pods = [proj(f"{z}{i}", labels={"zone": z}) for z in "ab" for i in range(3)]
    assert [u.name for u in plan_upgrade(model(ss), pods, revision="r", now="t").upgrades] == ["a0", "b0"]


@given(st.lists(st.sampled_from(["a", "b", "c", ""]), min_size=0, max_size=40), st.sampled_from([["a"], ["a", "b"]]))
def test_spread_is_even_and_keeps_relative_order(zones: list[str], values: list[str]) -> None:
    pods = [proj(f"p{i:02d}", labels={"zone": z} if z else {}) for i, z in enumerate(zones)]
    out = spread(pods, "zone", values)
    assert sorted(p.name for p in out) == [p.name for p in pods]

    def group(p: PodProjection) -> str | None:
        z = p.labels.get("zone")
        return z if z in values else None

    n = len(pods)
    for g in {group(p) for p in pods}:
        members = [p for p in pods if group(p) == g]
        assert [p for p in out if group(p) == g] == members  # relative order kept
        m = len(members)
        for k in range(n + 1):  # every prefix holds its fair share of each group, within one pod
            assert abs(sum(1 for p in out[:k] if group(p) == g) - k * m / n) <= 1
