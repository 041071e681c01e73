"""Which pods a SidecarSet owns, the status counters, and when the status needs writing."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import podstate
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.rollout.status import compute_status, matched_pods, pod_verdicts, status_changed
from sidecarsets.spec import selectors
from sidecarsets.spec.hashing import spec_hash
from sidecarsets.spec.names import ANN_INJECTED_LIST, ANN_INPLACE_STATE, ANN_WORKING_HOT, NS_NAME_LABEL
from tests.kube.builders import T0, image_id, injected_pod, model, shop_sidecarset, with_images

NS = {"shop": {NS_NAME_LABEL: "shop", "env": "prod"}, "dev": {NS_NAME_LABEL: "dev", "env": "dev"}}


def names(pods: list[PodProjection]) -> list[str]:
    return [p.name for p in pods]


def in_flight(old: JsonObj, new: JsonObj, name: str = "moving") -> JsonObj:
    """A pod patched from `old` to `new` whose kubelet still runs the old sidecar image."""
    raw = injected_pod(name, new)
    old_image = old["spec"]["containers"][0]["image"]
    raw["status"]["containerStatuses"][0].update(image=old_image, imageID=image_id(old_image))
    raw["metadata"]["annotations"][ANN_INPLACE_STATE] = orjson.dumps(
        {
            "mesh": {
                "revision": "r2",
                "updateTimestamp": T0,
                "lastContainerStatuses": {"envoy": {"imageID": image_id(old_image)}},
            }
        }
    ).decode()
    return raw


class TestMatching:
    def test_selector_and_injected_list(self) -> None:
        ss = shop_sidecarset()
        pods = [
            project(injected_pod("in", ss)),
            project(injected_pod("other-app", ss, labels={"app": "blog"})),
        ]
        not_listed = injected_pod("not-listed", ss)
        not_listed["metadata"]["annotations"][ANN_INJECTED_LIST] = "logging"
        pods.append(project(not_listed))
        assert names(matched_pods(model(ss), pods, NS)) == ["in"]

    def test_inactive_pods_are_not_matched(self) -> None:
        ss = shop_sidecarset()
        pods = [
            project(injected_pod("running", ss)),
            project(injected_pod("pending", ss, phase="Pending")),
            project(injected_pod("done", ss, phase="Succeeded")),
            project(injected_pod("failed", ss, phase="Failed")),
            project(injected_pod("deleting", ss, deleting=True)),
        ]
        assert names(matched_pods(model(ss), pods, NS)) == ["running", "pending"]

    def test_pod_missing_a_sidecar_is_not_consistent(self) -> None:
        two = shop_sidecarset(containers=[{"name": "envoy", "image": "e:1"}, {"name": "log", "image": "l:1"}])
        one = shop_sidecarset(containers=[{"name": "envoy", "image": "e:1"}])
        assert names(
            matched_pods(model(two), [project(injected_pod("a", one)), project(injected_pod("b", two))], NS)
        ) == ["b"]

    def test_hot_upgrade_containers_are_present_as_a_pair(self) -> None:
        hot = shop_sidecarset(
            containers=[{"name": "envoy", "image": "e:1", "upgradeStrategy": {"upgradeType": "HotUpgrade"}}]
        )
        unnamed = injected_pod("unnamed", hot)
        del unnamed["metadata"]["annotations"][ANN_WORKING_HOT]  # the pair, but no working container named
        plain = shop_sidecarset(containers=[{"name": "envoy", "image": "e:1"}])
        pods = [project(injected_pod("pair", hot)), project(unnamed), project(injected_pod("plain", plain))]
        assert names(matched_pods(model(hot), pods, NS)) == ["pair"]

    def test_native_sidecars_must_be_in_init_containers(self) -> None:
        ss = shop_sidecarset(initContainers=[{"name": "proxy", "image": "p:1", "restartPolicy": "Always"}])
        with_init = injected_pod("with", ss)
        with_init["spec"]["initContainers"] = [{"name": "proxy", "image": "p:1", "restartPolicy": "Always"}]
        without = injected_pod("without", ss)
        del without["spec"]["initContainers"]
        assert names(matched_pods(model(ss), [project(with_init), project(without)], NS)) == ["with"]

    def test_plain_init_containers_are_not_required(self) -> None:
        ss = shop_sidecarset(initContainers=[{"name": "setup", "image": "s:1"}])
        assert names(matched_pods(model(ss), [project(injected_pod("a", ss))], NS)) == ["a"]

    @pytest.mark.parametrize(
        ("extra", "expected"),
        [
            ({}, ["a", "b", "c"]),
            ({"namespaceSelector": {"matchLabels": {"env": "prod"}}}, ["a"]),
            ({"namespaceSelector": {"matchLabels": {NS_NAME_LABEL: "dev"}}}, ["b"]),
            # unknown namespace: a selector on its name alone can still be decided
            ({"namespaceSelector": {"matchLabels": {NS_NAME_LABEL: "new"}}}, ["c"]),
            (
                {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": NS_NAME_LABEL, "operator": "NotIn", "values": ["shop"]}]
                    }
                },
                ["b", "c"],
            ),
            # ... anything else about an unknown namespace is not guessed
            (
                {"namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}},
                ["b"],
            ),
            ({"namespace": "dev"}, ["b"]),
            # spec.namespace overrides namespaceSelector
            ({"namespace": "dev", "namespaceSelector": {"matchLabels": {"env": "prod"}}}, ["b"]),
        ],
    )
    def test_namespaces(self, extra: dict[str, Any], expected: list[str]) -> None:
        ss = shop_sidecarset(**extra)
        pods = [
            project(injected_pod("a", ss, namespace="shop")),
            project(injected_pod("b", ss, namespace="dev")),
            project(injected_pod("c", ss, namespace="new")),
        ]
        assert names(matched_pods(model(ss), pods, NS)) == expected

    def test_known_namespace_without_the_name_label(self) -> None:
        ss = shop_sidecarset(namespace="legacy")
        assert names(matched_pods(model(ss), [project(injected_pod("a", ss, namespace="legacy"))], {"legacy": {}})) == [
            "a"
        ]

    @pytest.mark.parametrize("selector", [{}, {"matchLabels": {}}])
    def test_empty_selector_matches_nothing(self, selector: JsonObj) -> None:
        ss = shop_sidecarset(selector=selector)
        assert matched_pods(model(ss), [project(injected_pod("a", ss))], NS) == []

    def test_missing_selector_or_name(self) -> None:
        ss = shop_sidecarset()
        del ss["spec"]["selector"]
        assert matched_pods(model(ss), [project(injected_pod("a", shop_sidecarset()))], NS) == []
        nameless = shop_sidecarset()
        nameless["metadata"] = {}
        assert matched_pods(model(nameless), [project(injected_pod("a", shop_sidecarset()))], NS) == []


class TestComputeStatus:
    def test_counts(self) -> None:
        v1 = shop_sidecarset(metadata={"generation": 3})
        v2 = with_images(v1, envoy="envoy:v2")
        pods = [
            project(injected_pod("old-ready", v1)),
            project(injected_pod("old-not-ready", v1, ready=False)),
            project(injected_pod("new-ready", v2)),
            project(injected_pod("new-pending", v2, phase="Pending", ready=False, with_statuses=False)),
            project(in_flight(v1, v2)),
        ]
        status = compute_status(model(v2), pods, latest_revision="mesh-abc", collision_count=0)
        assert status == {
            "observedGeneration": 4,
            "matchedPods": 5,
            "updatedPods": 3,
            "readyPods": 2,  # old-ready, new-ready; the in-flight pod is Ready but not consistent
            "updatedReadyPods": 1,
            "latestRevision": "mesh-abc",
            "collisionCount": 0,
        }

    def test_ready_needs_running_and_not_deleting(self) -> None:
        ss = shop_sidecarset()
        pods = [project(injected_pod("a", ss, phase="Pending")), project(injected_pod("b", ss, deleting=True))]
        assert compute_status(model(ss), pods, latest_revision=None, collision_count=None)["readyPods"] == 0

    def test_ready_needs_every_container_reported(self) -> None:
        ss = shop_sidecarset()
        raw = injected_pod("a", ss)
        raw["status"]["containerStatuses"].pop()
        assert compute_status(model(ss), [project(raw)], latest_revision=None, collision_count=None)["readyPods"] == 0

    def test_optional_fields_are_omitted(self) -> None:
        ss = shop_sidecarset()
        del ss["metadata"]["generation"]
        status = compute_status(model(ss), [], latest_revision=None, collision_count=None)
        assert status == {"matchedPods": 0, "updatedPods": 0, "readyPods": 0, "updatedReadyPods": 0}


class TestSharedVerdicts:
    """`pod_verdicts` answers once per reconcile what status and planner would each ask per pod."""

    V1 = shop_sidecarset()
    V2 = with_images(V1, envoy="envoy:v2")

    def pods(self) -> list[PodProjection]:
        v1, v2 = self.V1, self.V2
        digest = with_images(v1, envoy="docker.io/library/envoy@sha256:" + "b" * 64)
        unreported = injected_pod("unreported", v2)
        unreported["status"]["containerStatuses"].pop()
        # the same spec and statuses as an in-flight pod, but no in-place record: nothing to wait for
        no_record = in_flight(v1, v2, name="no-record")
        del no_record["metadata"]["annotations"][ANN_INPLACE_STATE]
        # pinned, but the kubelet still reports another digest: the pinned image is not running yet
        not_pulled = injected_pod("digest-not-pulled", digest)
        envoy = next(s for s in not_pulled["status"]["containerStatuses"] if s["name"] == "envoy")
        envoy["imageID"] = "docker.io/library/envoy@sha256:" + "c" * 64
        raws = [
            injected_pod("old-ready", v1),
            injected_pod("old-not-ready", v1, ready=False),
            injected_pod("new-ready", v2),
            injected_pod("new-deleting", v2, deleting=True),
            injected_pod("new-pending", v2, phase="Pending", ready=False, with_statuses=False),
            in_flight(v1, v2),
            in_flight(v1, v2, name="moving-too"),
            not_pulled,
            unreported,
            no_record,
        ]
        return [project(r) for r in raws]

    def test_same_answers_as_the_per_pod_questions(self) -> None:
        pods = self.pods()
        v3 = with_images(self.V2, envoy="envoy:v3")  # the in-flight pods are outdated again
        for ss in (self.V2, v3):
            v = pod_verdicts(model(ss), pods)
            current, sidecars = spec_hash(ss["spec"]), {"envoy"}
            for i, p in enumerate(pods):
                updated = podstate.is_updated(p, sidecarset="mesh", spec_hash=current)
                assert v.updated[i] == updated, p.name
                assert v.available[i] == podstate.is_available(p, sidecarset="mesh", containers=sidecars), p.name
                moving = podstate.upgrade_in_flight(p, sidecarset="mesh", containers=sidecars)
                assert v.in_flight[i] == (moving and not updated), p.name
        # replicas in one state share their tuples, and still get their own answers
        assert pods[5].container_statuses is pods[6].container_statuses is pods[9].container_statuses
        v = pod_verdicts(model(self.V2), pods)
        assert [p.name for i, p in enumerate(pods) if v.available[i]] == ["old-ready", "new-ready", "no-record"]
        assert not any(v.in_flight)  # the pods still moving are updated, so not counted in flight
        v = pod_verdicts(model(v3), pods)
        assert [p.name for i, p in enumerate(pods) if v.in_flight[i]] == ["moving", "moving-too"]

    def test_status_from_shared_verdicts_equals_status_computed_alone(self) -> None:
        pods = self.pods()
        alone = compute_status(model(self.V2), pods, latest_revision="r", collision_count=0)
        shared = compute_status(
            model(self.V2), pods, latest_revision="r", collision_count=0, verdicts=pod_verdicts(model(self.V2), pods)
        )
        assert shared == alone
        counters = ("matchedPods", "updatedPods", "readyPods", "updatedReadyPods")
        assert [alone[k] for k in counters] == [10, 7, 3, 2]

    def test_verdicts_for_other_pods_or_another_spec_are_refused(self) -> None:
        pods = self.pods()
        v = pod_verdicts(model(self.V2), pods)
        for ss, others in ((self.V2, pods[1:]), (self.V2, [*pods[1:], pods[0]]), (self.V1, pods)):
            with pytest.raises(ValueError, match="other pods or another SidecarSet spec"):
                compute_status(model(ss), others, latest_revision=None, collision_count=None, verdicts=v)
        assert v.is_for(list(pods), sidecarset="mesh", spec_hash=spec_hash(self.V2["spec"]))


_label_keys = st.sampled_from(["app", "zone", "tier", "a/b"])
_label_values = st.sampled_from(["shop", "a", "b", ""])
_requirement = st.fixed_dictionaries(
    {
        "key": st.one_of(_label_keys, st.just(""), st.integers()),
        "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Bogus"]),
    },
    optional={"values": st.one_of(st.lists(_label_values, max_size=3), st.just("a"))},
)
_selectors = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "matchLabels": st.one_of(
                st.dictionaries(_label_keys, st.one_of(_label_values, st.integers()), max_size=2), st.just([])
            ),
            "matchExpressions": st.one_of(st.lists(_requirement, max_size=3), st.just({})),
        },
    ),
)


@given(selector=_selectors, labels=st.dictionaries(_label_keys, _label_values, max_size=4))
def test_compiled_matcher_agrees_with_matches(selector: JsonObj | None, labels: dict[str, str]) -> None:
    """The matcher status and planner compile once per reconcile gives `selectors.matches`' answer,
    on plain dicts and on projected pod labels, for well-formed and ill-formed selectors alike."""
    match = selectors.matcher(selector)
    expected = selectors.matches(selector, labels)
    assert match(labels) == expected
    projected = project(injected_pod("p", shop_sidecarset(), labels=labels)).labels
    assert match(projected) == selectors.matches(selector, projected)


class TestStatusChanged:
    NEW = {"observedGeneration": 2, "matchedPods": 3, "updatedPods": 1, "readyPods": 3, "updatedReadyPods": 0}

    def test_no_old_status(self) -> None:
        assert status_changed(None, self.NEW)

    def test_key_order_and_omitted_zero_are_not_changes(self) -> None:
        old = {"readyPods": 3, "updatedPods": 1, "matchedPods": 3, "observedGeneration": 2}
        assert not status_changed(old, self.NEW)
        assert not status_changed({**old, "latestRevision": None}, self.NEW)

    @pytest.mark.parametrize(
        "change", [{"readyPods": 2}, {"observedGeneration": 1}, {"latestRevision": "x"}, {"collisionCount": 1}]
    )
    def test_real_changes(self, change: JsonObj) -> None:
        assert status_changed(self.NEW, {**self.NEW, **change})
