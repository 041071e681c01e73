"""NamespacedSidecarSets on the real API server with real RBAC: who may write one, what it may hold,
where it is injected and how it is rolled out.

Users are impersonated through kubectl (`--as`), so the API server's own RBAC decides what they may
write and the webhook's SubjectAccessReview is made for exactly that user. The shipped ClusterRoles
(config/rbac) reach the built-in `admin`, `edit` and `view` roles by aggregation: the test control
plane runs kube-controller-manager, whose clusterrole-aggregation controller folds them in.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from kuberuntime import api
from sidecarsets.spec import names
from tests.e2e.certsupport import scrape
from tests.e2e.helpers import SS_PATH, create_ready_pods, image_of, kubectl, make_pod, pods
from tests.kube import builders
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import REPO, ControlPlane
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.managerharness import RunningManager

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ROLES = REPO / "config" / "rbac" / "namespacedsidecarsets_clusterroles.yaml"


def nss_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/namespaces/{namespace}/{names.NAMESPACED_PLURAL}"
    return f"{base}/{name}" if name else base


def tenant_set(name: str, namespace: str, app: str, image: str = "log:1", container: str = "log") -> dict[str, Any]:
    return builders.namespaced_sidecarset(name, namespace, app=app, containers=[builders.container(container, image)])


def as_user(cp: ControlPlane, user: str, *args: str, obj: dict[str, Any] | None = None) -> tuple[int, str]:
    """kubectl as `user` (impersonated): (exit code, stdout and stderr)."""
    done = kubectl(cp, f"--as={user}", *args, stdin=None if obj is None else json.dumps(obj))
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def shipped_roles(kube: Kube, manager: RunningManager) -> None:
    """The shipped ClusterRoles, applied; returns once `admin` and `view` have them aggregated."""
    for role in yaml.safe_load_all(ROLES.read_text()):
        kube.apply(f"{RBAC}/clusterroles", role)

    def aggregated(role: str, verb: str) -> bool:
        rules = kube.get(f"{RBAC}/clusterroles/{role}").get("rules") or []
        return any(names.NAMESPACED_PLURAL in r.get("resources", []) and verb in r.get("verbs", []) for r in rules)

    eventually(lambda: aggregated("admin", "create") and aggregated("view", "list"), timeout=30, what="aggregation")


def bind(kube: Kube, namespace: str, user: str, role: str, *, kind: str = "ClusterRole") -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{user}-{role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    kube.create(f"{RBAC}/namespaces/{namespace}/rolebindings", binding)


@pytest.fixture
def teams(kube: Kube, kubelet: FakeKubelet, injected_ns: str, shipped_roles: None) -> Iterator[Callable[..., str]]:
    """`teams(**labels)`: a further namespace labelled for injection (the per-test one is the first)."""
    made: list[str] = []

    def make(**labels: str) -> str:
        name = f"{injected_ns[:50]}-{len(made) + 2}"
        meta = {"name": name, "labels": {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED, **labels}}
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
        kubelet.namespaces.add(name)
        eventually(
            lambda: kube.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None,
            timeout=30,
            what=f"default ServiceAccount in {name}",
        )
        made.append(name)
        return name

    yield make
    for name in made:
        kube.delete(f"/api/v1/namespaces/{name}")


def refusal(kube: Kube, path: str, obj: dict[str, Any]) -> str:
    with pytest.raises(api.ApiError) as refused:
        kube.create(path, obj)
    return refused.value.message


def containers(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"]["containers"]]


def new_pod(kube: Kube, namespace: str, app: str) -> dict[str, Any]:
    """A dry-run pod create: what a new pod gets now (the webhook's store catches up within a second)."""
    return kube.create(f"/api/v1/namespaces/{namespace}/pods", make_pod("probe", app), dryRun="All")


def test_an_admin_of_team_a_creates_one_there_and_its_pods_get_it_but_not_in_team_b(
    control_plane: ControlPlane, kube: Kube, injected_ns: str, teams: Callable[..., str]
) -> None:
    team_a, team_b = injected_ns, teams()
    bind(kube, team_a, "alice", "admin")
    code, out = as_user(control_plane, "alice", "create", "-f", "-", obj=tenant_set("logs", team_a, "web"))
    assert code == 0, out
    eventually(lambda: "log" in containers(new_pod(kube, team_a, "web")), timeout=20, what="tenant sidecar injected")
    pod = new_pod(kube, team_a, "web")
    hashes = json.loads(pod["metadata"]["annotations"][names.ANN_HASH])
    assert f"{team_a}/logs" in hashes
    code, out = as_user(control_plane, "alice", "create", "-f", "-", obj=tenant_set("logs", team_b, "web"))
    assert code != 0 and "forbidden" in out.lower() and names.NAMESPACED_PLURAL in out
    assert "log" not in containers(new_pod(kube, team_b, "web"))


def test_a_role_without_pods_create_is_refused_naming_the_missing_right(
    control_plane: ControlPlane, kube: Kube, injected_ns: str, shipped_roles: None
) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "sidecars-only"},
        "rules": [{"apiGroups": [names.GROUP], "resources": [names.NAMESPACED_PLURAL], "verbs": ["*"]}],
    }
    kube.create(f"{RBAC}/namespaces/{injected_ns}/roles", role)
    bind(kube, injected_ns, "bob", "sidecars-only", kind="Role")
    code, out = as_user(control_plane, "bob", "create", "-f", "-", obj=tenant_set("logs", injected_ns, "web"))
    assert code != 0
    assert f'user "bob" may not create pods in namespace {injected_ns}' in out
    assert "verb create, resource pods" in out


def test_a_view_user_reads_but_cannot_write(
    control_plane: ControlPlane, kube: Kube, injected_ns: str, shipped_roles: None
) -> None:
    kube.create(nss_path(injected_ns), tenant_set("logs", injected_ns, "web"))
    bind(kube, injected_ns, "carol", "view")
    code, out = as_user(control_plane, "carol", "get", names.NAMESPACED_PLURAL, "-n", injected_ns, "-o", "name")
    assert code == 0 and "logs" in out, out
    code, out = as_user(control_plane, "carol", "create", "-f", "-", obj=tenant_set("more", injected_ns, "web"))
    assert code != 0 and "forbidden" in out.lower()
    code, out = as_user(control_plane, "carol", "delete", names.NAMESPACED_PLURAL, "logs", "-n", injected_ns)
    assert code != 0 and "forbidden" in out.lower()


def test_a_privileged_sidecar_in_a_baseline_namespace_is_refused(kube: Kube, teams: Callable[..., str]) -> None:
    team = teams(**{"pod-security.kubernetes.io/enforce": "baseline"})
    obj = builders.namespaced_sidecarset(
        "debug", team, containers=[builders.container("debug", "debug:1", securityContext={"privileged": True})]
    )
    message = refusal(kube, nss_path(team), obj)
    assert f'namespace {team} enforces PodSecurity "baseline"' in message and "privileged" in message


def test_a_container_name_taken_by_a_cluster_sidecarset_is_refused(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]], shipped_roles: None
) -> None:
    cluster = sidecarsets("web")  # containers proxy (and init proxy-init) for app=web, everywhere
    message = refusal(kube, nss_path(injected_ns), tenant_set("mine", injected_ns, "web", container="proxy"))
    assert f"container proxy belongs to SidecarSet {cluster['metadata']['name']}" in message


def test_the_disabled_label_refuses_new_ones_and_stops_injection(kube: Kube, injected_ns: str) -> None:
    kube.create(nss_path(injected_ns), tenant_set("logs", injected_ns, "web"))
    eventually(lambda: "log" in containers(new_pod(kube, injected_ns, "web")), timeout=20, what="injected")
    label = {names.NS_NAMESPACED_SIDECARSETS_LABEL: names.NS_NAMESPACED_SIDECARSETS_DISABLED}
    kube.patch(f"/api/v1/namespaces/{injected_ns}", {"metadata": {"labels": label}})
    eventually(lambda: "log" not in containers(new_pod(kube, injected_ns, "web")), timeout=20, what="not injected")
    message = refusal(kube, nss_path(injected_ns), tenant_set("more", injected_ns, "web"))
    assert "sidecarctl.io/namespaced-sidecarsets=disabled" in message


def wait_injected(kube: Kube, namespace: str) -> None:
    eventually(
        lambda: "log" in containers(new_pod(kube, namespace, "web")), timeout=20, what=f"injected in {namespace}"
    )


def test_an_image_change_rolls_in_place_in_that_namespace_only(
    kube: Kube, injected_ns: str, teams: Callable[..., str]
) -> None:
    team_a, team_b = injected_ns, teams()
    for team in (team_a, team_b):
        kube.create(nss_path(team), tenant_set("logs", team, "web"))
    for team in (team_a, team_b):
        wait_injected(kube, team)
    before = {team: create_ready_pods(kube, team, "web", 2) for team in (team_a, team_b)}
    kube.patch(
        nss_path(team_a, "logs"), [{"op": "replace", "path": "/spec/containers/0/image", "value": "log:2"}], "json"
    )

    def rolled() -> bool:
        return all(image_of(p, "log") == "log:2" for p in pods(kube, team_a, "web"))

    eventually(rolled, timeout=60, what=f"log:2 rolled in place in {team_a}")
    after = pods(kube, team_a, "web")
    assert [p["metadata"]["uid"] for p in after] == [p["metadata"]["uid"] for p in before[team_a]]
    assert all(image_of(p, "log") == "log:1" for p in pods(kube, team_b, "web"))
    status = kube.get(nss_path(team_a, "logs"))["status"]
    assert status["matchedPods"] == 2 and status["latestRevision"].startswith("logs-")
    revisions = kube.get(f"/apis/apps/v1/namespaces/{team_a}/controllerrevisions")["items"]
    assert {r["metadata"]["ownerReferences"][0]["kind"] for r in revisions} == {names.NAMESPACED_KIND}


def _matched_series(manager: RunningManager, namespace: str, name: str) -> float | None:
    """`sidecarctl_sidecarset_pods` (matched) of one SidecarSet (`namespace` "") or NamespacedSidecarSet."""
    return scrape(manager.probe_url).find(
        "sidecarctl_sidecarset_pods", sidecarset_namespace=namespace, sidecarset=name, state="matched"
    )


def test_same_name_cluster_and_namespaced_sets_are_both_injected_and_upgraded_apart(
    kube: Kube, injected_ns: str, shipped_roles: None, manager: RunningManager
) -> None:
    name = f"mesh-{secrets.token_hex(3)}"
    cluster = builders.sidecarset(name, app="web", containers=[builders.container("proxy", "proxy:1")])
    kube.create(SS_PATH, cluster)
    try:
        kube.create(nss_path(injected_ns), tenant_set(name, injected_ns, "web"))

        def both() -> bool:
            return {"proxy", "log"} <= set(containers(new_pod(kube, injected_ns, "web")))

        eventually(both, timeout=20, what="both sets injected")
        [pod] = create_ready_pods(kube, injected_ns, "web", 1)
        assert containers(pod)[:2] == ["proxy", "log"]  # the cluster's sidecars first
        hashes = json.loads(pod["metadata"]["annotations"][names.ANN_HASH])
        assert {name, f"{injected_ns}/{name}"} <= set(hashes)
        patch = [{"op": "replace", "path": "/spec/containers/0/image", "value": "log:2"}]
        kube.patch(nss_path(injected_ns, name), patch, "json")
        eventually(lambda: image_of(pods(kube, injected_ns, "web")[0], "log") == "log:2", timeout=60, what="log:2")
        assert image_of(pods(kube, injected_ns, "web")[0], "proxy") == "proxy:1"
        patch = [{"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:2"}]
        kube.patch(f"{SS_PATH}/{name}", patch, "json")
        eventually(lambda: image_of(pods(kube, injected_ns, "web")[0], "proxy") == "proxy:2", timeout=60, what="p:2")
        final = pods(kube, injected_ns, "web")[0]
        assert image_of(final, "log") == "log:2" and final["metadata"]["uid"] == pod["metadata"]["uid"]
        # Their metrics are two series, the tenant's labelled with its namespace.
        for namespace in ("", injected_ns):
            eventually(
                lambda namespace=namespace: _matched_series(manager, namespace, name) == 1,  # type: ignore[misc]
                timeout=20,
                what=f"the matched-pods series of {namespace or 'the cluster'}'s {name}",
            )
    finally:
        kube.delete(f"{SS_PATH}/{name}")


def test_a_cpu_change_resizes_its_pods_in_place(kube: Kube, injected_ns: str) -> None:
    """A NamespacedSidecarSet's resources, changed, are resized into its running pods through
    `pods/resize` as a SidecarSet's are: its revisions live in its namespace, and are read there."""
    small = {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}
    body = tenant_set("sized", injected_ns, "sized")
    body["spec"]["containers"][0]["resources"] = small
    kube.create(nss_path(injected_ns), body)
    eventually(lambda: "log" in containers(new_pod(kube, injected_ns, "sized")), timeout=20, what="injecting")
    before = create_ready_pods(kube, injected_ns, "sized", 2)
    # Its first revision recorded and counted in its pods first: a change before that leaves no
    # revision of the old resources to resize from (the pods would be marked not upgradable).
    eventually(
        lambda: (kube.get(nss_path(injected_ns, "sized")).get("status") or {}).get("updatedPods") == 2,
        timeout=30,
        what="both pods counted at the first revision",
    )
    ops = [{"op": "replace", "path": "/spec/containers/0/resources/limits/cpu", "value": "400m"}]
    kube.patch(nss_path(injected_ns, "sized"), ops, "json")

    def limit(pod: dict[str, Any]) -> str | None:
        log = next(c for c in pod["spec"]["containers"] if c["name"] == "log")
        cpu = (log.get("resources") or {}).get("limits", {}).get("cpu")
        return None if cpu is None else str(cpu)

    try:
        eventually(
            lambda: all(limit(p) == "400m" for p in pods(kube, injected_ns, "sized")),
            timeout=60,
            what="resized in place",
        )
    except AssertionError as e:  # what the controller saw, for the one who reads a failure
        status = kube.get(nss_path(injected_ns, "sized")).get("status")
        seen = [
            (p["metadata"]["name"], limit(p), p["metadata"].get("annotations"))
            for p in pods(kube, injected_ns, "sized")
        ]
        raise AssertionError(f"{e}; status {status}; pods {seen}") from e
    after = pods(kube, injected_ns, "sized")
    assert sorted(p["metadata"]["uid"] for p in after) == sorted(p["metadata"]["uid"] for p in before)
    assert all(image_of(p, "log") == "log:1" for p in after)


def _log(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "log")


def test_a_pods_overrides_reach_its_sidecar_within_the_namespaced_sets_bounds(kube: Kube, injected_ns: str) -> None:
    """`spec.overrides` of a NamespacedSidecarSet bound what its pods may ask, as a SidecarSet's do: an
    allowed ask is injected merged, one past the bound is refused naming the set (namespace/name),
    and a running pod annotated again is resized in place by the controller."""
    body = tenant_set("tuned", injected_ns, "tuned")
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}
    body["spec"]["overrides"] = [{"containerName": "log", "resources": {"cpu": {"min": "50m", "max": "1"}}}]
    kube.create(nss_path(injected_ns), body)
    eventually(lambda: "log" in containers(new_pod(kube, injected_ns, "tuned")), timeout=20, what="injecting")
    path = f"/api/v1/namespaces/{injected_ns}/pods"

    def asking(name: str, cpu: str) -> dict[str, Any]:
        p = make_pod(name, "tuned")
        p["metadata"]["annotations"] = {
            names.ANN_OVERRIDES: json.dumps({"log": {"resources": {"limits": {"cpu": cpu}}}})
        }
        return p

    got = kube.create(path, asking("tuned-0", "500m"))
    assert _log(got)["resources"] == {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}
    assert got["metadata"]["annotations"][names.ANN_INJECTED_BY] == names.INJECTED_BY_WEBHOOK
    message = refusal(kube, path, asking("tuned-1", "2"))
    assert f'"2" is above the maximum {names.NAMESPACED_KIND} {injected_ns}/tuned allows for container log' in message

    # Running, then annotated again: resized in place (same pod, same container), not recreated.
    eventually(
        lambda: (kube.get(nss_path(injected_ns, "tuned")).get("status") or {}).get("readyPods") == 1,
        timeout=30,
        what="the pod counted ready",
    )
    again = {"log": {"resources": {"limits": {"cpu": "800m"}}}}
    kube.patch(f"{path}/tuned-0", {"metadata": {"annotations": {names.ANN_OVERRIDES: json.dumps(again)}}}, "merge")

    def resized() -> dict[str, Any] | None:
        now = kube.get(f"{path}/tuned-0")
        return now if str(_log(now)["resources"]["limits"]["cpu"]) == "800m" else None

    after = eventually(resized, timeout=30, what="the log sidecar resized to the new override")
    assert after["metadata"]["uid"] == got["metadata"]["uid"]
