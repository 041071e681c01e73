"""Fuzzing the webhooks: whatever arrives, the answer is an AdmissionReview or a 4xx, never a 5xx."""

from __future__ import annotations

import base64
import copy
from typing import Any

import jsonpatch
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore, namespace_labels
from tests.http.test_inject_app import pod, review, sidecarset

json_scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
names_st = st.sampled_from(["app", "proxy", "proxy-init", "x", "", "IS_INJECTED"])
containers = st.lists(
    st.fixed_dictionaries(
        {"name": names_st, "image": st.text(max_size=8)},
        optional={
            "env": st.lists(st.fixed_dictionaries({"name": names_st}, optional={"value": json_values}), max_size=3),
            "volumeMounts": st.lists(
                st.fixed_dictionaries({"name": names_st, "mountPath": st.text(max_size=5)}), max_size=2
            ),
            "restartPolicy": st.sampled_from(["Always", "Never"]),
        },
    ),
    max_size=3,
)
pods = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "labels": st.dictionaries(st.sampled_from(["app", names.POD_INJECT_LABEL, "x"]), st.text(max_size=5)),
                "annotations": st.dictionaries(
                    st.sampled_from([names.ANN_HASH, names.ANN_INJECTED_LIST, names.ANN_DEFAULT_CONTAINER, "a/b~c"]),
                    st.text(max_size=10),
                ),
                "name": st.text(max_size=5),
            },
        ),
        "spec": st.fixed_dictionaries(
            {"containers": containers},
            optional={
                "initContainers": containers,
                "volumes": st.lists(st.fixed_dictionaries({"name": names_st}), max_size=2),
                "imagePullSecrets": st.lists(json_values, max_size=2),
            },
        ),
    },
    optional={"status": json_values},
)


def _client() -> TestClient:
    store = TemplateStore()
    store.on_namespace(
        "ADDED", None, namespace_labels({"metadata": {"name": "shop", "labels": {names.NS_INJECTION_LABEL: "enabled"}}})
    )
    store.on_sidecarset(
        "ADDED",
        None,
        sidecarset(
            containers=[
                {"name": "proxy", "image": "proxy:1", "shareVolumePolicy": {"type": "enabled"}},
                {
                    "name": "log",
                    "image": "log:1",
                    "podInjectPolicy": "AfterAppContainer",
                    "transferEnv": [{"sourceContainerName": "app", "envName": "x"}],
                },
            ],
            selector={"matchExpressions": [{"key": "app", "operator": "Exists"}]},
        ),
    )
    return TestClient(create_webhook_app(store, WebhookSettings()), raise_server_exceptions=False)


CLIENT = _client()


def _check(resp: Any, obj: Any = None) -> None:
    assert resp.status_code < 500, resp.text
    if resp.status_code == 200:
        body = resp.json()
        assert body["kind"] == "AdmissionReview"
        assert isinstance(body["response"]["allowed"], bool)
        assert isinstance(body["response"]["uid"], str)
        if "patch" in body["response"] and isinstance(obj, dict):
            ops = orjson.loads(base64.b64decode(body["response"]["patch"]))
            out = jsonpatch.apply_patch(copy.deepcopy(obj), ops)
            before = [c.get("name") for c in obj["spec"]["containers"]]
            got = [c.get("name") for c in out["spec"]["containers"]]
            if len(before) == len(set(before)):  # the engine never adds a duplicate name
                assert len(got) == len(set(got)), f"duplicate containers {got}"
    else:
        assert resp.status_code >= 400
        assert "Traceback" not in resp.text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=200) | json_values.map(orjson.dumps))
def test_arbitrary_bodies(body: bytes) -> None:
    _check(CLIENT.post(names.INJECT_PATH, content=body, headers={"content-type": "application/json"}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    request=st.dictionaries(
        st.sampled_from(
            ["uid", "kind", "operation", "object", "namespace", "dryRun", "subResource", "oldObject", "resource"]
        ),
        json_values,
    )
)
def test_arbitrary_requests(request: dict[str, Any]) -> None:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    _check(CLIENT.post(names.INJECT_PATH, content=orjson.dumps(body), headers={"content-type": "application/json"}))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=pods)
def test_arbitrary_pods(obj: dict[str, Any]) -> None:
    body = review(obj)
    _check(
        CLIENT.post(names.INJECT_PATH, content=orjson.dumps(body), headers={"content-type": "application/json"}), obj
    )


def test_plain_pod_still_injects() -> None:
    r = CLIENT.post(
        names.INJECT_PATH, content=orjson.dumps(review(pod())), headers={"content-type": "application/json"}
    )
    assert "patch" in r.json()["response"]
