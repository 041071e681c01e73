"""sidecarsets.validation.podsecurity: the Pod Security Standards on a SidecarSet's sidecars.

Agreement with kube-apiserver's own PodSecurity admission is shown end to end
(tests/e2e/test_podsecurity_e2e.py); here each check, the namespace labels as the API server reads
them, and the warning and condition texts.
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import podsecurity
from sidecarsets.validation.podsecurity import BASELINE, PRIVILEGED, RESTRICTED
from tests.kube import builders

COMPLIANT = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def ss(*containers: dict[str, Any], **spec: Any) -> SidecarSet:
    return SidecarSet.from_object(builders.sidecarset("mesh", containers=list(containers), **spec))


def proxy(security: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    extra = {"securityContext": security} if security is not None else {}
    return builders.container("proxy", "proxy:1", **extra, **fields)


def reasons(s: SidecarSet, level: str) -> list[str]:
    return [v.reason for v in podsecurity.violations(s, level)]


def test_a_restricted_sidecar_passes_every_level() -> None:
    s = ss(proxy(COMPLIANT))
    assert reasons(s, RESTRICTED) == [] and reasons(s, BASELINE) == [] and reasons(s, PRIVILEGED) == []


def test_a_sidecar_that_sets_nothing_is_baseline_but_not_restricted() -> None:
    s = ss(proxy())
    assert reasons(s, BASELINE) == []
    assert reasons(s, RESTRICTED) == [
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "runAsNonRoot != true",
        "seccompProfile",
    ]
    details = {v.reason: v.detail for v in podsecurity.violations(s, RESTRICTED)}
    assert details["allowPrivilegeEscalation != false"] == (
        'container "proxy" must set securityContext.allowPrivilegeEscalation=false'
    )
    assert details["runAsNonRoot != true"] == 'pod or container "proxy" must set securityContext.runAsNonRoot=true'


@pytest.mark.parametrize(
    ("change", "level", "reason"),
    [
        ({"privileged": True}, BASELINE, "privileged"),
        ({"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}, BASELINE, "non-default capabilities"),
        ({"capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}, RESTRICTED, "unrestricted capabilities"),
        ({"runAsUser": 0}, RESTRICTED, "runAsUser=0"),
        ({"runAsNonRoot": False}, RESTRICTED, "runAsNonRoot != true"),
        ({"seccompProfile": {"type": "Unconfined"}}, BASELINE, "seccompProfile"),
        ({"procMount": "Unmasked"}, BASELINE, "procMount"),
        ({"seLinuxOptions": {"type": "spc_t"}}, BASELINE, "seLinuxOptions"),
        ({"appArmorProfile": {"type": "Unconfined"}}, BASELINE, "forbidden AppArmor profile"),
        ({"windowsOptions": {"hostProcess": True}}, BASELINE, "hostProcess"),
        ({"allowPrivilegeEscalation": True}, RESTRICTED, "allowPrivilegeEscalation != false"),
    ],
)
def test_each_container_check(change: dict[str, Any], level: str, reason: str) -> None:
    s = ss(proxy({**COMPLIANT, **change}))
    assert reasons(s, level) == [reason]
    if level == RESTRICTED:
        assert reasons(s, BASELINE) == []


def test_checks_of_ports_probes_volumes_and_annotations() -> None:
    s = ss(proxy(COMPLIANT, ports=[{"containerPort": 15001, "hostPort": 15001}]))
    assert reasons(s, BASELINE) == ["hostPort"]
    s = ss(proxy(COMPLIANT, readinessProbe={"httpGet": {"path": "/", "port": 1, "host": "10.0.0.1"}}))
    assert reasons(s, BASELINE) == ["probe or lifecycle host"]
    mounted = proxy(COMPLIANT, volumeMounts=[{"name": "sock", "mountPath": "/var/run"}])
    s = ss(mounted, volumes=[{"name": "sock", "hostPath": {"path": "/var/run"}}])
    assert reasons(s, BASELINE) == ["hostPath volumes"]
    assert reasons(s, RESTRICTED) == ["restricted volume types"]
    unmounted = ss(proxy(COMPLIANT), volumes=[{"name": "sock", "hostPath": {"path": "/var/run"}}])
    assert reasons(unmounted, BASELINE) == [], "a volume no sidecar mounts never reaches a pod"
    apparmor = [{"annotations": {"container.apparmor.security.beta.kubernetes.io/proxy": "unconfined"}}]
    s = ss(proxy(COMPLIANT), patchPodMetadata=apparmor)
    assert reasons(s, BASELINE) == ["forbidden AppArmor profile"]


def test_init_containers_are_checked_too() -> None:
    s = SidecarSet.from_object(
        builders.sidecarset(
            "mesh", containers=[proxy(COMPLIANT)], init_containers=[builders.container("init", "init:1")]
        )
    )
    assert "allowPrivilegeEscalation != false" in reasons(s, RESTRICTED)


def test_namespace_labels_read_as_the_api_server_reads_them() -> None:
    label = podsecurity.LABEL
    assert podsecurity.namespace_policy({}) == {"enforce": PRIVILEGED, "warn": PRIVILEGED, "audit": PRIVILEGED}
    assert podsecurity.namespace_policy({label + "enforce": "baseline"})["warn"] == BASELINE, "warn follows enforce"
    both = podsecurity.namespace_policy({label + "enforce": "baseline", label + "warn": "restricted"})
    assert (both["enforce"], both["warn"]) == (BASELINE, RESTRICTED)
    assert podsecurity.namespace_policy({label + "enforce": "bogus"})["enforce"] == RESTRICTED, "fails closed"
    assert podsecurity.namespace_policy({label + "warn": "bogus"})["warn"] == PRIVILEGED, "fails open"


def test_findings_take_the_strictest_mode_violated_in_each_selected_namespace() -> None:
    label = podsecurity.LABEL
    namespaces = {
        "open": {},
        "base": {label + "enforce": "baseline"},
        "strict": {label + "enforce": "restricted"},
        "warned": {label + "enforce": "baseline", label + "warn": "restricted"},
        "audited": {label + "audit": "restricted"},
        "kube-system": {label + "enforce": "restricted"},
    }
    found = podsecurity.findings(ss(proxy()), namespaces, skip=("kube-system",))
    assert [(f.namespace, f.mode, f.level) for f in found] == [
        ("audited", "audit", RESTRICTED),
        ("strict", "enforce", RESTRICTED),
        ("warned", "warn", RESTRICTED),
    ]
    shop_only = ss(proxy(), namespace="strict")
    assert [f.namespace for f in podsecurity.findings(shop_only, namespaces)] == ["strict"]
    assert podsecurity.findings(ss(proxy(COMPLIANT)), namespaces) == []


def test_warnings_and_the_condition_name_namespaces_and_checks() -> None:
    label = podsecurity.LABEL
    namespaces = {f"team-{k:02}": {label + "enforce": "restricted"} for k in range(12)}
    found = podsecurity.findings(ss(proxy({**COMPLIANT, "runAsUser": 0})), namespaces)
    [warning] = podsecurity.warnings(found)
    assert warning.startswith('PodSecurity "restricted" (enforce) in namespaces team-00, team-01')
    assert "and 2 more: pods with these sidecars would be refused: runAsUser=0" in warning
    condition = podsecurity.condition(found)
    assert (condition["type"], condition["status"], condition["reason"]) == ("PodSecurity", "False", "Violations")
    assert condition["message"].startswith("12 selected namespace(s)")
    assert (
        'team-00 (enforce restricted): runAsUser=0 (container "proxy" must not set runAsUser=0)' in condition["message"]
    )
    assert condition["message"].endswith("; and 2 more namespaces")
    assert podsecurity.condition([])["status"] == "True"
