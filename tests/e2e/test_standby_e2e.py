"""The warm standby on a real kube-apiserver: a standby takes over a rollout where the leader left it.

Two `sidecarctl run` process trees on a control plane of the module's own, both with the manager's
ServiceAccount token, so the API server's audit log names every request they make; the leader's
whole tree is SIGKILLed mid-rollout (no Lease release, as a node failure looks). Before the kill
only the leader writes; after it only the standby lives. Each replica's requests are told apart by
its User-Agent, which names its Lease identity: the leader's last requests are still arriving for
tens of milliseconds after the kill began. The fake kubelet runs the pods and reports in-place restarts; its watch sees
every state the pods go through, which is how unavailability is counted (`Unavailable`), exactly
rather than sampled.

- 600 pods (`SIDECARCTL_STANDBY_PODS` sets another number: docs/development/tests.md), maxUnavailable
  10%, the leader killed with about a third updated: the standby holds
  every pod before the kill (`sidecarctl_cached_objects`), goes on without reading the pods again
  (no LIST, no WatchList: the audit log), no pod is patched twice, none of its patches is refused,
  maxUnavailable holds across the takeover, and the status it writes is right.
- A standby whose pod watch stalled (tests/kube/apiproxy.py) before the rollout began, so it
  missed all of it: once it holds the Lease it plans only after catching up, so none of its
  patches is refused as planned from a stale pod, and maxUnavailable holds although pods the old
  leader patched are still restarting when it plans.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.common import injected
from sidecarctl.manager import user_agent
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders
from tests.kube.apiproxy import ApiProxy
from tests.kube.client import eventually
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.managerharness import ManagerProcess
from tests.kube.measure import Metrics, descendants
from tests.reliability import fixtures as reliability
from tests.reliability.harness import (
    LEASE_PATH,
    MANAGER_USER,
    SS_PATH,
    AuditEvent,
    ReliabilityCluster,
    audit_events,
    report,
)

PODS = "/api/v1/pods"
INJECTED = f"{names.POD_INJECTED_LABEL}=true"
KUBELET_RESTART_DELAY = 0.3  # the reliability tier's cluster, with a fake kubelet restarting containers
# The reliability tier's fixtures: a control plane of this module's own, and a proxy in front of it.
cluster, proxy, k8s_bin_dir = reliability.cluster, reliability.proxy, reliability.k8s_bin_dir


# -- what the test watches ----------------------------------------------------------------------------------
def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def unavailable(pod: dict[str, Any]) -> bool:
    """Not Ready, or a container whose spec image the kubelet does not run yet (patched, not restarted):
    what maxUnavailable bounds."""
    if not _ready(pod):
        return True
    running = {s["name"]: s.get("image") for s in (pod.get("status") or {}).get("containerStatuses") or []}
    return any(running.get(c["name"]) != c["image"] for c in pod["spec"]["containers"])


@dataclass
class Unavailable:
    """Pods of `namespace` unavailable at once, counted on every event of the fake kubelet's pod watch."""

    namespace: str
    now: set[str] = field(default_factory=set)
    peak: int = 0
    peak_at: float = 0.0

    def attach(self, kubelet: FakeKubelet) -> None:
        forward = kubelet.informer.handler
        assert forward is not None

        def handler(kind: str, old: Any, new: Any) -> None:
            forward(kind, old, new)
            pod = new or old
            if pod["metadata"].get("namespace") != self.namespace:
                return
            name = pod["metadata"]["name"]
            if new is not None and unavailable(new):
                self.now.add(name)
            else:
                self.now.discard(name)
            if len(self.now) > self.peak:
                self.peak, self.peak_at = len(self.now), time.time()

        kubelet.informer.handler = handler

    def reset(self) -> None:
        self.peak = len(self.now)


# -- set-up ---------------------------------------------------------------------------------------------------
def rollout_ready(cluster: ReliabilityCluster, app: str, count: int, max_unavailable: int) -> tuple[str, Unavailable]:
    """A namespace the fake kubelet runs, SidecarSet `app` (proxy:1) and `count` pods it injected, all
    Ready; the pods are created as the webhook leaves them (the engine's patch), directly."""
    ns = f"{app}-{os.urandom(3).hex()}"
    cluster.kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    assert cluster.kubelet is not None
    cluster.kubelet.namespaces.add(ns)
    watch = Unavailable(ns)
    watch.attach(cluster.kubelet)
    strategy = {"type": "RollingUpdate", "maxUnavailable": max_unavailable}
    ss = cluster.sidecarset(app, app, updateStrategy=strategy)
    # The labels the webhook would have seen; the namespace itself stays unlabelled, so nothing admits
    # these pods again (no webhook, no policy) and the controller alone writes to them.
    labels = {names.NS_NAME_LABEL: ns, names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
    template = injected(
        builders.pod(None, labels={"app": app}), [SidecarSet.from_object(ss)], namespace=ns, labels=labels
    )

    async def create_all() -> None:
        gate = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            body = {**template, "metadata": {**template["metadata"], "name": f"{app}-{i:04d}"}}
            async with gate:
                await cluster.client.create(f"/api/v1/namespaces/{ns}/pods", body)

        await asyncio.gather(*(one(i) for i in range(count)))

    cluster.aloop.run(create_all(), timeout=300)
    kubelet = cluster.kubelet

    def all_ready() -> bool:
        return sum(1 for k, p in list(kubelet.informer.store.items()) if k.startswith(f"{ns}/") and _ready(p)) == count

    eventually(
        all_ready,
        timeout=120 + count / 20,  # the fake kubelet reports ~100 pods/s here; a loaded machine, a fifth of it
        interval=0.5,
        what=f"{count} pods Ready",
    )
    return ns, watch


def start_pair(
    cluster: ReliabilityCluster,
    app: str,
    *,
    lease: int,
    standby_kubeconfig: Any = None,
    standby_extra: tuple[str, ...] = (),
) -> tuple[ManagerProcess, ManagerProcess]:
    """The leader (holding the Lease) and a standby that holds its caches."""
    flags = (f"--lease-duration={lease}",)
    leader = cluster.start_manager(f"{app}-a", extra=flags)
    eventually(lambda: holder(cluster) == f"{app}-a", timeout=30, what="the first replica leads")
    standby = cluster.start_manager(f"{app}-b", kubeconfig_path=standby_kubeconfig, extra=(*flags, *standby_extra))
    return leader, standby


def holder(cluster: ReliabilityCluster) -> str:
    return str((cluster.kube.get(LEASE_PATH).get("spec") or {}).get("holderIdentity") or "")


def kill_tree(m: ManagerProcess) -> float:
    """SIGKILL to every process of the manager at once, as a node failure; the wall time of the kill."""
    pids = descendants(m.proc.pid)
    at = time.time()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    return at


def updated(cluster: ReliabilityCluster, ns: str, image: str) -> int:
    """Pods of `ns` whose proxy the controller has patched to `image` (the kubelet's view)."""
    assert cluster.kubelet is not None
    store = list(cluster.kubelet.informer.store.items())
    return sum(
        1 for k, p in store if k.startswith(f"{ns}/") and any(c["image"] == image for c in p["spec"]["containers"])
    )


def set_image(cluster: ReliabilityCluster, name: str, image: str) -> None:
    ops = [{"op": "replace", "path": "/spec/containers/0/image", "value": image}]
    cluster.kube.patch(f"{SS_PATH}/{name}", ops, patch_type="json")


def wait_done(cluster: ReliabilityCluster, name: str, count: int, timeout: float) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        ss = cluster.kube.get(f"{SS_PATH}/{name}")
        st = ss.get("status") or {}
        want = (count, count, count, count, ss["metadata"]["generation"])
        got = (st.get("matchedPods"), st.get("updatedPods"), st.get("readyPods"), st.get("updatedReadyPods"))
        return st if (*got, st.get("observedGeneration")) == want else None

    return eventually(done, timeout=timeout, interval=0.5, what=f"status: {count} pods updated and ready")


# -- the audit log ---------------------------------------------------------------------------------------------
def query(e: AuditEvent) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(e.uri).query))


def sent_by(events: list[AuditEvent], identity: str) -> list[AuditEvent]:
    """The requests of one replica's control process, told by its User-Agent (which carries its Lease
    identity). Both replicas are the same ServiceAccount, and the time of receipt cannot tell them
    apart: the killed leader's last requests, already sent, reach the API server tens of
    milliseconds after the kill began (and fail with 504 as its connections drop, or land)."""
    agent = user_agent("control", identity)
    return [e for e in events if e.user_agent == agent]


def pod_patches(events: list[AuditEvent], ns: str) -> list[AuditEvent]:
    """Patches of pod specs in `ns` (the in-place upgrades; not status)."""
    return [e for e in events if e.verb == "patch" and e.resource == "pods" and e.namespace == ns]


def pod_reads(events: list[AuditEvent]) -> list[AuditEvent]:
    """Lists and watches of the injected pods (the controller's pod watch)."""
    return [
        e
        for e in events
        if e.verb in ("list", "watch")
        and urllib.parse.urlsplit(e.uri).path == PODS
        and query(e).get("labelSelector") == INJECTED
    ]


def whole_reads(events: list[AuditEvent]) -> list[AuditEvent]:
    """Reads of every injected pod: a paged LIST (its pages of `limit` 100), or a WatchList."""
    return [
        e
        for e in pod_reads(events)
        if (e.verb == "list" and query(e).get("limit") != "1") or query(e).get("sendInitialEvents") == "true"
    ]


def before_refusals(everyone: list[AuditEvent], refused: list[AuditEvent]) -> list[str]:
    """For each refused pod patch, the last write to that pod before it (by anyone): what moved the
    resourceVersion the patch tested."""
    out = []
    for r in refused:
        prior = [
            e
            for e in everyone
            if e.write
            and e.code < 300
            and e.namespace == r.namespace
            and e.name == r.name
            and e.completed <= r.received
        ]
        last = prior[-1] if prior else None
        what = "nothing" if last is None else f"{last.user.rsplit(':', 1)[-1]} {last.verb} {last.resource}"
        gap = "" if last is None else f" {r.received - last.completed:+.3f} s"
        out.append(f"{r.name} (at {r.received:.3f}): after {what}{gap}")
    return out


def repatched(events: list[AuditEvent], ns: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in pod_patches(events, ns):
        if e.code < 300:
            counts[e.name] = counts.get(e.name, 0) + 1
    return {name: n for name, n in counts.items() if n > 1}


# -- the tests ----------------------------------------------------------------------------------------------------
# 600: enough for ten waves of 60 in CI's time; the figures at 10,000 pods are bench/bench_initial_state.py's.
BIG = int(os.environ.get("SIDECARCTL_STANDBY_PODS", "600"))
BIG_MAX_UNAVAILABLE = max(1, BIG // 10)  # 10%: ten waves, so the kill lands with waves before and after it
# Seconds for the first status and for the rollout (ten waves, mostly the API server's time): 600 pods need
# a fraction of these here; a larger run scales them.
BIG_ROLLOUT = max(300, BIG // 2)
KILL_AT = BIG // 3
# Seconds. Renewals share the API server with 60 patches a wave and the kubelet's status writes on 2
# cores: a renew deadline of 2/3 of the lease (3.3 s) keeps a slow renewal from handing the Lease over
# before the kill.
BIG_LEASE = 5


def test_a_warm_standby_takes_over_a_rollout_where_the_leader_left_it(cluster: ReliabilityCluster) -> None:
    app = "big"
    ns, watch = rollout_ready(cluster, app, BIG, BIG_MAX_UNAVAILABLE)
    leader, standby = start_pair(cluster, app, lease=BIG_LEASE)
    try:
        wait_done(cluster, app, BIG, timeout=max(120, BIG // 5))  # the leader's first status: every pod counted
        watch.reset()
        set_image(cluster, app, "proxy:2")
        eventually(
            lambda: updated(cluster, ns, "proxy:2") >= KILL_AT, timeout=BIG_ROLLOUT, interval=0.2, what="a third"
        )
        at_kill = updated(cluster, ns, "proxy:2")
        held = Metrics(standby.probe_url).value("sidecarctl_cached_objects", informer="pods")
        killed = kill_tree(leader)
        eventually(
            lambda: holder(cluster) == f"{app}-b", timeout=BIG_LEASE + 10, interval=0.1, what="the standby leads"
        )
        # Ten waves, each a few seconds here at 60 pods; most of the time is the API server's.
        status = wait_done(cluster, app, BIG, timeout=BIG_ROLLOUT)
        catch_up = Metrics(standby.probe_url).value("sidecarctl_leader_catch_up_seconds")
    finally:
        cluster.stop_manager(standby)
    everyone = audit_events(cluster.cp.audit_log)
    events = [e for e in everyone if e.user == MANAGER_USER]
    after = [e for e in sent_by(events, f"{app}-b") if e.received > killed]
    late = [e for e in sent_by(events, f"{app}-a") if e.received > killed]
    patches_after = [e for e in pod_patches(after, ns) if e.code < 300]
    refused_after = [e for e in pod_patches(after, ns) if e.code >= 300]
    first_reads = [f"{e.verb} {query(e)}" for e in pod_reads(events) if e.received < killed][:4]
    lease_taken = next(e for e in after if e.resource == "leases" and e.write and e.code < 300)
    report(
        f"warm standby takes over a rollout of {BIG} pods (maxUnavailable {BIG_MAX_UNAVAILABLE}, lease {BIG_LEASE} s)",
        {
            "pods updated at the kill": at_kill,
            "Lease taken after the kill": f"{lease_taken.received - killed:.2f} s",
            "first pod patch after the kill": f"{patches_after[0].received - killed:.2f} s"
            if patches_after
            else "none",
            "caches caught up (sidecarctl_leader_catch_up_seconds)": f"{catch_up:.2f} s",
            "pods patched by the new leader": len({e.name for e in patches_after}),
            "whole reads of the pods after the kill": len(whole_reads(after)),
            "pods in the standby's cache at the kill (sidecarctl_cached_objects)": held,
            "the replicas' first reads of the pods": first_reads,
            "most pods unavailable at once": f"{watch.peak} (at +{watch.peak_at - killed:.1f} s from the kill)",
            "the new leader's refused patches": before_refusals(everyone, refused_after)[:20],
            "the old leader's requests received after the kill (in flight), by code": dict(
                sorted(Counter(e.code for e in late).items())
            ),
        },
    )
    assert held == BIG, "the standby did not hold every injected pod before the kill"
    assert 0 < at_kill < BIG, "the kill must land in the middle of the rollout"
    assert not whole_reads(after), "the standby read every pod again after winning the Lease"
    assert repatched(events, ns) == {}, "pods patched twice for one revision"
    assert patches_after, "the new leader did not go on with the rollout"
    assert all(e.code < 300 for e in pod_patches(after, ns)), "the new leader planned from a stale pod"
    assert watch.peak <= BIG_MAX_UNAVAILABLE
    assert status["updatedPods"] == BIG and status["readyPods"] == BIG


PARTITIONED = 10  # two waves: the first restarting at the kill, the second planned by the standby
PARTITIONED_MAX_UNAVAILABLE = 5
PARTITIONED_LEASE = 3
# Seconds the fake kubelet takes to restart a patched container: longer than the standby's way to its
# first plan after the kill (the Lease, 3 s; its retry period with jitter, up to 1.3 s; the catch-up,
# about 1 s), so the old leader's last wave is still restarting when the standby plans. A standby that
# planned from its stalled watch would see those pods untouched and ready.
RESTART = 10.0
STANDBY_WATCH_TIMEOUT = 300  # its stalled stream is not dropped by itself during the test (after 310 s)


def test_a_standby_whose_pod_watch_stalled_plans_only_once_it_has_caught_up(
    cluster: ReliabilityCluster, proxy: ApiProxy
) -> None:
    app = "cut"
    assert cluster.kubelet is not None
    ns, watch = rollout_ready(cluster, app, PARTITIONED, PARTITIONED_MAX_UNAVAILABLE)
    through_proxy = cluster.kubeconfig_for(proxy.url)
    leader, standby = start_pair(
        cluster,
        app,
        lease=PARTITIONED_LEASE,
        standby_kubeconfig=through_proxy,
        standby_extra=(f"--watch-timeout={STANDBY_WATCH_TIMEOUT}",),
    )
    cluster.kubelet.restart_delay = RESTART
    try:
        wait_done(cluster, app, PARTITIONED, timeout=60)
        # Warm first: the standby holds every injected pod, and its first state (a WatchList, itself a
        # watch stream) has ended, so the stall hits the watch that follows it.
        injected_pods = len(cluster.kube.get(PODS, labelSelector=INJECTED)["items"])
        held = Metrics(standby.probe_url)
        eventually(
            lambda: held.value("sidecarctl_cached_objects", informer="pods") == injected_pods,
            timeout=60,
            what="the standby holds every injected pod",
        )
        eventually(
            lambda: [s for s in proxy.open_streams("pods") if "sendInitialEvents" not in s.path],
            timeout=30,
            what="the standby watches the pods",
        )
        stalled_at = time.time()
        assert proxy.stall("pods") >= 1
        watch.reset()
        set_image(cluster, app, "proxy:2")
        eventually(
            lambda: updated(cluster, ns, "proxy:2") >= PARTITIONED_MAX_UNAVAILABLE,
            timeout=30,
            interval=0.05,
            what="the first wave patched",
        )
        at_kill = updated(cluster, ns, "proxy:2")
        killed = kill_tree(leader)
        restarting = len(watch.now)
        status = wait_done(cluster, app, PARTITIONED, timeout=120)
    finally:
        cluster.kubelet.restart_delay = 0.3
        cluster.stop_manager(standby)
    events = audit_events(cluster.cp.audit_log, user=MANAGER_USER)
    after = [e for e in sent_by(events, f"{app}-b") if e.received > killed]
    patches_after = pod_patches(after, ns)
    first_patch = min(e.received for e in patches_after) if patches_after else float("inf")
    quorum_reads = [e for e in pod_reads(after) if e.verb == "list" and query(e).get("limit") == "1"]
    new_watches = [e for e in pod_reads(after) if e.verb == "watch" and e.received < first_patch]
    report(
        f"a standby whose pod watch stalled takes over ({PARTITIONED} pods,"
        f" maxUnavailable {PARTITIONED_MAX_UNAVAILABLE})",
        {
            "pods patched / restarting at the kill": f"{at_kill} / {restarting}",
            "first pod patch after the kill": f"{first_patch - killed:.2f} s",
            "its pod reads after the kill": [
                f"{e.verb} {query(e)}" for e in pod_reads(after) if e.received < first_patch
            ],
            "its pod patches refused": sum(1 for e in patches_after if e.code >= 300),
            "most pods unavailable at once": watch.peak,
        },
    )
    assert restarting > 0, "the old leader's last wave must still be restarting when the standby plans"
    assert patches_after, "the standby did not go on with the rollout"
    assert all(e.code < 300 for e in patches_after), "the standby planned from what its stalled watch showed"
    assert repatched(events, ns) == {}, "pods patched twice for one revision"
    assert watch.peak <= PARTITIONED_MAX_UNAVAILABLE
    assert quorum_reads and quorum_reads[0].received < first_patch, "no quorum read of the pods before planning"
    assert new_watches, "the stalled pod watch was not replaced before planning"
    assert not whole_reads(after), "the standby read every pod again instead of catching up"
    # Its stalled stream would have been dropped STANDBY_WATCH_TIMEOUT + 10 s after the stall at the
    # earliest: planning came long before, so it did not wait for that.
    assert first_patch - stalled_at < STANDBY_WATCH_TIMEOUT
    assert status["updatedPods"] == PARTITIONED
