"""`sidecarctl check-inject` against the real API server and the session's manager (--injection=auto).

One scene, built once: a namespace labelled for injection and one labelled `sidecar-injection=disabled`,
SidecarSets for each reason the command gives (a selector term that fails, paused injection, one kept
on the webhook by its annotation, a canary and its base, one created after its pod, one whose image
changed while its updates are paused, its injection paused too) and a Deployment with no pods in
kube-system. The command runs as a subprocess, as a user runs it, several at once; each test reads
one answer. Two of the runs use ServiceAccount tokens bound to the viewer rules of
docs/guides/check-inject.md, all of them and only those not marked optional.

These namespaces are not the fake kubelet's: the pods stay Pending. A pod that is not running is
current when it records the SidecarSet's current hash (it starts with exactly those sidecars).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, make_pod, set_image, status_of, wait_condition
from tests.e2e.helpers import sidecarctl as run_cli
from tests.e2e.policysupport import policy_holding
from tests.kube import builders
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import REPO, ControlPlane
from tests.kube.managerharness import RunningManager

TOK = secrets.token_hex(3)
ON, OFF = f"ck-on-{TOK}", f"ck-off-{TOK}"
MAIN, TIER, PAUSED, WEB = f"ck-main-{TOK}", f"ck-tier-{TOK}", f"ck-paused-{TOK}", f"ck-web-{TOK}"
BASE, CANARY, LATE, OLD = f"ck-base-{TOK}", f"ck-canary-{TOK}", f"ck-late-{TOK}", f"ck-old-{TOK}"
APP = f"ck-{TOK}"
DEPLOY = f"ck-sys-{TOK}"
PODS = "/api/v1/namespaces/{}/pods"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def sidecarctl(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check-inject", *args, "--kubeconfig", str(cp.kubeconfig))


def sidecarset(name: str, app: str, container: str, image: str = "agent:1", **spec: Any) -> dict[str, Any]:
    return builders.sidecarset(name, app=app, containers=[builders.container(container, image)], **spec)


def namespace(kube: Kube, name: str, value: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {names.NS_INJECTION_LABEL: value}},
    }
    kube.create("/api/v1/namespaces", body)
    eventually(
        lambda: kube.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None,
        timeout=30,
        what=f"default ServiceAccount in {name}",
    )


def pod(kube: Kube, ns: str, name: str, app: str, **labels: str) -> None:
    kube.create(PODS.format(ns), make_pod(name, app, ck=TOK, **labels))


def dry_run_until(kube: Kube, app: str, what: str, ok: Any, **labels: str) -> None:
    """Dry-run creates in ON until the API server injects as the scene needs (store and policies caught up)."""

    def attempt() -> bool:
        p = kube.create(PODS.format(ON), make_pod("probe", app, **labels), dryRun="All")
        assert ok(p), f"{what}: {[c['image'] for c in p['spec']['containers']]} {p['metadata'].get('annotations')}"
        return True

    eventually(attempt, timeout=30, interval=0.1, what=what)


def _by(p: dict[str, Any]) -> str | None:
    return (p["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY)


def _images(p: dict[str, Any]) -> list[str]:
    return [c["image"] for c in p["spec"]["containers"]]


@pytest.fixture(scope="module")
def scene(kube: Kube, control_plane: ControlPlane, manager: RunningManager) -> Iterator[dict[str, Any]]:
    made: list[str] = []
    try:
        tier = {
            "matchLabels": {"app": APP},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}],
        }
        canary = {"annotations": {names.ANN_CANARY: "true", names.ANN_BASE: BASE}}
        for obj in (
            sidecarset(MAIN, APP, "proxy"),
            sidecarset(TIER, APP, "logger", selector=tier),
            sidecarset(PAUSED, APP, "pauser", injectionStrategy={"paused": True}),
            sidecarset(WEB, f"ckw-{TOK}", "proxy", metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}}),
            sidecarset(BASE, f"ckc-{TOK}", "proxy"),
            sidecarset(
                CANARY,
                "",
                "proxy",
                "agent:canary",
                metadata=canary,
                selector={"matchLabels": {"app": f"ckc-{TOK}", "track": "canary"}},
                updateStrategy={"type": "NotUpdate"},
            ),
            sidecarset(OLD, f"cko-{TOK}", "proxy", updateStrategy={"paused": True}),
        ):
            kube.create(SS_PATH, obj)
            made.append(obj["metadata"]["name"])
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": DEPLOY},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": APP}},
                "template": {
                    "metadata": {"labels": {"app": APP}},
                    "spec": {"containers": [{"name": "app", "image": "a"}]},
                },
            },
        }
        kube.create("/apis/apps/v1/namespaces/kube-system/deployments", deployment)
        namespace(kube, ON, names.NS_INJECTION_ENABLED)
        namespace(kube, OFF, "disabled")
        wait_condition(kube, MAIN, "True")
        wait_condition(kube, TIER, "True")
        dry_run_until(kube, APP, "main by a policy", lambda p: _by(p) == "policy" and "agent:1" in _images(p))
        dry_run_until(kube, f"ckw-{TOK}", "web by the webhook", lambda p: _by(p) == "webhook")
        dry_run_until(kube, f"ckc-{TOK}", "the canary", lambda p: "agent:canary" in _images(p), track="canary")
        dry_run_until(kube, f"cko-{TOK}", "old", lambda p: "agent:1" in _images(p))
        pod(kube, ON, "main-pod", APP)
        pod(kube, ON, "web-pod", f"ckw-{TOK}")
        pod(kube, ON, "canary-pod", f"ckc-{TOK}", track="canary")
        pod(kube, ON, "optout-pod", APP, **{names.POD_INJECT_LABEL: "false"})
        pod(kube, ON, "late-pod", f"ckl-{TOK}")
        pod(kube, ON, "old-pod", f"cko-{TOK}")
        pod(kube, OFF, "off-pod", APP)
        kube.create(SS_PATH, sidecarset(LATE, f"ckl-{TOK}", "proxy"))
        made.append(LATE)
        set_image(kube, OLD, "agent:2")
        # Paused injection keeps OLD from new pods only: the controller still counts old-pod, out of date.
        kube.patch(f"{SS_PATH}/{OLD}", {"spec": {"injectionStrategy": {"paused": True}}})
        runs = {
            "all": ("-n", ON, "-l", f"ck={TOK}", "-o", "json"),
            "main": (f"{ON}/main-pod",),
            "late": ("-n", ON, "pod/late-pod"),
            "off": ("-n", OFF, "off-pod", "-o", "json"),
            "system": ("-n", "kube-system", f"deployment/{DEPLOY}", "-o", "json"),
            "absent": ("-n", ON, "nope"),
        }
        viewers = {which: viewer_kubeconfig(kube, control_plane, which) for which in ("viewer", "bare")}
        with ThreadPoolExecutor(len(runs) + len(viewers)) as pool:
            done = {k: pool.submit(sidecarctl, control_plane, *a) for k, a in runs.items()}
            for which, config in viewers.items():
                done[which] = pool.submit(run_cli, "check-inject", *runs["all"], "--kubeconfig", str(config))
            out: dict[str, Any] = {k: f.result() for k, f in done.items()}
        out["main-revision"] = status_of(kube, MAIN).get("latestRevision")
        out["main-policy"] = policy_holding(kube, MAIN)
        for key in ("main", "late"):
            print(f"\n--- sidecarctl check-inject ({key})\n{out[key].stdout}---", flush=True)
        yield out
    finally:
        for name in made:
            kube.delete(f"{SS_PATH}/{name}")
        kube.delete(f"/apis/apps/v1/namespaces/kube-system/deployments/{DEPLOY}")
        for ns in (ON, OFF):
            kube.delete(f"/api/v1/namespaces/{ns}")
        for which in ("viewer", "bare"):
            kube.delete(f"{RBAC}/clusterroles/ck-{which}-{TOK}")
            kube.delete(f"{RBAC}/clusterrolebindings/ck-{which}-{TOK}")


def readme_viewer_rules() -> list[dict[str, Any]]:
    """The rules the check-inject guide gives for a viewer (the YAML block after its RBAC line)."""
    text = (REPO / "docs" / "guides" / "check-inject.md").read_text(encoding="utf-8")
    block = text[text.index("**RBAC** for a viewer") :]
    block = block[block.index("```yaml") + len("```yaml") : block.index("```", block.index("```yaml") + 7)]
    rules: list[dict[str, Any]] = yaml.safe_load(block)["rules"]
    return rules


def viewer_kubeconfig(kube: Kube, cp: ControlPlane, which: str) -> Path:
    """A ServiceAccount token bound to the guide's viewer rules (`viewer`), or to those the guide
    does not mark optional (`bare`: no ControllerRevisions, no MutatingAdmissionPolicies)."""
    rules = readme_viewer_rules()
    if which == "bare":
        optional = {"controllerrevisions", "mutatingadmissionpolicies"}
        rules = [r for r in rules if not optional & set(r["resources"])]
    name = f"ck-{which}-{TOK}"
    kube.create(f"/api/v1/namespaces/{ON}/serviceaccounts", {"metadata": {"name": name}})
    kube.create(f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": rules})
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ON}],
    }
    kube.create(f"{RBAC}/clusterrolebindings", binding)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    token = kube.create(f"/api/v1/namespaces/{ON}/serviceaccounts/{name}/token", request)["status"]["token"]
    return cp.token_kubeconfig(Path(tempfile.mkdtemp(prefix="sidecarctl-ck-")) / "kubeconfig", token)


def _doc(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _pod(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in doc["pods"] if p["name"] == name)


def _ss(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in pod["sidecarSets"] if v["name"] == name)


def test_a_policy_served_pod_is_current_at_its_revision_and_the_others_say_why_not(scene: dict[str, Any]) -> None:
    doc = _doc(scene["all"])
    p = _pod(doc, "main-pod")
    main = _ss(p, MAIN)
    assert main["selects"] and main["state"] == "current", main
    assert main["revision"] == scene["main-revision"] and main["revision"]
    assert main["path"]["path"] == "policy" and main["path"]["policy"] == scene["main-policy"] is not None
    assert p["injectedBy"] == "policy" and p["path"]["path"] == "policy" and p["ok"] is True
    tier = _ss(p, TIER)
    assert [r["code"] for r in tier["reasons"]] == ["SelectorMismatch"]
    assert "matchExpressions tier In (gold): the pod has no label tier" in tier["reasons"][0]["message"]
    assert [r["code"] for r in _ss(p, PAUSED)["reasons"]] == ["InjectionPaused"]
    assert _ss(p, WEB)["reasons"][0]["message"] == f"spec.selector matchLabels app=ckw-{TOK}: the pod has app={APP}"


def test_the_webhook_path_names_the_annotation(scene: dict[str, Any]) -> None:
    p = _pod(_doc(scene["all"]), "web-pod")
    web = _ss(p, WEB)
    assert web["state"] == "current" and web["path"]["path"] == "webhook"
    assert f"{names.ANN_INJECTION_PATH}=webhook" in web["path"]["reason"]
    assert p["path"]["path"] == "webhook" and WEB in p["path"]["reason"] and p["injectedBy"] == "webhook"


def test_a_canary_replaces_its_base(scene: dict[str, Any]) -> None:
    p = _pod(_doc(scene["all"]), "canary-pod")
    assert [r["code"] for r in _ss(p, BASE)["reasons"]] == ["ReplacedByCanary"]
    assert CANARY in _ss(p, BASE)["reasons"][0]["message"]
    assert _ss(p, CANARY)["state"] == "current" and _ss(p, BASE)["state"] == "absent"
    assert "canary SidecarSet" in _ss(p, CANARY)["path"]["reason"]


def test_opted_out_missing_and_outdated_pods(scene: dict[str, Any]) -> None:
    doc = _doc(scene["all"])
    assert scene["all"].returncode == 1 and doc["ok"] is False
    out = _pod(doc, "optout-pod")
    assert out["gate"]["code"] == "OptedOut" and _ss(out, MAIN)["state"] == "absent" and out["ok"]
    late = _ss(_pod(doc, "late-pod"), LATE)
    assert late["selects"] and late["state"] == "missing" and late["detail"] == "created before the SidecarSet"
    old = _ss(_pod(doc, "old-pod"), OLD)
    assert old["state"] == "outdated" and old["revision"] and not old["selects"], old
    assert [r["code"] for r in old["reasons"]] == ["InjectionPaused"], old
    assert old["detail"].startswith("updates are paused (spec.updateStrategy.paused: true)"), old
    assert _pod(doc, "old-pod")["ok"] is False
    assert [p["name"] for p in doc["pods"] if not p["ok"]] == ["late-pod", "old-pod"]


def test_text_and_exit_status(scene: dict[str, Any]) -> None:
    main, late = scene["main"], scene["late"]
    assert main.returncode == 0, main.stderr
    assert f"Pod {ON}/main-pod (Pending, injected by policy)" in main.stdout
    assert f"injected, current at revision {scene['main-revision']}" in main.stdout
    assert f"via MutatingAdmissionPolicy {scene['main-policy']}" in main.stdout
    assert main.stdout.endswith("OK: every SidecarSet that selects the pods is present and current\n")
    assert late.returncode == 1 and late.stderr == ""
    line = next(x for x in late.stdout.splitlines() if x.startswith(f"  {LATE} "))
    assert line.split(None, 1)[1].startswith("MISSING: selects the pod, its sidecars are not in it: created before the")
    assert late.stdout.endswith(f"Not present or not current (1): {ON}/late-pod: {LATE} missing\n")


def test_namespace_not_labelled(scene: dict[str, Any]) -> None:
    off = scene["off"]
    p = _doc(off)["pods"][0]
    assert off.returncode == 0
    assert p["gate"] == {
        "code": "NamespaceNotLabelled",
        "message": f"namespace {OFF} is not labelled sidecar-injection=enabled (it has sidecar-injection=disabled)",
    }
    assert _ss(p, MAIN)["reasons"] == [p["gate"]] and _ss(p, MAIN)["state"] == "absent"


def test_a_workload_without_pods_is_checked_by_its_template_in_a_system_namespace(scene: dict[str, Any]) -> None:
    system = scene["system"]
    p = _doc(system)["pods"][0]
    assert system.returncode == 0
    assert p["template"] == f"deployment/{DEPLOY}" and p["gate"]["code"] == "SystemNamespace"
    assert "kube-system is never injected" in p["gate"]["message"]


def test_an_absent_pod_is_one_line_and_status_1(scene: dict[str, Any]) -> None:
    absent = scene["absent"]
    assert absent.returncode == 1 and absent.stdout == ""
    assert absent.stderr == f"sidecarctl check-inject: error: pod {ON}/nope not found\n"


def test_the_readme_viewer_rules_are_enough_and_the_optional_ones_only_add_detail(scene: dict[str, Any]) -> None:
    """Run as a ServiceAccount bound to exactly the guide's rules, the answer is the admin's; bound
    to those not marked optional, every pod's and SidecarSet's state and exit status are the same."""
    admin, viewer, bare = scene["all"], scene["viewer"], scene["bare"]
    assert viewer.stdout and viewer.returncode == admin.returncode, viewer.stderr
    assert _doc(viewer) == _doc(admin)
    assert bare.returncode == admin.returncode, bare.stderr

    def states(doc: dict[str, Any]) -> dict[tuple[str, str], tuple[bool, str]]:
        return {(p["name"], v["name"]): (v["selects"], v["state"]) for p in doc["pods"] for v in p["sidecarSets"]}

    assert states(_doc(bare)) == states(_doc(admin))
    assert [p["ok"] for p in _doc(bare)["pods"]] == [p["ok"] for p in _doc(admin)["pods"]]
