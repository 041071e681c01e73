"""Events on the real API server: fields, aggregation by count, namespaces, best-effort posting."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kuberuntime import kubeapi
from kuberuntime.events import MAX_MESSAGE, EventRecorder, truncate_message
from tests.kube import builders
from tests.kube.client import Kube
from tests.kube.loop import BackgroundLoop

SS_PATH = "/apis/sidecarctl.io/v1alpha1/sidecarsets"


@pytest.fixture
def sidecarset(kube: Kube, crd: dict[str, Any]) -> Iterator[dict[str, Any]]:
    name = f"events-{secrets.token_hex(3)}"
    yield kube.create(SS_PATH, builders.sidecarset(name))
    kube.delete(f"{SS_PATH}/{name}")


def events_about(kube: Kube, namespace: str, uid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get(
        f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.uid={uid}"
    )["items"]
    return items


def test_event_on_a_sidecarset_lands_in_default_and_repeats_bump_count(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, sidecarset: dict[str, Any]
) -> None:
    rec = EventRecorder(kube_client, instance="manager-0")
    meta = sidecarset["metadata"]
    first = aloop.run(rec.event(sidecarset, type="Warning", reason="NotUpgradablePods", message="2 pods differ"))
    assert first is not None
    try:
        (ev,) = events_about(kube, "default", meta["uid"])
        assert ev["involvedObject"] == {
            "apiVersion": "sidecarctl.io/v1alpha1",
            "kind": "SidecarSet",
            "name": meta["name"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
        }
        assert (ev["type"], ev["reason"], ev["message"]) == ("Warning", "NotUpgradablePods", "2 pods differ")
        assert ev["source"]["component"] == "sidecarctl"
        assert ev["reportingComponent"] == "sidecarctl"
        assert ev["reportingInstance"] == "manager-0"
        assert ev["count"] == 1
        assert ev["firstTimestamp"] == ev["lastTimestamp"]

        aloop.run(rec.event(sidecarset, type="Warning", reason="NotUpgradablePods", message="2 pods differ"))
        (again,) = events_about(kube, "default", meta["uid"])
        assert again["metadata"]["name"] == ev["metadata"]["name"], "aggregated into the same Event"
        assert again["count"] == 2
        assert again["firstTimestamp"] == ev["firstTimestamp"]
        assert again["lastTimestamp"] >= ev["lastTimestamp"]

        # A different message is a different event.
        aloop.run(rec.event(sidecarset, type="Warning", reason="NotUpgradablePods", message="3 pods differ"))
        assert sorted(e["count"] for e in events_about(kube, "default", meta["uid"])) == [1, 2]
    finally:
        for e in events_about(kube, "default", meta["uid"]):
            kube.delete(f"/api/v1/namespaces/default/events/{e['metadata']['name']}")


def test_event_on_a_pod_lands_in_its_namespace(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, namespace: str
) -> None:
    pod = kube.create(f"/api/v1/namespaces/{namespace}/pods", builders.pod("web", labels={}))
    rec = EventRecorder(kube_client, namespace="sidecarctl-system")
    for _ in range(3):
        aloop.run(rec.event(pod, type="Normal", reason="SidecarUpgraded", message="proxy: proxy:1 -> proxy:2"))
    (ev,) = events_about(kube, namespace, pod["metadata"]["uid"])
    assert ev["metadata"]["namespace"] == namespace
    assert ev["involvedObject"]["namespace"] == namespace
    assert ev["involvedObject"]["kind"] == "Pod"
    assert ev["involvedObject"]["apiVersion"] == "v1"
    assert ev["count"] == 3
    assert ev["reason"] == "SidecarUpgraded"


def test_manager_namespace_for_cluster_scoped_objects_is_accepted(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, namespace: str, sidecarset: dict[str, Any]
) -> None:
    rec = EventRecorder(kube_client, namespace=namespace)
    assert aloop.run(rec.event(sidecarset, type="Normal", reason="Synced", message="ok")) is not None
    (ev,) = events_about(kube, namespace, sidecarset["metadata"]["uid"])
    assert ev["involvedObject"]["namespace"] == namespace
    assert ev["involvedObject"]["kind"] == "SidecarSet"


def test_long_message_is_cut_in_the_middle_and_stored(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, namespace: str
) -> None:
    cm = kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
    )
    message = "BEGIN" + "x" * 5000 + "END"
    aloop.run(EventRecorder(kube_client).event(cm, type="Normal", reason="Long", message=message))
    (ev,) = events_about(kube, namespace, cm["metadata"]["uid"])
    assert len(ev["message"]) == MAX_MESSAGE
    assert ev["message"].startswith("BEGIN") and ev["message"].endswith("END")
    assert "..." in ev["message"]


def test_an_expired_aggregated_event_is_created_again(
    aloop: BackgroundLoop, kube: Kube, kube_client: kubeapi.KubeClient, namespace: str
) -> None:
    cm = kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
    )
    rec = EventRecorder(kube_client)
    first = aloop.run(rec.event(cm, type="Normal", reason="R", message="m"))
    assert first is not None
    kube.delete(f"/api/v1/namespaces/{namespace}/events/{first['metadata']['name']}")
    second = aloop.run(rec.event(cm, type="Normal", reason="R", message="m"))
    assert second is not None
    (ev,) = events_about(kube, namespace, cm["metadata"]["uid"])
    assert ev["metadata"]["name"] != first["metadata"]["name"]
    assert ev["count"] == 1


def test_a_failed_post_logs_and_does_not_raise(
    aloop: BackgroundLoop, kube_client: kubeapi.KubeClient, sidecarset: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    rec = EventRecorder(kube_client, namespace=f"missing-{secrets.token_hex(3)}")
    with caplog.at_level(logging.WARNING, logger="kuberuntime.events"):
        assert aloop.run(rec.event(sidecarset, type="Normal", reason="Synced", message="ok")) is None
    assert any("not recorded" in r.getMessage() for r in caplog.records)
    # Events about Events are skipped, and bad arguments are named.
    assert (
        aloop.run(rec.event({"kind": "Event", "metadata": {"name": "e"}}, type="Normal", reason="R", message=""))
        is None
    )
    with pytest.raises(ValueError, match="Normal, Warning"):
        aloop.run(rec.event(sidecarset, type="Info", reason="R", message="m"))


@given(st.text(max_size=3000))
def test_truncate_message_keeps_short_messages_and_both_ends_of_long_ones(message: str) -> None:
    cut = truncate_message(message)
    if len(message) <= MAX_MESSAGE:
        assert cut == message
    else:
        assert len(cut) == MAX_MESSAGE
        head, _, tail = cut.partition("...")
        assert message.startswith(head) and message.endswith(cut[len(head) + 3 :])
        assert len(head) >= 500 and len(tail) >= 500
