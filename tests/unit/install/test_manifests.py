"""The install manifests under config/ keep the contract the manager and its users rely on.

config/default is kept simple on purpose (kustomizations that only list `resources`), so this
module renders it by following those lists, with no kubectl; tests/e2e/test_install_e2e.py checks
that `kubectl kustomize` renders exactly the same objects and that the API server accepts them.

Where a value is shared with the manager (flag names and defaults, webhook paths, label names) the
check goes through the manager's own code: the Deployment's args are parsed by the real
`sidecarctl run` parser, and the webhook selectors are compared with the injection policy.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from injector.engine import eligibility
from injector.policy import params
from sidecarctl.cli import main as cli
from sidecarctl.cli import runcmd
from sidecarsets.spec import names, selectors
from sidecarsets.validation import validate_sidecarset

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "config"
MANAGER_NS = names.DEFAULT_MANAGER_NAMESPACE
SA = "sidecarctl"
NAME_LABEL = ("app.kubernetes.io/name", "sidecarctl")
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources"}

Obj = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Rendering config/default without kubectl


def load_docs(path: Path) -> list[Obj]:
    return [d for d in yaml.load_all(path.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader) if d]


def render(directory: Path) -> list[Obj]:
    """The objects a resources-only kustomization tree produces, in listing order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    extra = set(kustomization) - KUSTOMIZATION_KEYS
    assert not extra, f"{directory}/kustomization.yaml uses {sorted(extra)}: this renderer only follows resources"
    out: list[Obj] = []
    for entry in kustomization.get("resources") or []:
        target = (directory / entry).resolve()
        out.extend(render(target) if target.is_dir() else load_docs(target))
    return out


def key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"])


@pytest.fixture(scope="module")
def default() -> dict[tuple[str, str, str], Obj]:
    objs = render(CONFIG / "default")
    keyed = {key(o): o for o in objs}
    assert len(keyed) == len(objs), "an object is listed twice"
    return keyed


def one(objs: Mapping[tuple[str, str, str], Obj], kind: str, name: str, namespace: str = "") -> Obj:
    found = objs.get((kind, namespace, name))
    assert found is not None, f"no {kind} {namespace + '/' if namespace else ''}{name}"
    return found


def manager_args(deployment: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The Deployment's manager command parsed by the real `sidecarctl run` parser, env as in the pod."""
    return parse_run(manager_container(deployment), deployment["metadata"]["namespace"], monkeypatch)


def parse_run(container: Mapping[str, Any], namespace: str, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    assert container["command"] == ["sidecarctl", "run"]
    for var in [v for v in os.environ if v.startswith(runcmd.ENV_PREFIX)]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("POD_NAMESPACE", namespace)  # what the fieldRef gives
    for env in container.get("env") or []:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    parser = argparse.ArgumentParser(prog="sidecarctl")
    sub = parser.add_subparsers(dest="command", required=True)
    runcmd.add_run(sub)
    return parser.parse_args([container["command"][1], *container.get("args", [])])


def manager_container(deployment: Mapping[str, Any]) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["manager"]
    found: Obj = containers[0]
    return found


def port_number(container: Mapping[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port]
    assert len(numbers) == 1, f"container port {port!r} is not defined once"
    return int(numbers[0])


# ---------------------------------------------------------------------------------------------
# Files


def yaml_files() -> Iterator[Path]:
    for path in sorted(CONFIG.rglob("*.yaml")):
        if "crd" not in path.relative_to(CONFIG).parts:
            yield path


@pytest.mark.parametrize("path", list(yaml_files()), ids=lambda p: str(p.relative_to(CONFIG)))
def test_every_file_says_what_it_is_for_in_a_leading_comment(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    comment = []
    for line in lines:
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    assert len(" ".join(comment)) > 40, f"{path.relative_to(REPO)} does not open with a comment saying its purpose"


def test_default_holds_exactly_the_install_objects(default: dict[tuple[str, str, str], Obj]) -> None:
    assert set(default) == {
        ("CustomResourceDefinition", "", f"{names.PLURAL}.{names.GROUP}"),
        ("CustomResourceDefinition", "", names.NAMESPACED_CRD_NAME),
        ("ClusterRole", "", "sidecarctl-namespacedsidecarsets-edit"),
        ("ClusterRole", "", "sidecarctl-namespacedsidecarsets-view"),
        ("Namespace", "", MANAGER_NS),
        ("ServiceAccount", MANAGER_NS, SA),
        ("ClusterRole", "", SA),
        ("ClusterRoleBinding", "", SA),
        ("Role", MANAGER_NS, SA),
        ("RoleBinding", MANAGER_NS, SA),
        ("Deployment", MANAGER_NS, "sidecarctl"),
        ("PodDisruptionBudget", MANAGER_NS, "sidecarctl"),
        ("Service", MANAGER_NS, "sidecarctl-webhook"),
        ("Service", MANAGER_NS, "sidecarctl-metrics"),
        ("ClusterRole", "", "sidecarctl-metrics-reader"),
        ("MutatingWebhookConfiguration", "", names.MUTATING_WEBHOOK_CONFIG),
        ("ValidatingWebhookConfiguration", "", names.VALIDATING_WEBHOOK_CONFIG),
    }
    for (kind, _, name), obj in default.items():
        if kind != "CustomResourceDefinition":
            labels = obj["metadata"].get("labels") or {}
            assert labels.get(NAME_LABEL[0]) == NAME_LABEL[1], f"{kind} {name} lacks {NAME_LABEL[0]}"
    ns = one(default, "Namespace", MANAGER_NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# ---------------------------------------------------------------------------------------------
# RBAC


def rules(role: Mapping[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """(apiGroup, resource, verb, resourceNames) for every combination a role grants."""
    out: set[tuple[str, str, str, tuple[str, ...]]] = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb, tuple(rule.get("resourceNames") or ())))
    return out


def test_rbac_has_no_wildcards_and_is_bound_to_the_manager(default: dict[tuple[str, str, str], Obj]) -> None:
    for kind, ns in (("ClusterRole", ""), ("Role", MANAGER_NS)):
        role = one(default, kind, SA, ns)
        for group, resource, verb, resource_names in rules(role):
            for value in (group, resource, verb, *resource_names):
                assert "*" not in value, f"{kind} grants a wildcard: {(group, resource, verb, resource_names)}"
            assert verb not in ("escalate", "bind", "impersonate", "deletecollection")
    for kind, ns, role_kind in (("ClusterRoleBinding", "", "ClusterRole"), ("RoleBinding", MANAGER_NS, "Role")):
        binding = one(default, kind, SA, ns)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": SA}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA, "namespace": MANAGER_NS}]


def test_rbac_grants_the_manager_s_calls_and_names_match_its_flags(
    default: dict[tuple[str, str, str], Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = manager_args(one(default, "Deployment", "sidecarctl", MANAGER_NS), monkeypatch)
    assert rules(one(default, "ClusterRole", SA)) == {
        ("", "namespaces", "list", ()),
        ("", "namespaces", "watch", ()),
        ("", "pods", "list", ()),
        ("", "pods", "watch", ()),
        ("", "pods", "patch", ()),
        ("", "pods", "get", ()),  # patchPodMetadata re-applied on upgrade reads the pod first
        ("", "pods/status", "patch", ()),
        ("", "pods/resize", "patch", ()),  # sidecar CPU and memory changed in place
        ("", "events", "create", ()),
        ("", "events", "patch", ()),
        ("authentication.k8s.io", "tokenreviews", "create", ()),  # --metrics-secure
        ("authorization.k8s.io", "subjectaccessreviews", "create", ()),
        (names.GROUP, names.PLURAL, "list", ()),
        (names.GROUP, names.PLURAL, "watch", ()),
        (names.GROUP, f"{names.PLURAL}/status", "patch", ()),
        (names.GROUP, names.NAMESPACED_PLURAL, "list", ()),
        (names.GROUP, names.NAMESPACED_PLURAL, "watch", ()),
        (names.GROUP, f"{names.NAMESPACED_PLURAL}/status", "patch", ()),
        # a NamespacedSidecarSet's revisions live in its own namespace
        *(("apps", "controllerrevisions", v, ()) for v in ("list", "get", "create", "patch", "delete")),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get", (args.mutating_config,)),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch", (args.mutating_config,)),
        # the policy sync watches the pod webhook's configuration by name (its matchCondition)
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "list", (args.mutating_config,)),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "watch", (args.mutating_config,)),
        *(
            ("admissionregistration.k8s.io", resource, verb, ())
            for resource in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
            for verb in ("list", "watch", "get", "create", "update", "delete")
        ),
        # the API server lets a policy name a paramKind only to whoever may get all of the kind
        ("", params.PLURAL, "get", ()),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "get", (args.validating_config,)),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch", (args.validating_config,)),
        # caBundle of the CRD's conversion webhook
        ("apiextensions.k8s.io", "customresourcedefinitions", "get", (args.conversion_crd,)),
        ("apiextensions.k8s.io", "customresourcedefinitions", "patch", (args.conversion_crd,)),
    }
    assert args.conversion_crd == one(default, "CustomResourceDefinition", names.CRD_NAME)["metadata"]["name"]
    assert rules(one(default, "Role", SA, MANAGER_NS)) == {
        ("coordination.k8s.io", "leases", "create", ()),
        ("coordination.k8s.io", "leases", "get", (args.lease_name,)),
        ("coordination.k8s.io", "leases", "update", (args.lease_name,)),
        *(("apps", "controllerrevisions", v, ()) for v in ("list", "watch", "get", "create", "patch", "delete")),
        ("", "secrets", "create", ()),
        ("", "secrets", "get", (args.secret_name,)),
        ("", "secrets", "update", (args.secret_name,)),
        ("", "configmaps", "create", ()),  # dry-run only: the policy support probe
        # the policies' parameter objects (injector.policy.params), here only
        *(("", params.PLURAL, v, ()) for v in ("list", "watch", "get", "create", "update", "delete")),
    }
    assert args.namespace == MANAGER_NS


# ---------------------------------------------------------------------------------------------
# The manager workload


def test_deployment_runs_the_manager_self_signed_with_probes_and_ports(
    default: dict[tuple[str, str, str], Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = one(default, "Deployment", "sidecarctl", MANAGER_NS)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = manager_container(deployment)
    args = manager_args(deployment, monkeypatch)
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, "rollouts must not drop below 2 replicas"
    assert selectors.matches(spec["selector"], spec["template"]["metadata"]["labels"])
    assert pod["serviceAccountName"] == SA

    assert args.self_signed is True and args.sync_ca_bundle is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert args.cert_dir in mounts, "--cert-dir must be a mounted volume (the root filesystem is read-only)"
    assert "emptyDir" in volumes[mounts[args.cert_dir]]
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]

    webhook_port = int(args.webhook_bind.rpartition(":")[2])
    probe_port = int(args.probe_bind.rpartition(":")[2])
    assert (webhook_port, probe_port) == (9443, 8080)
    declared = {p["containerPort"] for p in container["ports"]}
    assert {webhook_port, probe_port} <= declared
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert port_number(container, get["port"]) == probe_port
        assert get.get("scheme", "HTTP") == "HTTP"

    # SIGTERM comes after preStop; the manager then drains for up to 5 s and stops its tasks within 10 s.
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + 15


def test_deployment_runs_unprivileged_with_a_read_only_root(default: dict[tuple[str, str, str], Obj]) -> None:
    deployment = one(default, "Deployment", "sidecarctl", MANAGER_NS)
    pod = deployment["spec"]["template"]["spec"]
    sc = manager_container(deployment)["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for ctx in (pod["securityContext"], sc):
        assert isinstance(ctx["runAsUser"], int) and ctx["runAsUser"] > 0, "numeric non-root UID"
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc.get("privileged", False) is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


def _quantity(value: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def test_deployment_has_resources_spread_and_a_disruption_budget(default: dict[tuple[str, str, str], Obj]) -> None:
    deployment = one(default, "Deployment", "sidecarctl", MANAGER_NS)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    resources = manager_container(deployment)["resources"]
    for res in ("cpu", "memory"):
        assert _quantity(resources["requests"][res]) <= _quantity(resources["limits"][res])
    terms = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert any(
        t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        and selectors.matches(t["podAffinityTerm"]["labelSelector"], pod_labels)
        for t in terms
    )
    pdb = one(default, "PodDisruptionBudget", "sidecarctl", MANAGER_NS)
    assert pdb["spec"]["minAvailable"] == 1
    assert selectors.matches(pdb["spec"]["selector"], pod_labels)


def test_service_routes_443_to_the_webhook_port_and_is_in_the_serving_cert(
    default: dict[tuple[str, str, str], Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = one(default, "Deployment", "sidecarctl", MANAGER_NS)
    args = manager_args(deployment, monkeypatch)
    service = one(default, "Service", args.service_name, MANAGER_NS)
    assert selectors.matches(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    assert port_number(manager_container(deployment), port["targetPort"]) == 9443
    # The self-signed certificate names <service>.<namespace>.svc, which the API server dials.
    assert args.namespace == service["metadata"]["namespace"]


# ---------------------------------------------------------------------------------------------
# Webhook configurations


def _webhook(default: dict[tuple[str, str, str], Obj], kind: str, name: str) -> Obj:
    config = one(default, kind, name)
    (hook,) = config["webhooks"]
    found: Obj = hook
    return found


def test_injection_webhook_settings(default: dict[tuple[str, str, str], Obj]) -> None:
    hook = _webhook(default, "MutatingWebhookConfiguration", names.MUTATING_WEBHOOK_CONFIG)
    assert hook["name"] == names.MUTATING_WEBHOOK_NAME
    assert hook["clientConfig"] == {
        "service": {"name": "sidecarctl-webhook", "namespace": MANAGER_NS, "path": names.INJECT_PATH, "port": 443}
    }, "caBundle must be absent: the manager fills it and `kubectl apply` must leave it alone"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"]["matchLabels"] == {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert (expr["key"], expr["operator"]) == (names.NS_NAME_LABEL, "NotIn")
    assert set(expr["values"]) == names.SYSTEM_NAMESPACES | {MANAGER_NS}
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": names.POD_INJECT_LABEL, "operator": "NotIn", "values": ["false"]}]
    }
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["timeoutSeconds"] == 10
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]


def test_namespaced_sidecarsets_roles_aggregate_to_the_built_in_roles(default: dict[tuple[str, str, str], Obj]) -> None:
    edit = one(default, "ClusterRole", "sidecarctl-namespacedsidecarsets-edit")
    view = one(default, "ClusterRole", "sidecarctl-namespacedsidecarsets-view")
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in edit["metadata"]["labels"].items() if k.startswith(aggregate) and v == "true"} == {
        aggregate + "admin",
        aggregate + "edit",
    }
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(aggregate) and v == "true"} == {
        aggregate + "view"
    }
    writes = {"create", "update", "patch", "delete"}
    assert writes <= {verb for _, resource, verb, _ in rules(edit) if resource == names.NAMESPACED_PLURAL}
    assert {verb for _, _, verb, _ in rules(view)} == {"get", "list", "watch"}


def test_validation_webhook_settings(default: dict[tuple[str, str, str], Obj]) -> None:
    hook = _webhook(default, "ValidatingWebhookConfiguration", names.VALIDATING_WEBHOOK_CONFIG)
    assert hook["clientConfig"] == {
        "service": {"name": "sidecarctl-webhook", "namespace": MANAGER_NS, "path": names.VALIDATE_PATH, "port": 443}
    }
    assert hook["rules"] == [
        {
            "apiGroups": [names.GROUP],
            "apiVersions": [names.VERSION, names.VERSION_V1BETA1],
            "operations": ["CREATE", "UPDATE"],
            "resources": [names.PLURAL],
            "scope": "Cluster",
        },
        {
            "apiGroups": [names.GROUP],
            "apiVersions": [names.VERSION_V1BETA1],
            "operations": ["CREATE", "UPDATE"],
            "resources": [names.NAMESPACED_PLURAL],
            "scope": "Namespaced",
        },
    ]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 10
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]


def test_conversion_webhook_is_the_manager_s_service(
    default: dict[tuple[str, str, str], Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = manager_args(one(default, "Deployment", "sidecarctl", MANAGER_NS), monkeypatch)
    conversion = one(default, "CustomResourceDefinition", names.CRD_NAME)["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook" and conversion["webhook"]["conversionReviewVersions"] == ["v1"]
    # The Service the serving certificate names, as for both webhook configurations; caBundle the manager's.
    assert conversion["webhook"]["clientConfig"] == {
        "service": {"name": args.service_name, "namespace": MANAGER_NS, "path": names.CONVERT_PATH, "port": 443}
    }
    one(default, "Service", args.service_name, MANAGER_NS)


NAMESPACE_NAMES = st.one_of(
    st.sampled_from(sorted(names.SYSTEM_NAMESPACES | {MANAGER_NS, "default", "shop"})),
    st.from_regex(r"\A[a-z][a-z0-9-]{0,10}[a-z0-9]\Z"),
)
LABEL_VALUES = st.sampled_from(["enabled", "disabled", "true", "false", "", "Enabled"])


@given(
    namespace=NAMESPACE_NAMES,
    ns_labels=st.dictionaries(st.sampled_from([names.NS_INJECTION_LABEL, "team", "istio-injection"]), LABEL_VALUES),
    pod_labels=st.dictionaries(
        st.sampled_from([names.POD_INJECT_LABEL, "app", names.POD_INJECTED_LABEL]), LABEL_VALUES
    ),
)
def test_the_api_server_sends_exactly_the_pods_the_injection_policy_accepts(
    default: dict[tuple[str, str, str], Obj], namespace: str, ns_labels: dict[str, str], pod_labels: dict[str, str]
) -> None:
    hook = _webhook(default, "MutatingWebhookConfiguration", names.MUTATING_WEBHOOK_CONFIG)
    # The API server sets kubernetes.io/metadata.name on every namespace itself.
    sent = selectors.matches(hook["namespaceSelector"], {**ns_labels, names.NS_NAME_LABEL: namespace})
    sent = sent and selectors.matches(hook["objectSelector"], pod_labels)
    reason = eligibility.skip_reason(
        {"metadata": {"labels": pod_labels}},
        namespace=namespace,
        namespace_labels=ns_labels,
        operation="CREATE",
        manager_namespace=MANAGER_NS,
        require_namespace_label=True,
    )
    assert sent == (reason is None), f"webhook sends={sent}, policy says {reason!r}"


# ---------------------------------------------------------------------------------------------
# cert-manager overlay (its rendering and the API server's view are in tests/e2e/test_install_e2e.py)


def test_certmanager_chain_and_deployment_patch_fit_together(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = load_docs(CONFIG / "certmanager" / "issuer.yaml") + load_docs(CONFIG / "certmanager" / "certificate.yaml")
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    assert all(d["apiVersion"] == "cert-manager.io/v1" and d["metadata"]["namespace"] == MANAGER_NS for d in docs)
    (ca_cert,) = [c for c in certs.values() if c["spec"].get("isCA")]
    (serving,) = [c for c in certs.values() if not c["spec"].get("isCA")]
    assert "selfSigned" in issuers[ca_cert["spec"]["issuerRef"]["name"]]["spec"]
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    assert f"sidecarctl-webhook.{MANAGER_NS}.svc" in serving["spec"]["dnsNames"]

    patch = load_docs(CONFIG / "certmanager" / "deployment_patch.yaml")[0]
    base = render(CONFIG / "default")
    deployment = next(o for o in base if o["kind"] == "Deployment")
    container = manager_container(patch)
    base_container = manager_container(deployment)
    args = parse_run({**base_container, **container}, deployment["metadata"]["namespace"], monkeypatch)
    assert args.self_signed is False, "cert-manager mode must not also issue its own certificates"
    assert args.sync_ca_bundle is False, "cainjector keeps caBundle; two writers would fight"
    (volume,) = patch["spec"]["template"]["spec"]["volumes"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == args.cert_dir
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    assert volume["emptyDir"] is None, "the strategic merge patch must drop the emptyDir"

    ops: list[Obj] = yaml.safe_load((CONFIG / "certmanager" / "cainjection_patch.yaml").read_text(encoding="utf-8"))
    assert [op["path"] for op in ops] == ["/metadata/annotations"]
    assert ops[0]["value"] == {"cert-manager.io/inject-ca-from": f"{MANAGER_NS}/{serving['metadata']['name']}"}


# ---------------------------------------------------------------------------------------------
# Samples


def samples() -> list[Obj]:
    return [d for p in sorted((CONFIG / "samples").glob("*.yaml")) for d in load_docs(p)]


def test_sample_sidecarsets_are_valid_together() -> None:
    sets = [d for d in samples() if d["kind"] == "SidecarSet"]
    assert {s["metadata"]["name"] for s in sets} == {"mesh-proxy", "log-agent"}
    for s in sets:
        assert s["apiVersion"] == names.API_VERSION
        errors = validate_sidecarset(s, others=[o for o in sets if o is not s])
        assert errors == [], f"{s['metadata']['name']}: {errors}"
    mesh = next(s for s in sets if s["metadata"]["name"] == "mesh-proxy")
    assert [c["name"] for c in mesh["spec"]["initContainers"]] == ["proxy-init"]
    assert [c["name"] for c in mesh["spec"]["containers"]] == ["proxy"]
    assert mesh["spec"]["updateStrategy"]["maxUnavailable"] == "20%"


def test_sample_namespaces_exist_in_file_order_before_their_objects() -> None:
    seen: set[str] = set()
    for doc in samples():
        if doc["kind"] == "Namespace":
            seen.add(doc["metadata"]["name"])
        elif doc["metadata"].get("namespace"):
            assert doc["metadata"]["namespace"] in seen, f"{doc['kind']} comes before its namespace"
    demo = next(d for d in samples() if d["kind"] == "Namespace")
    assert demo["metadata"]["labels"][names.NS_INJECTION_LABEL] == names.NS_INJECTION_ENABLED


def test_demo_deployment_gets_both_sample_sidecarsets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = samples()
    ns = next(d for d in docs if d["kind"] == "Namespace")
    out = tmp_path / "injected.yaml"
    argv = ["inject", "-f", str(CONFIG / "samples" / "05-demo-deployment.yaml"), "-o", str(out)]
    argv += ["--sidecarset", str(CONFIG / "samples" / "03-mesh-proxy-sidecarset.yaml")]
    argv += ["--sidecarset", str(CONFIG / "samples" / "04-log-agent-sidecarset.yaml")]
    argv += ["--namespace-labels", f"{ns['metadata']['name']}:{names.NS_INJECTION_LABEL}={names.NS_INJECTION_ENABLED}"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    (deployment,) = load_docs(out)
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["proxy-init"]
    assert [c["name"] for c in pod["containers"]] == ["proxy", "app", "log-agent"]
    app = next(c for c in pod["containers"] if c["name"] == "app")
    agent = next(c for c in pod["containers"] if c["name"] == "log-agent")
    assert app["volumeMounts"][0] in agent["volumeMounts"], "shareVolumePolicy mounts the app's volumes"
    app_env = {e["name"]: e for e in app["env"]}
    for env_name in ("SERVICE_NAME", "LOG_LEVEL"):
        assert app_env[env_name] in agent["env"], f"transferEnv copies {env_name}"
    config_volume = next(v for v in pod["volumes"] if "configMap" in v)
    config_maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert [(c["metadata"]["name"], c["metadata"]["namespace"]) for c in config_maps] == [
        (config_volume["configMap"]["name"], deployment["metadata"]["namespace"])
    ], "the proxy's config volume must resolve in the demo namespace"


def test_the_metrics_reader_role_grants_get_on_metrics_only(default: dict[tuple[str, str, str], Obj]) -> None:
    reader = one(default, "ClusterRole", "sidecarctl-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_metrics_are_served_secure_on_their_own_port(
    default: dict[tuple[str, str, str], Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = one(default, "Deployment", "sidecarctl", MANAGER_NS)
    args = manager_args(deployment, monkeypatch)
    assert args.metrics_secure is True and port_number(manager_container(deployment), "metrics") == 8443
    assert args.metrics_bind.endswith(":8443")
    service = one(default, "Service", "sidecarctl-metrics", MANAGER_NS)
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert "sidecarctl-metrics.sidecarctl-system.svc" in args.extra_dns, "the serving certificate names the Service"
