"""A fault of the webhook's own is not the caller's: answered in process as the API server needs it.

Once the request is known, /inject and /validate-sidecarset answer an AdmissionReview denial with
code 500 (InternalError) and a message that names the fault and points to the manager's log, and
/convert a ConversionReview Failure with the same; a fault before the request could be read is a
plain 500. Each is counted as an `error` and logged on one line. The real manager process is
checked the same way in tests/reliability/test_handler_faults.py.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY
from starlette.testclient import TestClient

from injector.http import admission, app, decisions
from sidecarsets.spec import conversion, names
from sidecarsets.store import TemplateStore
from tests.http import test_convert_app as convert_app
from tests.http.test_inject_app import pod, review, shop_store
from tests.kube import builders


def fault(*_: Any, **__: Any) -> Any:
    raise KeyError("a bug in the webhook")


async def async_fault(*_: Any, **__: Any) -> Any:
    fault()


def errors(webhook: str) -> float:
    return REGISTRY.get_sample_value("sidecarctl_admissions_total", {"webhook": webhook, "result": "error"}) or 0.0


@pytest.fixture
def client() -> TestClient:
    return TestClient(app.create_webhook_app(shop_store()), raise_server_exceptions=False)


def assert_errored(answer: Any) -> dict[str, Any]:
    """The denial's status: code 500, InternalError, the fault named, the manager's log pointed to."""
    status: dict[str, Any] = answer["status"]
    assert answer["allowed"] is False
    assert (status["code"], status["reason"]) == (500, "InternalError")
    assert "KeyError: 'a bug in the webhook'" in status["message"]
    assert "not the request's" in status["message"] and "see the manager's log" in status["message"]
    return status


@pytest.mark.parametrize("api_version", admission.API_VERSIONS)
def test_a_fault_in_inject_is_a_denial_with_code_500_for_that_request(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, api_version: str
) -> None:
    monkeypatch.setattr(decisions, "inject", async_fault)
    before = errors("inject")
    body = review(pod(), api_version=api_version)
    with caplog.at_level(logging.ERROR, logger="injector.app"):
        r = client.post(names.INJECT_PATH, content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert (r.status_code, r.headers["content-type"]) == (200, "application/json")
    doc = r.json()
    assert (doc["apiVersion"], doc["kind"]) == (api_version, "AdmissionReview")
    assert doc["response"]["uid"] == body["request"]["uid"] and "patch" not in doc["response"]
    assert_errored(doc["response"])
    assert errors("inject") == before + 1
    (line,) = [r for r in caplog.records if r.name == "injector.app"]
    assert line.getMessage() == "inject: unexpected error: KeyError: 'a bug in the webhook'"
    assert line.exc_info is None, "one line, no traceback"


def test_a_fault_in_validate_denies_the_sidecarset(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decisions, "validate", async_fault)
    kind = {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND}
    body = review(builders.sidecarset("mesh"), kind=kind, resource={"resource": names.PLURAL}, namespace="")
    r = client.post(names.VALIDATE_PATH, content=orjson.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert_errored(r.json()["response"])


def test_the_same_fault_answers_each_request_and_the_next_good_one_is_served(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = decisions.inject

    async def flaky(review: admission.Review, *args: Any) -> decisions.Decision:
        if review.uid.endswith("bad"):
            fault()
        return await real(review, *args)

    monkeypatch.setattr(decisions, "inject", flaky)
    for uid in ("u-bad", "u-good"):
        body = review(pod(), uid=uid)
        r = client.post(names.INJECT_PATH, content=orjson.dumps(body), headers={"content-type": "application/json"})
        answer = r.json()["response"]
        assert (r.status_code, answer["uid"]) == (200, uid)
        if uid == "u-bad":
            assert_errored(answer)
        else:
            assert answer["allowed"] is True and "patch" in answer


def test_a_fault_before_the_request_is_read_is_a_plain_500(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "parse", fault)
    body = orjson.dumps(review(pod()))
    r = client.post(names.INJECT_PATH, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 500 and r.headers["content-type"].startswith("text/plain")
    assert "see the manager's log" in r.text and "Traceback" not in r.text


def test_a_fault_in_conversion_is_a_conversion_failure_with_code_500(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(conversion, "convert", fault)
    client = TestClient(app.create_webhook_app(TemplateStore()), raise_server_exceptions=False)
    before = errors("convert")
    r = convert_app.post(client, convert_app.review([convert_app.stored("a")]))
    assert r.status_code == 200
    doc = r.json()
    assert (doc["kind"], doc["response"]["uid"]) == ("ConversionReview", convert_app.UID)
    result = doc["response"]["result"]
    assert (result["status"], result["code"], result["reason"]) == ("Failure", 500, "InternalError")
    assert "KeyError: 'a bug in the webhook'" in result["message"] and "see the manager's log" in result["message"]
    assert "convertedObjects" not in doc["response"]
    assert errors("convert") == before + 1


def test_bad_conversion_input_is_still_a_failure_without_a_code(client: TestClient) -> None:
    """The fault path does not swallow the answers to bad input: those name the problem, no code."""
    r = convert_app.post(client, convert_app.review("not a list"))
    result = r.json()["response"]["result"]
    assert (r.status_code, result) == (200, {"status": "Failure", "message": "request.objects must be a list"})
