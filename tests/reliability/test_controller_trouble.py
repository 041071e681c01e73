"""The SidecarSet controller under trouble, in the real manager, read back from the API server's audit log.

The manager runs with a ServiceAccount token (tests/reliability/harness.py), so every request it
makes is named in the audit log: how often it tried to patch a pod, what it wrote while another
holder had the Lease, and whether, after winning it back, it caught its caches up with a quorum read
before planning (without reading every pod again: they were kept while it stood by).
A fake kubelet runs the pods and reports in-place restarts.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from kuberuntime import api
from kuberuntime.clock import micro_time, utc_now
from tests.kube import builders
from tests.kube.client import eventually
from tests.kube.managerharness import ManagerProcess
from tests.kube.measure import Metrics
from tests.reliability.harness import (
    LEASE_PATH,
    MANAGER_USER,
    SS_PATH,
    AuditEvent,
    ReliabilityCluster,
    audit_events,
    report,
)

IDENTITY = "controller-trouble"
WINDOW = 20.0  # seconds the refused pod's patch attempts are counted over: the backoff's first six
KUBELET_RESTART_DELAY = 0.3
VAP_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAPB_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


@pytest.fixture(scope="module")
def manager(cluster: ReliabilityCluster) -> Iterator[ManagerProcess]:
    cluster.sidecarset("warm", "warm")
    m = cluster.start_manager(IDENTITY)
    try:
        cluster.register_webhooks(m, "warm")
        eventually(lambda: _holder(cluster) == IDENTITY, timeout=30, what="the manager holds the Lease")
        yield m
    finally:
        cluster.stop_manager(m)


def _holder(cluster: ReliabilityCluster) -> str:
    return str((cluster.kube.get(LEASE_PATH).get("spec") or {}).get("holderIdentity") or "")


def _pods(cluster: ReliabilityCluster, ns: str, app: str) -> list[dict[str, Any]]:
    items = cluster.kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={app}")["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def _image(pod: dict[str, Any], container: str = "proxy") -> str:
    return str(next(c["image"] for c in pod["spec"]["containers"] if c["name"] == container))


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _upgraded(cluster: ReliabilityCluster, ns: str, app: str, image: str) -> set[str]:
    return {p["metadata"]["name"] for p in _pods(cluster, ns, app) if _image(p) == image and _ready(p)}


def _rollout(cluster: ReliabilityCluster, app: str, count: int) -> str:
    """A labelled namespace with `count` Ready pods injected with proxy:1 by SidecarSet `app`."""
    ns = cluster.labelled_namespace(app, kubelet=True)
    cluster.sidecarset(app, app, updateStrategy={"type": "RollingUpdate", "maxUnavailable": 1})
    cluster.wait_injecting(ns, app)
    for i in range(count):
        cluster.kube.create(
            f"/api/v1/namespaces/{ns}/pods",
            builders.pod(f"{app}-{i}", labels={"app": app}, terminationGracePeriodSeconds=1),
        )
    eventually(lambda: len(_upgraded(cluster, ns, app, "proxy:1")) == count, timeout=60, what=f"{count} pods Ready")
    return ns


def _set_image(cluster: ReliabilityCluster, name: str, image: str) -> None:
    cluster.kube.patch(
        f"{SS_PATH}/{name}", [{"op": "replace", "path": "/spec/containers/0/image", "value": image}], patch_type="json"
    )


def _query(e: AuditEvent) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(e.uri).query))


def _streams_state(e: AuditEvent) -> bool:
    """A WatchList: every pod streamed, as a LIST would give them."""
    return e.verb == "watch" and _query(e).get("sendInitialEvents") == "true"


def _pod_patches(events: list[AuditEvent], ns: str) -> list[AuditEvent]:
    """The manager's patches of pod specs in `ns` (the in-place upgrades; not status, not bindings)."""
    return [e for e in events if e.verb == "patch" and e.resource == "pods" and e.namespace == ns]


def test_a_pod_whose_upgrade_is_always_refused_backs_off_while_the_other_nine_upgrade(
    cluster: ReliabilityCluster, manager: ManagerProcess
) -> None:
    kube = cluster.kube
    app, refused = "refuse", "refuse-3"
    ns = _rollout(cluster, app, 10)
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "deny-proxy-2"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
                ]
            },
            "validations": [
                {
                    "expression": f"!(object.metadata.name == '{refused}' && "
                    "object.spec.containers.exists(c, c.image == 'proxy:2'))",
                    "message": f"proxy:2 is not allowed on {refused}",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "deny-proxy-2"},
        "spec": {
            "policyName": "deny-proxy-2",
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    }
    kube.create(VAP_PATH, policy)
    kube.create(VAPB_PATH, binding)
    try:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{refused}")
        index = [c["name"] for c in pod["spec"]["containers"]].index("proxy")
        probe = [{"op": "replace", "path": f"/spec/containers/{index}/image", "value": "proxy:2"}]

        def denied() -> bool:  # the API server's policy informer is a moment behind the objects
            try:
                kube.patch(f"/api/v1/namespaces/{ns}/pods/{refused}", probe, patch_type="json", dryRun="All")
                return False
            except api.ApiError as e:
                return "proxy:2 is not allowed" in e.message

        eventually(denied, timeout=30, interval=0.2, what="the ValidatingAdmissionPolicy denies proxy:2")
        started = time.time()
        _set_image(cluster, app, "proxy:2")
        others = {f"{app}-{i}" for i in range(10)} - {refused}
        eventually(
            lambda: others <= _upgraded(cluster, ns, app, "proxy:2"), timeout=60, interval=0.2, what="9 pods upgraded"
        )
        nine_at = time.time() - started
        time.sleep(max(0.0, started + WINDOW - time.time()))  # the whole window, for the attempt count
        window = started + WINDOW
        attempts = [
            e
            for e in _pod_patches(audit_events(cluster.cp.audit_log, user=MANAGER_USER), ns)
            if e.name == refused and started <= e.received <= window
        ]
        events = [
            e
            for e in kube.get("/api/v1/namespaces/default/events")["items"]
            if e.get("reason") == "UpgradeFailed" and f"{ns}/{refused}" in e.get("message", "")
        ]
        still = _image(kube.get(f"/api/v1/namespaces/{ns}/pods/{refused}"))
    finally:
        kube.delete(f"{VAPB_PATH}/deny-proxy-2")
        kube.delete(f"{VAP_PATH}/deny-proxy-2")
    report(
        "refused upgrade: 10 pods, maxUnavailable 1, a ValidatingAdmissionPolicy denies proxy:2 on one",
        {
            "other 9 upgraded": f"{nine_at:.1f} s after the image change",
            f"patch attempts on the refused pod in {WINDOW:.0f} s (audit)": len(attempts),
            "seconds after the change": ", ".join(f"{e.received - started:.1f}" for e in attempts),
            "their answers": sorted({e.code for e in attempts}),
            "UpgradeFailed Events naming it": [e.get("message") for e in events][:1],
        },
    )
    assert nine_at <= 60.0
    # Unobstructed, 9 pods upgrade here in ~5 s: the refused pod must not hold the others back.
    assert nine_at <= 20.0, f"the refused pod held the rollout back: 9 pods took {nine_at:.1f} s"
    assert still == "proxy:1"
    # Backoff from 0.5 s doubling: attempts at about 0, 0.5, 1.5, 3.5, 7.5, 15.5 s (each wait jittered
    # by 10 %; the next at 31.5); a backoff capped at 2 s would make 11 in the window, a retry at every
    # replan (0.05 s) hundreds.
    assert 2 <= len(attempts) <= 8, f"{len(attempts)} patch attempts on {refused} in {WINDOW:.0f} s"
    assert all(e.code >= 400 for e in attempts)
    assert events, "no UpgradeFailed Event names the refused pod"


def _takeover(cluster: ReliabilityCluster, holder: str, duration: int) -> tuple[float, float]:
    """Write the Lease for `holder` as another candidate would; (wall time before, after) the write."""
    for _ in range(20):
        lease = cluster.kube.get(LEASE_PATH)
        spec = lease.get("spec") or {}
        now = micro_time(utc_now())
        spec = {
            **spec,
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1,
        }
        before = time.time()
        try:
            cluster.kube.update(LEASE_PATH, {**lease, "spec": spec})
        except api.Conflict:  # the manager renewed in between
            continue
        return before, time.time()
    raise AssertionError("could not write the Lease")


def test_a_leader_that_loses_the_lease_stops_writing_and_catches_up_before_planning_when_it_wins_it_back(
    cluster: ReliabilityCluster, manager: ManagerProcess
) -> None:
    assert cluster.kubelet is not None
    cluster.kubelet.restart_delay = 1.0  # a rollout that lasts: the takeover lands in its middle
    app, count = "lead", 12
    ns = _rollout(cluster, app, count)
    _set_image(cluster, app, "proxy:2")
    eventually(lambda: len(_upgraded(cluster, ns, app, "proxy:2")) >= 2, timeout=30, what="rollout under way")

    metrics = Metrics(manager.probe_url)
    tracked_leading = metrics.value("sidecarctl_tracked_pods")
    _lost_before, lost_after = _takeover(cluster, "intruder", 15)
    at_takeover = len(_upgraded(cluster, ns, app, "proxy:2"))
    hold_until = time.monotonic() + 8.0
    tracked_lost: list[float] = []
    while time.monotonic() < hold_until:  # the intruder keeps renewing, as a live leader does
        time.sleep(2.0)
        tracked_lost.append(metrics.value("sidecarctl_tracked_pods"))
        lease = cluster.kube.get(LEASE_PATH)
        lease["spec"]["renewTime"] = micro_time(utc_now())
        with contextlib.suppress(api.Conflict):
            cluster.kube.update(LEASE_PATH, lease)
    at_release = len(_upgraded(cluster, ns, app, "proxy:2"))
    released_before, _ = _takeover(cluster, "", 1)  # released: the holder is empty
    try:
        eventually(lambda: _holder(cluster) == IDENTITY, timeout=30, interval=0.1, what="the manager leads again")
    except AssertionError:
        print(f"manager log:\n{manager.log_tail(200)}")  # why the campaign did not start again
        raise
    regained_seen = time.time()
    eventually(
        lambda: len(_upgraded(cluster, ns, app, "proxy:2")) == count, timeout=90, interval=0.2, what="rollout done"
    )
    cluster.kubelet.restart_delay = 0.3

    mine = audit_events(cluster.cp.audit_log, user=MANAGER_USER)
    lease_name = LEASE_PATH.rsplit("/", 1)[1]
    lease_events = [e for e in mine if e.resource == "leases" and e.name == lease_name]
    regain = next(e for e in lease_events if e.write and e.code < 300 and e.received >= released_before)
    lease_reads = [e for e in lease_events if e.verb == "get"]
    # Every write counts, caBundle's too: it is in sync long before, so the leaderless syncer has
    # nothing to write, and the rest (pods, status, revisions, Events, policies) is the leader's.
    during = [e for e in mine if e.write and lost_after < e.received < regain.received]
    in_flight: list[AuditEvent] = []
    violations: list[AuditEvent] = []
    # The last Lease read that can have seen this replica still holding it; reads after the
    # takeover come from other tasks (the renew loop) and tell nothing of a write already sent.
    confirm = max((r for r in lease_reads if r.received <= lost_after), key=lambda r: r.received, default=None)
    for e in during:
        # A batch confirmed by a Lease read that saw the old holder may still be on the wire when
        # the takeover lands: that read must precede the takeover and the write follow it at once.
        if confirm is not None and e.received - confirm.completed <= 0.5:
            in_flight.append(e)
        else:
            violations.append(e)
    pod_reads = [e for e in mine if e.resource == "pods" and e.uri.startswith("/api/v1/pods?")]
    reads_after = [e for e in pod_reads if e.received > regain.received]
    quorum_after = [e for e in reads_after if e.verb == "list" and _query(e).get("limit") == "1"]
    whole_after = [e for e in reads_after if e not in quorum_after and (e.verb == "list" or _streams_state(e))]
    patches_after = [e for e in _pod_patches(mine, ns) if e.received > regain.received]
    report(
        "leadership lost and regained: another holder takes the Lease mid-rollout for 8 s, then releases it",
        {
            "pods upgraded at the takeover / at the release / in the end": f"{at_takeover} / {at_release} / {count}",
            "manager writes while another held the Lease": f"{len(violations)} (in flight at the takeover: "
            f"{len(in_flight)}: {sorted({e.resource for e in in_flight})})",
            "regained": f"{regain.received - released_before:.1f} s after the release "
            f"(seen by the test {regained_seen - released_before:.1f} s)",
            "first quorum read of the pods after regaining": f"{quorum_after[0].received - regain.received:.2f} s after"
            if quorum_after
            else "none",
            "reads of every pod after regaining": len(whole_after),
            "first pod patch after regaining": f"{patches_after[0].received - regain.received:.2f} s after"
            if patches_after
            else "none",
            "sidecarctl_tracked_pods leading / every 2 s while another held the Lease": f"{tracked_leading:.0f} / "
            + ", ".join(f"{v:.0f}" for v in tracked_lost),
        },
    )
    assert tracked_leading >= count, f"the leader exported {tracked_leading} tracked pods, {count} are injected"
    # A replica that stopped leading drops the leader's gauges: the next leader exports them.
    assert tracked_lost and tracked_lost[-1] == 0, f"a replica without the Lease exported {tracked_lost}"
    assert 0 < at_takeover < count, "the takeover must land in the middle of the rollout"
    assert not violations, "writes after the Lease was lost:\n" + "\n".join(
        f"{e.verb} {e.uri} at +{e.received - lost_after:.2f} s" for e in violations
    )
    assert at_release - at_takeover <= 1, "the rollout went on while another replica held the Lease"
    assert quorum_after, "no quorum read of the pods after leadership was regained"
    assert patches_after, "the rollout did not go on after leadership was regained"
    assert quorum_after[0].received < patches_after[0].received, "planning after the regain did not wait to catch up"
    assert not whole_after, "the pods were read whole again: the standby's cache was not kept"
