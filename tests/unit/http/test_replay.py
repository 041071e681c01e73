"""Replaying answers to repeated admission requests: keyed without the uid, spliced with the new one."""

from __future__ import annotations

import orjson
from starlette.testclient import TestClient

from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from injector.http.replay import ReplayCache, request_key
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore, namespace_labels
from tests.http.test_inject_app import ns, pod, review, sidecarset


def go_ordered(uid: str, obj: dict[str, object] | None = None) -> bytes:
    """An AdmissionReview in the field order the API server writes."""
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "shop",
        "operation": "CREATE",
        "object": obj or pod(),
    }
    return orjson.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})


def test_key_ignores_only_the_uid() -> None:
    a, b = request_key(go_ordered("uid-1")), request_key(go_ordered("uid-2"))
    assert a is not None and b is not None
    assert a[0] == b[0]
    assert (a[1], b[1]) == ("uid-1", "uid-2")
    other = request_key(go_ordered("uid-1", pod(app="other")))
    assert other is not None and other[0] != a[0]


def test_unexpected_shapes_are_not_replayable() -> None:
    assert request_key(b"") is None
    assert request_key(b'{"request":{"uid":"x"},"kind":"AdmissionReview"}') is None
    body = orjson.dumps(
        {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"object": {}, "uid": "x"}}
    )
    assert request_key(body) is None


def test_cache_splices_uid_and_respects_version_ttl_and_size() -> None:
    now = [0.0]
    cache = ReplayCache(ttl=1.0, max_entries=2, clock=lambda: now[0])
    response = b'{"response":{"uid":"u1","allowed":true}}'
    cache.put(b"k", "u1", 7, "injected", response)
    assert cache.get(b"k", "u2", 7) == ("injected", b'{"response":{"uid":"u2","allowed":true}}')
    assert cache.get(b"k", "u3", 8) is None  # another snapshot version
    cache.put(b"k", "u1", 7, "injected", response)
    now[0] = 1.5
    assert cache.get(b"k", "u2", 7) is None  # expired
    for key in (b"a", b"b", b"c"):
        cache.put(key, "u1", 1, "skipped", response)
    assert cache.get(b"a", "u9", 1) is None  # evicted, oldest first
    assert cache.get(b"c", "u9", 1) is not None
    cache.put(b"twice", "u1", 1, "skipped", b'{"uid":"u1","x":{"uid":"u1"}}')
    assert cache.get(b"twice", "u2", 1) is None  # ambiguous uid: never cached


def _client() -> tuple[TestClient, TemplateStore, ReplayCache]:
    store = TemplateStore()
    store.on_namespace("ADDED", None, namespace_labels(ns("shop", **{names.NS_INJECTION_LABEL: "enabled"})))
    store.on_sidecarset("ADDED", None, sidecarset())
    cache = ReplayCache()
    app = create_webhook_app(store, WebhookSettings(replay=cache))
    return TestClient(app), store, cache


def post(client: TestClient, body: bytes) -> dict[str, object]:
    r = client.post(names.INJECT_PATH, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    result: dict[str, object] = r.json()["response"]
    return result


def test_webhook_replays_identical_pods_with_their_own_uid() -> None:
    client, store, cache = _client()
    first = post(client, go_ordered("uid-1"))
    second = post(client, go_ordered("uid-2"))
    assert cache.hits == 1
    assert second["uid"] == "uid-2"
    assert second["patch"] == first["patch"]
    # A SidecarSet change makes the next identical pod take the full path, with the new spec.
    store.on_sidecarset("MODIFIED", sidecarset(), sidecarset(containers=[{"name": "proxy", "image": "proxy:9"}]))
    third = post(client, go_ordered("uid-3"))
    assert cache.hits == 1
    assert third["patch"] != first["patch"]


def test_unknown_namespace_and_pinned_revisions_are_not_replayed() -> None:
    client, store, cache = _client()
    body = orjson.loads(go_ordered("a"))
    body["request"]["namespace"] = "not-yet-known"
    for uid in ("a", "b"):
        body["request"]["uid"] = uid
        post(client, orjson.dumps(body))
    assert cache.hits == 0
    pinned = sidecarset(
        "pinned",
        selector={"matchLabels": {"app": "pin"}},
        containers=[{"name": "pin", "image": "pin:1"}],
        injectionStrategy={"revision": {"customVersion": "v1", "policy": "Partial"}},
    )
    store.on_sidecarset("ADDED", None, pinned)
    for uid in ("c", "d"):
        # The pinned SidecarSet does not select this pod: its missing revision must not block it.
        answer = post(client, go_ordered(uid))
        assert answer["allowed"] is True and "patch" in answer
    assert cache.hits == 0


def test_default_settings_replay_and_the_slow_path_still_answers_other_orders() -> None:
    client, _, _ = _client()
    r = client.post(
        names.INJECT_PATH, content=orjson.dumps(review(pod())), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200 and "patch" in r.json()["response"]
