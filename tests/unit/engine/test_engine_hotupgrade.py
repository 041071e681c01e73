"""HotUpgrade at injection: the `<n>-1` / `<n>-2` pair Kruise's webhook injects, and that the
controller then upgrades.

Checked on the patched pod: the two containers (built as the cold sidecar, then split), their
version env vars, the version and working annotations, placement, native init containers, the
hash annotations' logical names, same-name pods, and the controller's reading of the result.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest

from injector.engine import engine
from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import main as cli
from sidecarsets.pods import podstate
from sidecarsets.pods.projection import project
from sidecarsets.rollout import hotupgrade
from sidecarsets.rollout.planner import Stage, plan_upgrade
from sidecarsets.rollout.status import compute_status, matched_pods, pod_verdicts
from sidecarsets.spec import hotsidecars, names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

NOW = "2024-01-01T00:00:00Z"
EMPTY = "empty:1"
HOT = {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY}
IS_INJECTED = {"name": names.ENV_IS_INJECTED, "value": "true"}
NS_LABELS = {"shop": {names.NS_NAME_LABEL: "shop"}}


def hot(name: str, image: str, **fields: Any) -> JsonObj:
    fields.setdefault("upgradeStrategy", HOT)
    return builders.container(name, image, **fields)


def ss_object(name: str = "mesh", *, containers: Sequence[JsonObj] = (), **spec: Any) -> JsonObj:
    return builders.sidecarset(name, containers=list(containers), **spec)


def make_pod(*containers: JsonObj, annotations: dict[str, str] | None = None, **spec: Any) -> JsonObj:
    return builders.pod("web-1", namespace="shop", containers=list(containers) or None, annotations=annotations, **spec)


def inject(pod: JsonObj, *objects: JsonObj) -> engine.InjectionResult:
    return engine.inject(
        pod,
        namespace="shop",
        namespace_labels={names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED},
        sidecarsets=[SidecarSet.from_object(o) for o in objects],
        now=NOW,
    )


def run(pod: JsonObj, *objects: JsonObj) -> tuple[engine.InjectionResult, JsonObj]:
    before = copy.deepcopy(pod)
    result = inject(pod, *objects)
    assert pod == before, "the input pod was modified"
    assert result.denied is None, result.denied
    patched: JsonObj = jsonpatch.apply_patch(pod, result.patch)
    every = [c["name"] for c in [*patched["spec"]["containers"], *(patched["spec"].get("initContainers") or [])]]
    assert len(every) == len(set(every)), every
    return result, patched


def names_of(containers: Sequence[JsonObj]) -> list[str]:
    return [c["name"] for c in containers]


def by_name(pod: JsonObj, field: str = "containers") -> dict[str, JsonObj]:
    return {c["name"]: c for c in pod["spec"].get(field) or []}


def version_env(container: str) -> list[JsonObj]:
    """The two vars Kruise appends, exactly: a fieldRef with no apiVersion (the API server's default)."""
    return [
        {
            "name": "SIDECARSET_VERSION",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['version.sidecarset.sidecarctl.io/{container}']"}
            },
        },
        {
            "name": "SIDECARSET_VERSION_ALT",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['versionalt.sidecarset.sidecarctl.io/{container}']"}
            },
        },
    ]


def pair_annotations(*sidecars: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for n in sidecars:
        out |= {
            f"version.sidecarset.sidecarctl.io/{n}-1": "1",
            f"versionalt.sidecarset.sidecarctl.io/{n}-1": "0",
            f"version.sidecarset.sidecarctl.io/{n}-2": "0",
            f"versionalt.sidecarset.sidecarctl.io/{n}-2": "1",
        }
    return out


def working(pod: JsonObj) -> str:
    return str(pod["metadata"]["annotations"][names.ANN_WORKING_HOT])


# --- the pair ------------------------------------------------------------------------------------


def test_the_pair_is_the_cold_sidecar_twice_with_its_image_the_empty_image_and_version_vars_last() -> None:
    sidecar: JsonObj = {
        "name": "envoy",
        "image": "envoy:1",
        "args": ["--concurrency", "2"],
        "env": [{"name": "LOG_LEVEL", "value": "info"}],
        "volumeMounts": [{"name": "config", "mountPath": "/etc/envoy"}],
        "shareVolumePolicy": {"type": "enabled"},
        "transferEnv": [{"sourceContainerName": "app", "envName": "ZONE"}],
    }
    app = {
        "name": "app",
        "image": "app:1",
        "env": [{"name": "ZONE", "value": "z1"}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    volumes = [{"name": "config", "configMap": {"name": "envoy"}}]
    pod = make_pod(app, volumes=[{"name": "data", "emptyDir": {}}])
    cold = ss_object(containers=[sidecar], volumes=volumes)
    hot_ss = ss_object(containers=[{**sidecar, "upgradeStrategy": HOT}], volumes=volumes)
    _, cold_pod = run(pod, cold)
    result, hot_pod = run(pod, hot_ss)
    assert result.warnings == (), "no 'HotUpgrade is not supported' any more"
    built = by_name(cold_pod)["envoy"]
    assert built["env"] == [{"name": "LOG_LEVEL", "value": "info"}, IS_INJECTED, {"name": "ZONE", "value": "z1"}]
    assert [m["name"] for m in built["volumeMounts"]] == ["config", "data"]

    assert names_of(hot_pod["spec"]["containers"]) == ["envoy-1", "envoy-2", "app"]
    first, second = hot_pod["spec"]["containers"][:2]
    assert first == {**built, "name": "envoy-1", "env": [*built["env"], *version_env("envoy-1")]}
    assert second == {**built, "name": "envoy-2", "image": EMPTY, "env": [*built["env"], *version_env("envoy-2")]}
    assert list(first) == list(built) and list(second) == list(built), "same key order as the cold sidecar"
    assert hot_pod["spec"]["volumes"] == cold_pod["spec"]["volumes"], "the SidecarSet's volume added once"
    # The two containers share no object (a later change to one never reaches the other).
    first["volumeMounts"][0]["mountPath"] = "/changed"
    assert second["volumeMounts"][0]["mountPath"] == "/etc/envoy"


def test_the_version_vars_are_appended_even_when_the_sidecar_defines_them() -> None:
    own = {"name": "SIDECARSET_VERSION", "value": "mine"}
    _, patched = run(make_pod(), ss_object(containers=[hot("envoy", "envoy:1", env=[own])]))
    env = by_name(patched)["envoy-1"]["env"]
    assert env == [own, IS_INJECTED, *version_env("envoy-1")], "Kruise appends, without dedupe"


def test_the_empty_image_is_taken_verbatim_and_is_empty_when_unset() -> None:
    _, patched = run(make_pod(), ss_object(containers=[hot("envoy", "envoy:1", upgradeStrategy=HOT)]))
    assert by_name(patched)["envoy-2"]["image"] == EMPTY
    unset = hot("envoy", "envoy:1", upgradeStrategy={"upgradeType": "HotUpgrade"})
    _, patched = run(make_pod(), ss_object(containers=[unset]))
    assert by_name(patched)["envoy-1"]["image"] == "envoy:1"
    assert by_name(patched)["envoy-2"]["image"] == "", "left for the API server to refuse, as Kruise leaves it"


# --- annotations ---------------------------------------------------------------------------------


def test_version_and_working_annotations() -> None:
    result, patched = run(make_pod(), ss_object(containers=[hot("envoy", "envoy:1")]))
    annotations = patched["metadata"]["annotations"]
    for key, value in pair_annotations("envoy").items():
        assert annotations[key] == value, key
    assert working(patched) == '{"envoy":"envoy-1"}'
    assert not [k for k in annotations if "sidecarset.sidecarctl.io/" in k and k not in pair_annotations("envoy")]
    assert result.patch[0] == {"op": "add", "path": "/metadata/labels/sidecarctl.io~1injected", "value": "true"}


def test_a_cold_sidecarset_writes_no_hot_annotation() -> None:
    _, patched = run(make_pod(), ss_object(containers=[builders.container("log", "log:1")]))
    annotations = patched["metadata"]["annotations"]
    assert names.ANN_WORKING_HOT not in annotations
    assert not [k for k in annotations if k.startswith(("version.", "versionalt."))]


def test_the_working_annotation_is_merged_into_the_pod_s_own() -> None:
    before = {names.ANN_WORKING_HOT: '{"zeta":"zeta-2","envoy":"envoy-2"}'}
    result, patched = run(make_pod(annotations=before), ss_object(containers=[hot("envoy", "envoy:1")]))
    assert working(patched) == '{"envoy":"envoy-1","zeta":"zeta-2"}'
    assert result.warnings == ()


@pytest.mark.parametrize(
    ("raw", "kept", "warned"),
    [
        ("not json", "", True),
        ('["envoy"]', "", True),
        ("null", "", False),
        ('{"zeta":"zeta-2","bad":1}', ',"zeta":"zeta-2"', True),
    ],
)
def test_an_unreadable_working_annotation_keeps_what_go_would_read(raw: str, kept: str, warned: bool) -> None:
    pod = make_pod(annotations={names.ANN_WORKING_HOT: raw})
    result, patched = run(pod, ss_object(containers=[hot("envoy", "envoy:1")]))
    assert working(patched) == '{"envoy":"envoy-1"' + kept + "}"
    assert bool([w for w in result.warnings if names.ANN_WORKING_HOT in w]) is warned


def test_several_hot_sidecars_share_one_sorted_working_object() -> None:
    one = ss_object("one", containers=[hot("mesh", "mesh:1"), hot("envoy", "envoy:1")])
    _, patched = run(make_pod(), one)
    assert working(patched) == '{"envoy":"envoy-1","mesh":"mesh-1"}'
    a = ss_object("a", containers=[hot("mesh", "mesh:1")])
    b = ss_object("b", containers=[hot("envoy", "envoy:1")])
    _, patched = run(make_pod(), b, a)
    assert working(patched) == '{"envoy":"envoy-1","mesh":"mesh-1"}'
    for key, value in pair_annotations("envoy", "mesh").items():
        assert patched["metadata"]["annotations"][key] == value


def test_hot_annotations_win_over_patch_pod_metadata() -> None:
    """Kruise writes the injection's annotations after patchPodMetadata."""
    patch = [{"annotations": {"version.sidecarset.sidecarctl.io/envoy-1": "9"}, "patchPolicy": "Overwrite"}]
    _, patched = run(make_pod(), ss_object(containers=[hot("envoy", "envoy:1")], patchPodMetadata=patch))
    assert patched["metadata"]["annotations"]["version.sidecarset.sidecarctl.io/envoy-1"] == "1"


# --- placement -----------------------------------------------------------------------------------


def test_both_containers_go_where_the_sidecar_would_first_one_first() -> None:
    ss = ss_object(
        containers=[
            builders.container("before", "b:1"),
            hot("envoy", "envoy:1"),
            hot("late", "late:1", podInjectPolicy="AfterAppContainer"),
            builders.container("after", "a:1", podInjectPolicy="AfterAppContainer"),
        ]
    )
    pod = make_pod(builders.container("app", "app:1"), builders.container("worker", "w:1"))
    _, patched = run(pod, ss)
    assert names_of(patched["spec"]["containers"]) == [
        "before",
        "envoy-1",
        "envoy-2",
        "app",
        "worker",
        "late-1",
        "late-2",
        "after",
    ]
    assert patched["metadata"]["annotations"][names.ANN_DEFAULT_CONTAINER] == "app"


# --- init containers -----------------------------------------------------------------------------


def test_a_native_hot_init_container_is_split_a_plain_one_is_not() -> None:
    ss = ss_object(
        containers=[builders.container("log", "log:1")],
        initContainers=[
            hot("vault", "vault:1", restartPolicy="Always"),
            hot("certs", "certs:1"),
        ],
    )
    pod = make_pod(initContainers=[builders.container("migrate", "migrate:1")])
    _, patched = run(pod, ss)
    inits = by_name(patched, "initContainers")
    assert names_of(patched["spec"]["initContainers"]) == ["migrate", "certs", "vault-1", "vault-2"]
    assert inits["certs"] == {"name": "certs", "image": "certs:1", "env": [IS_INJECTED]}
    base = {"restartPolicy": "Always"}
    assert inits["vault-1"] == {
        "name": "vault-1",
        "image": "vault:1",
        **base,
        "env": [IS_INJECTED, *version_env("vault-1")],
    }
    assert inits["vault-2"] == {
        "name": "vault-2",
        "image": EMPTY,
        **base,
        "env": [IS_INJECTED, *version_env("vault-2")],
    }
    annotations = patched["metadata"]["annotations"]
    for key, value in pair_annotations("vault").items():
        assert annotations[key] == value
    assert not [k for k in annotations if "certs-" in k]
    assert working(patched) == '{"vault":"vault-1"}'
    assert json.loads(annotations[names.ANN_HASH])["mesh"]["sidecarList"] == ["log", "vault"]


# --- hash annotations ----------------------------------------------------------------------------


def test_the_hash_annotations_list_sidecars_by_their_own_names() -> None:
    ss = ss_object(containers=[hot("envoy", "envoy:1"), builders.container("log", "log:1")])
    _, patched = run(make_pod(), ss)
    model = SidecarSet.from_object(ss)
    for key, value in ((names.ANN_HASH, model.hash), (names.ANN_HASH_WITHOUT_IMAGE, model.hash_without_image)):
        entry = json.loads(patched["metadata"]["annotations"][key])["mesh"]
        assert entry["sidecarList"] == ["envoy", "log"]
        assert entry["hash"] == value


def test_the_sidecarset_hash_includes_the_upgrade_strategy() -> None:
    def hashes(strategy: JsonObj) -> tuple[str, str]:
        m = SidecarSet.from_object(ss_object(containers=[hot("envoy", "envoy:1", upgradeStrategy=strategy)]))
        return m.hash, m.hash_without_image

    base = hashes(HOT)
    other_empty = hashes({**HOT, "hotUpgradeEmptyImage": "empty:2"})
    cold = hashes({"upgradeType": "ColdUpgrade"})
    assert base[0] != other_empty[0] and base[1] != other_empty[1]
    assert base[0] != cold[0] and base[1] != cold[1]


# --- pods that already have the names ------------------------------------------------------------


def test_a_pod_at_the_sidecarset_s_hash_is_left_alone() -> None:
    ss = ss_object(containers=[hot("envoy", "envoy:1")])
    _, once = run(make_pod(), ss)
    again = inject(once, ss)
    assert again.patch == [] and again.skipped == engine.SKIP_ALREADY_INJECTED


def test_a_pod_with_the_pair_from_an_older_version_gets_it_replaced_in_place() -> None:
    """As a cold sidecar replaces its namesake (Kruise's mergeSidecarContainers): the pair is
    rewritten where it is, and the pod starts over with `-1` serving the new image."""
    old = ss_object(containers=[hot("envoy", "envoy:1")])
    _, injected = run(make_pod(), old)
    pod = copy.deepcopy(injected)
    names_in_pod = names_of(pod["spec"]["containers"])
    pod["spec"]["containers"].reverse()  # another webhook moved things around
    pod["metadata"]["annotations"][names.ANN_WORKING_HOT] = '{"envoy":"envoy-2"}'
    new = ss_object(containers=[hot("envoy", "envoy:2")])
    result, patched = run(pod, new)
    assert names_of(patched["spec"]["containers"]) == list(reversed(names_in_pod))
    assert {op["op"] for op in result.patch if op["path"].startswith("/spec/containers")} == {"replace"}
    assert by_name(patched)["envoy-1"]["image"] == "envoy:2" and by_name(patched)["envoy-2"]["image"] == EMPTY
    assert by_name(patched)["envoy-1"]["env"] == [IS_INJECTED, *version_env("envoy-1")]
    assert working(patched) == '{"envoy":"envoy-1"}'


def test_the_pod_s_own_container_named_like_the_pair_is_replaced_and_the_cli_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = make_pod(builders.container("app", "app:1"), builders.container("envoy-2", "mine:1"))
    ss = ss_object(containers=[hot("envoy", "envoy:1")])
    _, patched = run(pod, ss)
    assert names_of(patched["spec"]["containers"]) == ["envoy-1", "app", "envoy-2"]
    assert by_name(patched)["envoy-2"]["image"] == EMPTY
    (tmp_path / "pod.yaml").write_text(json.dumps(pod))
    (tmp_path / "ss.yaml").write_text(json.dumps(ss))
    argv = ["inject", "-f", str(tmp_path / "pod.yaml"), "--sidecarset", str(tmp_path / "ss.yaml")]
    assert cli.main([*argv, "--timestamp", NOW]) == 0
    _, err = capsys.readouterr()
    assert "its container envoy-2 replaces the pod's own container of that name in spec.containers" in err
    assert "envoy-1 replaces" not in err
    assert "HotUpgrade" not in err


def test_a_pair_name_an_init_container_of_the_pod_has_is_refused() -> None:
    """The selection compares sidecars by their own names; the engine still never emits a pod
    with one name twice."""
    pod = make_pod(initContainers=[builders.container("envoy-1", "x:1")])
    result = inject(pod, ss_object(containers=[hot("envoy", "envoy:1")]))
    assert result.patch == [] and result.denied == "injection would duplicate container name envoy-1"


# --- the controller's reading of the injected pod -------------------------------------------------


def shop_hot(image: str, rv: str) -> JsonObj:
    ss = builders.shop_sidecarset(containers=[hot("envoy", image)])
    ss["metadata"]["resourceVersion"] = rv
    ss["spec"]["updateStrategy"] = {"type": "RollingUpdate", "maxUnavailable": 1}
    return ss


def running(injected: JsonObj, name: str) -> JsonObj:
    """The injected pod as the API server stores it and a node runs it."""
    out = copy.deepcopy(injected)
    out["metadata"] |= {"name": name, "uid": f"uid-{name}", "resourceVersion": "10", "creationTimestamp": builders.T0}
    out["spec"]["nodeName"] = "node-1"
    out["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
    }
    return builders.kubelet_sync(out)


def counts(ss: JsonObj, raws: Sequence[JsonObj]) -> tuple[int, int, int, int]:
    m = builders.model(ss)
    pods = matched_pods(m, [project(r) for r in raws], NS_LABELS)
    st = compute_status(m, pods, latest_revision="r", collision_count=0, verdicts=pod_verdicts(m, pods))
    return st["matchedPods"], st["updatedPods"], st["readyPods"], st["updatedReadyPods"]


def test_the_injected_pod_is_what_the_controller_upgrades() -> None:
    v1, v2 = shop_hot("envoy:v1", "R1"), shop_hot("envoy:v2", "R2")
    app_pod = builders.pod("p0", namespace="shop", labels={"app": "shop"})
    _, injected = run(app_pod, v1)
    raw = running(injected, "p0")
    pod = project(raw)
    m1 = builders.model(v1)
    h = hotsidecars.hot_sidecars(m1)[0]
    assert hotupgrade.working(pod, h) == "envoy-1" and hotupgrade.idle(pod, h) == "envoy-2"
    assert hotupgrade.empties_done(pod, m1) and not hotupgrade.in_hot_upgrade(pod, m1)
    assert podstate.has_sidecars(pod, cold=m1.cold_names, hot=m1.hot_names, native_init=[])
    assert podstate.is_updated(pod, sidecarset="mesh", spec_hash=m1.hash)
    assert counts(v1, [raw]) == (1, 1, 1, 1), "consistent and ready at the SidecarSet's version"
    assert plan_upgrade(m1, [pod], revision="r", now=NOW).stage is Stage.DONE

    # The next version goes onto the idle `-2`, which then serves; the flip empties `-1`.
    assert counts(v2, [raw]) == (1, 0, 1, 0)
    plan = plan_upgrade(builders.model(v2), [pod], revision="r", now=NOW)
    assert plan.stage is Stage.UPGRADING and [u.name for u in plan.upgrades] == ["p0"]
    raw = builders.apply_patch(raw, plan.upgrades[0].patch)
    images = {c["name"]: c["image"] for c in raw["spec"]["containers"]}
    assert (images["envoy-1"], images["envoy-2"]) == ("envoy:v1", "envoy:v2")
    assert orjson.loads(working(raw)) == {"envoy": "envoy-2"}
    raw = builders.kubelet_sync(raw)
    plan = plan_upgrade(builders.model(v2), [project(raw)], revision="r", now=NOW)
    assert plan.stage is Stage.FLIPPING
    raw = builders.kubelet_sync(builders.apply_patch(raw, plan.upgrades[0].patch))
    images = {c["name"]: c["image"] for c in raw["spec"]["containers"]}
    assert (images["envoy-1"], images["envoy-2"]) == (EMPTY, "envoy:v2")
    assert counts(v2, [raw]) == (1, 1, 1, 1)


def test_a_pod_with_a_native_hot_init_pair_is_matched_by_the_controller() -> None:
    ss = builders.shop_sidecarset(
        containers=[builders.container("log", "log:1")],
        init_containers=[hot("vault", "vault:1", restartPolicy="Always")],
    )
    _, injected = run(builders.pod("p0", namespace="shop", labels={"app": "shop"}), ss)
    raw = running(injected, "p0")
    assert counts(ss, [raw])[0] == 1
