"""Rollout properties over random pods and strategies, simulated round by round.

Each round plans, applies the patches to the pod JSON with jsonpatch, and lets a simulated
kubelet catch up with some of the pods (sometimes ready, sometimes not). The checks use their
own reading of the pod JSON, not the planner's helpers.
"""

from __future__ import annotations

import math
import random
from typing import Any

import jsonpatch
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import podstate
from sidecarsets.pods.projection import project
from sidecarsets.rollout.planner import Plan, plan_upgrade
from sidecarsets.rollout.status import compute_status, pod_verdicts
from sidecarsets.spec.hashing import spec_hash
from sidecarsets.spec.names import ANN_HASH, ANN_INPLACE_STATE
from tests.kube.builders import apply_patch, injected_pod, kubelet_sync, model, set_ready, shop_sidecarset, with_images

V1 = shop_sidecarset(containers=[{"name": "envoy", "image": "envoy:v1"}, {"name": "log", "image": "log:v1"}])
OTHER = shop_sidecarset(
    containers=[{"name": "envoy", "image": "envoy:v1", "args": ["-x"]}, {"name": "log", "image": "log:v1"}]
)

percent_or_int = st.one_of(st.integers(0, 6), st.sampled_from(["0%", "10%", "25%", "50%", "90%", "99%", "100%"]))

strategies = st.fixed_dictionaries(
    {},
    optional={
        "maxUnavailable": percent_or_int,
        "partition": percent_or_int,
        "selector": st.just({"matchLabels": {"canary": "true"}}),
        "priorityStrategy": st.sampled_from(
            [
                {"weightPriority": [{"weight": 10, "matchSelector": {"matchLabels": {"zone": "a"}}}]},
                {"orderPriority": [{"orderedKey": "rank"}]},
            ]
        ),
        "scatterStrategy": st.sampled_from([[{"key": "zone", "value": "*"}], [{"key": "zone", "value": "b"}]]),
    },
)

pod_specs = st.lists(
    st.fixed_dictionaries(
        {
            "zone": st.sampled_from("abc"),
            "rank": st.integers(0, 20),
            "canary": st.booleans(),
            "ready": st.booleans(),
            "pending": st.booleans(),
            "restarts": st.integers(0, 3),
            "kind": st.sampled_from(["old", "old", "old", "updated", "not-upgradable"]),
        }
    ),
    min_size=0,
    max_size=10,
)


def build(specs: list[dict[str, Any]], target: JsonObj) -> list[JsonObj]:
    pods = []
    for i, s in enumerate(specs):
        source = {"old": V1, "updated": target, "not-upgradable": OTHER}[s["kind"]]
        labels = {"zone": s["zone"], "rank": f"r{s['rank']}"}
        if s["canary"]:
            labels["canary"] = "true"
        pending = s["pending"] and not s["ready"]
        pods.append(
            injected_pod(
                f"p{i}",
                source,
                labels=labels,
                ready=s["ready"],
                phase="Pending" if pending else "Running",
                with_statuses=not pending,
                restarts=s["restarts"],
            )
        )
    return pods


def is_updated(raw: JsonObj, ss: JsonObj) -> bool:
    entry = orjson.loads(raw["metadata"]["annotations"][ANN_HASH]).get("mesh")
    return isinstance(entry, dict) and entry.get("hash") == spec_hash(ss["spec"])


def is_available(raw: JsonObj) -> bool:
    """Running, Ready, and the node runs every image the spec asks for."""
    status = raw["status"]
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])
    images = {c["name"]: c["image"] for c in raw["spec"]["containers"]}
    reported = {c["name"]: c["image"] for c in status.get("containerStatuses", [])}
    return status["phase"] == "Running" and ready and reported == images


def expected_m(value: Any, total: int) -> int:
    if value is None:
        return 1
    if isinstance(value, str):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def check_patch(before: JsonObj, patch: list[JsonObj]) -> JsonObj:
    """The patch applies and changes only sidecar images and the two bookkeeping annotations."""
    after: JsonObj = jsonpatch.apply_patch(before, patch)
    for old, new in zip(before["spec"]["containers"], after["spec"]["containers"], strict=True):
        if old["name"] not in ("envoy", "log"):
            assert new == old
        else:
            assert {k: v for k, v in new.items() if k != "image"} == {k: v for k, v in old.items() if k != "image"}
    annotations = dict(after["metadata"]["annotations"])
    for key in (ANN_HASH, ANN_INPLACE_STATE):
        annotations.pop(key, None)
    original = {k: v for k, v in before["metadata"]["annotations"].items() if k not in (ANN_HASH, ANN_INPLACE_STATE)}
    assert annotations == original
    rest_after = {**after, "metadata": None, "spec": {**after["spec"], "containers": None}}
    rest_before = {**before, "metadata": None, "spec": {**before["spec"], "containers": None}}
    assert rest_after == rest_before
    assert {k: v for k, v in after["metadata"].items() if k != "annotations"} == {
        k: v for k, v in before["metadata"].items() if k != "annotations"
    }
    return after


def run_round(ss: JsonObj, pods: list[JsonObj]) -> tuple[Plan, list[JsonObj]]:
    projections = [project(p) for p in pods]
    plan = plan_upgrade(model(ss), projections, revision="rev", now="2024-06-01T00:00:00Z")
    assert plan_upgrade(model(ss), projections, revision="rev", now="2024-06-01T00:00:00Z") == plan  # deterministic
    assert plan_upgrade(model(ss), projections[::-1], revision="rev", now="2024-06-01T00:00:00Z") == plan

    strategy = ss["spec"].get("updateStrategy", {})
    by_name = {p["metadata"]["name"]: p for p in pods}
    m = expected_m(strategy.get("maxUnavailable"), len(pods))
    assert plan.max_unavailable == m
    unavailable_updated = sum(1 for p in pods if is_updated(p, ss) and not is_available(p))
    newly_ready = 0
    stuck = {name for _, name in plan.not_upgradable}
    for upgrade in plan.upgrades:
        raw = by_name[upgrade.name]
        assert upgrade.name not in stuck and not is_updated(raw, ss)
        if "selector" in strategy:
            assert raw["metadata"]["labels"].get("canary") == "true"
        newly_ready += is_available(raw)
    # the safety property of maxUnavailable
    assert unavailable_updated + newly_ready <= max(m, unavailable_updated)

    patched = {u.name: u.patch for u in plan.upgrades}
    out = []
    for p in pods:
        name = p["metadata"]["name"]
        if name in patched:
            check_patch(p, patched[name])
            p = apply_patch(p, patched[name])
            assert is_updated(p, ss)
        out.append(p)
    return plan, out


def kubelet(pods: list[JsonObj], rng: random.Random) -> list[JsonObj]:
    out = []
    for p in pods:
        roll = rng.random()
        if roll < 0.5:
            p = kubelet_sync(p, ready=True)
        elif roll < 0.65:
            p = kubelet_sync(p, ready=False)
        elif roll < 0.7 and p["status"]["phase"] == "Running":
            p = set_ready(p, not is_available(p))
        out.append(p)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=pod_specs,
    strategy=strategies,
    paused=st.booleans(),
    rng=st.randoms(use_true_random=False),
    bump=st.booleans(),
)
def test_rollout_never_exceeds_max_unavailable(
    specs: list[dict[str, Any]], strategy: JsonObj, paused: bool, rng: random.Random, bump: bool
) -> None:
    ss = with_images(V1, envoy="envoy:v2")
    ss["spec"]["updateStrategy"] = {**strategy, "paused": paused}
    pods = build(specs, ss)
    for round_no in range(2 * len(pods) + 4):
        if bump and round_no == len(pods) // 2:  # a newer version arrives mid-rollout
            ss = with_images(ss, log="log:v3")
        plan, pods = run_round(ss, pods)
        if paused:
            assert plan.upgrades == () and plan.reason == "paused"
        pods = kubelet(pods, rng)


@settings(max_examples=40, deadline=None)
@given(
    specs=pod_specs,
    max_unavailable=st.one_of(st.integers(1, 4), st.sampled_from(["10%", "50%", "100%"])),
    priority=st.booleans(),
)
def test_rollout_completes_when_nothing_holds_it_back(
    specs: list[dict[str, Any]], max_unavailable: Any, priority: bool
) -> None:
    ss = with_images(V1, envoy="envoy:v2", log="log:v2")
    ss["spec"]["updateStrategy"] = {"maxUnavailable": max_unavailable}
    if priority:
        ss["spec"]["updateStrategy"]["priorityStrategy"] = {"orderPriority": [{"orderedKey": "rank"}]}
    for s in specs:
        if s["kind"] == "not-upgradable":
            s["kind"] = "old"
    pods = build(specs, ss)
    for _ in range(len(pods) + 1):
        plan, pods = run_round(ss, pods)
        pods = [kubelet_sync(p, ready=True) for p in pods]
    plan, _ = run_round(ss, pods)
    assert plan.done and plan.reason == "done"
    assert all(is_updated(p, ss) and is_available(p) for p in pods)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=pod_specs, strategy=strategies, rng=st.randoms(use_true_random=False))
def test_shared_verdicts_agree_with_the_per_pod_questions(
    specs: list[dict[str, Any]], strategy: JsonObj, rng: random.Random
) -> None:
    """A reconcile evaluates the pods once for both the status and the plan, memoised over the
    tuples replicas share: through a rollout (pods updated, in flight, unready, not upgradable,
    in any order) every answer is the per-pod function's, and the plan and status do not change."""
    ss = with_images(V1, envoy="envoy:v2")
    ss["spec"]["updateStrategy"] = strategy
    current, sidecars = spec_hash(ss["spec"]), {"envoy", "log"}
    pods = build(specs, ss)
    for _ in range(4):
        projections = [project(p) for p in pods]
        rng.shuffle(projections)
        verdicts = pod_verdicts(model(ss), projections)
        for i, p in enumerate(projections):
            updated = podstate.is_updated(p, sidecarset="mesh", spec_hash=current)
            moving = podstate.upgrade_in_flight(p, sidecarset="mesh", containers=sidecars)
            assert verdicts.updated[i] == updated
            assert verdicts.available[i] == podstate.is_available(p, sidecarset="mesh", containers=sidecars)
            assert verdicts.in_flight[i] == (moving and not updated)
        alone = plan_upgrade(model(ss), projections, revision="rev", now="2024-06-01T00:00:00Z")
        assert (
            plan_upgrade(model(ss), projections, revision="rev", now="2024-06-01T00:00:00Z", verdicts=verdicts) == alone
        )
        assert compute_status(
            model(ss), projections, latest_revision="rev", collision_count=0, verdicts=verdicts
        ) == compute_status(model(ss), projections, latest_revision="rev", collision_count=0)
        _, pods = run_round(ss, pods)
        pods = kubelet(pods, rng)
