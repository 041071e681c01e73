"""The /convert ConversionReview contract, in process: what the API server sends, what it gets back.

The API server checks the answer strictly (same uid, the objects in order, each in the desired
version, metadata changed only in labels and annotations), and shows a Failure's message to its
client. So every request that is a ConversionReview gets one back; bad input is a Failure naming the
object and the field, and only what hits a bound or is no ConversionReview at all is a 4xx.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from injector.http.app import CONVERT_MAX_BYTES, create_webhook_app
from injector.http.body import BodyLimits, count_values
from sidecarsets.spec import names
from sidecarsets.spec.conversion import convert
from sidecarsets.store import TemplateStore
from tests.kube import builders

ALPHA, BETA = names.API_VERSION, names.API_VERSION_V1BETA1
UID = "0f6d2b7e-0000-4000-8000-00000000c0de"


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_webhook_app(TemplateStore()), raise_server_exceptions=False)


def stored(name: str, **spec: Any) -> dict[str, Any]:
    """A v1alpha1 SidecarSet with the metadata the API server keeps on it."""
    meta = {"uid": f"uid-{name}", "resourceVersion": "17", "generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z"}
    return builders.sidecarset(name, metadata=meta, **spec)


def review(objects: Any, desired: Any = BETA, **request: Any) -> dict[str, Any]:
    body = {"uid": UID, "desiredAPIVersion": desired, "objects": objects, **request}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": body}


def post(client: TestClient, body: Any, **headers: str) -> Any:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return client.post(names.CONVERT_PATH, content=raw, headers={"content-type": "application/json", **headers})


def counted(result: str) -> float:
    value = REGISTRY.get_sample_value("sidecarctl_admissions_total", {"webhook": "convert", "result": result})
    return value or 0.0


def test_a_list_is_converted_in_order_with_the_uid_echoed(client: TestClient) -> None:
    objects = [
        stored("a", namespace="shop"),
        stored("b", labels={names.SS_LABEL_CUSTOM_VERSION: "v2"}),
        {**stored("c"), "apiVersion": BETA},  # already in the desired version: given back as it is
    ]
    before = counted("converted")
    r = post(client, review(objects))
    assert r.status_code == 200
    body = r.json()
    assert (body["apiVersion"], body["kind"]) == ("apiextensions.k8s.io/v1", "ConversionReview")
    response = body["response"]
    assert response["uid"] == UID
    assert response["result"] == {"status": "Success"}
    assert response["convertedObjects"] == [convert(o, BETA) for o in objects]
    assert [o["apiVersion"] for o in response["convertedObjects"]] == [BETA] * 3
    assert response["convertedObjects"][0]["spec"]["namespaceSelector"] == {
        "matchLabels": {names.NS_NAME_LABEL: "shop"}
    }, "an alpha namespace reads as Kruise's selector"
    assert response["convertedObjects"][1]["spec"]["customVersion"] == "v2"
    assert counted("converted") == before + 1


def test_back_to_the_storage_version(client: TestClient) -> None:
    beta = convert(stored("a", namespaceSelector={"matchLabels": {"team": "a"}}), BETA)
    r = post(client, review([beta], ALPHA))
    assert r.json()["response"]["convertedObjects"] == [stored("a", namespaceSelector={"matchLabels": {"team": "a"}})]


def test_an_empty_list_is_a_success(client: TestClient) -> None:
    r = post(client, review([]))
    assert r.status_code == 200
    assert r.json()["response"] == {"uid": UID, "convertedObjects": [], "result": {"status": "Success"}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (review([stored("a")], "sidecarctl.io/v2"), "request.desiredAPIVersion 'sidecarctl.io/v2' is not a SidecarSet"),
        (review([stored("a")], None), "request.desiredAPIVersion None is not a SidecarSet version"),
        (review({"items": []}), "request.objects must be a list"),
        ({**review([]), "apiVersion": "apiextensions.k8s.io/v1beta1"}, "'apiextensions.k8s.io/v1beta1' is not"),
        (
            review([stored("a"), {**stored("b"), "kind": "Pod"}]),
            f"cannot convert SidecarSet b (request.objects[1]) to {BETA}: kind: 'Pod' is not SidecarSet",
        ),
        (review(["junk"]), "cannot convert a SidecarSet without a name (request.objects[0])"),
        (
            review([{**stored("a"), "apiVersion": BETA, "spec": {"specificNamespace": "shop"}}], ALPHA),
            f"cannot convert SidecarSet a (request.objects[0]) to {ALPHA}: spec.specificNamespace must be an object",
        ),
    ],
)
def test_bad_requests_are_a_failure_naming_what_is_wrong(client: TestClient, body: Any, message: str) -> None:
    before = counted("failed")
    r = post(client, body)
    assert r.status_code == 200, "the API server shows a Failure's message to its client; an HTTP error it hides"
    response = r.json()["response"]
    assert response["uid"] == UID
    assert response["result"]["status"] == "Failure"
    assert message in response["result"]["message"]
    assert "convertedObjects" not in response
    assert counted("failed") == before + 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "body is not valid JSON"),
        (b"[]", "body must be a ConversionReview with a request"),
        (orjson.dumps({"kind": "AdmissionReview", "request": {}}), "body must be a ConversionReview"),
        (orjson.dumps({"kind": "ConversionReview", "request": {"objects": []}}), "request.uid must be a non-empty"),
    ],
)
def test_a_body_that_is_no_conversion_review_is_a_400_in_the_same_shape(
    client: TestClient, raw: bytes, message: str
) -> None:
    r = post(client, raw)
    assert r.status_code == 400
    result = r.json()["response"]["result"]
    assert result["status"] == "Failure" and message in result["message"]


def test_only_post_and_json(client: TestClient) -> None:
    assert client.get(names.CONVERT_PATH).status_code == 405
    r = post(client, review([]), **{"content-type": "text/plain"})
    assert r.status_code == 415


def test_a_list_larger_than_a_pod_fits_and_the_bounds_still_hold() -> None:
    limits = BodyLimits(max_values=500)
    client = TestClient(create_webhook_app(TemplateStore(), limits=limits), raise_server_exceptions=False)
    many = review([stored(f"s{i}") for i in range(60)])  # about 1,000 JSON values: twice what a pod may hold
    assert count_values(orjson.dumps(many)) > 2 * limits.max_values
    assert post(client, many).status_code == 200
    r = post(client, review([stored(f"s{i}") for i in range(600)]))  # about 10,000
    assert r.status_code == 413 and "JSON values" in r.text
    huge = orjson.dumps(review([stored("a", containers=[{"name": "p", "image": "x" * CONVERT_MAX_BYTES}])]))
    r = post(client, huge)
    assert r.status_code == 413 and "larger than" in r.text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
OBJECTS = st.one_of(
    JSON,
    st.builds(
        lambda spec, meta, version: {"apiVersion": version, "kind": "SidecarSet", "metadata": meta, "spec": spec},
        st.dictionaries(
            st.sampled_from(["namespace", "namespaceSelector", "specificNamespace", "customVersion", "selector"]), JSON
        ),
        st.fixed_dictionaries({}, optional={"name": st.text(max_size=4), "labels": JSON, "annotations": JSON}),
        st.sampled_from([ALPHA, BETA, names.KRUISE_API_VERSION, "v1"]),
    ),
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(objects=st.lists(OBJECTS, max_size=3), desired=st.sampled_from([ALPHA, BETA, "sidecarctl.io/v2"]))
def test_whatever_the_objects_the_answer_is_a_conversion_review(
    client: TestClient, objects: list[Any], desired: str
) -> None:
    r = post(client, review(objects, desired))
    assert r.status_code == 200
    response = r.json()["response"]
    assert response["uid"] == UID
    if response["result"]["status"] == "Success":
        converted = response["convertedObjects"]
        assert len(converted) == len(objects)
        assert all(o["apiVersion"] == desired for o in converted)
    else:
        assert response["result"]["status"] == "Failure" and response["result"]["message"]
