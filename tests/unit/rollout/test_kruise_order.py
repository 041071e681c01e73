"""The upgrade order reproduces OpenKruise's own test tables.

Scatter: every case of Kruise's scatter sort tests (tests/unit/rollout/data/kruise_scatter_cases.json:
pod labels, null for a missing pod, the candidate positions, the expected order). Priority:
Kruise's compare and sort cases. Selection: the factory-pod cases of Kruise's
TestSortNextUpgradePods / TestGetNextUpgradePods (creation order, not-ready first, weight and
order priority, counts under maxUnavailable and partition). Across reconciles: one pick per
round, with the scatter counted over every matched pod, the sequence Kruise gives.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.rollout import ordering
from sidecarsets.rollout.planner import plan_upgrade
from sidecarsets.rollout.podpatch import pod_patch
from tests.kube import builders

CASES = json.loads((Path(__file__).parent / "data" / "kruise_scatter_cases.json").read_text())
V1 = builders.shop_sidecarset()


def pod(i: int, labels: dict[str, str] | None) -> PodProjection:
    return project(builders.injected_pod(f"p{i:03d}", V1, labels=labels or {}))


@pytest.mark.parametrize("case", CASES["scatterPodsByRule"], ids=lambda c: c["desc"])
def test_scatter_pods_by_rule(case: dict[str, Any]) -> None:
    pods = [pod(i, labels) for i, labels in enumerate(case["podLabels"][: len(case["expected"])])]
    term = (case["term"]["key"], case["term"]["value"])
    order = ordering.scatter_by(term, [pods[i] for i in case["candidates"]], pods)
    assert [pods.index(p) for p in order] == case["expected"]


@pytest.mark.parametrize("case", CASES["sort"], ids=lambda c: c["desc"])
def test_scatter_sort(case: dict[str, Any]) -> None:
    slots = [None if labels is None else pod(i, labels) for i, labels in enumerate(case["podLabels"])]
    everyone = [p for p in slots if p is not None]
    candidates = [p for i in case["candidates"] if (p := slots[i]) is not None]
    order = list(candidates)
    terms = ordering.scatter_terms(case["strategy"], everyone)
    for term in ordering._chosen_terms(terms, candidates):
        order = ordering.scatter_by(term, order, everyone)
    assert [slots.index(p) for p in order] == case["expected"]


WEIGHT = {
    "weightPriority": [
        {"weight": 20, "matchSelector": {"matchLabels": {"key": "foo"}}},
        {"weight": 10, "matchSelector": {"matchLabels": {"key": "bar"}}},
    ]
}
WEIGHT3 = {
    "weightPriority": [
        {"weight": 20, "matchSelector": {"matchLabels": {"key1": "foo"}}},
        {"weight": 10, "matchSelector": {"matchLabels": {"key2": "bar"}}},
        {"weight": 15, "matchSelector": {"matchLabels": {"key3": "baz"}}},
    ]
}
WEIGHT3B = {
    "weightPriority": [
        {"weight": 20, "matchSelector": {"matchLabels": {"key1": "foo"}}},
        {"weight": 10, "matchSelector": {"matchLabels": {"key2": "bar"}}},
        {"weight": 5, "matchSelector": {"matchLabels": {"key3": "baz"}}},
    ]
}
ORDER = {"orderPriority": [{"orderedKey": "key1"}, {"orderedKey": "key2"}]}


@pytest.mark.parametrize(
    ("strategy", "first", "second", "before"),
    [
        (WEIGHT, {}, {}, True),
        (WEIGHT, {"key": "foo"}, {"key": "foo"}, True),
        (WEIGHT, {"key": "bar"}, {"key": "foo"}, False),
        (WEIGHT, {}, {"key": "bar"}, False),
        (WEIGHT, {}, {"key": "foo"}, False),
        (WEIGHT3, {"key1": "foo"}, {"key2": "bar", "key3": "baz"}, False),
        (WEIGHT3B, {"key2": "bar", "key3": "baz"}, {"key1": "foo"}, False),
        (ORDER, {}, {}, True),
        (ORDER, {"key1": "o-10"}, {"key1": "o-5"}, True),
        (ORDER, {"key1": "o-10"}, {"key1": "o-10"}, True),
        (ORDER, {"key1": "o-10"}, {"key1": "o-20"}, False),
        (ORDER, {"key2": "o-20"}, {"key1": "o-10"}, False),
        (ORDER, {"key2": "o-20"}, {"key2": "o-10"}, True),
    ],
)
def test_priority_compare(strategy: JsonObj, first: dict[str, str], second: dict[str, str], before: bool) -> None:
    """Kruise's TestCompare: True when the first pod goes first (ties keep the given order)."""
    key = ordering.priority_key(strategy)
    assert key is not None
    a, b = pod(0, first), pod(1, second)
    assert (key(a) <= key(b)) is before


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ({}, [0, 1, 2, 3]),
        (
            {
                "weightPriority": [
                    {"weight": 100, "matchSelector": {"matchLabels": {"foo": "bar"}}},
                    {"weight": 90, "matchSelector": {"matchLabels": {"hello": "world"}}},
                ]
            },
            [2, 0, 1, 3],
        ),
        (
            {
                "weightPriority": [
                    {"weight": 100, "matchSelector": {"matchLabels": {"not": "match"}}},
                    {"weight": 90, "matchSelector": {"matchLabels": {"not1": "match1"}}},
                ]
            },
            [0, 1, 2, 3],
        ),
    ],
)
def test_priority_sort(strategy: JsonObj, expected: list[int]) -> None:
    pods = [pod(0, {"hello": "world"}), pod(1, {}), pod(2, {"foo": "bar"}), pod(3, {})]
    key = ordering.priority_key(strategy)
    order = sorted(pods, key=key) if key is not None else pods
    assert [pods.index(p) for p in order] == expected


# -- Kruise's factory pods ---------------------------------------------------------------------------
OLD, NEW = builders.shop_sidecarset(), builders.with_images(builders.shop_sidecarset(), envoy="envoy:v2")
NOT_UPGRADABLE = copy.deepcopy(NEW)
NOT_UPGRADABLE["spec"]["containers"][0]["env"] = [{"name": "X", "value": "1"}]  # not an image-only change


def factory(
    count: int, upgraded: int, upgraded_and_ready: int, *, labels: dict[int, dict[str, str]] | None = None
) -> list[PodProjection]:
    """`count` running, ready pods created one second apart (a higher index is newer); the first
    `upgraded` were patched to the new version in place, the first `upgraded_and_ready` of those
    already run it (the kubelet restarted the sidecar), the others not yet (unavailable). Shuffled."""
    new = builders.model(NEW)
    out = []
    for i in range(count):
        created = f"2024-05-01T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        obj = builders.injected_pod(f"pod-{i}", OLD, created=created, labels=(labels or {}).get(i, {}))
        if i < upgraded:
            patch = pod_patch(
                project(obj),
                ss_name=new.name,
                images=new.cold_images,
                new_hash=new.hash,
                sidecars=new.sidecar_list,
                revision="r2",
                now="2024-05-01T12:00:00Z",
            )
            obj = builders.apply_patch(obj, patch)
            if i < upgraded_and_ready:
                obj = builders.kubelet_sync(obj)
        out.append(project(obj))
    random.Random(count * 31 + upgraded).shuffle(out)
    return out


def names_planned(pods: list[PodProjection], strategy: JsonObj, ss: JsonObj = NEW) -> tuple[list[str], int]:
    obj = {**ss, "spec": {**ss["spec"], "updateStrategy": {"type": "RollingUpdate", **strategy}}}
    p = plan_upgrade(builders.model(obj), pods, revision="r2", now="2024-05-02T00:00:00Z")
    return [u.name for u in p.upgrades], len(p.not_upgradable)


def test_sort_by_creation_newest_first() -> None:
    assert names_planned(factory(20, 10, 5), {"maxUnavailable": 10})[0] == [f"pod-{i}" for i in (19, 18, 17, 16, 15)]


def test_not_ready_pods_go_first_and_cost_nothing() -> None:
    pods = factory(20, 10, 5)
    for i, p in enumerate(pods):
        if p.name in ("pod-10", "pod-13"):
            pods[i] = project(
                builders.injected_pod(p.name, OLD, created=p.creation_timestamp, ready=False, phase="Running")
            )
    assert names_planned(pods, {"maxUnavailable": 10})[0] == [f"pod-{i}" for i in (13, 10, 19, 18, 17, 16, 15)]


def test_weight_priority_picks() -> None:
    pods = factory(20, 10, 2, labels={15: {"test-key": "bar"}, 16: {"test-key": "foo"}})
    strategy = {
        "maxUnavailable": 10,
        "priorityStrategy": {
            "weightPriority": [
                {"weight": 50, "matchSelector": {"matchLabels": {"test-key": "foo"}}},
                {"weight": 30, "matchSelector": {"matchLabels": {"test-key": "bar"}}},
            ]
        },
    }
    assert names_planned(pods, strategy)[0] == ["pod-16", "pod-15"]


def test_order_priority_picks() -> None:
    labels = {i: {"key1": "5"} for i in range(20)} | {17: {"key1": "10"}, 18: {"key1": "20"}}
    strategy = {"maxUnavailable": 10, "priorityStrategy": {"orderPriority": [{"orderedKey": "key1"}]}}
    assert names_planned(factory(20, 10, 2, labels=labels), strategy)[0] == ["pod-18", "pod-17"]


@pytest.mark.parametrize(
    ("shape", "strategy", "upgrade"),
    [
        ((100, 30, 26), {"maxUnavailable": 10}, 6),
        ((1000, 300, 260), {"maxUnavailable": "10%"}, 60),
        ((1000, 300, 250), {"maxUnavailable": "5%"}, 0),
        ((100, 30, 27), {"maxUnavailable": 100}, 70),
        ((1000, 800, 760), {"maxUnavailable": 100, "partition": 180}, 20),
        ((1000, 800, 760), {"maxUnavailable": 100, "partition": 100}, 60),
        ((1000, 800, 760), {"maxUnavailable": 100, "partition": "18%"}, 20),
        ((1000, 800, 760), {"maxUnavailable": 100, "partition": "10%"}, 60),
        ((5, 0, 0), {"maxUnavailable": "5%"}, 1),
        ((5, 0, 0), {"maxUnavailable": 5, "partition": "99%"}, 1),
        ((5, 0, 0), {"maxUnavailable": 5, "partition": "1%"}, 4),
    ],
)
def test_upgrade_counts(shape: tuple[int, int, int], strategy: JsonObj, upgrade: int) -> None:
    planned, not_upgradable = names_planned(factory(*shape), strategy)
    assert (len(planned), not_upgradable) == (upgrade, 0)


def test_update_selector_limits_the_candidates() -> None:
    pods = factory(1000, 0, 0, labels={i: {"app": "test"} for i in range(30)})
    strategy = {"maxUnavailable": 100, "selector": {"matchLabels": {"app": "test"}}}
    assert names_planned(pods, strategy) == (sorted((f"pod-{i}" for i in range(30)), key=lambda n: -int(n[4:])), 0)


def test_a_spec_change_beyond_images_makes_every_pod_not_upgradable() -> None:
    assert names_planned(factory(100, 0, 0), {"maxUnavailable": 100}, ss=NOT_UPGRADABLE) == ([], 100)


# -- one pick per reconcile --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("marks", "sequence"),
    [
        ("······AAAA", [6, 0, 1, 7, 2, 3, 8, 4, 5, 9]),
        ("AAAA······", [0, 4, 5, 1, 6, 7, 2, 3, 8, 9]),
        ("·A·A·A·A·A", [1, 0, 2, 3, 4, 5, 6, 7, 8, 9]),
        ("···AAA", [3, 0, 4, 1, 2, 5]),
        ("AAAAAAA···", [0, 7, 1, 2, 8, 3, 4, 5, 6, 9]),
    ],
)
def test_one_pick_per_reconcile_keeps_the_scatter(marks: str, sequence: list[int]) -> None:
    """maxUnavailable 1, pods upgraded and ready between reconciles: Kruise's sequence, the scatter
    counted over every matched pod (upgraded ones too), so labelled pods stay spread out."""
    same_time = "2024-05-01T10:00:00Z"
    labels = [{"a": "x"} if m == "A" else {} for m in marks]
    done: set[int] = set()
    picked: list[int] = []
    strategy = {"maxUnavailable": 1, "scatterStrategy": [{"key": "a", "value": "x"}]}
    while len(picked) < len(marks):
        pods = [
            project(builders.injected_pod(f"p{i:03d}", NEW if i in done else OLD, created=same_time, labels=labels[i]))
            for i in range(len(marks))
        ]
        planned, _ = names_planned(pods, strategy)
        assert len(planned) == 1, planned
        i = int(planned[0][1:])
        picked.append(i)
        done.add(i)
    assert picked == sequence
