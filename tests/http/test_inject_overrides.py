"""/inject and a pod's sidecarctl.io/overrides: a refusal is a 403 Forbidden denial counted by reason,
an ignored override a warning on an admitted pod."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from sidecarsets.spec import names
from tests.http.test_inject_app import NOW, patched, pod, post, review, shop_store, sidecarset
from tests.kube import builders

BOUNDS = [{"containerName": "proxy", "resources": {"cpu": {"max": "2"}}}]


def client() -> TestClient:
    store = shop_store()
    proxy = builders.container("proxy", "proxy:1", resources={"limits": {"cpu": "1"}})
    store.on_sidecarset("ADDED", None, sidecarset(containers=[proxy], overrides=BOUNDS))
    return TestClient(create_webhook_app(store, WebhookSettings(clock=lambda: NOW)), raise_server_exceptions=False)


def with_overrides(value: Any) -> dict[str, Any]:
    p = pod()
    p["metadata"]["annotations"] = {names.ANN_OVERRIDES: json.dumps(value)}
    return p


def refusals(reason: str) -> float:
    return REGISTRY.get_sample_value("sidecarctl_override_refusals_total", {"reason": reason}) or 0.0


def test_an_allowed_override_is_injected_merged() -> None:
    obj = with_overrides({"proxy": {"resources": {"limits": {"cpu": "1500m"}}}})
    got = post(client(), review(obj)).json()
    assert got["response"]["allowed"] is True
    proxy = next(c for c in patched(got, obj)["spec"]["containers"] if c["name"] == "proxy")
    assert proxy["resources"] == {"limits": {"cpu": "1500m"}}


def test_a_refused_override_is_a_403_forbidden_counted_by_reason() -> None:
    denials = {"reason": "overrides"}
    before = refusals("out_of_range"), REGISTRY.get_sample_value("sidecarctl_pod_denials_total", denials)
    got = post(client(), review(with_overrides({"proxy": {"resources": {"limits": {"cpu": "3"}}}}))).json()
    response = got["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert response["status"]["message"] == (
        'sidecarctl.io/overrides[proxy].resources.limits.cpu: Forbidden: "3" is above the maximum SidecarSet mesh '
        "allows for container proxy (allowed: at most 2)"
    )
    assert refusals("out_of_range") == before[0] + 1
    assert REGISTRY.get_sample_value("sidecarctl_pod_denials_total", denials) == (before[1] or 0) + 1


def test_a_malformed_annotation_is_refused_and_counted_invalid() -> None:
    before = refusals("invalid")
    obj = pod()
    obj["metadata"]["annotations"] = {names.ANN_OVERRIDES: "{not json"}
    response = post(client(), review(obj)).json()["response"]
    assert response["status"]["code"] == 403 and response["status"]["message"].startswith(
        'sidecarctl.io/overrides: Invalid value: "{not json": not valid JSON'
    )
    assert refusals("invalid") == before + 1


def test_an_override_of_a_container_nothing_injects_is_a_warning_on_an_admitted_pod() -> None:
    got = post(client(), review(with_overrides({"app": {"env": [{"name": "A", "value": "1"}]}}))).json()
    response = got["response"]
    assert response["allowed"] is True and "patch" in response
    assert response["warnings"] == [
        "sidecarctl.io/overrides[app]: no SidecarSet injects a container app into this pod; its override is ignored"
    ]
