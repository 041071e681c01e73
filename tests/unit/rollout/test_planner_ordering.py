"""Upgrade order: Kubernetes' ActivePods order, then priorityStrategy, then scatterStrategy."""

from __future__ import annotations

from typing import Any

import pytest

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.rollout.ordering import active_pods_key, priority_key, scatter_terms, upgrade_order
from sidecarsets.rollout.planner import plan_upgrade
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
    # As Kruise: a pod with none of the keys first, then the trailing integer, higher first.
    assert order_of(pods, strategy) == ["none", "r10", "r2", "r1", "nodigits"]


def test_order_priority_several_keys() -> None:
    strategy = {"priorityStrategy": {"orderPriority": [{"orderedKey": "a"}, {"orderedKey": "b"}]}}
    pods = [
        proj("b9", labels={"b": "9"}),
        proj("a1", labels={"a": "1"}),
        proj("a3", labels={"a": "3", "b": "1"}),
        proj("x"),
    ]
    assert order_of(pods, strategy) == ["x", "a3", "a1", "b9"]


def test_ill_formed_priority_orders_nothing() -> None:
    assert priority_key({"weightPriority": [{"weight": "x"}], "orderPriority": "no"}) is None
    assert priority_key(None) is None


def test_scatter_spreads_one_value() -> None:
    pods = [proj(f"{z}{i}", labels={"zone": z}) for z in "ab" for i in range(3)]
    assert order_of(pods) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    # As Kruise: groups of 1 and 2 (3 of 6 pods carry it), the last carrier at the very end.
    assert order_of(pods, {"scatterStrategy": [{"key": "zone", "value": "a"}]}) == ["a0", "b0", "b1", "a1", "b2", "a2"]


def test_scatter_star_expands_over_matched_pods_in_their_order() -> None:
    pods = [proj("a0", labels={"zone": "a"}), proj("b0", labels={"zone": "b"}), proj("a1", labels={"zone": "a"})]
    terms = [{"key": "zone", "value": "*"}, {"key": ""}, {"value": "x"}, "junk", {"key": "rack", "value": 3}]
    assert scatter_terms(terms, pods) == [("zone", "a"), ("zone", "b")]
    assert scatter_terms([{"key": "zone", "value": "b"}, {"key": "zone", "value": "*"}], pods) == [
        ("zone", "b"),
        ("zone", "a"),
    ]
    assert scatter_terms("junk", pods) == []


def test_scatter_in_the_planner_picks_spread_pods_first() -> None:
    ss = with_images(V1, envoy="envoy:v2")
    ss["spec"]["updateStrategy"] = {"maxUnavailable": 2, "scatterStrategy": [{"key": "zone", "value": "a"}]}
    pods = [proj(f"{z}{i}", labels={"zone": z}) for z in "ab" for i in range(3)]
    assert [u.name for u in plan_upgrade(model(ss), pods, revision="r", now="t").upgrades] == ["a0", "b0"]
