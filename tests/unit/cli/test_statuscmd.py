"""`sidecarctl status`: the rollout at a glance from the controller's own verdicts, one line per
SidecarSet without a name, and one line on stderr for every failure."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import clusterread, statuscmd
from sidecarctl.cli import main as cli
from sidecarsets.pods import missed
from sidecarsets.pods.projection import project
from sidecarsets.rollout.glance import Glance
from sidecarsets.rollout.planner import Stage, plan_upgrade
from sidecarsets.spec import names
from tests.kube.builders import (
    apply_patch,
    injected_pod,
    model,
    namespaced_sidecarset,
    pod,
    shop_sidecarset,
    with_images,
)
from tests.unit.rollout.test_preview import StubApi, kubeconfig_for, marked

NOW = "2024-06-01T12:00:00Z"
V1 = shop_sidecarset()
ENABLED = {names.NS_INJECTION_LABEL: "enabled"}


def v2_stored(**status: Any) -> JsonObj:
    ss = with_images(V1, envoy="envoy:v2")
    ss["metadata"].update(uid="uid-mesh", creationTimestamp="2024-05-01T09:00:00Z")
    ss["status"] = {
        "observedGeneration": 2,
        "matchedPods": 4,
        "updatedPods": 1,
        "readyPods": 3,
        "updatedReadyPods": 0,
        "latestRevision": "mesh-2",
        **status,
    }
    return ss


def scene() -> tuple[JsonObj, list[JsonObj], list[JsonObj]]:
    """(SidecarSet, injected pods, unlabelled pods): one pod upgrading, one not upgradable, one not
    ready, one fine; and a running pod admitted without the sidecars."""
    ss = v2_stored()
    p0, p1, p2, p3 = (marked(injected_pod(f"p{i}", V1, ready=i != 2)) for i in range(4))
    plan = plan_upgrade(model(ss), [project(p0)], revision="mesh-2", now=NOW)
    p0 = apply_patch(p0, plan.upgrades[0].patch)  # patched; the kubelet has not reported the new image
    p1["spec"]["containers"][0]["env"].append({"name": "MODE", "value": "x"})
    p1["metadata"]["annotations"][names.ANN_HASH_WITHOUT_IMAGE] = json.dumps({"mesh": {"hash": "older"}})
    bare = pod(
        "bare",
        namespace="shop",
        labels={"app": "shop"},
        metadata={"creationTimestamp": "2024-05-02T00:00:00Z"},
        status={"phase": "Running"},
    )
    return ss, [p0, p1, p2, p3], [bare]


def namespaces() -> list[JsonObj]:
    return [{"metadata": {"name": "shop", "labels": ENABLED}}, {"metadata": {"name": "other"}}]


def glance_of(ss: JsonObj, pods: list[JsonObj], unlabelled: list[JsonObj]) -> Glance:
    (g,) = statuscmd.build(
        statuscmd.Inputs([ss], pods, namespaces(), unlabelled, []), now=NOW, manager_namespace="sidecarctl-system"
    )
    return g


class TestGlance:
    def test_counts_batch_blockers_and_missed_pods(self) -> None:
        g = glance_of(*scene())
        assert dict(g.counts) == {"matchedPods": 4, "updatedPods": 1, "readyPods": 3, "updatedReadyPods": 0}
        assert dict(g.live) == {"matchedPods": 4, "updatedPods": 1, "readyPods": 2, "updatedReadyPods": 0}
        assert (g.generation, g.observed_generation) == (2, 2)
        assert g.upgrading == (("shop/p0", "the new image is not reported running yet"),)
        assert g.not_ready == (("shop/p2", "envoy: not ready"),)
        (blocked,) = g.not_upgradable
        assert (blocked.pod, blocked.fields) == ("shop/p1", ("envoy: env",))
        assert [(m.key, m.reason) for m in g.missing] == [("shop/bare", missed.ADMITTED_WITHOUT)]
        # The pod already not ready is upgraded for free while p0 holds the budget, as the planner says.
        assert (g.stage, g.reason) == (Stage.UPGRADING, "upgrading 1")
        assert g.summary == "upgrading 1, 1 in flight, 1 not upgradable, 1 not ready"

    def test_stopped_by_the_progress_deadline(self) -> None:
        ss, pods, _ = scene()
        ss["status"]["conditions"] = [
            {
                "type": names.CONDITION_PROGRESSING,
                "status": "False",
                "reason": names.REASON_DEADLINE_EXCEEDED,
                "message": "rollout stopped: 1 upgraded pod(s) not ready within 60s: shop/p0 (envoy: ErrImagePull)",
                "observedGeneration": 2,
            }
        ]
        g = glance_of(ss, pods, [])
        assert g.stopped and g.stage is Stage.STOPPED
        assert g.reason.startswith("rollout stopped: 1 upgraded pod(s)")
        assert g.summary.startswith("stopped: ProgressDeadlineExceeded")
        text = statuscmd.render_one(g)
        assert "\n  rollout stopped: 1 upgraded pod(s)" in text and "Progressing=False ProgressDeadlineExceeded" in text

    def test_a_condition_of_an_older_generation_does_not_stop_it(self) -> None:
        ss, pods, _ = scene()
        ss["status"]["conditions"] = [
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "observedGeneration": 1}
        ]
        assert not glance_of(ss, pods, []).stopped

    def test_done(self) -> None:
        ss = v2_stored(matchedPods=2, updatedPods=2, readyPods=2, updatedReadyPods=2)
        pods = [marked(injected_pod(f"p{i}", ss)) for i in range(2)]
        g = glance_of(ss, pods, [])
        assert (g.stage, g.summary, g.upgrading, g.not_ready) == (Stage.DONE, "done", (), ())

    def test_update_selector_exclusions(self) -> None:
        ss, pods, _ = scene()
        ss["spec"]["updateStrategy"] = {"selector": {"matchLabels": {"canary": "yes"}}}
        g = glance_of(ss, pods, [])
        # Outside the selector, a pod is not even judged upgradable: the planner skips it first.
        assert g.excluded_by_selector == ("shop/p1", "shop/p2", "shop/p3")
        assert g.not_upgradable == ()

    def test_missing_counts_only_labelled_namespaces(self) -> None:
        ss, pods, bare = scene()
        elsewhere = copy.deepcopy(bare[0])
        elsewhere["metadata"]["namespace"] = "other"
        assert [m.key for m in glance_of(ss, pods, [*bare, elsewhere]).missing] == ["shop/bare"]

    def test_pods_whose_env_overrides_changed_and_pods_outside_tightened_bounds(self) -> None:
        ss = shop_sidecarset(overrides=[{"containerName": "envoy", "resources": {"cpu": {"max": "1"}}, "env": ["L"]}])
        changed, outside, fine = (injected_pod(f"p{i}", ss) for i in range(3))
        for raw, asked, record in (
            (changed, {"envoy": {"env": [{"name": "L", "value": "b"}]}}, {"envoy": {"L": "a"}}),
            (outside, {"envoy": {"resources": {"limits": {"cpu": "2"}}}}, {}),
            (fine, {"envoy": {"env": [{"name": "L", "value": "a"}]}}, {"envoy": {"L": "a"}}),
        ):
            raw["metadata"]["annotations"][names.ANN_OVERRIDES] = json.dumps(asked)
            raw["metadata"]["annotations"][names.ANN_OVERRIDES_ENV_APPLIED] = json.dumps(record)
        g = glance_of(ss, [changed, outside, fine], [])
        assert g.recreate == (("shop/p0", 'envoy env L: "a" -> "b"'),)
        (blocked,) = g.not_upgradable
        assert (blocked.pod, blocked.compared_with) == ("shop/p1", "the SidecarSet's override bounds")
        assert "allowed: at most 1" in blocked.fields[0]
        text = statuscmd.render_one(g)
        assert "Env overrides changed since injection (1); recreate them to pick them up:\n  p0 (envoy env L" in text
        assert "1 to recreate for env overrides" in g.summary

    def test_json_and_text(self) -> None:
        g = glance_of(*scene())
        doc = g.as_json()
        assert list(doc) == [
            "kind",
            "name",
            "generation",
            "observedGeneration",
            "counts",
            "live",
            "stage",
            "reason",
            "stopped",
            "upgrading",
            "notReady",
            "notUpgradable",
            "excludedByUpdateSelector",
            "missing",
            "conditions",
            "recreateForOverrides",
            "summary",
        ]
        json.dumps(doc)
        text = statuscmd.render_one(g)
        assert "matched 4, updated 1, ready 3, updated and ready 0" in text
        assert "(the pods now: matched 4, updated 1, ready 2" in text
        assert "  pods of namespace shop\n" in text
        assert "Upgrading now (1):\n  p0 (the new image is not reported running yet)" in text
        assert "\n  p1: envoy: env" in text and "\n  bare: admitted without injection" in text
        table = statuscmd.render_table([g])
        header, row = table.splitlines()
        assert header.split() == ["NAME", "MATCHED", "UPDATED", "READY", "ROLLOUT", "MISSING"]
        assert row.split()[:4] == ["mesh", "4", "1", "3"] and row.split()[-1] == "1"


# -- through the command line ----------------------------------------------------------------------
@pytest.fixture
def api() -> Iterator[StubApi]:
    ss, pods, bare = scene()
    with StubApi() as server:
        server.put(f"{clusterread.SS_PATH}/mesh", ss)
        other = shop_sidecarset("logs")
        other["metadata"]["uid"] = "uid-logs"
        server.put(f"{clusterread.SS_PATH}/logs", other)
        for p in [*pods, *bare]:
            server.pod(p)
        for ns in namespaces():
            server.put(f"/api/v1/namespaces/{ns['metadata']['name']}", ns)
        yield server


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_one_sidecarset(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    config = str(kubeconfig_for(api, tmp_path))
    code, out, err = run(["status", "mesh", "--kubeconfig", config, "-o", "json"], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["name"] == "mesh" and doc["counts"]["updatedPods"] == 1
    assert [m["pod"] for m in doc["missing"]] == ["shop/bare"]
    assert {m for m, _, _ in api.requests} == {"GET"}
    assert {ua for _, _, ua in api.requests} == {"sidecarctl-status"}
    assert any("labelSelector" in p or p == "/api/v1/namespaces/shop/pods" for _, p, _ in api.requests)
    code, out, _ = run(["status", "mesh", "--kubeconfig", config], capsys)
    assert code == 0 and out.startswith("SidecarSet mesh\n")


def test_every_sidecarset(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    code, out, err = run(["status", "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["NAME", "logs", "mesh"]
    code, out, _ = run(["status", "--kubeconfig", str(kubeconfig_for(api, tmp_path)), "-o", "json"], capsys)
    assert [s["name"] for s in json.loads(out)["sidecarSets"]] == ["logs", "mesh"]


def test_no_such_sidecarset(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    code, out, err = run(["status", "nope", "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys)
    assert (code, out) == (1, "")
    assert err == "sidecarctl status: error: SidecarSet nope not found\n"


def test_unreachable_and_unconfigured(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    code, _, err = run(["status", "--kubeconfig", str(kubeconfig_for(None, tmp_path))], capsys)
    assert code == 1 and err.count("\n") == 1 and "cannot reach the API server" in err
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = run(["status"], capsys)
    assert code == 1 and err.count("\n") == 1 and "no kubeconfig" in err


def test_refused(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    api.deny("/api/v1/namespaces")
    code, _, err = run(["status", "mesh", "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys)
    assert code == 1 and err.count("\n") == 1 and "403 Forbidden" in err


def test_empty_cluster(tmp_path: Path, capsys: Any) -> None:
    with StubApi() as server:
        code, out, _ = run(["status", "--kubeconfig", str(kubeconfig_for(server, tmp_path))], capsys)
    assert (code, out) == (0, "No SidecarSets.\n")


# -- NamespacedSidecarSets ---------------------------------------------------------------------------
def tenant_scene(server: StubApi) -> None:
    """A NamespacedSidecarSet `shop/mesh` beside the cluster SidecarSet `mesh`: the same name, its
    own pods (keyed `shop/mesh`), injected from its revision in its own namespace; its new spec
    changes the sidecar's env, so they cannot be upgraded in place."""
    older = namespaced_sidecarset("mesh", "shop", containers=[{"name": "agent", "image": "agent:v1"}])
    older["spec"]["selector"] = {"matchLabels": {"app": "shop"}}
    older["metadata"].update(uid="uid-shop-mesh", generation=1)
    tenant = copy.deepcopy(older)
    tenant["spec"]["containers"][0]["env"] = [{"name": "MODE", "value": "x"}]
    tenant["metadata"]["generation"] = 2
    tenant["status"] = {"observedGeneration": 2, "matchedPods": 2, "updatedPods": 0, "latestRevision": "mesh-t2"}
    server.put(f"{clusterread.tenant_path('shop')}/mesh", tenant)
    for i in range(2):
        server.pod(marked(injected_pod(f"t{i}", older, labels={"tier": "t"})))
    revision = {
        "metadata": {
            "name": "mesh-t1",
            "namespace": "shop",
            "labels": {names.REVISION_LABEL_SIDECARSET: "mesh"},
            "annotations": {},
        },
        "revision": 1,
        "data": {"spec": older["spec"]},
    }
    server.put("/apis/apps/v1/namespaces/shop/controllerrevisions/mesh-t1", revision)


def test_a_namespaced_sidecarset_is_read_from_its_namespace_alone(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    tenant_scene(api)
    config = str(kubeconfig_for(api, tmp_path))
    code, out, err = run(["status", "-n", "shop", "mesh", "--kubeconfig", config, "-o", "json"], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert (doc["kind"], doc["name"], doc["counts"]["matchedPods"]) == ("NamespacedSidecarSet", "shop/mesh", 2)
    # Its pods only (not the cluster set's, keyed `mesh`), compared with its own revision.
    assert {b["pod"] for b in doc["notUpgradable"]} == {"shop/t0", "shop/t1"}
    assert {b["comparedWith"] for b in doc["notUpgradable"]} == {"ControllerRevision mesh-t1"}
    # What a namespace's admins may read: nothing cluster-wide.
    paths = {p for _, p, _ in api.requests}
    assert all(
        p.startswith(("/api/v1/namespaces/shop", "/apis/apps/v1/namespaces/shop/")) or "/namespaces/shop/" in p
        for p in paths
    ), paths
    code, out, _ = run(["status", "-n", "shop", "mesh", "--kubeconfig", config], capsys)
    assert code == 0 and out.startswith("NamespacedSidecarSet shop/mesh\n")
    code, out, err = run(["status", "-n", "shop", "nope", "--kubeconfig", config], capsys)
    assert (code, out) == (1, "")
    assert err == "sidecarctl status: error: NamespacedSidecarSet shop/nope not found\n"


def test_every_sidecarset_lists_the_namespaced_ones_too(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    tenant_scene(api)
    config = str(kubeconfig_for(api, tmp_path))
    code, out, err = run(["status", "--kubeconfig", config], capsys)
    assert (code, err) == (0, "")
    assert [line.split()[0] for line in out.splitlines()] == ["NAME", "logs", "mesh", "shop/mesh"]
    code, out, _ = run(["status", "-n", "shop", "--kubeconfig", config, "-o", "json"], capsys)
    assert [(s["kind"], s["name"]) for s in json.loads(out)["sidecarSets"]] == [("NamespacedSidecarSet", "shop/mesh")]
