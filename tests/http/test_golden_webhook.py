"""The golden injection cases through the webhook: same engine, same result as the CLI, byte for byte.

Each Pod case is sent as an AdmissionReview to the ASGI app; the returned JSON Patch, applied with
jsonpatch, must give the expected pod of the case. The namespace is labelled for injection (the
CLI does not gate on it), with any labels the case gives. Cases whose pods name no namespace while
a SidecarSet is namespace-scoped are CLI-only: an admission request always has a namespace.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import jsonpatch
import orjson
import pytest
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.store import TemplateStore, namespace_labels
from tests.golden_cases import GOLDEN_NOW, GoldenCase, cases


def _webhook_comparable(case: GoldenCase) -> bool:
    if not case.has_pods or "--manager-namespace" in " ".join(case.args):
        return False
    scoped = any(SidecarSet.from_object(o).namespace_selector is not None for o in case.sidecarsets)
    return not (scoped and any(not (pod.get("metadata") or {}).get("namespace") for pod, _ in case.pods()))


CASES = [c for c in cases() if _webhook_comparable(c)]


def test_most_pod_cases_run_through_the_webhook() -> None:
    assert len(CASES) >= 15


def _client(case: GoldenCase, namespace: str) -> TestClient:
    store = TemplateStore()
    labels = {**case.namespace_labels.get(namespace, {}), names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
    store.on_namespace("ADDED", None, namespace_labels({"metadata": {"name": namespace, "labels": labels}}))
    for obj in case.sidecarsets:
        store.on_sidecarset("ADDED", None, obj)
    app = create_webhook_app(store, WebhookSettings(clock=lambda: GOLDEN_NOW))
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_webhook(case: GoldenCase) -> None:
    for pod, expected in case.pods():
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        review: dict[str, Any] = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "golden",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "operation": "CREATE",
                "object": pod,
            },
        }
        r = _client(case, namespace).post(
            names.INJECT_PATH, content=orjson.dumps(review), headers={"content-type": "application/json"}
        )
        assert r.status_code == 200, r.text
        resp = r.json()["response"]
        assert resp["allowed"] is True, resp
        got = copy.deepcopy(pod)
        if "patch" in resp:
            got = jsonpatch.apply_patch(got, orjson.loads(base64.b64decode(resp["patch"])))
        assert got == expected
        for warning in resp.get("warnings", []):
            assert any(warning in line for line in case.expected_warnings), warning
