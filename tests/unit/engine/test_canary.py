"""Canary SidecarSets: a canary that selects a pod replaces its base in that pod; the pair's validation."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch

from injector.engine import engine
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import FieldError, validate_sidecarset
from tests.kube import builders

NOW = "2024-01-01T00:00:00Z"
CANARY = {names.ANN_CANARY: "true", names.ANN_BASE: "mesh"}


def base_obj(containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return builders.sidecarset(
        "mesh",
        containers=containers or [builders.container("proxy", "envoy:1")],
        patchPodMetadata=[{"annotations": {"mesh/version": "1"}}],
        **spec,
    )


def canary_obj(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault("updateStrategy", {"type": "NotUpdate"})
    return builders.sidecarset(
        "mesh-canary",
        containers=[builders.container("proxy", "envoy:2")],
        selector={"matchLabels": {"app": "web", "track": "canary"}},
        metadata={"annotations": CANARY if annotations is None else annotations},
        **spec,
    )


def injected(pod: Any, *objs: dict[str, Any]) -> Any:
    result = engine.inject(
        pod,
        namespace="shop",
        namespace_labels=None,
        sidecarsets=[SidecarSet.from_object(o) for o in objs],
        now=NOW,
        require_namespace_label=False,
    )
    assert result.denied is None
    return jsonpatch.apply_patch(pod, result.patch)


def images(pod: Any) -> dict[str, str]:
    return {c["name"]: c["image"] for c in pod["spec"]["containers"]}


def test_a_matching_canary_replaces_its_base() -> None:
    out = injected(builders.pod(labels={"app": "web", "track": "canary"}), base_obj(), canary_obj())
    assert images(out)["proxy"] == "envoy:2"
    annotations = out["metadata"]["annotations"]
    assert annotations[names.ANN_INJECTED_LIST] == "mesh-canary"
    assert list(json.loads(annotations[names.ANN_HASH])) == ["mesh-canary"]
    assert "mesh/version" not in annotations  # the base's patchPodMetadata is not applied either


def test_a_canary_replaces_what_its_base_policy_injected_a_moment_before() -> None:
    # The base's MutatingAdmissionPolicy runs before the webhook and, until the API server enforces
    # the version that excludes the canary's pods, injects the base into them too.
    by_base_policy = injected(builders.pod(labels={"app": "web", "track": "canary"}), base_obj())
    assert by_base_policy["metadata"]["annotations"][names.ANN_INJECTED_LIST] == "mesh"
    out = injected(by_base_policy, base_obj(), canary_obj())
    assert images(out)["proxy"] == "envoy:2"
    assert [c["name"] for c in out["spec"]["containers"]].count("proxy") == 1
    annotations = out["metadata"]["annotations"]
    assert annotations[names.ANN_INJECTED_LIST] == "mesh-canary"
    assert list(json.loads(annotations[names.ANN_HASH])) == ["mesh-canary"]
    assert list(json.loads(annotations[names.ANN_HASH_WITHOUT_IMAGE])) == ["mesh-canary"]


def test_the_base_sidecars_its_canary_lacks_are_removed_from_a_pod_the_base_policy_injected() -> None:
    two = [builders.container("proxy", "envoy:1"), builders.container("log-agent", "fluent:1")]
    setup = [builders.container("mesh-init", "init:1")]
    base = base_obj(containers=two, initContainers=setup)
    pod = builders.pod(labels={"app": "web", "track": "canary"})
    pod["spec"]["initContainers"] = [builders.container("migrate", "db:1")]
    by_base_policy = injected(pod, base)
    assert {c["name"] for c in by_base_policy["spec"]["containers"]} == {"proxy", "log-agent", "app"}
    out = injected(by_base_policy, base, canary_obj())
    assert [c["name"] for c in out["spec"]["containers"]] == ["proxy", "app"]
    assert images(out)["proxy"] == "envoy:2"
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["migrate"], "the pod's own init container stays"
    assert out["metadata"]["annotations"][names.ANN_INJECTED_LIST] == "mesh-canary"


def test_a_pod_container_named_like_a_replaced_base_sidecar_is_kept() -> None:
    # Not injected by the base (no IS_INJECTED, base not in the injected list): the pod's own.
    base = base_obj(containers=[builders.container("proxy", "envoy:1"), builders.container("log-agent", "fluent:1")])
    pod = builders.pod(labels={"app": "web", "track": "canary"})
    pod["spec"]["containers"].append(builders.container("log-agent", "mine:1"))
    out = injected(pod, base, canary_obj())
    assert images(out)["log-agent"] == "mine:1"


def test_a_canary_that_does_not_match_leaves_the_base() -> None:
    out = injected(builders.pod(labels={"app": "web"}), base_obj(), canary_obj())
    assert images(out)["proxy"] == "envoy:1"
    assert out["metadata"]["annotations"][names.ANN_INJECTED_LIST] == "mesh"


def test_a_paused_canary_does_not_replace_its_base() -> None:
    paused = canary_obj(injectionStrategy={"paused": True})
    out = injected(builders.pod(labels={"app": "web", "track": "canary"}), base_obj(), paused)
    assert images(out)["proxy"] == "envoy:1"


def test_both_annotations_are_needed() -> None:
    not_canary = canary_obj(annotations={names.ANN_CANARY: "True", names.ANN_BASE: "mesh"})
    result = engine.inject(
        builders.pod(labels={"app": "web", "track": "canary"}),
        namespace="shop",
        namespace_labels=None,
        sidecarsets=[SidecarSet.from_object(base_obj()), SidecarSet.from_object(not_canary)],
        now=NOW,
        require_namespace_label=False,
    )
    # Not a canary: both select the pod and both define `proxy`, so the older (by name) wins.
    assert result.injected == ("mesh",)
    assert any("mesh-canary is not injected" in w for w in result.warnings)


# --- validation ---------------------------------------------------------------------------------


def errors(obj: dict[str, Any], *others: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return [str(e) for e in validate_sidecarset(obj, old=old, others=list(others))]


BASE_FIELD = f"metadata.annotations[{names.ANN_BASE}]"


def test_a_canary_of_an_existing_base_is_valid_and_may_reuse_its_names() -> None:
    assert errors(canary_obj(), base_obj()) == []


def test_the_base_may_be_changed_while_its_canary_exists() -> None:
    assert errors(base_obj(), canary_obj(), old=base_obj()) == []


def test_two_canaries_of_one_base_still_conflict() -> None:
    second = canary_obj()
    second["metadata"]["name"] = "mesh-canary-2"
    found = errors(canary_obj(), base_obj(), second)
    assert found == ["spec.containers[0].name: container proxy already exists in SidecarSet mesh-canary-2"]


def test_the_base_must_exist() -> None:
    assert errors(canary_obj()) == [
        f'{BASE_FIELD}: Invalid value: "mesh": fetch base sidecarSet[mesh] failed: '
        'sidecarsets.sidecarctl.io "mesh" not found'
    ]


def test_the_base_cannot_be_itself_or_a_canary() -> None:
    own = canary_obj(annotations={names.ANN_CANARY: "true", names.ANN_BASE: "mesh-canary"})
    assert f'{BASE_FIELD}: Invalid value: "mesh-canary": base sidecarSet cannot be itself' in errors(own, own)
    other_canary = base_obj()
    other_canary["metadata"]["annotations"] = {names.ANN_CANARY: "true", names.ANN_BASE: "elsewhere"}
    found = errors(canary_obj(), other_canary)
    assert found == [f'{BASE_FIELD}: Invalid value: "mesh": base sidecarSet cannot be canary']


def test_the_base_is_immutable_and_a_sidecarset_cannot_turn_canary() -> None:
    moved = canary_obj(annotations={names.ANN_CANARY: "true", names.ANN_BASE: "mesh2"})
    mesh2 = base_obj()
    mesh2["metadata"]["name"] = "mesh2"
    message = f'{BASE_FIELD}: Invalid value: "mesh2": annotations[{names.ANN_BASE}] is immutable'
    assert message in errors(moved, base_obj(), mesh2, old=canary_obj())
    plain = canary_obj(annotations={})
    message = f'{BASE_FIELD}: Invalid value: "mesh": annotations[{names.ANN_BASE}] is immutable'
    assert message in errors(canary_obj(), base_obj(), old=plain)
    # Leaving canary status is allowed.
    assert errors(plain, old=canary_obj()) == []


def test_a_canary_is_never_rolled_out() -> None:
    for strategy in ({"type": "RollingUpdate"}, {}):
        found = validate_sidecarset(canary_obj(updateStrategy=strategy), others=[base_obj()])
        assert found == [
            FieldError(
                "spec.updateStrategy.type",
                'Invalid value: "RollingUpdate": RollingUpdate is not supported for canary sidecarSet',
            )
        ]
