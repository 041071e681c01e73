"""The injection engine, one behaviour per test, checked on the patched pod and on the patch itself."""

from __future__ import annotations

import copy
import datetime
import json
import math
from collections.abc import Sequence
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from injector.engine import engine, envs, metadata, patchops, podcheck
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

NOW = "2024-01-01T00:00:00Z"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
IS_INJECTED = {"name": names.ENV_IS_INJECTED, "value": "true"}


def make_ss(
    name: str = "mesh",
    *,
    created: str = "",
    containers: Sequence[dict[str, Any]] = (),
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> SidecarSet:
    """SidecarSet `name` for the `app: web` pods, with only the sidecars a test gives it."""
    meta = {"creationTimestamp": created} if created else None
    return SidecarSet.from_object(
        builders.sidecarset(name, containers=list(containers), metadata=meta, status=status, **spec)
    )


def make_pod(*containers: dict[str, Any], metadata: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """Pod shop/web-1 (`app: web`) with `containers`, one `app:1` container if none."""
    return builders.pod("web-1", namespace="shop", containers=list(containers) or None, metadata=metadata, **spec)


def run(pod: dict[str, Any], *sidecarsets: SidecarSet, **kw: Any) -> tuple[engine.InjectionResult, dict[str, Any]]:
    before = copy.deepcopy(pod)
    args: dict[str, Any] = {"namespace": "shop", "namespace_labels": ENABLED, "sidecarsets": sidecarsets, "now": NOW}
    args.update(kw)
    result = engine.inject(pod, **args)
    assert pod == before, "the input pod was modified"
    json.dumps(result.patch)
    json.dumps([result.injected, result.skipped, result.warnings, result.denied])
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, result.patch)
    assert_valid_pod(patched)
    return result, patched


def assert_valid_pod(pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    all_names = [c["name"] for c in spec["containers"] + (spec.get("initContainers") or [])]
    assert len(all_names) == len(set(all_names)), all_names
    volume_names = [v["name"] for v in spec.get("volumes") or []]
    assert len(volume_names) == len(set(volume_names)), volume_names
    secret_names = [s["name"] for s in spec.get("imagePullSecrets") or []]
    assert len(secret_names) == len(set(secret_names)), secret_names


def names_of(containers: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in containers]


def annotation_map(pod: dict[str, Any], key: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(pod["metadata"]["annotations"][key])
    return value


# --- placement -------------------------------------------------------------------------------


def test_before_sidecars_are_prepended_as_a_block_and_after_ones_appended() -> None:
    ss = make_ss(
        containers=[
            {"name": "b1", "image": "b"},
            {"name": "a1", "image": "a", "podInjectPolicy": "AfterAppContainer"},
            {"name": "b2", "image": "b", "podInjectPolicy": "BeforeAppContainer"},
        ]
    )
    pod = make_pod({"name": "app", "image": "app"}, {"name": "app2", "image": "app"})
    result, patched = run(pod, ss)
    assert names_of(patched["spec"]["containers"]) == ["b1", "b2", "app", "app2", "a1"]
    paths = [op["path"] for op in result.patch if op["path"].startswith("/spec/containers")]
    assert paths == ["/spec/containers/0", "/spec/containers/1", "/spec/containers/-"]


def test_sidecarsets_apply_in_name_order_whatever_the_input_order() -> None:
    zeta = make_ss("zeta", containers=[{"name": "z", "image": "z"}])
    alpha = make_ss("alpha", containers=[{"name": "a", "image": "a"}])
    _, patched = run(make_pod(), zeta, alpha)
    assert names_of(patched["spec"]["containers"]) == ["a", "z", "app"]
    _, again = run(make_pod(), alpha, zeta)
    assert again == patched


def test_a_container_of_the_same_name_is_replaced_in_place() -> None:
    ss = make_ss(containers=[{"name": "proxy", "image": "proxy:2"}])
    pod = make_pod(
        {"name": "app", "image": "app"}, {"name": "proxy", "image": "proxy:user"}, {"name": "x", "image": "x"}
    )
    result, patched = run(pod, ss)
    assert names_of(patched["spec"]["containers"]) == ["app", "proxy", "x"]
    assert patched["spec"]["containers"][1] == {"name": "proxy", "image": "proxy:2", "env": [IS_INJECTED]}
    assert [op["op"] for op in result.patch if op["path"].startswith("/spec/containers")] == ["replace"]
    # The replaced container is a sidecar now, not the first app container.
    assert patched["metadata"]["annotations"][names.ANN_DEFAULT_CONTAINER] == "app"


def test_init_containers_are_sorted_by_name_across_sidecarsets() -> None:
    one = make_ss("one", initContainers=[{"name": "zz", "image": "z"}, {"name": "mm", "image": "m"}])
    two = make_ss(
        "two",
        initContainers=[
            {"name": "aa", "image": "a"},
            {"name": "first", "image": "f", "podInjectPolicy": "BeforeAppContainer"},
        ],
    )
    pod = make_pod(initContainers=[{"name": "user-init", "image": "u"}])
    result, patched = run(pod, one, two)
    assert names_of(patched["spec"]["initContainers"]) == ["first", "user-init", "aa", "mm", "zz"]
    assert patched["spec"]["containers"] == pod["spec"]["containers"]
    assert all(op["op"] == "add" for op in result.patch)


def test_init_containers_added_whole_when_the_pod_has_none() -> None:
    ss = make_ss(initContainers=[{"name": "b", "image": "b"}, {"name": "a", "image": "a"}])
    for pod in (make_pod(), make_pod(initContainers=[]), make_pod(initContainers=None)):
        result, patched = run(pod, ss)
        (op,) = [op for op in result.patch if op["path"].startswith("/spec/initContainers")]
        assert op["path"] == "/spec/initContainers"
        assert names_of(patched["spec"]["initContainers"]) == ["a", "b"]


def test_native_sidecar_goes_to_init_containers_and_the_sidecar_list() -> None:
    ss = make_ss(
        containers=[{"name": "proxy", "image": "p"}],
        initContainers=[
            {"name": "setup", "image": "s"},
            {"name": "agent", "image": "a", "restartPolicy": "Always"},
        ],
    )
    _, patched = run(make_pod(), ss)
    agent = patched["spec"]["initContainers"][0]
    assert agent == {"name": "agent", "image": "a", "restartPolicy": "Always", "env": [IS_INJECTED]}
    entry = annotation_map(patched, names.ANN_HASH)["mesh"]
    assert entry["sidecarList"] == ["agent", "proxy"]


def test_sidecarset_only_fields_never_reach_the_pod() -> None:
    ss = make_ss(
        containers=[
            {
                "name": "proxy",
                "image": "p",
                "podInjectPolicy": "AfterAppContainer",
                "shareVolumePolicy": {"type": "disabled"},
                "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
                "transferEnv": [],
            }
        ]
    )
    _, patched = run(make_pod(), ss)
    assert patched["spec"]["containers"][1] == {"name": "proxy", "image": "p", "env": [IS_INJECTED]}


# --- volumes and env -------------------------------------------------------------------------


def test_shared_volumes_come_from_app_containers_only_and_own_mount_path_wins() -> None:
    ss = make_ss(
        containers=[
            {
                "name": "proxy",
                "image": "p",
                "env": [{"name": "OWN", "value": "1"}],
                "volumeMounts": [{"name": "own", "mountPath": "/data"}],
                "shareVolumePolicy": {"type": "enabled"},
            }
        ],
        volumes=[{"name": "own", "emptyDir": {}}],
    )
    app = {
        "name": "app",
        "image": "app",
        "env": [{"name": "POD", "value": "x"}, {"name": "OTHER", "value": "y"}, {"name": "OWN", "value": "app"}],
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "logs", "mountPath": "/logs", "subPathExpr": "$(POD)/$(OWN)"},
        ],
    }
    other_sidecar = {
        "name": "old-sidecar",
        "image": "o",
        "env": [IS_INJECTED],
        "volumeMounts": [{"name": "secret", "mountPath": "/secret"}],
    }
    pod = make_pod(
        app,
        other_sidecar,
        initContainers=[{"name": "init", "image": "i", "volumeMounts": [{"name": "boot", "mountPath": "/boot"}]}],
        volumes=[{"name": n, "emptyDir": {}} for n in ("data", "logs", "secret", "boot")],
    )
    result, patched = run(pod, ss)
    proxy = patched["spec"]["containers"][0]
    assert proxy["volumeMounts"] == [
        {"name": "own", "mountPath": "/data"},
        {"name": "logs", "mountPath": "/logs", "subPathExpr": "$(POD)/$(OWN)"},
    ]
    # Own env first, then IS_INJECTED, then the vars the subPathExpr uses (own OWN wins).
    assert proxy["env"] == [{"name": "OWN", "value": "1"}, IS_INJECTED, {"name": "POD", "value": "x"}]
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["data", "logs", "secret", "boot", "own"]
    assert result.warnings == ()


def test_shared_volume_devices() -> None:
    ss = make_ss(
        containers=[{"name": "proxy", "image": "p", "shareVolumeDevicePolicy": {"type": "enabled"}}],
    )
    app = {"name": "app", "image": "a", "volumeDevices": [{"name": "blk", "devicePath": "/dev/xvda"}]}
    _, patched = run(make_pod(app, volumes=[{"name": "blk", "persistentVolumeClaim": {"claimName": "c"}}]), ss)
    assert patched["spec"]["containers"][0]["volumeDevices"] == app["volumeDevices"]


def test_transfer_env_by_name_and_by_field_ref() -> None:
    ss = make_ss(
        containers=[
            {
                "name": "proxy",
                "image": "p",
                "env": [{"name": "REGION", "value": "sidecar"}],
                "transferEnv": [
                    {"sourceContainerName": "app", "envNames": ["REGION", "ZONE", "MISSING"]},
                    {
                        "sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['main-container']"}},
                        "envName": "TOKEN",
                    },
                    {
                        "sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.annotations['x/main']"}},
                        "envName": "ZONE",
                    },
                ],
            }
        ]
    )
    app = {"name": "app", "image": "a", "env": [{"name": "ZONE", "value": "z1"}, {"name": "REGION", "value": "r"}]}
    worker = {
        "name": "worker",
        "image": "w",
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "ZONE", "value": "w"},
        ],
    }
    pod = make_pod(
        app,
        worker,
        metadata={"labels": {"app": "web", "main-container": "worker"}, "annotations": {"x/main": "worker"}},
    )
    result, patched = run(pod, ss)
    assert patched["spec"]["containers"][0]["env"] == [
        {"name": "REGION", "value": "sidecar"},
        IS_INJECTED,
        {"name": "ZONE", "value": "z1"},
        worker["env"][0],
    ]
    assert result.warnings == ()


def test_transfer_env_with_a_missing_source_is_skipped_with_a_warning() -> None:
    ss = make_ss(
        containers=[
            {
                "name": "proxy",
                "image": "p",
                "transferEnv": [
                    {"sourceContainerName": "nope", "envName": "A"},
                    {"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['main']"}}, "envName": "B"},
                ],
            }
        ]
    )
    result, patched = run(make_pod(), ss)
    assert patched["spec"]["containers"][0]["env"] == [IS_INJECTED]
    assert len(result.warnings) == 2
    assert "'nope' is not in the pod" in result.warnings[0]
    assert "metadata.labels['main']" in result.warnings[1]
    assert all("SidecarSet mesh, container proxy" in w for w in result.warnings)


def test_only_mounted_sidecarset_volumes_are_added_and_the_pod_wins_a_clash() -> None:
    ss = make_ss(
        containers=[
            {
                "name": "proxy",
                "image": "p",
                "volumeMounts": [{"name": "certs", "mountPath": "/certs"}, {"name": "shared", "mountPath": "/s"}],
            },
        ],
        initContainers=[{"name": "init", "image": "i", "volumeDevices": [{"name": "dev", "devicePath": "/dev/x"}]}],
        volumes=[
            {"name": "unused", "emptyDir": {}},
            {"name": "shared", "emptyDir": {"medium": "Memory"}},
            {"name": "certs", "secret": {"secretName": "certs"}},
            {"name": "dev", "persistentVolumeClaim": {"claimName": "d"}},
        ],
    )
    pod = make_pod(volumes=[{"name": "shared", "configMap": {"name": "mine"}}])
    result, patched = run(pod, ss)
    assert patched["spec"]["volumes"] == [
        {"name": "shared", "configMap": {"name": "mine"}},
        {"name": "dev", "persistentVolumeClaim": {"claimName": "d"}},
        {"name": "certs", "secret": {"secretName": "certs"}},
    ]
    assert all(op["path"] == "/spec/volumes/-" for op in result.patch if "volumes" in op["path"])


def test_a_volume_nobody_defines_gives_a_warning() -> None:
    ss = make_ss(containers=[{"name": "proxy", "image": "p", "volumeMounts": [{"name": "ghost", "mountPath": "/g"}]}])
    result, patched = run(make_pod(), ss)
    assert "volume ghost is defined neither by the SidecarSet nor by the pod" in result.warnings[0]
    assert "volumes" not in patched["spec"]
    # A volume the pod defines is fine.
    result, _ = run(make_pod(volumes=[{"name": "ghost", "emptyDir": {}}]), ss)
    assert result.warnings == ()


def test_volumes_shared_by_two_sidecarsets_are_added_once() -> None:
    vol = {"name": "shared", "emptyDir": {}}
    one = make_ss(
        "one",
        containers=[{"name": "a", "image": "a", "volumeMounts": [{"name": "shared", "mountPath": "/s"}]}],
        volumes=[vol],
    )
    two = make_ss(
        "two",
        containers=[{"name": "b", "image": "b", "volumeMounts": [{"name": "shared", "mountPath": "/s"}]}],
        volumes=[vol],
    )
    result, patched = run(make_pod(), one, two)
    assert patched["spec"]["volumes"] == [vol]
    assert [op["path"] for op in result.patch if "volumes" in op["path"]] == ["/spec/volumes"]


def test_image_pull_secrets_are_merged_without_duplicates() -> None:
    one = make_ss("one", containers=[{"name": "a", "image": "a"}], imagePullSecrets=[{"name": "reg"}, {"name": "mesh"}])
    two = make_ss("two", containers=[{"name": "b", "image": "b"}], imagePullSecrets=[{"name": "mesh"}, {"name": "x"}])
    _, patched = run(make_pod(imagePullSecrets=[{"name": "reg"}]), one, two)
    assert patched["spec"]["imagePullSecrets"] == [{"name": "reg"}, {"name": "mesh"}, {"name": "x"}]
    _, patched = run(make_pod(), one)
    assert patched["spec"]["imagePullSecrets"] == [{"name": "reg"}, {"name": "mesh"}]


def test_own_is_injected_env_is_forced_to_true() -> None:
    ss = make_ss(
        containers=[
            {"name": "p", "image": "p", "env": [{"name": "IS_INJECTED", "value": "no"}, {"name": "A", "value": "1"}]}
        ]
    )
    _, patched = run(make_pod(), ss)
    assert patched["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, IS_INJECTED]


# --- metadata --------------------------------------------------------------------------------


def test_bookkeeping_annotations_and_label() -> None:
    ss = make_ss(
        containers=[{"name": "p2", "image": "p"}, {"name": "p1", "image": "p"}], status={"latestRevision": "mesh-5d8"}
    )
    result, patched = run(make_pod(), ss)
    ann = patched["metadata"]["annotations"]
    assert json.loads(ann[names.ANN_HASH]) == {
        "mesh": {
            "updateTimestamp": NOW,
            "hash": ss.hash,
            "sidecarSetName": "mesh",
            "sidecarList": ["p1", "p2"],
            "controllerRevision": "mesh-5d8",
        }
    }
    assert json.loads(ann[names.ANN_HASH_WITHOUT_IMAGE]) == {
        "mesh": {
            "updateTimestamp": NOW,
            "hash": ss.hash_without_image,
            "sidecarSetName": "mesh",
            "sidecarList": ["p1", "p2"],
        }
    }
    assert ann[names.ANN_INJECTED_LIST] == "mesh"
    assert ann[names.ANN_DEFAULT_CONTAINER] == "app"
    assert patched["metadata"]["labels"] == {"app": "web", names.POD_INJECTED_LABEL: "true"}
    assert result.injected == ("mesh",)
    # Compact JSON with Kruise's field order, like Go's encoder.
    assert ann[names.ANN_HASH].startswith('{"mesh":{"updateTimestamp":')


def test_entries_of_other_sidecarsets_are_kept() -> None:
    existing = {
        names.ANN_HASH: json.dumps({"other": {"hash": "h1", "sidecarSetName": "other"}, "legacy": "h2"}),
        names.ANN_INJECTED_LIST: "other,legacy",
    }
    ss = make_ss("mesh", containers=[{"name": "p", "image": "p"}])
    _, patched = run(make_pod(metadata={"annotations": existing}), ss)
    hashes = annotation_map(patched, names.ANN_HASH)
    assert list(hashes) == ["legacy", "mesh", "other"]
    assert hashes["other"] == {"hash": "h1", "sidecarSetName": "other"}
    assert hashes["legacy"] == "h2"
    assert patched["metadata"]["annotations"][names.ANN_INJECTED_LIST] == "legacy,mesh,other"


def test_an_unreadable_hash_annotation_is_rewritten_with_a_warning() -> None:
    ss = make_ss(containers=[{"name": "p", "image": "p"}])
    result, patched = run(make_pod(metadata={"annotations": {names.ANN_HASH: "{oops"}}), ss)
    assert list(annotation_map(patched, names.ANN_HASH)) == ["mesh"]
    assert any(names.ANN_HASH in w and "not JSON" in w for w in result.warnings)


def test_default_container_annotation_is_kept_when_present() -> None:
    ss = make_ss(containers=[{"name": "p", "image": "p"}])
    pod = make_pod(
        {"name": "a", "image": "a"},
        {"name": "b", "image": "b"},
        metadata={"annotations": {names.ANN_DEFAULT_CONTAINER: "b"}},
    )
    result, patched = run(pod, ss)
    assert patched["metadata"]["annotations"][names.ANN_DEFAULT_CONTAINER] == "b"
    assert not any(op["path"].endswith("default-container") for op in result.patch)


def test_annotation_keys_are_escaped_and_maps_added_whole_when_absent() -> None:
    ss = make_ss(containers=[{"name": "p", "image": "p"}], patchPodMetadata=[{"annotations": {"a~b/c": "v"}}])
    pod = make_pod(metadata={"annotations": {"keep": "1"}})
    result, patched = run(pod, ss)
    assert {"op": "add", "path": "/metadata/annotations/a~0b~1c", "value": "v"} in result.patch
    assert patched["metadata"]["annotations"]["keep"] == "1"
    no_maps = make_pod()
    del no_maps["metadata"]["labels"]
    ss_all = make_ss(
        selector={"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
        containers=[{"name": "p", "image": "p"}],
    )
    result, patched = run(no_maps, ss_all)
    assert [op["path"] for op in result.patch if op["path"].startswith("/metadata")] == [
        "/metadata/labels",
        "/metadata/annotations",
    ]
    no_metadata = {"spec": {"containers": [{"name": "app", "image": "a"}]}}
    result, patched = run(no_metadata, ss_all)
    assert result.patch[0]["path"] == "/metadata"
    assert patched["metadata"]["labels"] == {names.POD_INJECTED_LABEL: "true"}


@pytest.mark.parametrize(
    ("policy", "existing", "value", "expected"),
    [
        ("Retain", None, "new", "new"),
        ("Retain", "old", "new", "old"),
        ("Overwrite", "old", "new", "new"),
        ("Overwrite", None, "new", "new"),
        ("MergePatchJson", None, '{"a":1}', '{"a":1}'),
        (
            "MergePatchJson",
            '{"a":1,"b":{"c":1,"d":2}}',
            '{"b":{"c":null,"e":3},"f":[1]}',
            '{"a":1,"b":{"d":2,"e":3},"f":[1]}',
        ),
        ("MergePatchJson", '["x"]', '{"a":1}', '{"a":1}'),
    ],
)
def test_patch_pod_metadata(policy: str, existing: str | None, value: str, expected: str) -> None:
    ss = make_ss(
        containers=[{"name": "p", "image": "p"}],
        patchPodMetadata=[{"annotations": {"k": value}, "patchPolicy": policy}],
    )
    pod = make_pod(metadata={"annotations": {} if existing is None else {"k": existing}})
    result, patched = run(pod, ss)
    assert patched["metadata"]["annotations"]["k"] == expected
    assert result.warnings == ()


def test_merge_patch_json_into_a_non_json_value_warns_and_leaves_it() -> None:
    ss = make_ss(
        containers=[{"name": "p", "image": "p"}],
        patchPodMetadata=[{"annotations": {"k": '{"a":1}', "j": "not json"}, "patchPolicy": "MergePatchJson"}],
    )
    pod = make_pod(metadata={"annotations": {"k": "plain", "j": "{}"}})
    result, patched = run(pod, ss)
    assert patched["metadata"]["annotations"]["k"] == "plain"
    assert patched["metadata"]["annotations"]["j"] == "{}"
    assert len(result.warnings) == 2
    assert "annotation k is not JSON" in result.warnings[0]


def test_merge_patch_follows_rfc_7386() -> None:
    # RFC 7386 appendix A examples.
    cases = [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ]
    for target, patch, expected in cases:
        assert metadata.merge_patch(target, patch) == expected


# --- matching and conflicts ------------------------------------------------------------------


def test_paused_non_matching_and_out_of_scope_sidecarsets_are_not_injected() -> None:
    paused = make_ss("paused", containers=[{"name": "a", "image": "a"}], injectionStrategy={"paused": True})
    other_app = make_ss("other", selector={"matchLabels": {"app": "db"}}, containers=[{"name": "b", "image": "b"}])
    empty = make_ss("empty", selector={}, containers=[{"name": "c", "image": "c"}])
    elsewhere = make_ss("elsewhere", namespace="prod", containers=[{"name": "d", "image": "d"}])
    result, _ = run(make_pod(), paused, other_app, empty, elsewhere)
    assert (result.patch, result.skipped) == ([], engine.SKIP_NO_MATCH)
    here = make_ss(
        "here", namespaceSelector={"matchLabels": {"team": "shop"}}, containers=[{"name": "e", "image": "e"}]
    )
    result, _ = run(make_pod(), here, namespace_labels={**ENABLED, "team": "shop"})
    assert result.injected == ("here",)


def test_conflicting_sidecarsets_the_older_wins_and_the_other_is_skipped_whole() -> None:
    older = make_ss("zz-older", created="2023-01-01T00:00:00Z", containers=[{"name": "proxy", "image": "old"}])
    newer = make_ss(
        "aa-newer",
        created="2024-01-01T00:00:00Z",
        containers=[{"name": "log", "image": "l"}, {"name": "proxy", "image": "new"}],
    )
    result, patched = run(make_pod(), newer, older)
    assert result.injected == ("zz-older",)
    assert names_of(patched["spec"]["containers"]) == ["proxy", "app"]
    assert patched["spec"]["containers"][0]["image"] == "old"
    (warning,) = result.warnings
    assert "aa-newer" in warning and "zz-older" in warning and "proxy" in warning


def test_conflict_between_a_container_and_an_init_container() -> None:
    one = make_ss("one", containers=[{"name": "agent", "image": "a"}])
    two = make_ss("two", initContainers=[{"name": "agent", "image": "b", "restartPolicy": "Always"}])
    result, patched = run(make_pod(), two, one)
    assert result.injected == ("one",)
    assert "initContainers" not in patched["spec"]


def test_sidecar_colliding_with_a_pod_container_in_the_other_list_is_skipped() -> None:
    ss = make_ss(initContainers=[{"name": "app", "image": "x"}])
    result, _ = run(make_pod(), ss)
    assert (result.patch, result.skipped) == ([], engine.SKIP_ALL_CONFLICT)
    (warning,) = result.warnings
    assert "SidecarSet mesh is not injected: its init container app (a container of the pod)" in warning
    other = make_ss("other", containers=[{"name": "user-init", "image": "x"}])
    result, _ = run(make_pod(initContainers=[{"name": "user-init", "image": "u"}]), other)
    assert "container user-init (an init container of the pod)" in result.warnings[0]


# --- idempotency and re-injection ------------------------------------------------------------


def test_reinjection_is_a_no_op() -> None:
    ss = make_ss(
        containers=[{"name": "p", "image": "p", "shareVolumePolicy": {"type": "enabled"}}],
        initContainers=[{"name": "i", "image": "i"}],
        patchPodMetadata=[{"annotations": {"m": '{"a":1}'}, "patchPolicy": "MergePatchJson"}],
    )
    _, once = run(make_pod(), ss)
    result, twice = run(once, ss, now="2030-01-01T00:00:00Z")
    assert result.patch == []
    assert result.skipped == engine.SKIP_ALREADY_INJECTED
    assert twice == once


def test_a_new_sidecarset_is_added_to_an_injected_pod() -> None:
    first = make_ss("first", containers=[{"name": "a", "image": "a"}])
    second = make_ss("second", containers=[{"name": "b", "image": "b", "podInjectPolicy": "AfterAppContainer"}])
    _, once = run(make_pod(), first)
    result, twice = run(once, first, second)
    assert result.injected == ("second",)
    assert names_of(twice["spec"]["containers"]) == ["a", "app", "b"]
    assert twice["metadata"]["annotations"][names.ANN_INJECTED_LIST] == "first,second"
    assert set(annotation_map(twice, names.ANN_HASH)) == {"first", "second"}
    assert annotation_map(twice, names.ANN_HASH)["first"] == annotation_map(once, names.ANN_HASH)["first"]


def test_a_changed_sidecarset_replaces_its_containers_in_place() -> None:
    v1 = make_ss(containers=[{"name": "p", "image": "p:1"}])
    v2 = make_ss(containers=[{"name": "p", "image": "p:2"}])
    _, once = run(make_pod(), v1)
    result, twice = run(once, v2)
    assert [op["op"] for op in result.patch if op["path"].startswith("/spec")] == ["replace"]
    assert names_of(twice["spec"]["containers"]) == ["p", "app"]
    assert twice["spec"]["containers"][0]["image"] == "p:2"
    assert annotation_map(twice, names.ANN_HASH)["mesh"]["hash"] == v2.hash


# --- bad pods --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.update(spec=None), "spec must be an object"),
        (lambda p: p["spec"].update(containers=[]), "spec.containers must be a non-empty list"),
        (lambda p: p["spec"].update(containers=[{"image": "x"}]), "spec.containers[0]"),
        (lambda p: p["spec"].update(initContainers={}), "spec.initContainers must be a list"),
        (lambda p: p["spec"].update(volumes=[{}]), "spec.volumes[0]"),
        (lambda p: p["spec"]["containers"][0].update(env="A=1"), "spec.containers[0].env must be a list"),
        (lambda p: p["metadata"].update(annotations={"a": 1}), "metadata.annotations[a] must be a string"),
        (lambda p: p["metadata"].update(labels=[]), "metadata.labels must be an object"),
    ],
)
def test_malformed_pods_are_denied_with_the_field(mutate: Any, message: str) -> None:
    pod = make_pod()
    mutate(pod)
    result = engine.inject(
        pod,
        namespace="shop",
        namespace_labels=ENABLED,
        sidecarsets=[make_ss(containers=[{"name": "p", "image": "p"}])],
        now=NOW,
    )
    assert result.patch == []
    assert result.denied is not None and message in result.denied


def test_not_an_object_is_denied() -> None:
    result = engine.inject([], namespace="shop", namespace_labels=ENABLED, sidecarsets=[], now=NOW)  # type: ignore[arg-type]
    assert result.denied == "the pod must be a JSON object"


# --- patch helpers ---------------------------------------------------------------------------


def test_escape() -> None:
    assert patchops.escape("a/b~c") == "a~1b~0c"
    assert patchops.escape("~1") == "~01"


# --- the patch is the caller's own -------------------------------------------------------------


def _scribble(value: Any) -> None:
    """Change every object and list inside `value`, in place."""
    if isinstance(value, dict):
        for item in list(value.values()):
            _scribble(item)
        value["scribbled"] = True
    elif isinstance(value, list):
        for item in list(value):
            _scribble(item)
        value.append("scribbled")


def _object_ids(value: Any, out: set[int]) -> set[int]:
    if isinstance(value, dict | list):
        out.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            _object_ids(item, out)
    return out


def _sharing_everything() -> tuple[dict[str, Any], list[SidecarSet]]:
    """A pod and SidecarSets that exercise every path by which an input object reaches the patch."""
    app = {
        "name": "app",
        "image": "app:1",
        "env": [{"name": "A", "value": "1"}, {"name": "SRC", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "subPathExpr": "$(A)"}],
        "volumeDevices": [{"name": "blk", "devicePath": "/dev/blk"}],
    }
    pod = make_pod(app, volumes=[{"name": "data", "emptyDir": {}}])
    sets = [
        make_ss(
            "log",
            containers=[
                {
                    "name": "agent",
                    "image": "agent:1",
                    "env": [{"name": "OWN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "resources": {"limits": {"memory": "1Gi"}},
                    "volumeMounts": [{"name": "conf", "mountPath": "/conf"}],
                    "shareVolumePolicy": {"type": "enabled"},
                    "shareVolumeDevicePolicy": {"type": "enabled"},
                    "transferEnv": [{"sourceContainerName": "app", "envNames": ["SRC"]}],
                }
            ],
            initContainers=[{"name": "setup", "image": "setup:1", "args": ["a", "b"]}],
            volumes=[{"name": "conf", "configMap": {"name": "agent", "items": [{"key": "k", "path": "p"}]}}],
            imagePullSecrets=[{"name": "registry"}],
        )
    ]
    return pod, sets


def test_the_patch_shares_no_object_with_the_pod_or_the_sidecarsets() -> None:
    pod, sets = _sharing_everything()
    result, _ = run(pod, *sets)
    inputs = _object_ids(pod, set())
    for ss in sets:
        _object_ids(ss.obj, inputs)
        for sc in ss.containers + ss.init_containers:
            _object_ids(sc.container, inputs)
        for item in ss.volumes + ss.image_pull_secrets:
            _object_ids(item, inputs)
    assert _object_ids(result.patch, set()).isdisjoint(inputs)


def test_changing_the_pod_afterwards_does_not_change_the_patch() -> None:
    pod, sets = _sharing_everything()
    result, _ = run(pod, *sets)
    patch_before = copy.deepcopy(result.patch)
    _scribble(pod)
    assert result.patch == patch_before


def test_changing_the_patch_changes_neither_the_pod_nor_later_patches() -> None:
    pod, sets = _sharing_everything()
    pod_before = copy.deepcopy(pod)
    objects_before = [copy.deepcopy(ss.obj) for ss in sets]
    first, _ = run(pod, *sets)
    expected = copy.deepcopy(first.patch)
    _scribble(first.patch)
    assert pod == pod_before
    assert [ss.obj for ss in sets] == objects_before
    again, _ = run(pod, *sets)
    assert again.patch == expected


def test_yaml_values_and_shared_subtrees_reach_the_patch_as_a_deep_copy_would_leave_them() -> None:
    """A manifest read from YAML may hold dates, NaN and anchors (shared subtrees), which JSON cannot."""
    pod = yaml.safe_load(
        """
        metadata: {name: p, labels: {app: web}}
        spec:
          containers:
          - name: app
            image: app:1
            env:
            - {name: A, valueFrom: &from {fieldRef: {fieldPath: metadata.name}}}
            - {name: B, valueFrom: *from}
            volumeMounts: &mounts [{name: data, mountPath: /data}]
          - {name: worker, image: worker:1, volumeMounts: *mounts}
        """
    )
    ss = SidecarSet.from_object(
        yaml.safe_load(
            """
            metadata: {name: mesh}
            spec:
              selector: {matchLabels: {app: web}}
              containers:
              - name: proxy
                image: proxy:1
                env: [{name: SINCE, value: 2024-01-01}, {name: RATIO, value: .nan}]
                resources: {requests: &res {cpu: 10m}, limits: *res}
                shareVolumePolicy: {type: enabled}
                transferEnv: [{sourceContainerName: app, envNames: [A, B]}]
            """
        )
    )
    # Not `run`: the patch is not JSON (the CLI writes it back as YAML).
    result = engine.inject(pod, namespace="shop", namespace_labels=ENABLED, sidecarsets=[ss], now=NOW)
    (op,) = [op for op in result.patch if op["path"].startswith("/spec/containers")]
    proxy = op["value"]
    env = {e["name"]: e for e in proxy["env"]}
    assert env["SINCE"]["value"] == datetime.date(2024, 1, 1)
    assert math.isnan(env["RATIO"]["value"])
    assert proxy["resources"]["requests"] is proxy["resources"]["limits"]
    assert proxy["resources"]["requests"] is not ss.containers[0].container["resources"]["requests"]
    assert env["A"]["valueFrom"] is env["B"]["valueFrom"]
    assert env["A"]["valueFrom"] is not pod["spec"]["containers"][0]["env"][0]["valueFrom"]


# --- quick checks agree with the exact ones ------------------------------------------------------


def _reference_list_problem(items: Any, field: str) -> str | None:
    """The plain rule for a list of named entries, one entry at a time."""
    if items is None:
        return None
    if not isinstance(items, list):
        return f"{field} must be a list"
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return f"{field}[{i}] must be an object with a non-empty string name"
    return None


_entries = st.lists(
    st.one_of(
        st.builds(lambda n: {"name": n, "value": "v"}, st.sampled_from(["A", "B", names.ENV_IS_INJECTED])),
        st.builds(lambda n: {"name": n}, st.sampled_from(["", 7, None, ["A"]])),
        st.just({"value": "no name"}),
        st.sampled_from(["A=1", 3, None, ["A"]]),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(env=st.one_of(_entries, st.none(), st.just("A=1"), st.just({"name": "A"})))
def test_the_quick_env_check_gives_the_plain_rules_answer(env: Any) -> None:
    pod = make_pod({"name": "app", "image": "app:1", "env": env})
    assert podcheck.pod_problem(pod) == _reference_list_problem(env, "spec.containers[0].env")


@settings(max_examples=300, deadline=None)
@given(env=_entries, value=st.sampled_from(["true", "false", 1]))
def test_the_quick_is_injected_gives_the_plain_rules_answer(env: list[Any], value: Any) -> None:
    env = [{**e, "value": value} if isinstance(e, dict) and e.get("name") == names.ENV_IS_INJECTED else e for e in env]
    expected = any(
        isinstance(e, dict) and e.get("name") == names.ENV_IS_INJECTED and e.get("value") == "true" for e in env
    )
    assert envs.is_injected({"name": "c", "env": env}) is expected


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    existing=st.dictionaries(st.sampled_from(["mesh", "a", "zz", "naïve", 'q"uote']), _json, max_size=4),
    revision=st.sampled_from([None, "mesh-7c9f"]),
    without_image=st.booleans(),
)
def test_hash_annotation_text_is_what_json_dumps_writes(
    existing: dict[str, Any], revision: str | None, without_image: bool
) -> None:
    ss = make_ss(
        "mesh",
        containers=[{"name": "p", "image": "p"}],
        initContainers=[{"name": "n", "image": "n", "restartPolicy": "Always"}],
        status={"latestRevision": revision} if revision else None,
    )
    entry: dict[str, Any] = {
        "updateTimestamp": NOW,
        "hash": ss.hash_without_image if without_image else ss.hash,
        "sidecarSetName": "mesh",
        "sidecarList": ["n", "p"],
    }
    if revision and not without_image:
        entry["controllerRevision"] = revision
    merged = {**existing, "mesh": entry}
    expected = json.dumps({k: merged[k] for k in sorted(merged)}, separators=(",", ":"), ensure_ascii=False)
    assert metadata.with_entries(existing, [ss], now=NOW, without_image=without_image) == expected
