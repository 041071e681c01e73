"""Pods that run without their sidecars are found, reported with a reason, and recreated when asked.

On a control plane of its own, with kube-controller-manager (ReplicaSets, disruption budgets) and
a fake kubelet, and `sidecarctl run --missed-scan-interval=1 --recreate-missed` leading it. Three
ways a pod misses its sidecars, made the way they happen: a pod created before its SidecarSet, a
pod created before its namespace was labelled, and the pods of a ReplicaSet created while every
manager process was down and the pod webhook was `failurePolicy: Ignore`. Once the manager is back,
one scan reports them (condition, Event, gauge); the ReplicaSet's pods are evicted one at a time at
the bounded rate, never below the PodDisruptionBudget, and come back injected; the two pods nothing
would recreate are left alone and stay reported.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sidecarsets.pods import missed
from sidecarsets.spec import names
from tests.e2e.certsupport import scrape
from tests.e2e.helpers import SS_PATH, make_pod, make_sidecarset, wait_injecting
from tests.e2e.policysupport import PolicyCluster, kill_all, private_cluster
from tests.kube.client import eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import MWC_PATH

NS = "missed-shop"
LATE = "missed-late"  # labelled for injection only after its pod exists
APP = "miss"
SS = "missed-mesh"
REPLICAS = 4
PER_MINUTE = 20.0  # --recreate-missed-per-minute: one eviction every 3 s
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
PODS = "/api/v1/namespaces/{}/pods"
CONDITION = "PodsMissingSidecars"


@pytest.fixture(scope="module")
def cluster(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[PolicyCluster]:
    extra = ("--missed-scan-interval=1", "--recreate-missed", f"--recreate-missed-per-minute={PER_MINUTE:g}")
    with private_cluster(aloop, control_plane.bin_dir, injection="webhook", extra=extra, controller_manager=True) as c:
        kubelet = FakeKubelet(c.client, node="missed-node", restart_delay=0.1)
        aloop.run(kubelet.start())
        kubelet.namespaces |= {NS, LATE}
        try:
            yield c
        finally:
            aloop.run(kubelet.stop())


def _injected(pod: dict[str, Any]) -> bool:
    return SS in ((pod["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_LIST) or "").split(",")


def _running(c: PolicyCluster, ns: str, name: str) -> bool:
    pod = c.kube.get_or_none(f"{PODS.format(ns)}/{name}")
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running"


def _condition(c: PolicyCluster) -> dict[str, Any] | None:
    status = c.kube.get(f"{SS_PATH}/{SS}").get("status") or {}
    return next((x for x in status.get("conditions") or [] if x["type"] == CONDITION), None)


def _rs_pods(c: PolicyCluster) -> list[dict[str, Any]]:
    return [
        p
        for p in c.kube.get(PODS.format(NS), labelSelector=f"app={APP},tier=rs")["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]


def _gauge(c: PolicyCluster) -> float | None:
    assert c.manager is not None
    return scrape(c.manager.probe_url).find("sidecarctl_pods_missing_sidecars", sidecarset_namespace="", sidecarset=SS)


def _stamp(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_pods_that_missed_injection_are_reported_and_owned_ones_recreated_at_the_bounded_rate(
    cluster: PolicyCluster,
) -> None:
    c = cluster
    c.namespace(NS, ENABLED)
    c.namespace(LATE, {})

    # 1. before the SidecarSet exists
    c.kube.create(PODS.format(NS), make_pod("before-set", APP))
    time.sleep(1.1)  # creation times have a 1 s resolution
    c.kube.create(SS_PATH, make_sidecarset(SS, APP, initContainers=[]))
    wait_injecting(c.kube, NS, APP, lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    c.kube.create(PODS.format(NS), make_pod("served", APP))
    # 2. before its namespace was labelled (and a second after the SidecarSet)
    time.sleep(1.1)
    c.kube.create(PODS.format(LATE), make_pod("before-label", APP))
    time.sleep(1.1)
    c.namespace(LATE, ENABLED)
    eventually(lambda: _running(c, LATE, "before-label") and _running(c, NS, "served"), timeout=20, what="running")

    # 3. every manager process down, the pod webhook Ignore: the ReplicaSet's pods start bare
    mwc = c.kube.get(f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}")
    c.kube.patch(
        f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}",
        [
            {"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": "Ignore"}
            for i in range(len(mwc["webhooks"]))
        ],
        patch_type="json",
    )
    assert c.manager is not None
    kill_all(c.manager)
    labels = {"app": APP, "tier": "rs"}
    template = make_pod("x", APP, tier="rs")
    template["metadata"] = {"labels": labels}
    c.kube.create(
        f"/apis/apps/v1/namespaces/{NS}/replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web"},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": labels}, "template": template},
        },
    )
    c.kube.create(
        f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web"},
            "spec": {"minAvailable": REPLICAS - 1, "selector": {"matchLabels": labels}},
        },
    )
    bare = eventually(
        lambda: (
            ps
            if len(ps := _rs_pods(c)) == REPLICAS and all(p["status"].get("phase") == "Running" for p in ps)
            else None
        ),
        timeout=30,
        what="the ReplicaSet's pods running",
    )
    assert not any(_injected(p) for p in bare), "admitted without injection while the webhook was down"
    bare_names = {p["metadata"]["name"] for p in bare}
    eventually(
        lambda: (
            (c.kube.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/web").get("status") or {}).get(
                "disruptionsAllowed"
            )
            == 1
        ),
        timeout=30,
        what="the disruption budget allows one",
    )

    # -- the manager back: its first scan reports all of them ------------------------------------
    # The first eviction follows that scan at once and the next scan (1 s later) no longer lists the
    # evicted pod, so the condition names all six only briefly: the Event says what the scan found.
    started, started_wall = time.monotonic(), time.time()
    c.start_manager()
    ready_after = time.monotonic() - started

    def first_report() -> dict[str, Any] | None:
        for e in c.kube.get("/api/v1/events", fieldSelector=f"involvedObject.name={SS},reason={CONDITION}")["items"]:
            if all(f"{NS}/{n} " in e["message"] for n in bare_names):
                found: dict[str, Any] = e
                return found
        return None

    event = eventually(first_report, timeout=15, interval=0.1, what="an Event naming the ReplicaSet's pods")
    assert event["type"] == "Warning"
    message = event["message"]
    assert message.startswith("6 running pod(s)"), message
    assert f"{NS}/before-set ({missed.BEFORE_SIDECARSET})" in message, message
    assert f"{LATE}/before-label ({missed.BEFORE_NAMESPACE_LABEL})" in message, message
    assert all(f"{NS}/{n} ({missed.ADMITTED_WITHOUT})" in message for n in bare_names), message
    assert f"{NS}/served" not in message
    # to the second: the process start, ready, Lease, informers synced, the first scan
    after_start = _stamp(event["firstTimestamp"]) - int(started_wall)
    assert after_start <= ready_after + 1 + 2, f"reported {after_start:.0f}s after the manager started"

    # The scan says it in the Event first, then asks the controller to write the condition: a moment
    # later (5 s: a status write on this machine under the suite's load takes well under one).
    cond = eventually(
        lambda: (x := _condition(c)) is not None and x["status"] == "True" and x,
        timeout=5,
        interval=0.05,
        what="the PodsMissingSidecars condition True",
    )
    assert f"{NS}/before-set ({missed.BEFORE_SIDECARSET})" in cond["message"], cond
    assert (gauge := _gauge(c)) is not None and gauge >= 2

    # -- recreation: owned pods only, one at a time, within the budget ------------------------------
    lowest_ready = REPLICAS

    def all_recreated() -> bool:
        nonlocal lowest_ready
        pods = _rs_pods(c)
        ready = sum(
            any(x["type"] == "Ready" and x["status"] == "True" for x in (p.get("status") or {}).get("conditions") or [])
            for p in pods
        )
        lowest_ready = min(lowest_ready, ready)
        names_now = {p["metadata"]["name"] for p in pods}
        return len(pods) == REPLICAS and not names_now & bare_names and all(_injected(p) for p in pods)

    eventually(all_recreated, timeout=90, interval=0.1, what="the ReplicaSet's pods recreated with their sidecars")
    took = time.monotonic() - started
    assert lowest_ready >= REPLICAS - 1, f"ready pods fell to {lowest_ready} (budget minAvailable {REPLICAS - 1})"
    new = sorted(_stamp(p["metadata"]["creationTimestamp"]) for p in _rs_pods(c))
    gaps = [b - a for a, b in itertools.pairwise(new)]
    assert min(gaps) >= 60 / PER_MINUTE - 1.5, f"recreated faster than {PER_MINUTE:g}/min: gaps {gaps}"
    print(
        f"\nmissed injection: manager ready and leading {ready_after:.1f}s after its start, the pods reported "
        f"{after_start:.0f}s after it (1 s resolution); 4 pods recreated in {took:.1f}s"
    )

    # the pods nothing would recreate are still there and still reported; the recreated ones not
    assert _running(c, NS, "before-set") and _running(c, LATE, "before-label")

    def only_unowned() -> bool:
        x = _condition(c)
        return x is not None and x["message"].startswith("2 running pod(s)")

    eventually(only_unowned, timeout=10, what="only the two unowned pods reported")
    assert _gauge(c) == 2
