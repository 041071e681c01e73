"""The install manifests as kubectl and the real API server see them.

- `kubectl kustomize` renders config/default exactly as tests/unit/install/test_manifests.py reads it, and
  config/certmanager as that plus the cert-manager objects and patches;
- `kubectl apply -k ... --dry-run=server` is accepted for both. This API server has no cert-manager,
  so for config/certmanager the test installs stand-in CRDs for cert-manager.io/v1 Issuer and
  Certificate (namespaced, schema open): that checks the group, version, kinds and scoping that
  kubectl and the API server care about; the fields are checked against each other in
  tests/unit/install/test_manifests.py. The stand-ins are removed afterwards;
- the manager's pod passes the Pod Security "restricted" profile its namespace enforces;
- `kubectl apply -f config/samples/ --dry-run=server` is accepted, SidecarSets through the real
  validating webhook, and `kubectl get sidecarsets` shows the Kruise printer columns.
"""

from __future__ import annotations

import copy
import secrets
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kuberuntime import api, kubeapi, kubeconfig
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, kubectl, make_sidecarset
from tests.kube import builders, helm
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import REPO, ControlPlane
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import MANAGER_NS, RunningManager, ensure_namespace
from tests.unit.install.test_manifests import key, manager_container, parse_run, render

CONFIG = REPO / "config"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CERT_MANAGER_KINDS = ("Issuer", "Certificate")

Obj = dict[str, Any]


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed ({proc.returncode}):\n{proc.stderr}"
    return proc.stdout


def kustomize(cp: ControlPlane, directory: Path) -> list[Obj]:
    return [d for d in yaml.load_all(ok(kubectl(cp, "kustomize", str(directory))), yaml.CSafeLoader) if d]


def keyed(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {key(o): o for o in objs}


# ---------------------------------------------------------------------------------------------
# Rendering


def test_kubectl_renders_config_default_as_its_files_say(control_plane: ControlPlane) -> None:
    by_kubectl = keyed(kustomize(control_plane, CONFIG / "default"))
    by_files = keyed(render(CONFIG / "default"))
    assert set(by_kubectl) == set(by_files)
    for k, obj in by_files.items():
        assert by_kubectl[k] == obj, f"kubectl renders {k} differently"


def test_certmanager_overlay_swaps_certificates_and_drops_the_unused_rules(control_plane: ControlPlane) -> None:
    base = keyed(kustomize(control_plane, CONFIG / "default"))
    overlay = keyed(kustomize(control_plane, CONFIG / "certmanager"))
    added = {k for k in overlay if k[0] in CERT_MANAGER_KINDS}
    assert {(k[0], k[2]) for k in added} == {
        ("Issuer", "sidecarctl-selfsigned"),
        ("Issuer", "sidecarctl-ca"),
        ("Certificate", "sidecarctl-ca"),
        ("Certificate", "sidecarctl-serving-cert"),
    }
    assert set(overlay) - added == set(base)
    changed = {k for k in base if overlay[k] != base[k]}
    deployment_key = ("Deployment", MANAGER_NS, "sidecarctl")
    assert changed == {
        deployment_key,
        ("ClusterRole", "", "sidecarctl"),
        ("Role", MANAGER_NS, "sidecarctl"),
        ("MutatingWebhookConfiguration", "", names.MUTATING_WEBHOOK_CONFIG),
        ("ValidatingWebhookConfiguration", "", names.VALIDATING_WEBHOOK_CONFIG),
        ("CustomResourceDefinition", "", names.CRD_NAME),
    }

    pod = overlay[deployment_key]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["sidecarctl", "run"]
    assert container["args"] == ["--cert-dir=/var/run/sidecarctl/certs", "--no-sync-ca-bundle"]
    certs = next(v for v in pod["volumes"] if v["name"] == "certs")
    assert certs == {"name": "certs", "secret": {"secretName": "sidecarctl-webhook-tls", "defaultMode": 0o440}}
    # Apart from args and the cert volume, the pod is the default one.
    expected = copy.deepcopy(base[deployment_key])
    base_pod = expected["spec"]["template"]["spec"]
    base_pod["containers"][0]["args"] = container["args"]
    base_pod["containers"][0]["volumeMounts"][0]["readOnly"] = True
    base_pod["volumes"][0] = certs
    assert overlay[deployment_key] == expected

    for kind, name in (
        ("MutatingWebhookConfiguration", names.MUTATING_WEBHOOK_CONFIG),
        ("ValidatingWebhookConfiguration", names.VALIDATING_WEBHOOK_CONFIG),
    ):
        got, was = overlay[(kind, "", name)], base[(kind, "", name)]
        assert got["metadata"]["annotations"] == {
            **(was["metadata"].get("annotations") or {}),
            "cert-manager.io/inject-ca-from": f"{MANAGER_NS}/sidecarctl-serving-cert",
        }
        assert got["webhooks"] == was["webhooks"]
    crd_key = ("CustomResourceDefinition", "", names.CRD_NAME)
    assert overlay[crd_key]["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{MANAGER_NS}/sidecarctl-serving-cert"
    }, "cainjector keeps the conversion webhook's caBundle"
    assert overlay[crd_key]["spec"] == base[crd_key]["spec"]

    cluster_rules = overlay[("ClusterRole", "", "sidecarctl")]["rules"]
    role_rules = overlay[("Role", MANAGER_NS, "sidecarctl")]["rules"]
    # Without caBundle sync: no validating webhook configuration, no CRD, no Secrets. The mutating
    # configuration stays (the policy sync keeps its matchCondition), as do the policies.
    dropped = {"validatingwebhookconfigurations", "customresourcedefinitions"}
    assert not [r for r in cluster_rules if dropped & set(r["resources"])]
    assert not [r for r in role_rules if "secrets" in r["resources"]]
    base_cluster = base[("ClusterRole", "", "sidecarctl")]["rules"]
    base_role = base[("Role", MANAGER_NS, "sidecarctl")]["rules"]
    assert cluster_rules == [r for r in base_cluster if not dropped & set(r["resources"])]
    assert role_rules == [r for r in base_role if "secrets" not in r["resources"]]


def test_recreate_missed_overlay_adds_the_flag_and_only_the_eviction_rule(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = keyed(kustomize(control_plane, CONFIG / "default"))
    overlay = keyed(kustomize(control_plane, CONFIG / "recreate-missed"))
    added = set(overlay) - set(base)
    assert added == {
        ("ClusterRole", "", "sidecarctl-recreate-missed"),
        ("ClusterRoleBinding", "", "sidecarctl-recreate-missed"),
    }
    assert overlay[("ClusterRole", "", "sidecarctl-recreate-missed")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
    ]
    binding = overlay[("ClusterRoleBinding", "", "sidecarctl-recreate-missed")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sidecarctl", "namespace": MANAGER_NS}]
    deployment_key = ("Deployment", MANAGER_NS, "sidecarctl")
    changed = [k for k in base if k != deployment_key and base[k] != overlay[k]]
    assert not changed, f"the overlay changes more than the Deployment: {changed}"
    container = manager_container(overlay[deployment_key])
    assert container["args"] == [*manager_container(base[deployment_key])["args"], "--recreate-missed"]
    args = parse_run(container, MANAGER_NS, monkeypatch)
    assert args.recreate_missed is True
    # the two new objects are cluster-scoped: the API server accepts them as they are
    docs = "\n---\n".join(yaml.safe_dump(overlay[k]) for k in sorted(added))
    assert len(dry_run_apply(control_plane, "-f", "-", stdin=docs)) == 2


# ---------------------------------------------------------------------------------------------
# The API server's view


def dry_run_apply(cp: ControlPlane, *args: str, stdin: str | None = None) -> list[str]:
    out = ok(kubectl(cp, "apply", "--dry-run=server", *args, stdin=stdin))
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines and all(line.endswith("(server dry run)") for line in lines), out
    return lines


@dataclass
class Fresh:
    cp: ControlPlane
    kube: Kube


@pytest.fixture(scope="module")
def fresh(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[Fresh]:
    """A control plane of its own with only the CRD installed: a dry-run apply must meet the
    objects as a new install would, not the session manager's webhook configurations (which
    point at a URL and so cannot take the Service reference of config/webhook)."""
    cp = ControlPlane(bin_dir=control_plane.bin_dir, controller_manager=False).start()
    client = kubeapi.KubeClient(kubeconfig.load_config(str(cp.kubeconfig)))
    kube = Kube(aloop, client)
    try:
        ok(kubectl(cp, "apply", "-k", str(CONFIG / "crd")))
        # Not `kubectl wait --for=condition=Established`: right after the create the CRD may have no
        # status.conditions at all, which that command reports as an error instead of waiting.
        crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{names.CRD_NAME}"

        def established() -> bool:
            conditions = (kube.get(crd_path).get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

        eventually(established, timeout=30, what="the CRD Established")
        # Namespaced objects need their namespace to exist for a dry run (nothing is persisted).
        ensure_namespace(kube, MANAGER_NS)
        yield Fresh(cp, kube)
    finally:
        aloop.run(client.close())
        cp.stop()


def test_api_server_accepts_config_default(fresh: Fresh) -> None:
    lines = dry_run_apply(fresh.cp, "-k", str(CONFIG / "default"))
    assert len(lines) == len(render(CONFIG / "default"))


def _standin_crd(kind: str) -> Obj:
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io", "labels": {"sidecarctl.io/test": "cert-manager-stand-in"}},
        "spec": {
            "group": "cert-manager.io",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def cert_manager_standin(fresh: Fresh) -> Iterator[None]:
    kube = fresh.kube
    crds = [_standin_crd(kind) for kind in CERT_MANAGER_KINDS]
    for obj in crds:
        if kube.get_or_none(f"{CRD_PATH}/{obj['metadata']['name']}") is not None:
            pytest.fail(f"{obj['metadata']['name']} already exists; refusing to replace a real cert-manager CRD")
        kube.create(CRD_PATH, obj)
    try:

        def established() -> bool:
            for obj in crds:
                conds = (kube.get(f"{CRD_PATH}/{obj['metadata']['name']}").get("status") or {}).get("conditions")
                if not any(c["type"] == "Established" and c["status"] == "True" for c in conds or []):
                    return False
            return True

        eventually(established, timeout=30, what="stand-in cert-manager CRDs Established")
        yield
    finally:
        for obj in crds:
            kube.delete(f"{CRD_PATH}/{obj['metadata']['name']}")


def test_api_server_accepts_config_certmanager(fresh: Fresh, cert_manager_standin: None) -> None:
    def attempt() -> list[str] | None:
        # Discovery of the new group can lag its Established condition by a moment.
        proc = kubectl(fresh.cp, "apply", "--dry-run=server", "-k", str(CONFIG / "certmanager"))
        return proc.stdout.splitlines() if proc.returncode == 0 else None

    lines = eventually(attempt, timeout=20, interval=0.5, what="kubectl apply -k config/certmanager --dry-run=server")
    applied = {line.split()[0] for line in lines}
    assert {
        "issuer.cert-manager.io/sidecarctl-selfsigned",
        "issuer.cert-manager.io/sidecarctl-ca",
        "certificate.cert-manager.io/sidecarctl-serving-cert",
        "deployment.apps/sidecarctl",
    } <= applied


def _manager_pod(deployment: Obj, namespace: str) -> Obj:
    template = deployment["spec"]["template"]
    return builders.pod(
        "sidecarctl-psa", namespace=namespace, labels=template["metadata"]["labels"], **copy.deepcopy(template["spec"])
    )


def test_manager_pod_passes_the_restricted_pod_security_profile(kube: Kube, namespace: str) -> None:
    objs = keyed(render(CONFIG / "default"))
    ns_labels = objs[("Namespace", "", MANAGER_NS)]["metadata"]["labels"]
    enforce = {k: v for k, v in ns_labels.items() if k.startswith("pod-security.kubernetes.io/enforce")}
    assert enforce
    kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": enforce}})
    kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sidecarctl"}},
    )
    pod = _manager_pod(objs[("Deployment", MANAGER_NS, "sidecarctl")], namespace)
    kube.create(f"/api/v1/namespaces/{namespace}/pods", pod, dryRun="All")

    # The profile is really enforced here: one relaxed field and the same pod is refused.
    relaxed = copy.deepcopy(pod)
    relaxed["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(api.ApiError) as refused:
        kube.create(f"/api/v1/namespaces/{namespace}/pods", relaxed, dryRun="All")
    assert refused.value.status == 403 and "allowPrivilegeEscalation" in refused.value.message


# ---------------------------------------------------------------------------------------------
# Samples


def _validations(m: RunningManager) -> float:
    with urllib.request.urlopen(m.probe_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sidecarctl_admissions_total" and sample.labels == {
                "webhook": "validate",
                "result": "allowed",
            }:
                return float(sample.value)
    return 0.0


@pytest.fixture
def demo_namespace(control_plane: ControlPlane, kube: Kube) -> Iterator[str]:
    docs = [d for d in yaml.safe_load_all((CONFIG / "samples" / "01-demo-namespace.yaml").read_text()) if d]
    (ns,) = docs
    name = ns["metadata"]["name"]
    assert kube.get_or_none(f"/api/v1/namespaces/{name}") is None, f"namespace {name} exists already"
    ok(kubectl(control_plane, "apply", "-f", str(CONFIG / "samples" / "01-demo-namespace.yaml")))
    try:
        yield name
    finally:
        kube.delete(f"/api/v1/namespaces/{name}")


@pytest.mark.versions
def test_samples_are_accepted_by_the_api_server_and_the_validating_webhook(
    control_plane: ControlPlane, manager: RunningManager, demo_namespace: str
) -> None:
    before = _validations(manager)
    lines = dry_run_apply(control_plane, "-f", str(CONFIG / "samples"))
    applied = [line.split()[0] for line in lines]
    assert applied == [
        f"namespace/{demo_namespace}",
        "configmap/mesh-proxy-bootstrap",
        "sidecarset.sidecarctl.io/mesh-proxy",
        "sidecarset.sidecarctl.io/log-agent",
        "deployment.apps/shop",
    ]
    assert _validations(manager) - before == 2, "both SidecarSets went through /validate-sidecarset"


@pytest.mark.versions
def test_kubectl_get_sidecarsets_shows_kruise_printer_columns(
    control_plane: ControlPlane, kube: Kube, manager: RunningManager
) -> None:
    name = f"columns-{secrets.token_hex(3)}"
    kube.create(SS_PATH, make_sidecarset(name, f"nothing-{secrets.token_hex(3)}"))
    try:
        eventually(
            lambda: "matchedPods" in (kube.get(f"{SS_PATH}/{name}").get("status") or {}),
            timeout=20,
            what="status written by the controller",
        )
        out = ok(kubectl(control_plane, "get", "sidecarsets", name))  # v1beta1, the preferred version
        header, row = (line.split() for line in out.splitlines())
        assert header == ["NAME", "MATCHED", "UPDATED", "READY", "POLICY", "AGE"]
        assert row[:4] == [name, "0", "0", "0"]
        assert row[-1].endswith("s"), f"AGE of a new object is in seconds: {row[-1]}"
        short = ok(kubectl(control_plane, "get", "scs", name, "-o", "name"))
        assert short.strip() == f"sidecarset.{names.GROUP}/{name}"
    finally:
        kube.delete(f"{SS_PATH}/{name}")


def _helm(cp: ControlPlane, home: Path, *args: str) -> str:
    """helm (the project's pinned build) against `cp`, with a HOME of its own."""
    binary = helm.cached_binary("helm")
    assert binary is not None, helm.missing_reason("helm")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        **{f"HELM_{d}_HOME": str(home / d) for d in ("CACHE", "CONFIG", "DATA")},
    }
    proc = subprocess.run(
        [str(binary), f"--kubeconfig={cp.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.versions
def test_kubectl_apply_and_helm_install_store_every_object_on_this_minor(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The two installs the README gives, for real (not a dry run), each on a fresh control plane of
    this minor with its own kubectl: every object of `kubectl apply -k config/default` and of
    `helm install sidecarctl charts/sidecarctl` is stored (no field this minor refuses, the CRD's
    validation rules within its cost limits)."""
    wanted = {key(o) for o in render(CONFIG / "default")}
    with ControlPlane(bin_dir=control_plane.bin_dir, controller_manager=False) as cp:
        out = ok(kubectl(cp, "apply", "-k", str(CONFIG / "default")))
        assert len([line for line in out.splitlines() if line.strip()]) == len(wanted), out
        for kind, namespace, name in wanted:
            args = ["get", kind.lower(), name, "-o", "name", *(["-n", namespace] if namespace else [])]
            ok(kubectl(cp, *args))
    rendered = helm.helm_template()
    with ControlPlane(bin_dir=control_plane.bin_dir, controller_manager=False) as cp:
        _helm(cp, tmp_path, "install", "sidecarctl", str(helm.CHART), "--namespace", "default")
        assert "STATUS: deployed" in _helm(cp, tmp_path, "status", "sidecarctl", "--namespace", "default")
        for obj in rendered:
            meta = obj["metadata"]
            args = ["get", obj["kind"].lower(), meta["name"], "-o", "name"]
            ok(kubectl(cp, *args, *(["-n", meta["namespace"]] if meta.get("namespace") else [])))
