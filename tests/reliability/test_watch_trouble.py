"""Watches that lag or stall, between the real manager and the real API server.

The manager's kubeconfig names a proxy (tests/kube/apiproxy.py) that forwards every request to
kube-apiserver with the manager's own ServiceAccount token, and misbehaves only where told: it
delays the namespace watch's bytes, or stops forwarding the SidecarSet watch without closing it.
The webhooks are registered with the API server by URL and caBundle, as an install does, so pods
are created through the real admission chain.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kuberuntime import api
from kuberuntime.kubeapi import STALL_MARGIN
from tests.kube import builders
from tests.kube.apiproxy import ApiProxy
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import ManagerProcess
from tests.kube.measure import Metrics
from tests.reliability.harness import SS_PATH, WORKERS, ReliabilityCluster, report

LAG = 3.0
LAG_ROUNDS = 50
# The manager here holds each watch open WATCH_TIMEOUT s (the default 40 s is pinned by
# tests/unit/manager/test_options.py to notice a stall within a minute): a silent stream is
# restarted at most WATCH_TIMEOUT + a fifth of it (jitter) + STALL_MARGIN after its last byte, 22 s;
# the bound adds 8 s for the restarted watch's backoff, relist and the API server reaching a worker.
WATCH_TIMEOUT = 10
STALL_BOUND = WATCH_TIMEOUT + WATCH_TIMEOUT // 5 + STALL_MARGIN + 8.0
# Each state read after a 410 is answered this late: a gap a pod can fall into, and within the 2 s
# the webhook waits for it (--namespace-lookup-timeout) with room for the backoff before the read.
LIST_LAG = 1.0


@pytest.fixture(scope="module")
def manager(cluster: ReliabilityCluster, proxy: ApiProxy) -> Iterator[ManagerProcess]:
    cluster.sidecarset("lag", "lag")
    # The webhook's snapshot is what lags or stalls here, so the webhook injects every pod (in the
    # default mode, SidecarSets that a MutatingAdmissionPolicy can express are injected by the API server).
    m = cluster.start_manager(
        "watch-trouble",
        kubeconfig_path=cluster.kubeconfig_for(proxy.url),
        extra=("--injection=webhook", f"--watch-timeout={WATCH_TIMEOUT}"),
    )
    try:
        cluster.register_webhooks(m, "lag")
        yield m
    finally:
        cluster.stop_manager(m)


def _containers(pod: dict[str, object]) -> list[str]:
    spec = pod["spec"]
    assert isinstance(spec, dict)
    return [str(c["name"]) for c in spec["containers"]]


def test_a_namespace_the_watch_has_not_delivered_never_admits_a_pod_without_its_sidecars(
    cluster: ReliabilityCluster, proxy: ApiProxy, manager: ManagerProcess
) -> None:
    kube = cluster.kube
    metrics = Metrics(manager.probe_url)
    found_before = metrics.value("sidecarctl_namespace_lookups_total", result="found")
    proxy.delay("namespaces", LAG)
    admitted: dict[str, list[str]] = {}
    refusals: list[str] = []
    took: list[float] = []
    try:
        for i in range(LAG_ROUNDS):
            ns = cluster.labelled_namespace(f"lag{i}")
            started = time.monotonic()
            while True:  # as the ReplicaSet controller does: a refused pod is created again
                try:
                    pod = kube.create(f"/api/v1/namespaces/{ns}/pods", builders.pod("web", labels={"app": "lag"}))
                    admitted[ns] = _containers(pod)
                    break
                except api.ApiError as e:
                    refusals.append(f"{ns}: {e.status} {e.message[:160]}")
                    assert time.monotonic() - started < 30, f"pod in {ns} refused for 30 s: {refusals[-1]}"
                    time.sleep(0.2)
            took.append(time.monotonic() - started)
        # The lag was real: the namespaces were still arriving on the watch after the pods.
        lagging = [s for s in proxy.open_streams("namespaces") if s.chunks]
    finally:
        proxy.delay("namespaces", 0.0)
    found = metrics.value("sidecarctl_namespace_lookups_total", result="found") - found_before
    without = {ns: c for ns, c in admitted.items() if "proxy" not in c}
    report(
        f"namespace lag: the namespace watch delayed {LAG:g} s; {LAG_ROUNDS} x (labelled namespace + pod at once)",
        {
            "pods admitted": len(admitted),
            "admitted without the sidecar": len(without),
            "refusals (retried)": f"{len(refusals)} {refusals[:3]}",
            "namespaces read from the API server (metric)": f"{found:.0f}",
            "namespace + pod, created to admitted": f"max {max(took):.2f} s",
            "namespace watch streams through the proxy": len(lagging),
        },
    )
    assert len(admitted) == LAG_ROUNDS
    assert not without, f"pods admitted without their sidecars: {without}"
    # Each worker that saw a pod in a namespace its snapshot did not have yet read it from the API server.
    assert found >= LAG_ROUNDS * 0.8, f"only {found:.0f} namespace lookups: the lag did not reach the webhook"
    assert lagging, "the manager's namespace watches did not go through the proxy"


def test_a_stalled_sidecarset_watch_is_restarted_and_new_pods_get_the_new_image_within_its_bound(
    cluster: ReliabilityCluster, proxy: ApiProxy, manager: ManagerProcess
) -> None:
    kube = cluster.kube
    ns = cluster.labelled_namespace("stall")
    cluster.sidecarset("stall", "stall", image="proxy:1")

    def image() -> str | None:
        try:
            pod = kube.create(
                f"/api/v1/namespaces/{ns}/pods", builders.pod("probe", labels={"app": "stall"}), dryRun="All"
            )
        except api.ApiError:
            return None
        return next((str(c["image"]) for c in pod["spec"]["containers"] if c["name"] == "proxy"), None)

    deadline = time.monotonic() + 30
    while image() != "proxy:1":
        assert time.monotonic() < deadline, "pods never got proxy:1"
        time.sleep(0.2)
    streams = proxy.open_streams("sidecarsets")
    assert len(streams) >= 3, f"expected the control process's and both workers' SidecarSet watches: {streams}"
    metrics = Metrics(manager.probe_url)
    stalled_before = metrics.value("sidecarctl_watch_restarts_total", informer="sidecarsets", cause="stalled")
    restarts_before = metrics.value("sidecarctl_watch_restarts_total", informer="sidecarsets")

    # The worst moment to stall: right after the streams delivered something, so each one's silence
    # starts only now. A label change gives every stream one event; then nothing more gets through.
    marks = {id(s): s.chunks for s in streams}
    kube.patch(f"{SS_PATH}/stall", {"metadata": {"labels": {"touched": "1"}}})
    deadline = time.monotonic() + 10
    while any(s.chunks == marks[id(s)] for s in streams):
        assert time.monotonic() < deadline, "the label change did not reach every SidecarSet watch"
        time.sleep(0.02)
    stalled = proxy.stall("sidecarsets")
    changed = time.monotonic()
    kube.patch(
        f"{SS_PATH}/stall",
        [{"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:2"}],
        patch_type="json",
    )

    # New pods must get proxy:2 from whichever worker the API server reaches: ten in a row.
    seen: list[tuple[float, str | None]] = []
    streak = 0
    while streak < 10:
        got = image()
        seen.append((time.monotonic() - changed, got))
        streak = streak + 1 if got == "proxy:2" else 0
        assert time.monotonic() - changed < STALL_BOUND + 30, f"still old images after {STALL_BOUND + 30:.0f} s"
        time.sleep(0.25)
    first_new = next(t for t, img in seen if img == "proxy:2")
    all_new = next(t for n, (t, _) in enumerate(seen) if all(img == "proxy:2" for _, img in seen[n:]))
    # The API server keeps its connection to one worker, so ten pods in a row may have come from
    # one restarted watch; each process notices its own stall within the bound.
    deadline = changed + STALL_BOUND + 10
    while True:
        stalled_after = metrics.value("sidecarctl_watch_restarts_total", informer="sidecarsets", cause="stalled")
        if stalled_after - stalled_before >= stalled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    restarted_in = time.monotonic() - changed
    restarts_after = metrics.value("sidecarctl_watch_restarts_total", informer="sidecarsets")
    report(
        "stalled watch: the SidecarSet watch streams stop forwarding (not closed), then the image changes",
        {
            "streams stalled": stalled,
            "first pod with the new image": f"{first_new:.1f} s after the change",
            "every pod with the new image from": f"{all_new:.1f} s after the change (bound {STALL_BOUND:.0f} s)",
            "watch restarts, cause stalled (metric)": (
                f"{stalled_before:.0f} -> {stalled_after:.0f} within {restarted_in:.1f} s of the change"
            ),
            "watch restarts, all causes (metric)": f"{restarts_before:.0f} -> {restarts_after:.0f}",
        },
    )
    assert stalled >= 3
    assert all_new <= STALL_BOUND, f"pods got the new image only {all_new:.1f} s after the change"
    assert stalled_after - stalled_before >= stalled, "every stalled watch is counted as restarted for cause stalled"
    assert restarts_after > restarts_before


def test_a_sidecarset_created_while_the_watches_read_their_state_again_reaches_the_next_pod(
    aloop: BackgroundLoop, cluster: ReliabilityCluster, proxy: ApiProxy, manager: ManagerProcess
) -> None:
    """The SidecarSet watches end and resume into a 410 (a kube-apiserver whose watch cache started
    after their resourceVersion, as during a control plane upgrade), so each process reads the whole
    state again, answered LIST_LAG late. A SidecarSet created in that gap is in no worker's snapshot
    until its read finishes: the pod created right after it waits for that read (at most
    --namespace-lookup-timeout, 2 s) instead of being admitted without its sidecar.

    Each process is told by its User-Agent: counting the streams open at the expiry would not do, since
    a watch that is between two streams then (each ends every WATCH_TIMEOUT s or so) is open nowhere."""
    kube = cluster.kube
    ns = cluster.labelled_namespace("gone")
    metrics = Metrics(manager.probe_url)
    waited_before = metrics.value("sidecarctl_webhook_snapshot_waits_total", outcome="caught_up")
    behind_before = metrics.value("sidecarctl_webhook_snapshot_waits_total", outcome="behind")
    processes = {"control", *(f"webhook-{i}" for i in range(WORKERS))}
    answered_before = len(proxy.gone_to)

    def answered() -> set[str]:  # the processes whose SidecarSet watch was answered 410 since the expiry
        return {p for agent in proxy.gone_to[answered_before:] for p in processes if f"({p}; " in agent}

    proxy.delay_lists("sidecarsets", LIST_LAG)
    try:
        ended = aloop.run(proxy.expire("sidecarsets"))
        deadline = time.monotonic() + 10
        while answered() != processes:  # every process's watch has resumed into its 410
            assert time.monotonic() < deadline, f"only {sorted(answered())} of {sorted(processes)} got a 410"
            time.sleep(0.01)
        in_gap = time.monotonic()
        sidecar = builders.container("proxy", "proxy:1")
        kube.create(SS_PATH, builders.sidecarset("gone", containers=[sidecar], app="gone"))
        pod = kube.create(f"/api/v1/namespaces/{ns}/pods", builders.pod("web", labels={"app": "gone"}))
        took = time.monotonic() - in_gap
    finally:
        proxy.unexpire("sidecarsets")
        proxy.delay_lists("sidecarsets", 0.0)
    waited = metrics.value("sidecarctl_webhook_snapshot_waits_total", outcome="caught_up") - waited_before
    behind = metrics.value("sidecarctl_webhook_snapshot_waits_total", outcome="behind") - behind_before
    report(
        f"watches expired: every SidecarSet watch ends and resumes into a 410; each read again {LIST_LAG:g} s late",
        {
            "streams open at the expiry": ended,
            "watches answered 410": len(proxy.gone_to) - answered_before,
            "SidecarSet + pod created, after each process's 410": f"{took:.2f} s",
            "pod's containers": _containers(pod),
            "snapshot waits, caught up / behind (metric)": f"{waited:.0f} / {behind:.0f}",
        },
    )
    assert "proxy" in _containers(pod), "admitted from a snapshot missing the SidecarSet created in the gap"
    assert waited >= 1 and behind == 0
