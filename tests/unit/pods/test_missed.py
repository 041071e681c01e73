"""Pods that run without the sidecars their SidecarSets select: which ones, why, and what is done.

sidecarsets.pods.missed decides from pod facts, namespaces and SidecarSets; sidecarsets.controller.missedscan lists
the unlabelled pods of each labelled namespace through the API (here an in-memory one), publishes
the gauge, the condition and one Event per newly seen pod, and, when asked, evicts owned pods at a
bounded rate.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kuberuntime import api
from kuberuntime.events import EventRecorder
from sidecarsets.controller import metrics
from sidecarsets.controller.missedscan import CONDITION, MissedScan, RateLimit
from sidecarsets.pods import missed
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders
from tests.kube.fakeapi import FakeApiServer

ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}


def _ss(name: str = "mesh", *, created: str = "2024-05-01T10:00:00Z", **kw: Any) -> SidecarSet:
    obj = builders.sidecarset(name, **kw)
    obj["metadata"]["creationTimestamp"] = created
    return SidecarSet.from_object(obj)


def _pod(name: str, ns: str = "shop", *, labels: dict[str, str] | None = None, **kw: Any) -> missed.PodFacts:
    fields: dict[str, Any] = {
        "namespace": ns,
        "name": name,
        "labels": {"app": "web"} if labels is None else labels,
        "injected": (),
        "created": "2024-05-02T10:00:00Z",
        "phase": "Running",
        "deleting": False,
        "owned": True,
    }
    fields.update(kw)
    return missed.PodFacts(**fields)


def _find(pods: list[missed.PodFacts], sets: list[SidecarSet], **kw: Any) -> dict[str, list[missed.MissedPod]]:
    namespaces = kw.pop("namespaces", {"shop": ENABLED, "plain": {}})
    return missed.find_missing(pods, sets, namespaces, manager_namespace="sidecarctl-system", **kw)


# -- which pods --------------------------------------------------------------------------------


def test_a_selected_running_pod_without_the_sidecarset_is_missing_and_an_injected_one_is_not() -> None:
    pods = [_pod("bare"), _pod("done", injected=("mesh",)), _pod("other-app", labels={"app": "db"})]
    found = _find(pods, [_ss()])
    assert [(m.key, m.sidecarset) for m in found["mesh"]] == [("shop/bare", "mesh")]


def test_a_pod_injected_by_another_sidecarset_still_misses_this_one() -> None:
    found = _find([_pod("half", injected=("logs",))], [_ss("mesh"), _ss("logs")])
    assert [m.key for m in found["mesh"]] == ["shop/half"]
    assert found["logs"] == []


@pytest.mark.parametrize(
    ("why", "pod", "namespaces"),
    [
        ("namespace not labelled", _pod("p", "plain"), None),
        ("namespace unknown", _pod("p", "gone"), None),
        ("pod opted out", _pod("p", labels={"app": "web", names.POD_INJECT_LABEL: "false"}), None),
        ("pending", _pod("p", phase="Pending"), None),
        ("succeeded", _pod("p", phase="Succeeded"), None),
        ("being deleted", _pod("p", deleting=True), None),
        ("system namespace", _pod("p", "kube-system"), {"kube-system": ENABLED}),
        ("manager namespace", _pod("p", "sidecarctl-system"), {"sidecarctl-system": ENABLED}),
    ],
)
def test_pods_the_webhook_would_not_have_injected_are_not_reported(
    why: str, pod: missed.PodFacts, namespaces: dict[str, dict[str, str]] | None
) -> None:
    kw = {} if namespaces is None else {"namespaces": namespaces}
    assert _find([pod], [_ss()], **kw)["mesh"] == [], why


def test_paused_selectorless_and_namespace_scoped_sidecarsets_expect_nothing_elsewhere() -> None:
    paused = _ss("paused", injectionStrategy={"paused": True})
    elsewhere = _ss("elsewhere", namespace="other")
    found = _find([_pod("bare")], [paused, elsewhere])
    assert found == {"paused": [], "elsewhere": []}


def test_a_canary_replaces_its_base_in_the_pods_it_selects() -> None:
    base = _ss("mesh")
    canary = _ss(
        "mesh-canary",
        selector={"matchLabels": {"app": "web", "track": "canary"}},
        metadata={"annotations": {names.ANN_CANARY: "true", names.ANN_BASE: "mesh"}},
        updateStrategy={"type": "NotUpdate"},
    )
    pods = [_pod("c", labels={"app": "web", "track": "canary"}, injected=("mesh-canary",)), _pod("b")]
    found = _find(pods, [base, canary])
    assert [m.key for m in found["mesh"]] == ["shop/b"], "the canary's pod does not miss the base"
    assert found["mesh-canary"] == []


# -- why ---------------------------------------------------------------------------------------


def test_the_reason_follows_the_timestamps() -> None:
    ss = _ss(created="2024-05-03T00:00:00Z")
    early = _pod("early", created="2024-05-02T00:00:00Z")
    before_label = _pod("before-label", created="2024-05-04T00:00:00Z")
    late = _pod("late", created="2024-05-06T00:00:00Z")
    same_second = _pod("same-second", created="2024-05-03T00:00:00Z")
    found = _find([early, before_label, late, same_second], [ss], labelled_at={"shop": "2024-05-05T00:00:00Z"})
    assert {m.name: m.reason for m in found["mesh"]} == {
        "early": missed.BEFORE_SIDECARSET,
        "before-label": missed.BEFORE_NAMESPACE_LABEL,
        "late": missed.ADMITTED_WITHOUT,
        "same-second": missed.BEFORE_SIDECARSET,
    }


def test_the_label_time_is_the_latest_managed_fields_entry_that_set_the_label() -> None:
    ns = {
        "metadata": {
            "name": "shop",
            "managedFields": [
                {"time": "2024-05-01T00:00:00Z", "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}},
                {
                    "time": "2024-05-05T00:00:00Z",
                    "fieldsV1": {"f:metadata": {"f:labels": {f"f:{names.NS_INJECTION_LABEL}": {}}}},
                },
                {"time": "2024-05-07T00:00:00Z", "fieldsV1": {"f:spec": {}}},
                "junk",
            ],
        }
    }
    assert missed.label_time(ns) == "2024-05-05T00:00:00Z"
    assert missed.label_time({"metadata": {"name": "x"}}) is None


def test_pod_facts_of_a_malformed_pod_never_raise() -> None:
    for pod in ({}, {"metadata": "x"}, {"metadata": {"labels": "x", "annotations": {names.ANN_INJECTED_LIST: 3}}}):
        facts = missed.PodFacts.of(pod)
        assert facts.labels == {} and facts.injected == () and not facts.owned
    facts = missed.PodFacts.of(
        builders.pod(
            "p",
            annotations={names.ANN_INJECTED_LIST: "mesh, logs"},
            metadata={"ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}]},
        )
    )
    assert facts.injected == ("mesh", "logs") and facts.owned


# -- the scan --------------------------------------------------------------------------------------


class Rig:
    def __init__(self, *, recreate: bool = False, per_minute: float = 6.0) -> None:
        self.api = FakeApiServer()
        self.sets: dict[str, SidecarSet] = {}
        self.namespaces: dict[str, dict[str, str]] = {"shop": dict(ENABLED), "plain": {}}
        self.changed: list[set[str]] = []
        self.scan = MissedScan(
            self.api,
            manager_namespace="sidecarctl-system",
            sidecarsets=lambda: self.sets,
            namespaces=lambda: self.namespaces,
            injected_pods=lambda: [],
            recorder=EventRecorder(self.api),
            recreate=recreate,
            recreate_per_minute=per_minute,
            on_change=self.changed.append,
        )

    def add_set(self, name: str = "mesh") -> None:
        obj = builders.sidecarset(name)
        self.sets[name] = SidecarSet.from_object(self.api.put(f"/apis/sidecarctl.io/v1alpha1/sidecarsets/{name}", obj))

    def add_pod(self, name: str, ns: str = "shop", *, owned: bool = True, labels: dict[str, str] | None = None) -> None:
        meta: dict[str, Any] = {}
        if owned:
            meta["ownerReferences"] = [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}
            ]
        pod = builders.pod(name, namespace=ns, labels={"app": "web", **(labels or {})}, metadata=meta)
        pod["status"] = {"phase": "Running"}
        pod["metadata"]["creationTimestamp"] = "2024-05-09T00:00:00Z"
        self.api.put(f"/api/v1/namespaces/{ns}/pods/{name}", pod)

    def events(self) -> list[dict[str, Any]]:
        return [o for p, o in self.api.objects.items() if "/events/" in p]


def _gauge(name: str) -> float | None:
    for family in metrics.PODS_MISSING_SIDECARS.collect():
        for s in family.samples:
            if s.labels.get("sidecarset") == name:
                return float(s.value)
    return None


def test_a_scan_lists_only_unlabelled_pods_of_labelled_namespaces_and_reports_them() -> None:
    rig = Rig()
    rig.add_set("scan-report")
    rig.add_pod("bare")
    rig.add_pod("injected", labels={names.POD_INJECTED_LABEL: "true"})
    rig.add_pod("elsewhere", "plain")
    found = asyncio.run(rig.scan.scan_once())

    assert [m.key for m in found["scan-report"]] == ["shop/bare"]
    lists = [p for v, p in rig.api.calls if v == "get" and p.endswith("/pods")]
    assert lists == ["/api/v1/namespaces/shop/pods"], "one list per labelled namespace, none elsewhere"
    assert _gauge("scan-report") == 1
    cond = rig.scan.condition_of("scan-report")
    assert cond is not None and cond["type"] == CONDITION and cond["status"] == "True"
    assert "shop/bare" in cond["message"]
    [event] = rig.events()
    assert event["type"] == "Warning" and event["reason"] == "PodsMissingSidecars"
    assert "shop/bare" in event["message"] and event["involvedObject"]["name"] == "scan-report"
    assert rig.changed == [{"scan-report"}]

    asyncio.run(rig.scan.scan_once())
    assert len(rig.events()) == 1 and rig.events()[0].get("count", 1) == 1, "a pod already reported is not again"
    assert rig.changed == [{"scan-report"}], "no change, no status rewrite"

    # the controller writes the condition with the status; once the pod is gone it turns False
    obj = rig.sets["scan-report"].obj
    rig.sets["scan-report"] = SidecarSet.from_object({**obj, "status": {"conditions": [cond]}})
    rig.api.objects.pop("/api/v1/namespaces/shop/pods/bare")
    asyncio.run(rig.scan.scan_once())
    cond = rig.scan.condition_of("scan-report")
    assert cond is not None and cond["status"] == "False"
    assert _gauge("scan-report") == 0
    assert rig.changed[-1] == {"scan-report"}


def test_a_sidecarset_that_never_missed_a_pod_gets_no_condition() -> None:
    rig = Rig()
    rig.add_set("scan-clean")
    rig.add_pod("injected", labels={names.POD_INJECTED_LABEL: "true"})
    asyncio.run(rig.scan.scan_once())
    assert rig.scan.condition_of("scan-clean") is None, "no status write for every SidecarSet scanned"
    assert _gauge("scan-clean") == 0
    assert rig.events() == []


def test_a_deleted_sidecarset_loses_its_series_and_its_condition() -> None:
    rig = Rig()
    rig.add_set("scan-gone")
    rig.add_pod("bare")
    asyncio.run(rig.scan.scan_once())
    assert _gauge("scan-gone") == 1
    del rig.sets["scan-gone"]
    asyncio.run(rig.scan.scan_once())
    assert _gauge("scan-gone") is None
    assert rig.scan.condition_of("scan-gone") is None


def test_recreate_evicts_only_owned_pods_at_the_bounded_rate() -> None:
    rig = Rig(recreate=True, per_minute=1.0)
    rig.add_set("scan-evict")
    for name in ("a", "b", "c"):
        rig.add_pod(name)
    rig.add_pod("orphan", owned=False)
    asyncio.run(rig.scan.scan_once())
    evictions = rig.api.writes("create", "/api/v1/namespaces/shop/pods/")
    assert evictions == ["/api/v1/namespaces/shop/pods/a/eviction"], "one per minute: the first only"
    body = rig.api.objects["/api/v1/namespaces/shop/pods/a/eviction/a"]
    assert body["kind"] == "Eviction" and body["deleteOptions"]["preconditions"]["uid"]

    asyncio.run(rig.scan.scan_once())
    assert len(rig.api.writes("create", "/api/v1/namespaces/shop/pods/")) == 1, "no token yet"


def test_an_eviction_a_disruption_budget_refuses_is_left_for_a_later_scan() -> None:
    rig = Rig(recreate=True, per_minute=600.0)
    rig.add_set("scan-pdb")
    rig.add_pod("a")
    rig.api.fail("create", r"/pods/a/eviction$", api.ApiError(429, "TooManyRequests", "Cannot evict pod"))
    blocked = metrics.MISSED_RECREATED.labels("blocked")._value.get()
    asyncio.run(rig.scan.scan_once())
    assert metrics.MISSED_RECREATED.labels("blocked")._value.get() == blocked + 1
    assert "/api/v1/namespaces/shop/pods/a" in rig.api.objects


def test_an_unowned_pod_is_never_evicted_and_costs_no_token() -> None:
    rig = Rig(recreate=True, per_minute=1.0)
    rig.add_set("scan-orphan")
    rig.add_pod("a-orphan", owned=False)
    rig.add_pod("b-owned")
    asyncio.run(rig.scan.scan_once())
    assert rig.api.writes("create", "/api/v1/namespaces/shop/pods/") == [
        "/api/v1/namespaces/shop/pods/b-owned/eviction"
    ]


def test_the_token_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = RateLimit(6.0, monotonic=lambda: now[0])
    assert bucket.take() and not bucket.take()
    now[0] = 9.9
    assert not bucket.take()
    now[0] = 10.0
    assert bucket.take() and not bucket.take()
