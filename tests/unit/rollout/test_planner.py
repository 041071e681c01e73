"""The in-place upgrade planner: one rollout rule per test, on pods built as injection leaves them."""

from __future__ import annotations

import copy
import random
from typing import Any

import jsonpatch
import orjson
import pytest

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import podstate
from sidecarsets.pods.projection import project
from sidecarsets.rollout.planner import Plan, plan_upgrade
from sidecarsets.rollout.upgradable import condition_current, upgradable_condition
from sidecarsets.spec.hashing import spec_hash
from sidecarsets.spec.names import ANN_HASH, ANN_HASH_WITHOUT_IMAGE, ANN_INPLACE_STATE
from tests.kube.builders import (
    apply_patch,
    image_id,
    injected_pod,
    kubelet_sync,
    model,
    set_ready,
    shop_sidecarset,
    with_images,
)

NOW = "2024-06-01T12:00:00Z"
V1 = shop_sidecarset()


def v2(**strategy: Any) -> JsonObj:
    ss = with_images(V1, envoy="envoy:v2")
    if strategy:
        ss["spec"]["updateStrategy"] = strategy
    return ss


def plan(ss: JsonObj, raws: list[JsonObj]) -> Plan:
    return plan_upgrade(model(ss), [project(r) for r in raws], revision="mesh-2", now=NOW)


def chosen(p: Plan) -> list[str]:
    return [u.name for u in p.upgrades]


def pods(n: int, **kw: Any) -> list[JsonObj]:
    return [injected_pod(f"p{i}", V1, **kw) for i in range(n)]


def upgrade_all(ss: JsonObj, raws: list[JsonObj], p: Plan) -> list[JsonObj]:
    """Apply the plan's patches to the matching pods (the kubelet has not acted yet)."""
    by_name = {u.name: u for u in p.upgrades}
    return [
        apply_patch(r, by_name[r["metadata"]["name"]].patch) if r["metadata"]["name"] in by_name else r for r in raws
    ]


class TestMaxUnavailable:
    @pytest.mark.parametrize(
        ("total", "value", "m", "expected"),
        [
            (5, None, 1, 1),  # default 1
            (5, 2, 2, 2),
            (5, 0, 0, 0),
            (5, "10%", 1, 1),  # 0.5 rounds up
            (5, "50%", 3, 3),  # 2.5 rounds up
            (10, "5%", 1, 1),  # Kruise #1812: a small percentage never stalls the rollout
            (5, "0%", 0, 0),
            (5, "100%", 5, 5),
            (3, 10, 10, 3),
        ],
    )
    def test_ready_pods_taken_up_to_m(self, total: int, value: Any, m: int, expected: int) -> None:
        strategy = {"maxUnavailable": value} if value is not None else {}
        p = plan(v2(**strategy), pods(total))
        assert (len(p.upgrades), p.max_unavailable, p.unavailable) == (expected, m, 0)

    def test_not_ready_pods_are_free(self) -> None:
        raws = pods(2) + [injected_pod(f"nr{i}", V1, ready=False) for i in range(3)]
        p = plan(v2(maxUnavailable=1), raws)
        assert chosen(p) == ["nr0", "nr1", "nr2", "p0"]  # not-ready first, then one ready pod

    def test_not_ready_pods_are_free_even_with_zero(self) -> None:
        raws = [*pods(2), injected_pod("pending", V1, phase="Pending", ready=False, with_statuses=False)]
        assert chosen(plan(v2(maxUnavailable=0), raws)) == ["pending"]

    def test_updated_unavailable_pods_use_the_budget(self) -> None:
        ss = v2(maxUnavailable=2)
        raws = [*pods(4), set_ready(injected_pod("u1", ss), False), set_ready(injected_pod("u2", ss), False)]
        p = plan(ss, raws)
        assert (p.upgrades, p.unavailable, p.max_unavailable) == ((), 2, 2)
        assert p.reason == "waiting: 2/2 unavailable"

    def test_budget_left_is_used(self) -> None:
        ss = v2(maxUnavailable=3)
        raws = [*pods(4), set_ready(injected_pod("u1", ss), False)]
        p = plan(ss, raws)
        assert (len(p.upgrades), p.unavailable) == (2, 1)

    def test_updated_ready_pods_do_not_count(self) -> None:
        ss = v2(maxUnavailable=1)
        assert len(plan(ss, [*pods(3), injected_pod("u1", ss), injected_pod("u2", ss)]).upgrades) == 1


class TestPartition:
    @pytest.mark.parametrize(
        ("total", "partition", "expected"),
        [
            (5, 0, 5),
            (5, 2, 3),
            (5, 5, 0),  # an integer equal to the total keeps every pod
            (5, 9, 0),
            (5, "40%", 3),
            (5, "50%", 2),  # 2.5 rounds up to 3 kept
            (5, "90%", 1),  # 4.5 rounds up to 5 = total, not "100%": total-1 kept
            (5, "99%", 1),
            (5, "100%", 0),
            (1, "99%", 0),  # with one pod the total-1 rule does not apply
            (2, "99%", 1),
        ],
    )
    def test_pods_left_on_the_old_revision(self, total: int, partition: Any, expected: int) -> None:
        p = plan(v2(partition=partition, maxUnavailable="100%"), pods(total))
        assert len(p.upgrades) == expected
        if expected == 0:
            assert p.reason.startswith("partition:")

    def test_counted_over_all_matched_pods(self) -> None:
        ss = v2(partition=2, maxUnavailable="100%")
        raws = [injected_pod("done1", ss), injected_pod("done2", ss), *pods(3)]
        # 5 matched, 2 already updated: keep 2 of the 3 outdated ones
        assert len(plan(ss, raws).upgrades) == 1

    def test_rollout_stops_at_the_partition(self) -> None:
        ss = v2(partition="40%", maxUnavailable=1)
        raws = pods(5)
        for _ in range(10):
            p = plan(ss, raws)
            raws = [kubelet_sync(r) for r in upgrade_all(ss, raws, p)]
        updated = [r for r in raws if project(r).hash_for("mesh").hash == spec_hash(ss["spec"])]  # type: ignore[union-attr]
        assert len(updated) == 3


class TestStops:
    def test_paused(self) -> None:
        p = plan(v2(paused=True), pods(3))
        assert (p.upgrades, p.reason, p.done) == ((), "paused", False)

    def test_not_update(self) -> None:
        p = plan(v2(type="NotUpdate"), pods(3))
        assert (p.upgrades, p.reason) == ((), "NotUpdate")

    def test_done(self) -> None:
        ss = v2()
        p = plan(ss, [injected_pod("a", ss), injected_pod("b", ss)])
        assert (p.upgrades, p.done, p.reason) == ((), True, "done")

    def test_nothing_matched_is_done(self) -> None:
        assert plan(v2(), []).done


class TestNativeSidecars:
    """Init containers with restartPolicy Always are rolled in place like containers (Kruise refuses)."""

    OLD = shop_sidecarset(initContainers=[{"name": "proxy", "image": "p:1", "restartPolicy": "Always"}])

    def new(self, image: str = "p:2", **strategy: Any) -> JsonObj:
        ss = copy.deepcopy(self.OLD)
        ss["spec"]["initContainers"][0]["image"] = image
        ss["spec"]["updateStrategy"] = strategy or {"maxUnavailable": 1}
        return ss

    def test_the_init_container_image_is_patched_and_recorded(self) -> None:
        raws = [injected_pod(f"p{i}", self.OLD) for i in range(2)]
        p = plan(self.new(), raws)
        assert chosen(p) == ["p0"]
        ops = p.upgrades[0].patch
        assert {"op": "test", "path": "/spec/initContainers/0/name", "value": "proxy"} in ops
        assert {"op": "replace", "path": "/spec/initContainers/0/image", "value": "p:2"} in ops
        assert not any(o["path"].startswith("/spec/containers/") and o["op"] == "replace" for o in ops)
        after = upgrade_all(self.new(), raws, p)
        state = orjson.loads(after[0]["metadata"]["annotations"][ANN_INPLACE_STATE])["mesh"]
        assert state["lastContainerStatuses"] == {"proxy": {"imageID": image_id("p:1")}}
        # In flight until the kubelet restarts it: the budget of one is spent.
        assert chosen(plan(self.new(), after)) == []
        after[0] = kubelet_sync(after[0])
        assert chosen(plan(self.new(), after)) == ["p1"]

    def test_a_pod_whose_native_sidecar_is_not_reported_is_not_consistent(self) -> None:
        raw = injected_pod("p0", self.OLD)
        del raw["status"]["initContainerStatuses"]
        pod = project(raw)
        assert not podstate.is_consistent(pod, sidecarset="mesh", containers={"envoy", "proxy"})

    @pytest.mark.parametrize(
        ("strategy", "field"),
        [
            ({"maxUnavailable": "abc"}, "spec.updateStrategy.maxUnavailable"),
            ({"maxUnavailable": -1}, "spec.updateStrategy.maxUnavailable"),
            ({"partition": "150%"}, "spec.updateStrategy.partition"),
            ({"partition": True}, "spec.updateStrategy.partition"),
            ({"selector": {"matchLabels": {"a": 1}}}, "spec.updateStrategy.selector"),
            ({"type": "Sometimes"}, "spec.updateStrategy.type"),
        ],
    )
    def test_invalid_strategy_is_reported_not_raised(self, strategy: JsonObj, field: str) -> None:
        p = plan(v2(**strategy), pods(2))
        assert p.upgrades == () and p.reason.startswith(f"invalid: {field}:")

    def test_missing_image_is_reported(self) -> None:
        ss = v2()
        del ss["spec"]["containers"][0]["image"]
        assert plan(ss, pods(1)).reason == "invalid: spec.containers[0].image: must be a non-empty string"


class TestCandidates:
    def test_update_selector(self) -> None:
        ss = v2(selector={"matchLabels": {"canary": "true"}}, maxUnavailable="100%")
        raws = [
            injected_pod("c1", V1, labels={"canary": "true"}),
            injected_pod("n1", V1),
            injected_pod("c2", V1, labels={"canary": "true"}),
        ]
        assert sorted(chosen(plan(ss, raws))) == ["c1", "c2"]

    def test_not_upgradable_is_listed_never_patched(self) -> None:
        ss = v2(maxUnavailable="100%")
        ss["spec"]["containers"][0]["env"] = [{"name": "MODE", "value": "strict"}]  # more than an image
        p = plan(ss, pods(2))
        assert p.upgrades == ()
        assert p.not_upgradable == (("shop", "p0"), ("shop", "p1"))
        assert p.reason == "no upgradable pods"

    def test_pod_without_the_without_image_entry_is_not_upgradable(self) -> None:
        raw = injected_pod("a", V1)
        del raw["metadata"]["annotations"][ANN_HASH_WITHOUT_IMAGE]
        assert plan(v2(), [raw]).not_upgradable == (("shop", "a"),)

    def test_mixed_upgradable_and_not(self) -> None:
        other = shop_sidecarset(containers=[{"name": "envoy", "image": "envoy:v1", "args": ["--old"]}])
        p = plan(v2(maxUnavailable="100%"), [injected_pod("old-args", other), injected_pod("ok", V1)])
        assert chosen(p) == ["ok"] and p.not_upgradable == (("shop", "old-args"),)


class TestDoneDetection:
    def rolled(self, ss: JsonObj) -> list[JsonObj]:
        """One pod patched by the planner, the kubelet not done yet."""
        raws = [injected_pod("a", V1)]
        return upgrade_all(ss, raws, plan(ss, raws))

    def test_patched_pod_is_unavailable_until_the_kubelet_reports_the_image(self) -> None:
        ss = v2(maxUnavailable=1)
        raws = [*self.rolled(ss), injected_pod("b", V1)]
        p = plan(ss, raws)
        # a's pod condition still says Ready, but its imageID has not moved
        assert (p.unavailable, p.upgrades) == (1, ())

    def test_imageid_moved_means_done(self) -> None:
        ss = v2(maxUnavailable=1)
        raws = [kubelet_sync(self.rolled(ss)[0]), injected_pod("b", V1)]
        p = plan(ss, raws)
        assert (p.unavailable, chosen(p)) == (0, ["b"])

    def test_imageid_moved_but_not_ready_is_unavailable(self) -> None:
        ss = v2(maxUnavailable=1)
        raws = [kubelet_sync(self.rolled(ss)[0], ready=False), injected_pod("b", V1)]
        assert plan(ss, raws).unavailable == 1

    def test_same_imageid_but_status_image_equals_spec_means_done(self) -> None:
        ss = v2(maxUnavailable=1)
        raw = self.rolled(ss)[0]
        raw["status"]["containerStatuses"][0]["image"] = "envoy:v2"  # image retagged: same content
        assert plan(ss, [raw, injected_pod("b", V1)]).unavailable == 0

    def test_digest_pinned_images_compare_the_digest(self) -> None:
        digest_v1 = "docker.io/library/envoy@sha256:" + "1" * 64
        digest_v2 = "docker.io/library/envoy@sha256:" + "2" * 64
        d1 = shop_sidecarset(image=digest_v1)
        d2 = with_images(d1, envoy=digest_v2)
        raw = injected_pod("a", d1)
        raw["status"]["containerStatuses"][0]["imageID"] = "docker-pullable://envoy@sha256:" + "1" * 64
        patched = upgrade_all(d2, [raw], plan(d2, [raw]))[0]
        assert plan(d2, [patched, injected_pod("b", d1)]).unavailable == 1
        patched["status"]["containerStatuses"][0]["imageID"] = "docker-pullable://envoy@sha256:" + "2" * 64
        assert plan(d2, [patched, injected_pod("b", d1)]).unavailable == 0

    def test_pod_still_upgrading_to_an_older_version_is_patched_again_to_the_new_one(self) -> None:
        # Kruise waits for the older upgrade to land, forever if its image cannot be pulled; here
        # the pod is patched to the image wanted now (sidecarsets.rollout.planner._superseded). It is
        # counted unavailable, and, still reported ready, its new patch costs budget too.
        ss2 = v2(maxUnavailable=2)
        ss3 = with_images(ss2, envoy="envoy:v3")
        moving = self.rolled(ss2)[0]  # mid-upgrade to v2 when v3 arrives
        p = plan(ss3, [moving])
        assert (chosen(p), p.unavailable, p.reason) == (["a"], 1, "upgrading 1")
        (upgrade,) = p.upgrades
        assert {"op": "replace", "path": "/spec/containers/0/image", "value": "envoy:v3"} in upgrade.patch
        p = plan(ss3, [moving, injected_pod("b", V1)])
        assert (chosen(p), p.unavailable) == (["a"], 1)
        assert chosen(plan(ss3, [kubelet_sync(moving)])) == ["a"]

    def test_pod_upgrading_to_the_current_image_is_waited_for(self) -> None:
        ss2 = v2(maxUnavailable=2)
        moving = self.rolled(ss2)[0]
        p = plan(ss2, [moving, injected_pod("b", V1)])
        assert (chosen(p), p.unavailable) == (["b"], 1), "a is not patched again: its image is the one wanted"

    def test_older_upgrade_whose_image_is_reported_is_not_in_flight(self) -> None:
        ss2 = v2()
        ss3 = with_images(ss2, envoy="envoy:v3")
        moving = self.rolled(ss2)[0]
        moving["status"]["containerStatuses"][0]["image"] = "envoy:v2"  # same imageID, image already reported
        p = plan(ss3, [moving])
        assert (chosen(p), p.unavailable) == (["a"], 0)


class TestPatch:
    def test_shape(self) -> None:
        ss = v2()
        raw = injected_pod("a", V1)
        (upgrade,) = plan(ss, [raw]).upgrades
        assert (upgrade.namespace, upgrade.name, upgrade.uid, upgrade.resource_version) == (
            "shop",
            "a",
            "uid-shop-a",
            "100",
        )
        ops = upgrade.patch
        assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "100"}
        assert ops[1] == {"op": "test", "path": "/spec/containers/0/name", "value": "envoy"}
        assert ops[2] == {"op": "replace", "path": "/spec/containers/0/image", "value": "envoy:v2"}
        assert [o["path"] for o in ops[3:]] == [
            "/metadata/annotations/sidecarctl.io~1sidecarset-hash",
            "/metadata/annotations/sidecarctl.io~1inplace-update-state",
        ]
        hashes = orjson.loads(ops[3]["value"])
        assert hashes == {
            "mesh": {
                "updateTimestamp": NOW,
                "hash": spec_hash(ss["spec"]),
                "sidecarSetName": "mesh",
                "sidecarList": ["envoy"],
                "controllerRevision": "mesh-2",
            }
        }
        state = orjson.loads(ops[4]["value"])
        assert state == {
            "mesh": {
                "revision": "mesh-2",
                "updateTimestamp": NOW,
                "lastContainerStatuses": {"envoy": {"imageID": image_id("envoy:v1")}},
            }
        }

    def test_applying_changes_only_sidecar_images_and_two_annotations(self) -> None:
        two = shop_sidecarset(containers=[{"name": "envoy", "image": "e:1"}, {"name": "log", "image": "l:1"}])
        new = with_images(two, log="l:2")
        raw = injected_pod("a", two, app_containers=("app", "worker", "metrics"))
        # containers reordered by someone else: indices come from the pod, not the SidecarSet
        raw["spec"]["containers"] = raw["spec"]["containers"][2:] + raw["spec"]["containers"][:2]
        (upgrade,) = plan(new, [raw]).upgrades
        out = jsonpatch.apply_patch(raw, upgrade.patch)
        expected = copy.deepcopy(raw)
        expected["spec"]["containers"][4]["image"] = "l:2"
        for key in (ANN_HASH, ANN_INPLACE_STATE):
            expected["metadata"]["annotations"][key] = out["metadata"]["annotations"][key]
        assert out == expected
        assert out["spec"]["containers"][:3] == raw["spec"]["containers"][:3]  # app containers untouched
        assert orjson.loads(out["metadata"]["annotations"][ANN_INPLACE_STATE])["mesh"]["lastContainerStatuses"] == {
            "log": {"imageID": image_id("l:1")}
        }

    def test_other_sidecarsets_entries_are_kept(self) -> None:
        raw = injected_pod("a", V1)
        ann = raw["metadata"]["annotations"]
        hashes = orjson.loads(ann[ANN_HASH])
        hashes["logging"] = {
            "updateTimestamp": "2024-01-01T00:00:00Z",
            "hash": "lh",
            "sidecarSetName": "logging",
            "sidecarList": ["fluent"],
            "controllerRevision": "logging-1",
        }
        hashes["legacy"] = "oldhash"
        ann[ANN_HASH] = orjson.dumps(hashes).decode()
        other_state = {
            "revision": "logging-1",
            "updateTimestamp": "2024-01-01T00:00:00Z",
            "lastContainerStatuses": {"fluent": {"imageID": "f@1"}},
        }
        ann[ANN_INPLACE_STATE] = orjson.dumps({"logging": other_state}).decode()
        (upgrade,) = plan(v2(), [raw]).upgrades
        out = jsonpatch.apply_patch(raw, upgrade.patch)["metadata"]["annotations"]
        new_hashes = orjson.loads(out[ANN_HASH])
        assert new_hashes["logging"] == hashes["logging"] and new_hashes["legacy"] == "oldhash"
        assert new_hashes["mesh"]["hash"] == spec_hash(v2()["spec"])
        assert orjson.loads(out[ANN_INPLACE_STATE])["logging"] == other_state

    def test_stale_resource_version_fails_the_patch(self) -> None:
        raw = injected_pod("a", V1)
        (upgrade,) = plan(v2(), [raw]).upgrades
        raw["metadata"]["resourceVersion"] = "101"
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch(raw, upgrade.patch)

    def test_shifted_container_fails_the_patch(self) -> None:
        raw = injected_pod("a", V1)
        (upgrade,) = plan(v2(), [raw]).upgrades
        raw["spec"]["containers"].insert(0, {"name": "debug", "image": "busybox"})
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch(raw, upgrade.patch)

    def test_unchanged_images_only_rewrite_the_hash(self) -> None:
        two = shop_sidecarset(containers=[{"name": "envoy", "image": "e:1"}, {"name": "log", "image": "l:1"}])
        new = with_images(two, log="l:2")
        raw = injected_pod("a", two)
        raw["spec"]["containers"][1]["image"] = "l:2"  # someone already set it
        (upgrade,) = plan(new, [raw]).upgrades
        assert [o["op"] for o in upgrade.patch] == ["test", "add", "add"]


class TestDeterminism:
    def test_same_input_same_plan_any_order(self) -> None:
        ss = v2(maxUnavailable=3, scatterStrategy=[{"key": "zone", "value": "*"}])
        raws = [
            injected_pod(f"p{i}", V1, labels={"zone": f"z{i % 3}"}, restarts=i % 2, ready=i % 4 != 0) for i in range(12)
        ]
        first = plan(ss, raws)
        assert plan(ss, raws) == first
        shuffled = raws[:]
        random.Random(4).shuffle(shuffled)
        assert plan(ss, shuffled) == first


class TestUpgradableCondition:
    def test_true_and_false(self) -> None:
        p = project(injected_pod("a", V1))
        ok = upgradable_condition(p, {"mesh": False})
        assert ok == {
            "type": "SidecarSetUpgradable",
            "status": "True",
            "reason": "AllSidecarsetUpgradable",
            "message": '{"mesh":true}',
        }
        bad = upgradable_condition(p, {"mesh": True}, now=NOW)
        assert (bad["status"], bad["reason"], bad["message"], bad["lastTransitionTime"]) == (
            "False",
            "UpdateImmutableField",
            '{"mesh":false}',
            NOW,
        )

    def with_condition(self, status: str, reason: str, message: str) -> Any:
        raw = injected_pod("a", V1)
        raw["status"]["conditions"].append(
            {"type": "SidecarSetUpgradable", "status": status, "reason": reason, "message": message}
        )
        return project(raw)

    def test_other_sidecarsets_verdicts_are_merged(self) -> None:
        p = self.with_condition("False", "UpdateImmutableField", '{"logging":false}')
        cond = upgradable_condition(p, {"mesh": False}, now=NOW)
        assert (cond["status"], orjson.loads(cond["message"])) == ("False", {"logging": False, "mesh": True})
        assert "lastTransitionTime" not in cond  # still False
        cond = upgradable_condition(p, {"logging": False})
        assert (cond["status"], cond["message"]) == ("True", '{"logging":true}')

    def test_condition_current(self) -> None:
        p = self.with_condition("True", "AllSidecarsetUpgradable", '{ "mesh": true }')
        assert condition_current(p, upgradable_condition(p, {"mesh": False}))
        assert not condition_current(p, upgradable_condition(p, {"mesh": True}))
        assert not condition_current(p, upgradable_condition(p, {"logging": False}))
        assert not condition_current(project(injected_pod("b", V1)), upgradable_condition(p, {"mesh": False}))
        garbled = self.with_condition("True", "AllSidecarsetUpgradable", "not json")
        assert not condition_current(garbled, upgradable_condition(garbled, {}))
