"""/validate-sidecarset for a NamespacedSidecarSet: each admission decision and the message the user
reads, through the ASGI app, with the SubjectAccessReview answered by a stand-in (the real one is
tests/e2e/test_tenant_e2e.py). A tenant's sidecar must be refused whenever its writer could not run
it in a pod there, so every refusal names what is missing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from injector.http.validate.tenants import ReviewFailed, Verdict, review_body
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore
from tests.kube import builders

ALICE = {"username": "alice", "uid": "u-1", "groups": ["team-a-admins", "system:authenticated"], "extra": {"x": ["1"]}}


class Access:
    """Answers `create pods` for the users in `allowed`; records what it was asked."""

    def __init__(self, allowed: set[str] | None = None, *, fail: bool = False) -> None:
        self.allowed = {"alice"} if allowed is None else allowed
        self.fail = fail
        self.asked: list[tuple[Mapping[str, Any], str]] = []

    async def __call__(self, user_info: Mapping[str, Any], namespace: str) -> Verdict:
        self.asked.append((user_info, namespace))
        if self.fail:
            raise ReviewFailed("the SubjectAccessReview failed: TimeoutError")
        ok = user_info.get("username") in self.allowed
        return Verdict(ok, "" if ok else 'RBAC: no rule grants "create" on "pods"')


def store_with(namespaces: dict[str, dict[str, str]], *cluster: dict[str, Any]) -> TemplateStore:
    store = TemplateStore()
    for name, labels in namespaces.items():
        store.on_namespace("ADDED", None, {names.NS_NAME_LABEL: name, **labels})
    for obj in cluster:
        store.on_sidecarset("ADDED", None, obj)
    return store


TEAM_A = {"team-a": {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}}


def validate(
    obj: dict[str, Any],
    store: TemplateStore | None = None,
    *,
    access: Access | None = None,
    user: Mapping[str, Any] = ALICE,
    enabled: bool = True,
    namespace: str = "team-a",
    policy_only: bool = False,
) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0b2a8e-0000-4000-8000-000000000048",
            "kind": {"group": names.GROUP, "version": names.VERSION_V1BETA1, "kind": names.NAMESPACED_KIND},
            "resource": {"group": names.GROUP, "version": names.VERSION_V1BETA1, "resource": names.NAMESPACED_PLURAL},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": dict(user),
            "object": obj,
        },
    }
    settings = WebhookSettings(
        access_review=access or Access(), namespaced_sidecarsets=enabled, replay=None, policy_only=policy_only
    )
    app = create_webhook_app(store or store_with(TEAM_A), settings)
    client = TestClient(app, raise_server_exceptions=False)
    resp = client.post(names.VALIDATE_PATH, content=orjson.dumps(review), headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()["response"]
    return out


def refusal(answer: dict[str, Any]) -> tuple[int, str]:
    assert answer["allowed"] is False
    return answer["status"]["code"], answer["status"]["message"]


def test_a_valid_one_is_admitted_after_asking_for_the_writers_create_pods_right() -> None:
    access = Access()
    assert validate(builders.namespaced_sidecarset(), access=access)["allowed"] is True
    [(user_info, namespace)] = access.asked
    assert namespace == "team-a" and user_info["username"] == "alice"
    spec = review_body(user_info, namespace)["spec"]
    assert spec["resourceAttributes"] == {"namespace": "team-a", "verb": "create", "group": "", "resource": "pods"}
    assert spec["groups"] == ALICE["groups"] and spec["uid"] == "u-1" and spec["extra"] == {"x": ["1"]}


def test_a_writer_who_may_not_create_pods_is_refused_naming_the_right() -> None:
    code, message = refusal(validate(builders.namespaced_sidecarset(), access=Access(set())))
    assert code == 403
    assert 'user "alice" may not create pods in namespace team-a' in message
    assert "verb create, resource pods" in message and "RBAC" in message


def test_a_review_that_cannot_be_made_refuses_to_be_retried() -> None:
    code, message = refusal(validate(builders.namespaced_sidecarset(), access=Access(fail=True)))
    assert code == 503 and "retry" in message and "cannot check whether alice may create pods" in message


def test_the_disabled_namespace_label_refuses() -> None:
    labels = {names.NS_NAMESPACED_SIDECARSETS_LABEL: names.NS_NAMESPACED_SIDECARSETS_DISABLED}
    code, message = refusal(validate(builders.namespaced_sidecarset(), store_with({"team-a": labels})))
    assert code == 403 and "sidecarctl.io/namespaced-sidecarsets=disabled" in message


def test_the_kind_turned_off_cluster_wide_refuses() -> None:
    code, message = refusal(validate(builders.namespaced_sidecarset(), enabled=False))
    assert code == 403 and "--no-namespaced-sidecarsets" in message


def test_policy_only_injection_admits_what_a_policy_serves_and_refuses_the_rest() -> None:
    """--injection=policy has no pod webhook: a NamespacedSidecarSet a policy can serve is admitted,
    one only the webhook could serve (a HotUpgrade sidecar) is refused naming why."""
    assert validate(builders.namespaced_sidecarset(), policy_only=True)["allowed"] is True
    hot = builders.container(
        "proxy", "proxy:1", upgradeStrategy={"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}
    )
    code, message = refusal(validate(builders.namespaced_sidecarset(containers=[hot]), policy_only=True))
    assert code == 422 and "--injection=policy" in message and "HotUpgrade" in message


@pytest.mark.parametrize("namespace", ["kube-system", names.DEFAULT_MANAGER_NAMESPACE])
def test_system_and_manager_namespaces_refuse(namespace: str) -> None:
    store = store_with({namespace: {}})
    code, message = refusal(validate(builders.namespaced_sidecarset(namespace=namespace), store, namespace=namespace))
    assert code == 403 and "never gets sidecars" in message


def test_a_privileged_sidecar_in_a_baseline_namespace_is_refused() -> None:
    labels = {"pod-security.kubernetes.io/enforce": "baseline"}
    proxy = builders.container("proxy", "proxy:1", securityContext={"privileged": True})
    obj = builders.namespaced_sidecarset(containers=[proxy])
    code, message = refusal(validate(obj, store_with({"team-a": labels})))
    assert code == 403
    assert 'namespace team-a enforces PodSecurity "baseline"' in message and "privileged" in message


def test_host_path_is_refused_where_the_level_forbids_it_and_admitted_where_privileged() -> None:
    volume = {"name": "logs", "hostPath": {"path": "/var/log"}}
    mount = [{"name": "logs", "mountPath": "/logs"}]
    obj = builders.namespaced_sidecarset(
        containers=[builders.container("shipper", "shipper:1", volumeMounts=mount)], volumes=[volume]
    )
    code, message = refusal(validate(obj, store_with({"team-a": {"pod-security.kubernetes.io/enforce": "baseline"}})))
    assert code == 403 and "hostPath" in message
    assert validate(obj)["allowed"] is True  # no enforce label: privileged


def test_a_container_name_a_cluster_sidecarset_owns_is_refused() -> None:
    cluster = builders.sidecarset("mesh", containers=[builders.container("proxy", "envoy:1")])
    obj = builders.namespaced_sidecarset("debug", containers=[builders.container("proxy", "mine:1")])
    code, message = refusal(validate(obj, store_with(TEAM_A, cluster)))
    assert code == 409 and "container proxy belongs to SidecarSet mesh" in message


def test_a_cluster_sidecarset_that_cannot_reach_the_namespace_does_not_block_the_name() -> None:
    cluster = builders.sidecarset(
        "mesh", containers=[builders.container("proxy", "envoy:1")], namespace_selector={"matchLabels": {"env": "prod"}}
    )
    obj = builders.namespaced_sidecarset("debug", containers=[builders.container("proxy", "mine:1")])
    assert validate(obj, store_with(TEAM_A, cluster))["allowed"] is True


def test_a_namespace_selector_is_refused_naming_the_field() -> None:
    obj = builders.namespaced_sidecarset(namespaceSelector={"matchLabels": {"a": "b"}})
    code, message = refusal(validate(obj))
    assert code == 422 and "spec.namespaceSelector" in message and "its own namespace only" in message


def test_schema_rules_are_the_sidecarsets() -> None:
    obj = builders.namespaced_sidecarset(containers=[builders.container("Bad_Name", "x:1")])
    code, message = refusal(validate(obj))
    assert code == 422 and "spec.containers[0].name" in message


@pytest.mark.parametrize("obj", [{"spec": "nope"}, {"metadata": 3}, {}])
def test_bad_input_is_a_4xx_denial_never_a_fault(obj: dict[str, Any]) -> None:
    code, message = refusal(validate(obj))
    assert 400 <= code < 500 and message.startswith(f"{names.NAMESPACED_KIND} rejected: ")


def test_a_tenants_name_never_blocks_a_cluster_sidecarset() -> None:
    tenant = builders.namespaced_sidecarset("debug", containers=[builders.container("proxy", "mine:1")])
    store = store_with(TEAM_A, tenant)
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0b2a8e-0000-4000-8000-000000000049",
            "kind": {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND},
            "resource": {"group": names.GROUP, "version": names.VERSION, "resource": names.PLURAL},
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": builders.sidecarset("mesh"),
        },
    }
    client = TestClient(create_webhook_app(store, WebhookSettings(replay=None)), raise_server_exceptions=False)
    resp = client.post(names.VALIDATE_PATH, content=orjson.dumps(review), headers={"content-type": "application/json"})
    assert resp.json()["response"]["allowed"] is True
    assert "team-a/debug" in store.snapshot.objects  # the tenant's set was there to clash with
