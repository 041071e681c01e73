"""/validate-sidecarset admits a SidecarSet that patches Kruise's launch-priority annotation, with a
warning that sidecarctl does not implement Container Launch Priority (README: Choices)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.validate.advice import LAUNCH_PRIORITY, PRIORITY_ENV
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore
from tests.kube import builders


def validate(obj: dict[str, Any]) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0b2a8e-0000-4000-8000-000000000002",
            "kind": {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND},
            "resource": {"group": names.GROUP, "version": names.VERSION, "resource": names.PLURAL},
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": obj,
        },
    }
    client = TestClient(create_webhook_app(TemplateStore()), raise_server_exceptions=False)
    resp = client.post(names.VALIDATE_PATH, content=orjson.dumps(review), headers={"content-type": "application/json"})
    assert resp.status_code == 200
    out: dict[str, Any] = resp.json()["response"]
    return out


def test_launch_priority_is_admitted_with_a_warning() -> None:
    patch = [{"annotations": {LAUNCH_PRIORITY: "Ordered"}, "patchPolicy": "Overwrite"}]
    answer = validate(builders.sidecarset("mesh", patchPodMetadata=patch))
    assert answer["allowed"] is True
    [warning] = answer["warnings"]
    assert "spec.patchPodMetadata[0]" in warning and "Container Launch Priority" in warning
    assert "restartPolicy: Always" in warning


def test_a_sidecar_with_kruises_priority_env_gets_a_warning() -> None:
    proxy = builders.container("proxy", "proxy:1", env=[{"name": PRIORITY_ENV, "value": "1000"}])
    answer = validate(builders.sidecarset("mesh", containers=[proxy]))
    assert answer["allowed"] is True
    [warning] = answer["warnings"]
    assert warning.startswith(f"spec.containers[0] sets the env {PRIORITY_ENV}")


def test_other_annotations_get_no_warning() -> None:
    patch = [{"annotations": {"example.com/mesh": "on"}, "patchPolicy": "Retain"}]
    answer = validate(builders.sidecarset("mesh", patchPodMetadata=patch))
    assert answer["allowed"] is True
    assert not answer.get("warnings")
