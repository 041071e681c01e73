"""The /inject AdmissionReview contract, in process: what the API server sends, what it gets back."""

from __future__ import annotations

import base64
import copy
from typing import Any

import jsonpatch
import orjson
import pytest
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore, namespace_labels
from tests.kube import builders

NOW = "2026-11-29T10:00:00Z"


def ns(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def sidecarset(name: str = "mesh", **spec: Any) -> dict[str, Any]:
    """The default SidecarSet with an init container too, created before every request here."""
    init = [builders.container("proxy-init", "proxy-init:1")]
    created = {"creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1}
    return builders.sidecarset(name, init_containers=init, metadata=created, **spec)


def pod(**labels: str) -> dict[str, Any]:
    """A pod as a ReplicaSet sends it: no name yet, `generateName` instead; `app: web` unless `labels`."""
    return builders.pod(None, labels=labels or None, metadata={"generateName": "web-"})


def review(
    obj: Any, *, namespace: str = "shop", api_version: str = "admission.k8s.io/v1", **req: Any
) -> dict[str, Any]:
    request = {
        "uid": "7f0b2a8e-0000-4000-8000-000000000001",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": obj,
        "dryRun": False,
    }
    request.update(req)
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def shop_store() -> TemplateStore:
    """Namespace `shop` labelled for injection, `plain` not, and the default SidecarSet."""
    s = TemplateStore()
    s.on_namespace("ADDED", None, namespace_labels(ns("shop", **{names.NS_INJECTION_LABEL: "enabled"})))
    s.on_namespace("ADDED", None, namespace_labels(ns("plain")))
    s.on_sidecarset("ADDED", None, sidecarset())
    return s


@pytest.fixture
def store() -> TemplateStore:
    return shop_store()


@pytest.fixture
def client(store: TemplateStore) -> TestClient:
    app = create_webhook_app(store, WebhookSettings(clock=lambda: NOW))
    return TestClient(app, raise_server_exceptions=False)


def post(client: TestClient, body: Any, content_type: str = "application/json") -> Any:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return client.post(names.INJECT_PATH, content=data, headers={"content-type": content_type})


def patched(resp_json: dict[str, Any], original: dict[str, Any]) -> dict[str, Any]:
    r = resp_json["response"]
    if "patch" not in r:
        return original
    assert r["patchType"] == "JSONPatch"
    ops = orjson.loads(base64.b64decode(r["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(original), ops)
    return result


def test_injects_init_and_proxy_container_into_labelled_namespace(client: TestClient) -> None:
    p = pod()
    r = post(client, review(p))
    assert r.status_code == 200
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == "7f0b2a8e-0000-4000-8000-000000000001"
    assert body["response"]["allowed"] is True
    out = patched(body, p)
    assert [c["name"] for c in out["spec"]["containers"]] == ["proxy", "app"]
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["proxy-init"]
    assert {"name": "IS_INJECTED", "value": "true"} in out["spec"]["containers"][0]["env"]
    ann = out["metadata"]["annotations"]
    assert ann[names.ANN_INJECTED_LIST] == "mesh"
    assert "mesh" in orjson.loads(ann[names.ANN_HASH])
    assert ann[names.ANN_DEFAULT_CONTAINER] == "app"
    assert out["metadata"]["labels"][names.POD_INJECTED_LABEL] == "true"


def test_v1beta1_review_is_answered_in_v1beta1(client: TestClient) -> None:
    r = post(client, review(pod(), api_version="admission.k8s.io/v1beta1"))
    assert r.status_code == 200
    assert r.json()["apiVersion"] == "admission.k8s.io/v1beta1"
    assert "patch" in r.json()["response"]


def test_unlabelled_namespace_gets_no_patch(client: TestClient) -> None:
    r = post(client, review(pod(), namespace="plain"))
    assert r.status_code == 200
    assert r.json()["response"] == {"uid": "7f0b2a8e-0000-4000-8000-000000000001", "allowed": True}


def test_opted_out_pod_gets_no_patch(client: TestClient) -> None:
    r = post(client, review(pod(app="web", **{names.POD_INJECT_LABEL: "false"})))
    assert r.status_code == 200
    assert "patch" not in r.json()["response"]


def test_reinvocation_on_injected_pod_adds_nothing(client: TestClient) -> None:
    first = patched(post(client, review(pod())).json(), pod())
    again = post(client, review(first)).json()
    assert again["response"]["allowed"] is True
    assert "patch" not in again["response"]


def test_dry_run_answers_the_same_and_changes_nothing(client: TestClient, store: TemplateStore) -> None:
    before = store.snapshot
    real = post(client, review(pod())).json()["response"]["patch"]
    dry = post(client, review(pod(), dryRun=True)).json()["response"]["patch"]
    assert dry == real
    assert store.snapshot is before


def test_update_and_delete_operations_are_allowed_untouched(client: TestClient) -> None:
    for op in ("UPDATE", "DELETE", "CONNECT"):
        r = post(client, review(pod(), operation=op, oldObject=pod()))
        assert r.status_code == 200
        assert r.json()["response"] == {"uid": "7f0b2a8e-0000-4000-8000-000000000001", "allowed": True}


def test_sidecarset_changes_reach_the_next_admission(client: TestClient, store: TemplateStore) -> None:
    store.on_sidecarset("MODIFIED", sidecarset(), sidecarset(containers=[{"name": "proxy", "image": "proxy:2"}]))
    out = patched(post(client, review(pod())).json(), pod())
    assert out["spec"]["containers"][0]["image"] == "proxy:2"
    store.on_sidecarset("DELETED", sidecarset(), None)
    assert "patch" not in post(client, review(pod())).json()["response"]


def test_conflicting_sidecarsets_inject_one_and_warn(client: TestClient, store: TemplateStore) -> None:
    later = sidecarset("mesh-b")
    later["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    store.on_sidecarset("ADDED", None, later)
    body = post(client, review(pod())).json()["response"]
    out = patched({"response": body}, pod())
    assert [c["name"] for c in out["spec"]["containers"]].count("proxy") == 1
    assert out["metadata"]["annotations"][names.ANN_INJECTED_LIST] == "mesh"
    assert any("mesh-b" in w and "mesh" in w for w in body["warnings"])


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"", 400, "empty body"),
        (b"{not json", 400, "not valid JSON"),
        (b"[]", 400, "JSON object"),
        (orjson.dumps({"kind": "Pod"}), 400, "AdmissionReview"),
        (orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v2"}), 400, "apiVersion"),
        (orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}), 400, "no request"),
        (orjson.dumps(review(pod(), uid="")), 400, "uid"),
        (orjson.dumps(review("a string")), 400, "request.object"),
        (orjson.dumps(review(None)), 400, "request.object is required"),
        (
            orjson.dumps(review(pod(), kind={"group": "apps", "version": "v1", "kind": "Deployment"})),
            400,
            "admits pods",
        ),
    ],
)
def test_bad_bodies_get_a_4xx_with_a_clear_message(client: TestClient, body: bytes, status: int, fragment: str) -> None:
    r = post(client, body)
    assert r.status_code == status
    assert fragment in r.text
    assert "Traceback" not in r.text


def test_wrong_content_type_is_415(client: TestClient) -> None:
    r = post(client, orjson.dumps(review(pod())), content_type="text/plain")
    assert r.status_code == 415
    assert "application/json" in r.text


def test_oversized_body_is_413(client: TestClient) -> None:
    big = pod()
    big["metadata"]["annotations"] = {"blob": "x" * (6 * 1024 * 1024 + 10)}
    r = post(client, review(big))
    assert r.status_code == 413
    assert "limit" in r.text


def test_get_is_405(client: TestClient) -> None:
    assert client.get(names.INJECT_PATH).status_code == 405


def denials(reason: str) -> float:
    return REGISTRY.get_sample_value("sidecarctl_pod_denials_total", {"reason": reason}) or 0.0


def test_malformed_pod_is_denied_not_crashed(client: TestClient) -> None:
    bad = pod()
    bad["spec"]["containers"] = "oops"
    before = denials("cannot_inject")
    r = post(client, review(bad))
    assert r.status_code == 200
    resp = r.json()["response"]
    assert resp["allowed"] is False
    assert "containers" in resp["status"]["message"]
    assert denials("cannot_inject") == before + 1


def test_unknown_namespace_is_refused_for_a_retry_never_admitted_without_sidecars(client: TestClient) -> None:
    before = denials("namespace_unknown")
    r = post(client, review(pod(), namespace="not-yet-seen"))
    assert denials("namespace_unknown") == before + 1
    assert r.status_code == 200
    response = r.json()["response"]
    assert "patch" not in response
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert "not-yet-seen" in response["status"]["message"] and "retry" in response["status"]["message"]


def test_pod_in_default_namespace_when_request_names_none(client: TestClient, store: TemplateStore) -> None:
    store.on_namespace("ADDED", None, namespace_labels(ns("default", **{names.NS_INJECTION_LABEL: "enabled"})))
    out = patched(post(client, review(pod(), namespace="")).json(), pod())
    assert out["spec"]["containers"][0]["name"] == "proxy"
