"""/validate-sidecarset and tightened overrides: an update that allows less warns with the number of
running pods whose overrides fall outside the new bounds, names up to 10, and is admitted; one that
allows as much or more reads no pod."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from injector.http.validate import tightened
from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore
from tests.kube import builders

BOUNDS = [{"containerName": "proxy", "resources": {"cpu": {"max": "2"}}, "env": ["LOG_LEVEL"]}]


def mesh(bounds: Any) -> JsonObj:
    return builders.sidecarset("mesh", containers=[builders.container("proxy", "proxy:1")], overrides=bounds)


def injected(name: str, cpu: str | None, *, injected_by: str = "mesh") -> JsonObj:
    anns = {names.ANN_INJECTED_LIST: injected_by}
    if cpu is not None:
        anns[names.ANN_OVERRIDES] = json.dumps({"proxy": {"resources": {"limits": {"cpu": cpu}}}})
    return {"metadata": {"name": name, "namespace": "shop", "annotations": anns}}


class Pages:
    """GET /api/v1/pods, two pods a page with continue tokens; the selectors asked for are kept."""

    def __init__(self, pods: list[JsonObj], *, fail: bool = False) -> None:
        self.pods, self.fail = pods, fail
        self.asked: list[str] = []

    async def get(self, path: str, *, params: Any = None) -> JsonObj:
        assert path == "/api/v1/pods"
        self.asked.append(params["labelSelector"])
        if self.fail:
            raise api.ApiError(403, "Forbidden", "no")
        start = int(params.get("continue") or 0)
        more = start + 2 < len(self.pods)
        return {"metadata": {"continue": str(start + 2) if more else ""}, "items": self.pods[start : start + 2]}


def update(new: JsonObj, old: JsonObj, pages: Pages) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND},
            "resource": {"group": names.GROUP, "version": names.VERSION, "resource": names.PLURAL},
            "operation": "UPDATE",
            "object": new,
            "oldObject": old,
        },
    }
    settings = WebhookSettings(pod_lister=tightened.PodLister(pages))
    client = TestClient(create_webhook_app(TemplateStore(), settings), raise_server_exceptions=False)
    resp = client.post(names.VALIDATE_PATH, content=orjson.dumps(review), headers={"content-type": "application/json"})
    out: dict[str, Any] = resp.json()["response"]
    return out


def test_a_lower_maximum_warns_with_the_pods_outside_it_and_is_admitted() -> None:
    pods = [injected(f"web-{i}", "1500m") for i in range(12)] + [
        injected("small", "500m"),
        injected("plain", None),
        injected("other", "1500m", injected_by="other"),
    ]
    pages = Pages(pods)
    answer = update(mesh([{"containerName": "proxy", "resources": {"cpu": {"max": "1"}}}]), mesh(BOUNDS), pages)
    assert answer["allowed"] is True
    first, *named = answer["warnings"]
    assert first.startswith("spec.overrides: 12 running pod(s) carry overrides outside the new bounds")
    assert first.endswith("the first 10 follow")
    assert len(named) == 10 and named[0].startswith("spec.overrides: pod shop/web-0: sidecarctl.io/overrides[proxy]")
    assert pages.asked == [f"{names.POD_INJECTED_LABEL}=true,app=web"] * 8, "every page, by the SidecarSet's selector"


def test_an_update_that_allows_as_much_or_more_reads_no_pod() -> None:
    pages = Pages([injected("web-0", "1500m")])
    wider = [
        {
            "containerName": "proxy",
            "resources": {"cpu": {"max": "4"}, "memory": {"max": "1Gi"}},
            "env": ["LOG_LEVEL", "X"],
        }
    ]
    changed_image = copy.deepcopy(mesh(BOUNDS))
    changed_image["spec"]["containers"][0]["image"] = "proxy:2"
    for new in (mesh(wider), changed_image):
        assert not update(new, mesh(BOUNDS), pages).get("warnings")
    assert pages.asked == []


def test_a_dropped_env_name_counts_and_a_failed_read_is_said_not_refused() -> None:
    answer = update(
        mesh([{"containerName": "proxy", "resources": {"cpu": {"max": "2"}}}]), mesh(BOUNDS), Pages([], fail=True)
    )
    assert answer["allowed"] is True
    assert answer["warnings"] == [
        "spec.overrides: the running pods were not all checked against the new bounds "
        "(reading the pods failed after 0 (ApiError))"
    ]


def test_selectors_are_written_as_the_api_reads_them() -> None:
    selector = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "Exists"},
        ],
    }
    assert tightened.label_selector(selector) == (f"{names.POD_INJECTED_LABEL}=true,app=web,tier in (a,b),!canary,zone")
    assert tightened.label_selector({"matchExpressions": [{"key": "x", "operator": "Gt"}]}) is None
