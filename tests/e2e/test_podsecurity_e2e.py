"""Pod Security checked before pods fail: what sidecarctl says agrees with kube-apiserver's own
PodSecurity admission.

16 SidecarSets (for each of baseline and restricted: 4 violating it in different ways, 4 compliant)
against labelled namespaces at each enforce level (none, privileged, baseline, restricted): the
SidecarSet's `PodSecurity` condition names a namespace with mode enforce exactly when the API
server then refuses a pod there that only the sidecars could make non-compliant (its app container
meets restricted). `kubectl create` shows the validating webhook's warning; relabelling a namespace
moves the condition within 5 s; `sidecarctl.io/pod-security: enforce` turns the warning into a refusal.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from kuberuntime import api
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, kubectl
from tests.kube import builders
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.managerharness import RunningManager

RESTRICTED_OK = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
LEVELS = ("none", "privileged", "baseline", "restricted")
PODSEC = "pod-security.kubernetes.io/enforce"


@dataclass(frozen=True)
class Case:
    name: str
    security: dict[str, Any] | None
    extra: dict[str, Any]
    volumes: tuple[dict[str, Any], ...] = ()


CASES = [
    # baseline: violating in four ways, then four that baseline allows
    Case("b-privileged", {"privileged": True}, {}),
    Case("b-net-admin", {"capabilities": {"add": ["NET_ADMIN"]}}, {}),
    Case("b-host-port", None, {"ports": [{"containerPort": 15001, "hostPort": 15001}]}),
    Case(
        "b-host-path",
        None,
        {"volumeMounts": [{"name": "run", "mountPath": "/host-run"}]},
        ({"name": "run", "hostPath": {"path": "/run"}},),
    ),
    Case("b-plain", None, {}),
    Case("b-chown", {"capabilities": {"add": ["CHOWN"]}}, {}),
    Case("b-root", {"runAsUser": 0}, {}),
    Case("b-seccomp", {"seccompProfile": {"type": "RuntimeDefault"}}, {}),
    # restricted: violating in four ways (each baseline-compliant), then four that restricted allows
    Case("r-escalation", {**RESTRICTED_OK, "allowPrivilegeEscalation": True}, {}),
    Case("r-root", {**RESTRICTED_OK, "runAsNonRoot": None, "runAsUser": 0}, {}),
    Case("r-caps", {**RESTRICTED_OK, "capabilities": {"drop": ["NET_RAW"]}}, {}),
    Case("r-no-seccomp", {**RESTRICTED_OK, "seccompProfile": None}, {}),
    Case("r-ok", RESTRICTED_OK, {}),
    Case("r-bind", {**RESTRICTED_OK, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}, {}),
    Case("r-uid", {**RESTRICTED_OK, "runAsUser": 1337}, {}),
    Case(
        "r-config",
        RESTRICTED_OK,
        {"volumeMounts": [{"name": "conf", "mountPath": "/etc/proxy"}]},
        ({"name": "conf", "configMap": {"name": "proxy"}},),
    ),
]


def sidecarset(case: Case, name: str, app: str, **meta: Any) -> dict[str, Any]:
    security = {k: v for k, v in (case.security or {}).items() if v is not None}
    container = builders.container("proxy", "proxy:1", **case.extra)
    if case.security is not None:
        container["securityContext"] = security
    return builders.sidecarset(
        name,
        app=app,
        containers=[container],
        volumes=list(case.volumes),
        metadata=meta,
    )


def pod_security(kube: Kube, name: str) -> dict[str, Any] | None:
    status = kube.get(f"{SS_PATH}/{name}").get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == names.CONDITION_POD_SECURITY), None)


def app_pod(app: str) -> dict[str, Any]:
    return builders.pod(
        None,
        labels={"app": app},
        metadata={"generateName": f"{app}-"},
        containers=[builders.container("app", "app:1", securityContext=RESTRICTED_OK)],
    )


def injected_in(kube: Kube, namespace: str, app: str, sidecarset_name: str) -> bool:
    """Whether a pod created now in `namespace` gets `sidecarset_name`'s sidecars (dry run)."""
    pod = kube.create(f"/api/v1/namespaces/{namespace}/pods", app_pod(app), dryRun="All")
    injected = (pod["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_LIST, "")
    return sidecarset_name in injected.split(",")


@pytest.fixture
def levels(kube: Kube, manager: RunningManager) -> Iterator[dict[str, str]]:
    """A namespace labelled for injection at each enforce level: level -> name."""
    tag = secrets.token_hex(3)
    made = {}
    for level in LEVELS:
        labels = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
        if level != "none":
            labels[PODSEC] = level
        made[level] = f"psa-{level}-{tag}"
        kube.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": made[level], "labels": labels}},
        )
    for name in made.values():
        eventually(
            functools.partial(kube.get_or_none, f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            timeout=30,
            what="default ServiceAccount",
        )
    yield made
    for name in made.values():
        kube.delete(f"/api/v1/namespaces/{name}")


@pytest.mark.versions
def test_warnings_and_the_condition_agree_with_pod_security_admission_in_64_cases(
    kube: Kube, control_plane: ControlPlane, levels: dict[str, str]
) -> None:
    tag = secrets.token_hex(3)
    created: list[str] = []
    warned: dict[str, str] = {}
    try:
        for i, case in enumerate(CASES):
            name = f"psa-{case.name}-{tag}"
            proc = kubectl(
                control_plane, "create", "-f", "-", stdin=yaml.safe_dump(sidecarset(case, name, f"psa{i}-{tag}"))
            )
            assert proc.returncode == 0, proc.stderr
            created.append(name)
            warned[name] = proc.stderr
        agree, cases = 0, []
        evidence: dict[tuple[str, str], Any] = {}
        for i, case in enumerate(CASES):
            name = created[i]
            condition = eventually(functools.partial(pod_security, kube, name), timeout=20, what=f"{name} PodSecurity")
            # The condition is the controller's; injection goes live separately (a policy write or the
            # webhook's widened condition). Probe only once a pod in the unenforced namespace gets
            # this sidecar, or an uninjected pod is admitted and reads as a wrong prediction.
            eventually(
                functools.partial(injected_in, kube, levels["none"], f"psa{i}-{tag}", name),
                timeout=60,  # a policy pass under the whole suite's load: seconds, rarely tens
                what=f"{name} injecting",
            )
            for level, ns in levels.items():
                predicted = f"{ns} (enforce " in condition["message"]
                try:
                    pod = kube.create(f"/api/v1/namespaces/{ns}/pods", app_pod(f"psa{i}-{tag}"), dryRun="All")
                    refused = False
                except api.ApiError as e:
                    assert e.status == 403 and "violates PodSecurity" in e.message, e.message
                    refused = True
                cases.append((case.name, level, predicted, refused))
                agree += predicted == refused
                if predicted and not refused:  # what the API server admitted, for the failure message
                    evidence[(case.name, level)] = {
                        "annotations": pod["metadata"].get("annotations"),
                        "containers": [(c["name"], c.get("securityContext")) for c in pod["spec"]["containers"]],
                        "pod securityContext": pod["spec"].get("securityContext"),
                    }
        disagreements = [c for c in cases if c[2] != c[3]]
        print(f"\nPod Security: {agree}/{len(cases)} cases agree with the API server's PodSecurity admission")
        assert len(cases) == 64 and not disagreements, (disagreements, evidence)
        # The webhook said so when the SidecarSet was applied, naming the namespace and the check.
        escalation = created[[c.name for c in CASES].index("r-escalation")]
        assert f'PodSecurity "restricted" (enforce) in namespace {levels["restricted"]}' in warned[escalation]
        assert "allowPrivilegeEscalation != false" in warned[escalation]
        assert "PodSecurity" not in warned[created[[c.name for c in CASES].index("r-ok")]]
        # Refused pods by level: restricted refuses all 12 violating or only-baseline ones, baseline 4.
        refused_by_level = {lv: sum(1 for c in cases if c[1] == lv and c[3]) for lv in LEVELS}
        assert refused_by_level == {"none": 0, "privileged": 0, "baseline": 4, "restricted": 12}, refused_by_level
    finally:
        for name in created:
            kube.delete(f"{SS_PATH}/{name}")


def test_relabelling_a_namespace_moves_the_condition_within_5_seconds(
    kube: Kube, control_plane: ControlPlane, levels: dict[str, str]
) -> None:
    name = f"psa-relabel-{secrets.token_hex(3)}"
    case = next(c for c in CASES if c.name == "r-escalation")
    kube.create(SS_PATH, sidecarset(case, name, f"relabel-{name[-6:]}"))
    try:
        ns = levels["none"]
        eventually(lambda: pod_security(kube, name), timeout=20, what="PodSecurity condition")
        assert f"{ns} (" not in (pod_security(kube, name) or {})["message"]
        t0 = time.monotonic()
        kube.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {PODSEC: "restricted"}}})
        eventually(
            lambda: f"{ns} (enforce restricted)" in (pod_security(kube, name) or {}).get("message", ""),
            timeout=5,
            interval=0.05,
            what="the relabelled namespace in the condition",
        )
        took = time.monotonic() - t0
        kube.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {PODSEC: None}}})
        eventually(
            lambda: f"{ns} (" not in (pod_security(kube, name) or {}).get("message", ""),
            timeout=5,
            interval=0.05,
            what="the namespace gone from the condition",
        )
        print(f"\nnamespace relabelled: PodSecurity condition updated {took:.2f}s later")
    finally:
        kube.delete(f"{SS_PATH}/{name}")


def test_the_enforce_annotation_refuses_a_sidecarset_that_would_break_pods(
    control_plane: ControlPlane, levels: dict[str, str]
) -> None:
    case = next(c for c in CASES if c.name == "b-privileged")
    name = f"psa-refused-{secrets.token_hex(3)}"
    obj = sidecarset(case, name, f"refused-{name[-6:]}", annotations={names.ANN_POD_SECURITY: "enforce"})
    proc = kubectl(control_plane, "create", "-f", "-", stdin=yaml.safe_dump(obj))
    assert proc.returncode != 0
    assert f"{names.ANN_POD_SECURITY}=enforce" in proc.stderr and levels["baseline"] in proc.stderr, proc.stderr
    assert "privileged" in proc.stderr
