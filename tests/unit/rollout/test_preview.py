"""`sidecarctl preview`: the simulated rollout is the planner's, step by step; the explanations name
the right fields; the document has a stable shape; bad input and an unreachable cluster give one line.

The CLI tests talk HTTP to a small canned API server (`StubApi`, also used by test_statuscmd.py),
so paging, the kubeconfig and the error paths are the real ones.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import clusterread, previewcmd, previewtext
from sidecarctl.cli import main as cli
from sidecarctl.cli.clierror import CliError
from sidecarsets.pods.projection import project
from sidecarsets.rollout import rolloutsim, simnode, specdiff
from sidecarsets.rollout.planner import Stage, plan_upgrade
from sidecarsets.rollout.status import matched_pods
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube.builders import (
    apply_patch,
    container,
    injected_pod,
    kubelet_sync,
    model,
    namespaced_sidecarset,
    shop_sidecarset,
    with_images,
)

NOW = "2024-06-01T12:00:00Z"
V1 = shop_sidecarset()
REPO = Path(__file__).resolve().parents[3]
NS = {"shop": {names.NS_INJECTION_LABEL: "enabled", names.NS_NAME_LABEL: "shop"}}


class StubApi:
    """Canned GET answers over HTTP: objects by path, collections by prefix (label selectors
    `k`, `k=v`, `!k`; `limit`/`continue` pages), 403 for paths told to refuse."""

    def __init__(self) -> None:
        self.objects: dict[str, JsonObj] = {}
        self.denied: list[str] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, User-Agent)
        self.paged = False
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def put(self, path: str, obj: JsonObj) -> None:
        self.objects[path] = obj

    def pod(self, obj: JsonObj) -> None:
        meta = obj["metadata"]
        self.put(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", obj)

    def deny(self, prefix: str) -> None:
        self.denied.append(prefix)

    def _collection(self, path: str) -> list[JsonObj]:
        if path == "/api/v1/pods":
            return [o for p, o in sorted(self.objects.items()) if "/pods/" in p]
        prefix = path + "/"
        found = [o for p, o in sorted(self.objects.items()) if p.startswith(prefix) and "/" not in p[len(prefix) :]]
        across = re.fullmatch(r"(/apis/[^/]+/[^/]+)/([^/]+)", path)  # a namespaced kind, every namespace
        if found or across is None:
            return found
        base, plural = across.groups()
        one = re.compile(rf"{re.escape(base)}/namespaces/[^/]+/{re.escape(plural)}/[^/]+")
        return [o for p, o in sorted(self.objects.items()) if one.fullmatch(p)]

    @staticmethod
    def _selected(obj: JsonObj, selector: str) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for term in filter(None, selector.split(",")):
            if term.startswith("!"):
                if term[1:] in labels:
                    return False
            elif "=" in term:
                k, v = term.split("=", 1)
                if labels.get(k) != v:
                    return False
            elif term not in labels:
                return False
        return True

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path
        self.requests.append((request.method, path, request.headers.get("User-Agent", "")))
        if any(path.startswith(d) for d in self.denied):
            body = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": f"{path} is forbidden"}
            return web.json_response(body, status=403)
        if path in self.objects:
            return web.json_response(self.objects[path])
        items = self._collection(path)
        if not items and path.rsplit("/", 1)[-1] not in ("pods", "namespaces", "sidecarsets", "controllerrevisions"):
            return web.json_response({"kind": "Status", "reason": "NotFound", "message": "not found"}, status=404)
        items = [o for o in items if self._selected(o, request.query.get("labelSelector", ""))]
        start = int(request.query.get("continue") or 0)
        self.paged = self.paged or start > 0
        limit = min(int(request.query.get("limit") or len(items) or 1), 5)  # small pages, to be paged through
        page = items[start : start + limit]
        more = start + limit < len(items)
        return web.json_response({"items": page, "metadata": {"continue": str(start + limit) if more else ""}})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self) -> StubApi:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


def kubeconfig_for(api: StubApi | None, directory: Path) -> Path:
    """A kubeconfig naming the stub (or, for None, a port nobody listens on)."""
    if api is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        port = api.port
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stub", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "u"}}],
        "current-context": "stub",
    }
    path = directory / f"kubeconfig-{port}"
    path.write_text(yaml.safe_dump(cfg))
    return path


def v2(**strategy: Any) -> JsonObj:
    ss = with_images(V1, envoy="envoy:v2")
    if strategy:
        ss["spec"]["updateStrategy"] = strategy
    return ss


def marked(pod: JsonObj, *sidecars: str) -> JsonObj:
    """The pod with IS_INJECTED=true on its sidecars, as injection leaves them."""
    for c in pod["spec"]["containers"]:
        if c["name"] in (sidecars or ("envoy",)):
            c.setdefault("env", []).append({"name": names.ENV_IS_INJECTED, "value": "true"})
    return pod


def fleet() -> list[JsonObj]:
    """12 pods in three zones, two of them canaries, ready since different times."""
    out = []
    for i in range(12):
        labels = {"zone": "abc"[i % 3]}
        if i in (4, 9):
            labels["tier"] = "canary"
        out.append(marked(injected_pod(f"p{i:02d}", V1, labels=labels, ready_since=f"2024-05-01T10:00:{i:02d}Z")))
    return out


def step_by_step(ss_obj: JsonObj, raws: list[JsonObj]) -> list[list[str]]:
    """The controller's loop by hand: plan, patch, let the node catch up, plan again."""
    ss = model(ss_obj)
    pods = {f"{r['metadata']['namespace']}/{r['metadata']['name']}": r for r in raws}
    batches: list[list[str]] = []
    for _ in range(50):
        matched = matched_pods(ss, [project(p) for p in pods.values()], NS)
        plan = plan_upgrade(ss, matched, revision="mesh-2", now=NOW)
        if not plan.upgrades:
            break
        batches.append([f"{u.namespace}/{u.name}" for u in plan.upgrades])
        for u in plan.upgrades:
            key = f"{u.namespace}/{u.name}"
            pods[key] = kubelet_sync(apply_patch(pods[key], u.patch))
    return batches


def simulated(ss_obj: JsonObj, raws: list[JsonObj]) -> rolloutsim.Rollout:
    return rolloutsim.simulate_rollout(model(ss_obj), raws, NS, revision="mesh-2", now=NOW)


STRATEGIES = [
    pytest.param({"maxUnavailable": 3}, id="maxUnavailable"),
    pytest.param({"maxUnavailable": 2, "partition": 5}, id="partition"),
    pytest.param({"maxUnavailable": "25%", "partition": "20%"}, id="percentages"),
    pytest.param(
        {
            "maxUnavailable": 2,
            "priorityStrategy": {
                "weightPriority": [{"weight": 10, "matchSelector": {"matchLabels": {"tier": "canary"}}}]
            },
        },
        id="priority",
    ),
    pytest.param({"maxUnavailable": 2, "scatterStrategy": [{"key": "zone", "value": "a"}]}, id="scatter"),
    pytest.param(
        {
            "maxUnavailable": 3,
            "partition": 2,
            "priorityStrategy": {"orderPriority": [{"orderedKey": "tier"}]},
            "scatterStrategy": [{"key": "zone", "value": "*"}],
        },
        id="everything",
    ),
    pytest.param({"maxUnavailable": 2, "selector": {"matchLabels": {"zone": "b"}}}, id="update-selector"),
]


class TestSimulation:
    @pytest.mark.parametrize("strategy", STRATEGIES)
    def test_batches_are_the_planners_step_by_step(self, strategy: JsonObj) -> None:
        raws = fleet()
        expected = step_by_step(v2(**strategy), copy.deepcopy(raws))
        got = simulated(v2(**strategy), raws)
        assert [list(b.pods) for b in got.batches] == expected
        assert [b.number for b in got.batches] == list(range(1, len(expected) + 1))
        assert got.upgraded == tuple(k for b in expected for k in b)
        assert len(set(got.upgraded)) == len(got.upgraded), "a pod upgraded twice"

    def test_partition_and_budget_numbers(self) -> None:
        got = simulated(v2(maxUnavailable=2, partition=5), fleet())
        assert [len(b.pods) for b in got.batches] == [2, 2, 2, 1]
        assert (got.stage, got.partition, got.max_unavailable) == (Stage.PARTITION, 5, 2)
        assert len(got.kept) == 5 and not set(got.kept) & set(got.upgraded)
        assert got.reason == "partition: 5 pods kept on the old revision"

    def test_priority_goes_first_and_scatter_spreads(self) -> None:
        prio = {"weightPriority": [{"weight": 10, "matchSelector": {"matchLabels": {"tier": "canary"}}}]}
        got = simulated(v2(maxUnavailable=2, priorityStrategy=prio), fleet())
        assert set(got.batches[0].pods) == {"shop/p04", "shop/p09"}
        spread = simulated(v2(maxUnavailable=12, scatterStrategy=[{"key": "zone", "value": "a"}]), fleet())
        zones = ["abc"[int(k[-2:]) % 3] for k in spread.batches[0].pods]
        assert zones != sorted(zones) and zones[-1] == "a"

    def test_input_is_not_modified(self) -> None:
        raws = fleet()
        before = copy.deepcopy(raws)
        simulated(v2(maxUnavailable=4), raws)
        assert raws == before

    def test_not_ready_pods_count_as_the_controller_counts_them(self) -> None:
        raws = fleet()
        raws[0] = injected_pod("p00", V1, ready=False, labels={"zone": "a"})
        got = simulated(v2(maxUnavailable=2), raws)
        # Not ready already: upgrading it costs nothing, so batch 1 holds it and two more.
        assert "shop/p00" in got.batches[0].pods and len(got.batches[0].pods) == 3
        assert got.not_ready_before == (("shop/p00", "envoy: not ready"),)
        # Its app stays not ready after the upgrade: it holds one unit of the budget from then on.
        assert [len(b.pods) for b in got.batches] == [3] + [1] * 9
        assert got.waiting_on == (("shop/p00", "pod not ready"),)
        assert got.done

    def test_a_pod_upgrading_now_lands_before_the_next_batch(self) -> None:
        ss = v2(maxUnavailable=1)
        raws = fleet()
        plan = plan_upgrade(model(ss), [project(r) for r in raws], revision="mesh-2", now=NOW)
        (first,) = plan.upgrades
        i = next(i for i, r in enumerate(raws) if r["metadata"]["name"] == first.name)
        raws[i] = apply_patch(raws[i], first.patch)  # patched, the kubelet has not reported yet
        got = simulated(ss, raws)
        assert got.unavailable_before == 1
        assert f"shop/{first.name}" not in got.upgraded
        assert len(got.upgraded) == 11 and got.done

    @pytest.mark.parametrize(
        ("strategy", "stage"), [({"paused": True}, Stage.PAUSED), ({"type": "NotUpdate"}, Stage.NOT_UPDATE)]
    )
    def test_stopped_rollouts_have_no_batch(self, strategy: JsonObj, stage: Stage) -> None:
        got = simulated(v2(**strategy), fleet())
        assert (got.batches, got.stage) == ((), stage)

    def test_a_rollout_stopped_by_its_deadline_plans_nothing(self) -> None:
        ss = v2(maxUnavailable=2, progressDeadlineSeconds=60)
        stop = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "late"}
        ss["status"] = {"conditions": [{**stop, "observedGeneration": 2}]}
        got = simulated(ss, fleet())
        assert (got.batches, got.stage, got.reason) == ((), Stage.STOPPED, "stopped (ProgressDeadlineExceeded): late")
        ss["status"] = {"conditions": [{**stop, "observedGeneration": 1}]}  # an older generation stopped
        assert simulated(ss, fleet()).batches

    def test_not_upgradable_pods_are_listed_not_batched(self) -> None:
        ss = v2(maxUnavailable=5)
        ss["spec"]["containers"][0]["env"] = [{"name": "MODE", "value": "fast"}]
        got = simulated(ss, fleet())
        assert got.batches == () and len(got.not_upgradable) == 12
        assert got.stage is Stage.NOTHING_UPGRADABLE

    def test_hot_upgrade_flips_are_not_batches(self) -> None:
        hot = {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}
        v1 = shop_sidecarset(containers=[container("envoy", "envoy:v1", upgradeStrategy=hot)])
        raws = [injected_pod(f"h{i}", v1) for i in range(4)]
        new = with_images(v1, envoy="envoy:v2")
        new["spec"]["updateStrategy"] = {"maxUnavailable": 2}
        got = rolloutsim.simulate_rollout(model(new), raws, NS, revision="r", now=NOW)
        assert [len(b.pods) for b in got.batches] == [2, 2]
        assert got.flips >= 1 and got.done


class TestKubelet:
    def test_changed_image_runs_and_is_ready(self) -> None:
        pod = injected_pod("a", V1)
        pod["spec"]["containers"][0]["image"] = "envoy:v2"
        out = simnode.kubelet_report(pod, now=NOW)
        st = out["status"]["containerStatuses"][0]
        assert (st["image"], st["ready"], st["restartCount"]) == ("envoy:v2", True, 1)
        assert st["imageID"] != pod["status"]["containerStatuses"][0]["imageID"]
        assert out["status"]["containerStatuses"][1:] == pod["status"]["containerStatuses"][1:]
        assert (
            pod["spec"]["containers"][0]["image"] == "envoy:v2"
            and pod["status"]["containerStatuses"][0]["image"] == "envoy:v1"
        )

    def test_digest_images_report_their_digest(self) -> None:
        assert simnode.simulated_image_id("envoy@sha256:" + "a" * 64) == "envoy@sha256:" + "a" * 64

    def test_pending_pods_are_left_alone(self) -> None:
        pod = injected_pod("a", V1, phase="Pending", ready=False)
        pod["spec"]["containers"][0]["image"] = "envoy:v2"
        assert simnode.kubelet_report(pod, now=NOW) == pod

    def test_a_pod_not_ready_for_its_own_reasons_stays_not_ready(self) -> None:
        pod = injected_pod("a", V1)
        for c in pod["status"]["conditions"]:
            if c["type"] == "Ready":
                c["status"] = "False"  # every container ready, the pod not: a readiness gate
        pod["spec"]["containers"][0]["image"] = "envoy:v2"
        out = simnode.kubelet_report(pod, now=NOW)
        ready = next(c for c in out["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False"


class TestExplanations:
    def test_the_stored_spec_names_the_fields(self) -> None:
        new = copy.deepcopy(V1)
        new["spec"]["containers"][0]["env"] = [{"name": "MODE", "value": "fast"}]
        new["spec"]["containers"][0]["image"] = "envoy:v2"
        pod = injected_pod("a", V1)
        got = specdiff.why_not_upgradable(model(new), pod, specdiff.known_specs(model(V1), []))
        assert got.fields == ("envoy: env",)
        assert got.compared_with == "stored SidecarSet mesh (generation 1)"

    def test_a_controller_revision_is_found_by_its_hash(self) -> None:
        older = shop_sidecarset(containers=[container("envoy", "envoy:v0", args=["--old"])])
        stored = with_images(V1, envoy="envoy:v2")
        revision = {
            "metadata": {"name": "mesh-old", "labels": {names.REVISION_LABEL_SIDECARSET: "mesh"}},
            "data": {"spec": {"containers": older["spec"]["containers"]}},
            "revision": 1,
        }
        got = specdiff.why_not_upgradable(
            model(stored), injected_pod("a", older), specdiff.known_specs(model(stored), [revision])
        )
        assert (got.fields, got.compared_with) == (("envoy: args",), "ControllerRevision mesh-old")

    def test_without_the_old_spec_the_pod_is_compared(self) -> None:
        new = copy.deepcopy(V1)
        new["spec"]["containers"][0].update(
            env=[{"name": "MODE", "value": "fast"}], ports=[{"containerPort": 15001}], args=["-v"]
        )
        pod = injected_pod("a", V1)
        sidecar = pod["spec"]["containers"][0]
        # What the API server and injection add are no differences.
        sidecar.update(
            terminationMessagePath="/dev/termination-log",
            imagePullPolicy="IfNotPresent",
            resources={},
            env=[{"name": names.ENV_IS_INJECTED, "value": "true"}],
            ports=[{"containerPort": 15001, "protocol": "TCP"}],
            args=["-v"],
        )
        got = specdiff.why_not_upgradable(model(new), pod, [])
        assert (got.fields, got.compared_with) == (("envoy: env",), "pod")
        sidecar["env"].append({"name": "MODE", "value": "fast"})
        assert specdiff.pod_differences(model(new), pod) == []

    def test_sidecarset_only_fields_are_said_to_be_invisible(self) -> None:
        new = copy.deepcopy(V1)
        new["spec"]["containers"][0]["podInjectPolicy"] = "AfterAppContainer"
        got = specdiff.why_not_upgradable(model(new), injected_pod("a", V1), [])
        assert got.fields == (specdiff.NOT_VISIBLE,)
        stored = specdiff.why_not_upgradable(model(new), injected_pod("a", V1), specdiff.known_specs(model(V1), []))
        assert stored.fields == ("envoy: podInjectPolicy",)

    def test_added_and_removed_sidecars(self) -> None:
        new = copy.deepcopy(V1)
        new["spec"]["containers"] = [container("mesh-log", "log:1")]
        assert specdiff.spec_differences(V1["spec"], new["spec"]) == ["mesh-log: added", "envoy: removed"]
        assert specdiff.pod_differences(model(new), injected_pod("a", V1)) == [
            "mesh-log: not in the pod",
            "envoy: removed",
        ]


class TestContainerChanges:
    def test_image_and_fields(self) -> None:
        new = copy.deepcopy(V1)
        new["spec"]["containers"][0].update(image="envoy:v2", env=[{"name": "A", "value": "1"}])
        new["spec"]["containers"].append(container("log", "log:1"))
        new["spec"]["initContainers"] = [container("init", "init:1")]
        new["spec"]["updateStrategy"] = {"maxUnavailable": 2}
        got = [c.as_json() for c in specdiff.container_changes(V1["spec"], new["spec"])]
        assert got == [
            {
                "name": "init",
                "kind": "initContainer",
                "change": "added",
                "image": {"old": None, "new": "init:1"},
                "fields": [],
            },
            {
                "name": "envoy",
                "kind": "container",
                "change": "changed",
                "image": {"old": "envoy:v1", "new": "envoy:v2"},
                "fields": ["env"],
            },
            {
                "name": "log",
                "kind": "container",
                "change": "added",
                "image": {"old": None, "new": "log:1"},
                "fields": [],
            },
        ]
        assert specdiff.spec_field_changes(V1["spec"], new["spec"]) == ("updateStrategy",)

    def test_defaults_are_no_change(self) -> None:
        explicit = copy.deepcopy(V1)
        explicit["spec"]["containers"][0].update(
            podInjectPolicy="BeforeAppContainer", upgradeStrategy={"upgradeType": "ColdUpgrade"}
        )
        explicit["spec"]["updateStrategy"] = {"type": "RollingUpdate", "partition": 0, "maxUnavailable": 1}
        (change,) = specdiff.container_changes(V1["spec"], explicit["spec"])
        assert change.change == "unchanged"
        assert specdiff.spec_field_changes(V1["spec"], explicit["spec"]) == ()

    def test_removed(self) -> None:
        (gone,) = specdiff.container_changes(V1["spec"], {"containers": []})
        assert (gone.change, gone.old_image, gone.new_image) == ("removed", "envoy:v1", None)


# ---------------------------------------------------------------------------------------------
# The document and the command


def stored(obj: JsonObj) -> JsonObj:
    out = copy.deepcopy(obj)
    out["metadata"].update(uid="uid-mesh", resourceVersion="7", creationTimestamp="2024-05-01T09:00:00Z")
    return out


def namespace(name: str, **labels: str) -> JsonObj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def inputs(stored_obj: JsonObj | None, pods: list[JsonObj]) -> previewcmd.Inputs:
    sets = [stored_obj] if stored_obj is not None else []
    return previewcmd.Inputs(stored_obj, sets, pods, [namespace("shop", **{names.NS_INJECTION_LABEL: "enabled"})], [])


TOP_KEYS = [
    "kind",
    "sidecarSet",
    "file",
    "new",
    "generation",
    "inPlace",
    "resizedInPlace",
    "changes",
    "rollout",
    "notUpgradable",
    "excludedByUpdateSelector",
    "noLongerMatched",
    "neverInjected",
    "newPods",
]
ROLLOUT_KEYS = [
    "revision",
    "matched",
    "alreadyUpdated",
    "notReadyBefore",
    "unavailableBefore",
    "maxUnavailable",
    "partition",
    "batches",
    "upgraded",
    "resized",
    "hotUpgradeFlips",
    "kept",
    "waitingOn",
    "end",
    "done",
]


def build(file_obj: JsonObj, inp: previewcmd.Inputs) -> JsonObj:
    target = previewcmd.as_stored(file_obj, "ss.yaml: document 1")
    return previewcmd.build(target, "ss.yaml: document 1", inp, now=NOW, manager_namespace="sidecarctl-system")


class TestDocument:
    def test_shape_and_batches(self) -> None:
        file_obj = v2(maxUnavailable=3, partition=4)
        del file_obj["metadata"]["generation"]
        pods = fleet()
        pods[1]["spec"]["containers"][0]["env"] = [{"name": "X", "value": "1"}]
        pods[1]["metadata"]["annotations"][names.ANN_HASH_WITHOUT_IMAGE] = json.dumps(
            {"mesh": {"hash": "other", "sidecarSetName": "mesh"}}
        )
        doc = build(file_obj, inputs(stored(V1), pods))
        assert list(doc) == TOP_KEYS
        assert list(doc["rollout"]) == ROLLOUT_KEYS
        json.dumps(doc)  # serialisable as it is
        assert doc["new"] is False and doc["inPlace"] is True
        assert doc["generation"] == {"stored": 1, "applied": 2}
        assert doc["changes"]["containers"][0]["image"] == {"old": "envoy:v1", "new": "envoy:v2"}
        assert doc["changes"]["otherFields"] == ["updateStrategy"]
        batches = doc["rollout"]["batches"]
        assert [b["batch"] for b in batches] == [1, 2, 3]
        assert [len(b["pods"]) for b in batches] == [3, 3, 1]
        assert doc["rollout"]["end"]["stage"] == "partition" and len(doc["rollout"]["kept"]) == 4
        assert doc["notUpgradable"] == [{"pod": "shop/p01", "fields": ["envoy: env"], "comparedWith": "pod"}]
        (new_pod,) = [p for p in doc["newPods"] if p["labels"] == {"app": "shop", "zone": "a"}]
        assert new_pod["containers"][0] == {"name": "envoy", "image": "envoy:v2", "sidecarSet": "mesh"}
        assert [c["sidecarSet"] for c in new_pod["containers"][1:]] == [None, None]
        text = previewtext.render(doc)
        assert "Pods of namespace shop.\n" in text
        assert "batch 1 (3): " in text and "batch 3 (1): " in text and "\n  p01: envoy: env" in text

    def test_a_new_sidecarset_rolls_nothing_out(self) -> None:
        other = shop_sidecarset("older")
        pods = [marked(injected_pod(f"p{i}", other)) for i in range(3)]
        file_obj = shop_sidecarset("mesh", containers=[container("log", "log:1")])
        doc = build(file_obj, previewcmd.Inputs(None, [stored(other)], pods, inputs(None, []).namespaces, []))
        assert doc["new"] is True and doc["rollout"] is None and doc["inPlace"] is False
        assert [u["pod"] for u in doc["neverInjected"]] == ["shop/p0", "shop/p1", "shop/p2"]
        (new_pod,) = doc["newPods"]
        assert new_pod["pods"] == 3 and new_pod["injected"] == ["mesh", "older"]
        got = [(c["name"], c["sidecarSet"]) for c in new_pod["containers"]]
        assert sorted(got[:2]) == [("envoy", "older"), ("log", "mesh")]
        assert got[2:] == [("app", None), ("worker", None)]
        assert "is new: nothing is rolled out" in previewtext.render(doc)

    def test_pods_the_new_spec_no_longer_owns(self) -> None:
        pods = [marked(injected_pod("east", V1, labels={"zone": "east"})), marked(injected_pod("west", V1))]
        file_obj = copy.deepcopy(V1)
        file_obj["spec"]["selector"] = {"matchLabels": {"app": "shop", "zone": "east"}}
        doc = build(file_obj, inputs(stored(V1), pods))
        assert doc["noLongerMatched"] == [{"pod": "shop/west", "reason": "the selector no longer matches its labels"}]
        assert doc["rollout"]["matched"] == 1

    def test_refused_by_validation(self) -> None:
        bad = copy.deepcopy(V1)
        bad["spec"]["containers"].append(container("envoy", "again:1"))
        with pytest.raises(CliError, match="would refuse SidecarSet mesh"):
            build(bad, inputs(stored(V1), []))

    def test_no_pod_selected_gives_an_example_from_the_selector(self) -> None:
        doc = build(copy.deepcopy(V1), inputs(stored(V1), []))
        (example,) = doc["newPods"]
        assert example["example"] == "" and example["labels"] == {"app": "shop"}
        assert [c["name"] for c in example["containers"]] == ["envoy", "app"]


# -- through the command line, against a canned API server ---------------------------------------
def write(path: Path, *docs: Any) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def api() -> Iterator[StubApi]:
    with StubApi() as server:
        server.put(f"{clusterread.SS_PATH}/mesh", stored(V1))
        for p in fleet():
            server.pod(p)
        server.put("/api/v1/namespaces/shop", namespace("shop", **{names.NS_INJECTION_LABEL: "enabled"}))
        yield server


def test_cli_json_pages_through_lists_and_writes_nothing(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path / "ss.yaml", v2(maxUnavailable=5))
    config = kubeconfig_for(api, tmp_path)
    code, out, err = run(["preview", "-f", str(f), "--kubeconfig", str(config), "-o", "json"], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert [len(b["pods"]) for b in doc["rollout"]["batches"]] == [5, 5, 2]
    assert api.paged, "the pod list was read in pages"
    assert {m for m, _, _ in api.requests} == {"GET"}
    assert {ua for _, _, ua in api.requests} == {"sidecarctl-preview"}


def test_cli_text(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path / "ss.yaml", v2(maxUnavailable=6))
    code, out, _ = run(["preview", "-f", str(f), "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys)
    assert code == 0
    assert "container envoy: image envoy:v1 -> envoy:v2" in out and "batch 2 (6): " in out


def test_kubeconfig_from_the_environment(api: StubApi, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    f = write(tmp_path / "ss.yaml", v2())
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(kubeconfig_for(api, tmp_path))]))
    code, _, err = run(["preview", "-f", str(f)], capsys)
    assert (code, err) == (0, "")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "ss.yaml: cannot read: No such file or directory"),
        ("a: [", "ss.yaml: document 1: invalid YAML"),
        ("kind: Pod\nmetadata: {name: x}\n", "no SidecarSet in it"),
        ("kind: SidecarSet\nspec: {}\n", "metadata.name must be a non-empty string"),
        (
            "apiVersion: sidecarctl.io/v1alpha1\nkind: SidecarSet\nmetadata: {name: m}\nspec: {containers: 3}\n",
            "spec.containers",
        ),
    ],
)
def test_bad_files_give_one_line(tmp_path: Path, capsys: Any, content: str | None, message: str) -> None:
    f = tmp_path / "ss.yaml"
    if content is not None:
        f.write_text(content)
    code, out, err = run(["preview", "-f", str(f), "--kubeconfig", str(tmp_path / "none")], capsys)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("sidecarctl preview: error: ") and message in err


def test_no_kubeconfig(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    f = write(tmp_path / "ss.yaml", v2())
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = run(["preview", "-f", str(f)], capsys)
    assert code == 1 and err.count("\n") == 1 and "no kubeconfig" in err
    code, _, err = run(["preview", "-f", str(f), "--kubeconfig", str(tmp_path / "nope")], capsys)
    assert code == 1 and err.count("\n") == 1 and "cannot load cluster credentials" in err


def test_api_unreachable(tmp_path: Path, capsys: Any) -> None:
    f = write(tmp_path / "ss.yaml", v2())
    config = kubeconfig_for(None, tmp_path)
    code, _, err = run(["preview", "-f", str(f), "--kubeconfig", str(config), "--request-timeout", "2"], capsys)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("sidecarctl preview: error: cannot reach the API server at http://127.0.0.1:")


def test_api_refusing(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    api.deny("/api/v1/pods")
    f = write(tmp_path / "ss.yaml", v2())
    code, _, err = run(["preview", "-f", str(f), "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys)
    assert code == 1 and err.count("\n") == 1 and "refused a request: 403 Forbidden" in err


def test_usage_errors_exit_2(capsys: Any) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["preview"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["preview", "-f", "x", "-o", "yaml"])
    assert e.value.code == 2


@pytest.mark.parametrize("target", ["closed-pipe", "/dev/full"])
def test_output_that_cannot_be_written(api: StubApi, tmp_path: Path, target: str) -> None:
    f = write(tmp_path / "ss.yaml", v2())
    argv = [
        sys.executable,
        "-m",
        "sidecarctl.cli.main",
        "preview",
        "-f",
        str(f),
        "--kubeconfig",
        str(kubeconfig_for(api, tmp_path)),
    ]
    if target == "closed-pipe":
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    else:
        with open(target, "wb") as out:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, cwd=REPO, timeout=60, check=False)
        err, code = done.stderr.decode(), done.returncode
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "stdout was closed" in err or "cannot write to stdout" in err


def test_the_model_of_the_target_keeps_the_stored_identity() -> None:
    target = previewcmd.target_object(previewcmd.as_stored(v2(), "x"), stored(V1), now=NOW)
    ss = SidecarSet.from_object(target)
    assert (ss.uid, ss.generation, ss.creation_timestamp) == ("uid-mesh", 2, "2024-05-01T09:00:00Z")
    same = previewcmd.target_object(previewcmd.as_stored(V1, "x"), stored(V1), now=NOW)
    assert same["metadata"]["generation"] == 1


def test_cli_a_namespaced_sidecarset_is_previewed_in_its_namespace(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    """`shop/mesh` beside the cluster's `mesh`: its own three pods roll, one at a time; the cluster
    set's twelve are not its; only its namespace is read (and the cluster SidecarSets, whose names
    it may not take)."""
    tenant = namespaced_sidecarset(
        "mesh",
        "shop",
        containers=[container("agent", "agent:v1")],
        selector={"matchLabels": {"app": "shop", "tier": "t"}},
        metadata={"generation": 1},
    )
    api.put(f"{clusterread.tenant_path('shop')}/mesh", stored(tenant))
    for i in range(3):
        api.pod(marked(injected_pod(f"t{i}", tenant, labels={"tier": "t"}), "agent"))
    newer = with_images(tenant, agent="agent:v2")
    newer["spec"]["updateStrategy"] = {"maxUnavailable": 1}
    config = kubeconfig_for(api, tmp_path)
    f = write(tmp_path / "tenant.yaml", newer)
    code, out, err = run(["preview", "-f", str(f), "--kubeconfig", str(config), "-o", "json"], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert (doc["kind"], doc["sidecarSet"], doc["new"], doc["inPlace"]) == (
        "NamespacedSidecarSet",
        "shop/mesh",
        False,
        True,
    )
    assert doc["rollout"]["matched"] == 3
    assert [len(b["pods"]) for b in doc["rollout"]["batches"]] == [1, 1, 1]
    assert sorted(p for b in doc["rollout"]["batches"] for p in b["pods"]) == ["shop/t0", "shop/t1", "shop/t2"]
    assert doc["neverInjected"] == []
    paths = {p for _, p, _ in api.requests}
    assert "/api/v1/pods" not in paths and "/api/v1/namespaces" not in paths, paths
    # A cluster SidecarSet's container name is refused, as the API server would.
    taken = with_images(newer)
    taken["spec"]["containers"] = [container("envoy", "envoy:v9")]
    f = write(tmp_path / "taken.yaml", taken)
    code, out, err = run(["preview", "-f", str(f), "--kubeconfig", str(config)], capsys)
    assert (code, out) == (1, "")
    assert "the API server would refuse NamespacedSidecarSet shop/mesh" in err and "envoy" in err
