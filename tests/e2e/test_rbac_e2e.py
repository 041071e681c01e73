"""The manager's RBAC in config/default is exactly what it uses: proven from the API server's audit log.

On its own control plane (its controller must be the only one acting there), the install's
ServiceAccount, roles, bindings, CRD and webhook configurations are applied as config/default
renders them (the webhooks and the CRD's conversion pointed at a loopback URL: there is no cluster
network). The manager runs as `sidecarctl run --self-signed` with a token of that ServiceAccount and
goes through a whole life: certificate Secret created, caBundle synced (the CRD's too, and a
SidecarSet read back in v1beta1 through the conversion webhook), Lease taken, a SidecarSet whose first
revision name is already taken, pods injected and made Ready, an upgrade in two batches (an Event
created and then bumped), a rollback (revision renumbered), an upgrade that cannot be done in place
(pods marked not upgradable, history truncated), SIGTERM (Lease released), and a restart that
repairs a damaged Secret. Then every request the ServiceAccount made is compared with the rules:
none may be denied, each must be granted, and each granted rule must have been used.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from injector.policy import params
from kuberuntime.kubeconfig import load_config
from sidecarsets.spec import names
from sidecarsets.spec.revisions import revision_data, revision_hash, revision_name
from tests.e2e.helpers import (
    SS_PATH,
    create_ready_pods,
    image_of,
    make_sidecarset,
    pods,
    pods_digest,
    ready,
    set_image,
    upgradable,
    wait_injecting,
    wait_status,
)
from tests.e2e.policysupport import policy_holding
from tests.kube import builders
from tests.kube.audit import audit_lines
from tests.kube.builders import model
from tests.kube.client import Kube, eventually
from tests.kube.cluster import PrivateCluster, crd_established
from tests.kube.controlplane import REPO, ControlPlane, free_port
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MWC_PATH,
    VWC_PATH,
    ManagerProcess,
    conversion_bundle_synced,
    conversion_works,
    start_process,
    wait_ready,
)

MANAGER_NS = names.DEFAULT_MANAGER_NAMESPACE
SA = "sidecarctl"
SA_USER = f"system:serviceaccount:{MANAGER_NS}:{SA}"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
POLICIES = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"
REVISIONS_PATH = f"/apis/apps/v1/namespaces/{MANAGER_NS}/controllerrevisions"
SECRET_PATH = f"/api/v1/namespaces/{MANAGER_NS}/secrets/sidecarctl-webhook-certs"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/sidecarctl-controller"
INSTALLED_KINDS = (
    "Namespace",
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)

# RBAC never sees a name on these verbs, so a resourceNames rule cannot grant them. A list or watch
# has one only with the field selector metadata.name=<name> (the API server takes it as the name).
NAMELESS_VERBS = frozenset({"create", "deletecollection"})


# ---------------------------------------------------------------------------------------------
# Grants and uses


@dataclass(frozen=True)
class Grant:
    """One verb on one resource, as a rule grants it; `namespace` None means every namespace and cluster scope."""

    verb: str
    group: str
    resource: str
    resource_names: frozenset[str]
    namespace: str | None
    source: str

    def covers(self, use: Use) -> bool:
        if (self.verb, self.group, self.resource) != (use.verb, use.group, use.resource):
            return False
        if self.namespace is not None and self.namespace != use.namespace:
            return False
        if self.resource_names:
            return use.verb not in NAMELESS_VERBS and use.name in self.resource_names
        return True

    def describe(self) -> str:
        names_part = f" {sorted(self.resource_names)}" if self.resource_names else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{names_part} ({self.source})"


def _watched(grant: Grant, grants: Iterable[Grant], uses: Iterable[Use]) -> bool:
    """Whether the rule that grants `grant` also granted a watch of the same resource that was used."""
    return any(
        g.verb == "watch"
        and (g.group, g.resource, g.source) == (grant.group, grant.resource, grant.source)
        and any(g.covers(u) for u in uses)
        for g in grants
    )


@dataclass(frozen=True)
class Use:
    """One kind of request the ServiceAccount made; `namespace` "" is cluster scope."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str

    @property
    def scope(self) -> str:
        return self.namespace or "(cluster)"


def grants_for(objs: Iterable[Mapping[str, Any]], *, namespace: str, account: str) -> list[Grant]:
    """What the bindings in `objs` give the ServiceAccount, expanded to one Grant per verb and resource."""
    objs = list(objs)
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs}
    out: list[Grant] = []
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        if subject not in (binding.get("subjects") or []):
            continue
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role_ns = scope if ref["kind"] == "Role" else ""
        role = roles[(ref["kind"], role_ns or "", ref["name"])]
        for i, rule in enumerate(role["rules"]):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.append(
                            Grant(
                                verb,
                                group,
                                resource,
                                frozenset(rule.get("resourceNames") or ()),
                                scope,
                                f"{ref['kind']} {ref['name']} rule {i}",
                            )
                        )
    return out


def uses_from_audit(lines: Iterable[str], user: str) -> tuple[Counter[Use], list[str], list[dict[str, Any]]]:
    """(requests by kind, non-resource URLs, denied requests) of `user` in a JSON audit log."""
    uses: Counter[Use] = Counter()
    seen: set[str] = set()
    non_resource: list[str] = []
    denied: list[dict[str, Any]] = []
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if (event.get("user") or {}).get("username") != user:
            continue
        if (event.get("responseStatus") or {}).get("code") == 403:
            denied.append(event)
        if event["auditID"] in seen:
            continue  # a long request logs ResponseStarted and ResponseComplete
        seen.add(event["auditID"])
        ref = event.get("objectRef")
        if ref is None:
            non_resource.append(f"{event['verb']} {event['requestURI']}")
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        verb = event["verb"]
        name = "" if verb in NAMELESS_VERBS else str(ref.get("name") or "")
        uses[Use(verb, ref.get("apiGroup", ""), resource, ref.get("namespace", ""), name)] += 1
    return uses, non_resource, denied


def table(uses: Counter[Use], grants: list[Grant]) -> str:
    rows = [("VERB", "API GROUP", "RESOURCE", "NAMESPACE", "NAME", "REQUESTS", "GRANTED BY")]
    for use in sorted(uses, key=lambda u: (u.group, u.resource, u.verb, u.namespace, u.name)):
        by = ", ".join(g.source for g in grants if g.covers(use)) or "NOT GRANTED"
        rows.append((use.verb, use.group or "core", use.resource, use.scope, use.name or "-", str(uses[use]), by))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def test_grant_matching_follows_rbac_semantics() -> None:
    named = Grant("get", "", "secrets", frozenset({"certs"}), "ns", "r")
    assert named.covers(Use("get", "", "secrets", "ns", "certs"))
    assert not named.covers(Use("get", "", "secrets", "ns", "other"))
    assert not named.covers(Use("get", "", "secrets", "other-ns", "certs"))
    assert not Grant("create", "", "secrets", frozenset({"certs"}), "ns", "r").covers(
        Use("create", "", "secrets", "ns", "")
    ), "resourceNames never grants create"
    named_watch = Grant("watch", "", "secrets", frozenset({"certs"}), "ns", "r")
    assert named_watch.covers(Use("watch", "", "secrets", "ns", "certs")), "a watch of metadata.name=certs"
    assert not named_watch.covers(Use("watch", "", "secrets", "ns", "")), "a watch of them all"
    cluster = Grant("patch", "", "pods", frozenset(), None, "r")
    assert cluster.covers(Use("patch", "", "pods", "any", "p"))
    assert not cluster.covers(Use("patch", "", "pods/status", "any", "p"))
    assert not cluster.covers(Use("patch", "apps", "pods", "any", "p"))


def test_a_token_kubeconfig_authenticates_every_request(tmp_path: Path) -> None:
    """A ServiceAccount token (kubeconfig `token:`, or in-cluster) must reach the API server.

    kubernetes >= 37 keeps the token under `api_key["BearerToken"]` (value "Bearer <token>"); a
    client that asks for `api_key["authorization"]` sends no credentials and acts as
    system:anonymous, which the audit test below would see as 403s on every call.
    """
    kubeconfig = tmp_path / "token.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    config = load_config(str(kubeconfig))
    assert config.headers().get("Authorization") == "Bearer t0ken"


# ---------------------------------------------------------------------------------------------
# The cluster


def kubectl(cp: ControlPlane, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [str(cp.bin_dir / "kubectl"), f"--kubeconfig={cp.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def rendered_default(cp: ControlPlane) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(kubectl(cp, "kustomize", str(REPO / "config" / "default")), yaml.CSafeLoader) if d]


def by_url(obj: dict[str, Any], url: str) -> dict[str, Any]:
    """A webhook configuration, or the CRD's conversion webhook, pointed at `url` instead of the
    in-cluster Service (same paths)."""
    if obj["kind"] == "CustomResourceDefinition":
        if "conversion" not in obj["spec"]:
            return obj  # one version (NamespacedSidecarSet): nothing to convert
        webhook = obj["spec"]["conversion"]["webhook"]
        client = {"url": url + webhook["clientConfig"]["service"]["path"]}
        conversion = {**obj["spec"]["conversion"], "webhook": {**webhook, "clientConfig": client}}
        return {**obj, "spec": {**obj["spec"], "conversion": conversion}}
    if not obj["kind"].endswith("WebhookConfiguration"):
        return obj
    hooks = [
        {**h, "clientConfig": {"url": url + h["clientConfig"]["service"].get("path", "/")}} for h in obj["webhooks"]
    ]
    return {**obj, "webhooks": hooks}


@pytest.fixture
def cluster(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[PrivateCluster]:
    c = PrivateCluster(aloop, bin_dir=control_plane.bin_dir, kubelet_node="rbac-node", kubelet_restart_delay=0.2)
    try:
        yield c
    finally:
        c.close()


def _bundle_synced(kube: Kube) -> bool:
    for path in (f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}", f"{VWC_PATH}/{names.VALIDATING_WEBHOOK_CONFIG}"):
        if not kube.get(path)["webhooks"][0]["clientConfig"].get("caBundle"):
            return False
    return conversion_bundle_synced(kube)


def _start(cluster: PrivateCluster, kubeconfig: Path, port: int, metrics_port: int) -> ManagerProcess:
    cert_dir = Path(tempfile.mkdtemp(prefix="sidecarctl-rbac-certs-"))
    m = start_process(
        cluster.cp,
        cert_dir,
        identity="rbac-audit",
        webhook_port=port,
        extra=(
            f"--kubeconfig={kubeconfig}",
            "--self-signed",
            "--extra-ip=127.0.0.1",
            "--log-format=text",
            f"--metrics-bind=127.0.0.1:{metrics_port}",
            "--metrics-secure",
        ),
    )
    try:
        wait_ready(m, timeout=30)
    except AssertionError:
        m.kill()
        raise AssertionError(f"manager not ready:\n{m.log_tail()}") from None
    return m


def _scrape(kube: Kube, port: int, token: str | None) -> int:
    """GET /metrics on the secure port, trusting the CA of the self-signed Secret; the HTTP status."""
    ca = base64.b64decode(kube.get(SECRET_PATH)["data"]["ca.crt"]).decode()
    ctx = ssl.create_default_context(cadata=ca)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=5) as r:
            assert b"sidecarctl_serving_cert_expiry_timestamp_seconds" in r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _sa_token(kube: Kube, namespace: str, name: str) -> str:
    kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
    )
    token: str = kube.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    return token


def _stop(m: ManagerProcess) -> None:
    m.terminate()
    assert m.proc.returncode == 0, f"SIGTERM exit status {m.proc.returncode}:\n{m.log_tail()}"


# ---------------------------------------------------------------------------------------------
# The audit


def test_the_manager_uses_exactly_the_permissions_config_default_grants(
    cluster: PrivateCluster, tmp_path: Path
) -> None:
    cp, kube = cluster.cp, cluster.kube
    rendered = rendered_default(cp)
    port = free_port()
    installed = [by_url(o, f"https://127.0.0.1:{port}") for o in rendered if o["kind"] in INSTALLED_KINDS]
    early = [o for o in installed if o["kind"] in ("Namespace", "CustomResourceDefinition")]
    kubectl(cp, "apply", "-f", "-", stdin=yaml.safe_dump_all(early))
    crd_names = [o["metadata"]["name"] for o in early if o["kind"] == "CustomResourceDefinition"]
    eventually(lambda: all(crd_established(kube, n) for n in crd_names), timeout=30, what="CRDs Established")

    # Take the name the SidecarSet's first revision will get, with other data: the manager must
    # read it back (get), see the collision and pick the next name.
    app = "audit"
    ss_body = make_sidecarset(
        f"audit-{secrets.token_hex(3)}",
        app,
        initContainers=[],
        # a request, so that raising it keeps the pods' QoS class (Burstable): resized in place
        containers=[builders.container("proxy", "proxy:1", resources={"requests": {"cpu": "10m"}})],
        revisionHistoryLimit=2,
        updateStrategy={"type": "RollingUpdate", "maxUnavailable": 1},
        # re-applied by each upgrade, which reads the pod first (get pods)
        patchPodMetadata=[{"patchPolicy": "Overwrite", "annotations": {"audit.example/sidecar": "on"}}],
    )
    ss_name = ss_body["metadata"]["name"]
    defaulted = kube.create(SS_PATH, ss_body, dryRun="All")
    squatter = revision_name(ss_name, revision_hash(revision_data(model(defaulted)), 0))
    kube.create(
        REVISIONS_PATH,
        {
            "apiVersion": "apps/v1",
            "kind": "ControllerRevision",
            "metadata": {"name": squatter},
            "data": {"spec": {"containers": [{"name": "other", "image": "other:1"}]}},
            "revision": 1,
        },
    )

    kubectl(cp, "apply", "-f", "-", stdin=yaml.safe_dump_all([o for o in installed if o not in early]))
    token = kube.create(
        f"/api/v1/namespaces/{MANAGER_NS}/serviceaccounts/{SA}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    kubeconfig = cp.token_kubeconfig(tmp_path / "sidecarctl.kubeconfig", token)

    metrics_port = free_port()
    m = _start(cluster, kubeconfig, port, metrics_port)
    ns = ""
    try:
        assert kube.get(SECRET_PATH)["data"]["tls.crt"], "self-signed Secret created"
        # /metrics only for callers the API server authenticates and allows `get /metrics`.
        reader, stranger = _sa_token(kube, "default", "scraper"), _sa_token(kube, "default", "stranger")
        kube.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "scraper-reads-sidecarctl-metrics"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "sidecarctl-metrics-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": "default"}],
            },
        )
        assert _scrape(kube, metrics_port, None) == 401
        assert _scrape(kube, metrics_port, "not-a-token") == 401
        assert _scrape(kube, metrics_port, stranger) == 403
        eventually(
            lambda: _scrape(kube, metrics_port, reader) == 200, timeout=10, what="the bound scraper reads /metrics"
        )
        eventually(lambda: _bundle_synced(kube), timeout=20, what="caBundle synced in both configurations and the CRD")
        eventually(lambda: conversion_works(kube), timeout=20, what="v1beta1 converted by the manager")
        eventually(lambda: kube.get(LEASE_PATH)["spec"].get("holderIdentity") == "rbac-audit", timeout=20)

        ns = f"audit-{secrets.token_hex(3)}"
        kube.create(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"sidecar-injection": "enabled"}},
            },
        )
        assert cluster.kubelet is not None
        cluster.kubelet.namespaces.add(ns)
        eventually(lambda: kube.get_or_none(f"/api/v1/namespaces/{ns}/serviceaccounts/default"), timeout=30)
        kube.create(SS_PATH, ss_body)
        # Read back through the conversion webhook (the CRD's caBundle is the manager's to keep).
        beta = kube.get(f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/{names.PLURAL}/{ss_name}")
        assert beta["apiVersion"] == names.API_VERSION_V1BETA1
        wait_injecting(kube, ns, app, lambda p: [c["name"] for c in p["spec"]["containers"]] == ["proxy", "app"])
        create_ready_pods(kube, ns, app, 2)
        status = wait_status(kube, ss_name, matchedPods=2, updatedPods=2, readyPods=2)
        assert status["collisionCount"] == 1, "the taken revision name was detected"
        first = status["latestRevision"]
        assert first != squatter

        def all_on(image: str) -> bool:
            got = pods(kube, ns, app)
            return len(got) == 2 and all(image_of(p, "proxy") == image and ready(p) for p in got)

        set_image(kube, ss_name, "proxy:2")  # two batches of one pod: one Event, then the same one bumped
        eventually(lambda: all_on("proxy:2"), timeout=30, what="pods upgraded in place to proxy:2")
        # Its policy's parameter object rewritten (an update) before the next change: an image alone
        # changes no CEL (the policy itself is updated by the env change below).
        eventually(
            lambda: "proxy:2" in str(kube.get_or_none(f"{params.path(MANAGER_NS)}/{policy_holding(kube, ss_name)}")),
            timeout=20,
            what="the parameter object rewritten with proxy:2",
        )
        set_image(kube, ss_name, "proxy:1")  # rollback: the first revision is renumbered, not recreated
        eventually(lambda: all_on("proxy:1"), timeout=30, what="pods rolled back to proxy:1")
        assert wait_status(kube, ss_name, updatedPods=2, readyPods=2)["latestRevision"] == first

        # Resources only: rolled into the running pods through pods/resize, the same pods.
        uids = {p["metadata"]["uid"] for p in pods(kube, ns, app)}
        raise_cpu = [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "20m"}]
        kube.patch(f"{SS_PATH}/{ss_name}", raise_cpu, patch_type="json")

        def resized() -> bool:
            got = pods(kube, ns, app)
            cpu = [next(c for c in p["spec"]["containers"] if c["name"] == "proxy")["resources"] for p in got]
            return len(got) == 2 and all(r.get("requests", {}).get("cpu") == "20m" for r in cpu)

        eventually(resized, timeout=30, what="pods resized in place")
        assert {p["metadata"]["uid"] for p in pods(kube, ns, app)} == uids
        running = wait_status(kube, ss_name, updatedPods=2, readyPods=2, updatedReadyPods=2)["latestRevision"]

        kube.patch(  # not an image-only change: pods are marked, the history is truncated to 2
            f"{SS_PATH}/{ss_name}",
            [
                {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "MODE", "value": "strict"}]},
                {"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:3"},
            ],
            patch_type="json",
        )
        eventually(
            lambda: all(upgradable(p) == "False" for p in pods(kube, ns, app)),
            timeout=20,
            what="pods marked SidecarSetUpgradable=False",
        )

        def history() -> list[str]:
            listed = kube.get(REVISIONS_PATH, labelSelector=f"{names.REVISION_LABEL_SIDECARSET}={ss_name}")
            return sorted(r["metadata"]["name"] for r in listed["items"])

        eventually(lambda: len(history()) == 2, timeout=20, what="history truncated to revisionHistoryLimit 2")
        assert running in history(), "the revision the pods still run is kept"

        # The policy injecting the SidecarSet: a hand edit of its binding is put back (update); paused,
        # the SidecarSet needs no policy, and the manager deletes it and its binding.
        holder = eventually(lambda: policy_holding(kube, ss_name), timeout=20, what="the policy injecting it")
        binding_path = f"{BINDINGS}/{holder}"
        kept = eventually(lambda: kube.get_or_none(binding_path), timeout=20, what="the policy binding")
        edit = [{"op": "replace", "path": "/spec/matchResources/objectSelector", "value": {}}]
        kube.patch(binding_path, edit, patch_type="json")
        eventually(
            lambda: (
                kube.get(binding_path)["spec"]["matchResources"]["objectSelector"]
                == kept["spec"]["matchResources"]["objectSelector"]
            ),
            timeout=20,
            what="the hand-edited binding put back",
        )
        kube.patch(f"{SS_PATH}/{ss_name}", {"spec": {"injectionStrategy": {"paused": True}}})
        eventually(
            lambda: kube.get_or_none(f"{POLICIES}/{holder}") is None and kube.get_or_none(binding_path) is None,
            timeout=20,
            what="the paused SidecarSet's policy deleted (it held nothing else)",
        )
        eventually(
            lambda: kube.get_or_none(f"{params.path(MANAGER_NS)}/{holder}") is None,
            timeout=20,
            what="its parameter object deleted, --policy-settle seconds after the policy and binding",
        )

        # A NamespacedSidecarSet: watched across namespaces, its status patched, its revision in its namespace.
        nss = builders.namespaced_sidecarset(
            "tenant", ns, app="tenant", containers=[builders.container("log", "log:1")]
        )
        nss_path = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/namespaces/{ns}/{names.NAMESPACED_PLURAL}"
        kube.create(nss_path, nss)
        wait_injecting(kube, ns, "tenant", lambda p: "log" in [c["name"] for c in p["spec"]["containers"]])
        create_ready_pods(kube, ns, "tenant", 1)
        eventually(
            lambda: (kube.get(f"{nss_path}/tenant").get("status") or {}).get("readyPods") == 1,
            timeout=30,
            what="the NamespacedSidecarSet's status written",
        )

        events = [
            e
            for e in kube.get("/api/v1/namespaces/default/events")["items"]
            if e["involvedObject"].get("name") == ss_name
        ]
        reasons = {e["reason"] for e in events}
        assert {"SidecarUpgrade", "NotUpgradablePods"} <= reasons, reasons
        assert max(e["count"] for e in events if e["reason"] == "SidecarUpgrade") >= 2
    except AssertionError:
        print(f"pods:\n{pods_digest(kube, ns)}" if ns else "no namespace yet")
        print(f"manager log, warnings and the policy sync:\n{m.log_digest()}\nmanager log:\n{m.log_tail(400)}")
        raise
    finally:
        if m.proc.poll() is None:
            _stop(m)
    assert kube.get(LEASE_PATH)["spec"].get("holderIdentity") in ("", None), "Lease released on SIGTERM"

    # A restart against a damaged Secret repairs it in place (update, not create).
    junk = base64.b64encode(b"not a certificate").decode()
    damaged = kube.patch(SECRET_PATH, [{"op": "replace", "path": "/data/tls.crt", "value": junk}], patch_type="json")
    m = _start(cluster, kubeconfig, port, free_port())
    try:
        repaired = kube.get(SECRET_PATH)
        assert b"BEGIN CERTIFICATE" in base64.b64decode(repaired["data"]["tls.crt"])
        assert repaired["metadata"]["uid"] == damaged["metadata"]["uid"], "repaired in place"
    finally:
        _stop(m)

    grants = grants_for(rendered, namespace=MANAGER_NS, account=SA)
    uses, non_resource, denied = uses_from_audit((line.decode() for line in audit_lines(cp.audit_log)), SA_USER)
    report = table(uses, grants)
    print(f"\nrequests of {SA_USER}:\n{report}")
    assert uses, "no request of the ServiceAccount in the audit log"
    assert not denied, "denied requests:\n" + "\n".join(f"{e['verb']} {e['requestURI']}" for e in denied)
    # Discovery (the server's version, whether MutatingAdmissionPolicy and pods/resize are served) is
    # open to every authenticated user (ClusterRoles system:discovery, system:public-info-viewer);
    # nothing else outside resources.
    discovery = {
        "get /version",
        "get /api/v1",
        "get /apis/admissionregistration.k8s.io/v1",
        "get /apis/admissionregistration.k8s.io/v1beta1",
    }
    assert set(non_resource) <= discovery, f"non-resource requests: {non_resource}"
    not_granted = [u for u in uses if not any(g.covers(u) for g in grants)]
    assert not not_granted, f"used but not granted: {not_granted}\n{report}"
    unused = [g for g in grants if not any(g.covers(u) for u in uses)]
    # `list` on a kind the manager keeps a watch of (the watch used, above) serves two paths this
    # life does not take: the paged LIST that reads the state where the API server refuses a
    # WatchList, and the quorum read (a LIST of one) that catches up a cache too large to read
    # again at a takeover (sidecarctl.manager.warm.REREAD_UP_TO). So it may go unused here, but only
    # where the same rule's watch was used.
    unused = [g for g in unused if not (g.verb == "list" and _watched(g, grants, uses))]
    assert not unused, f"granted but never used: {[g.describe() for g in unused]}\n{report}"
