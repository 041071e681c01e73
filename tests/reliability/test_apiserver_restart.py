"""kube-apiserver restarted (same etcd) in the middle of a rollout and of a stream of pod creations.

The real manager runs with a ServiceAccount token, so the audit log (which the restarted API server
appends to) tells which watches it opened again and when, and how often it patched each pod.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from tests.kube import builders
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.kube.managerharness import ManagerProcess
from tests.reliability.harness import MANAGER_USER, SS_PATH, WORKERS, ReliabilityCluster, audit_events, report

IDENTITY = "restart"
APP = "restart"
KUBELET_RESTART_DELAY = 0.5
PODS = 12
RESUME_BOUND = 10.0
# The manager's watches: the control process has one of each (pods only while leading), every
# admission worker one of each but pods.
WATCHES = {"sidecarsets": 1 + WORKERS, "namespaces": 1 + WORKERS, "controllerrevisions": 1 + WORKERS, "pods": 1}


def _pods(cluster: ReliabilityCluster, ns: str) -> list[dict[str, Any]]:
    return list(cluster.kube.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=f"app={APP}")["items"])


def _image(pod: dict[str, Any]) -> str | None:
    return next((str(c["image"]) for c in pod["spec"]["containers"] if c["name"] == "proxy"), None)


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def test_watches_resume_and_the_rollout_completes_without_a_pod_patched_twice_across_an_apiserver_restart(
    cluster: ReliabilityCluster,
) -> None:
    kube = cluster.kube
    cluster.sidecarset(APP, APP, updateStrategy={"type": "RollingUpdate", "maxUnavailable": 1})
    manager: ManagerProcess = cluster.start_manager(IDENTITY)
    cluster.register_webhooks(manager, APP)
    ns = cluster.labelled_namespace(APP, kubelet=True)
    cluster.wait_injecting(ns, APP)
    for i in range(PODS):
        kube.create(f"/api/v1/namespaces/{ns}/pods", builders.pod(f"{APP}-{i}", labels={"app": APP}))
    eventually(lambda: sum(_ready(p) for p in _pods(cluster, ns)) == PODS, timeout=60, what=f"{PODS} pods Ready")
    rollout = {p["metadata"]["name"] for p in _pods(cluster, ns)}

    # Pods keep being created throughout, by a client of their own that retries what fails.
    created: dict[str, list[str]] = {}
    failed_creates = 0
    answered: list[tuple[float, str]] = []  # creates the API server refused: (monotonic time, why)

    def create_pods(stop: threading.Event) -> None:
        nonlocal failed_creates
        i = 0
        while not stop.is_set():
            name = f"new-{i}"
            try:
                body = builders.pod(name, labels={"app": APP}, terminationGracePeriodSeconds=1)
                pod = cluster.rest.create(f"/api/v1/namespaces/{ns}/pods", body)
                created[name] = [c["name"] for c in pod["spec"]["containers"]]
                i += 1
            except ApiError as e:  # answered, not merely unreachable
                failed_creates += 1
                answered.append((time.monotonic(), str(e)[-200:]))
            except OSError:
                failed_creates += 1
            stop.wait(0.3)

    stop = threading.Event()
    creator = threading.Thread(target=create_pods, args=(stop,), daemon=True)
    creator.start()
    try:
        changed = time.time()
        bump = [{"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:2"}]
        kube.patch(f"{SS_PATH}/{APP}", bump, patch_type="json")
        eventually(
            lambda: sum(_image(p) == "proxy:2" for p in _pods(cluster, ns) if p["metadata"]["name"] in rollout) >= 3,
            timeout=30,
            what="rollout under way",
        )
        before_restart = sum(_image(p) == "proxy:2" for p in _pods(cluster, ns) if p["metadata"]["name"] in rollout)
        sigterm = time.monotonic()
        stopped_mono, ready_mono = cluster.cp.restart_apiserver()
        ready_wall = time.time() - (time.monotonic() - ready_mono)
        stopped_wall = ready_wall - (ready_mono - stopped_mono)
        stopping, down = stopped_mono - sigterm, ready_mono - stopped_mono

        def done() -> bool:
            got = _pods(cluster, ns)
            return bool(got) and all(_image(p) == "proxy:2" and _ready(p) for p in got)

        eventually(done, timeout=120, interval=0.3, what="every pod on proxy:2 and Ready")
        completed = time.time() - ready_wall
        time.sleep(1.0)  # pods created meanwhile
    finally:
        stop.set()
        creator.join(timeout=30)
    eventually(done, timeout=60, interval=0.3, what="pods created at the end upgraded too")

    mine = audit_events(cluster.cp.audit_log, user=MANAGER_USER)
    resumed: dict[str, list[float]] = {}
    for e in mine:
        # The old process is gone: every watch received from then on was opened again (the new
        # one serves a moment before its /readyz says so, hence the negative figures).
        if e.verb == "watch" and e.code == 200 and e.received >= stopped_wall:
            resumed.setdefault(e.resource, []).append(e.received - ready_wall)
    late = {r: sorted(resumed.get(r, []))[n - 1] if len(resumed.get(r, [])) >= n else None for r, n in WATCHES.items()}
    patches = Counter(
        e.name for e in mine if e.verb == "patch" and e.resource == "pods" and e.namespace == ns and e.code < 300
    )
    failed_patches = Counter(
        e.name for e in mine if e.verb == "patch" and e.resource == "pods" and e.namespace == ns and e.code >= 300
    )
    without = {n: c for n, c in created.items() if "proxy" not in c}
    upgraded_new = {n for n in created if patches.get(n)}
    report(
        "API server restart in the middle of a rollout and of pod creation",
        {
            "rollout pods upgraded before the restart": f"{before_restart} of {PODS}",
            "API server restart": f"SIGTERM to exit {stopping:.1f} s, exit to ready {down:.1f} s",
            "watches opened again, seconds after ready (the last needed of each)": {
                r: (f"{t:.2f}" if t is not None else "missing") for r, t in late.items()
            },
            "every watch opened again": {r: [round(t, 2) for t in sorted(ts)] for r, ts in resumed.items()},
            "rollout completed": f"{completed:.1f} s after the API server was ready "
            f"({time.time() - changed:.0f} s since the image change)",
            "pods created meanwhile": f"{len(created)}, {len(without)} without sidecars, {failed_creates} failed "
            "creates (retried)",
            "successful pod patches (audit)": f"{sum(patches.values())} on {len(patches)} pods, max per pod "
            f"{max(patches.values(), default=0)}; refused {sum(failed_patches.values())}",
            "created pods upgraded in place": len(upgraded_new),
            "creates refused by the API server, seconds after ready": [
                f"{t - ready_mono:+.2f} {why}" for t, why in answered
            ],
        },
    )
    assert not without, f"pods admitted without their sidecars: {without}"
    assert len(created) >= 10 and failed_creates > 0, "pod creation must span the restart"
    # Once the server is ready it admits pods at once: the policies' paramKind is a built-in kind its
    # REST mapping holds from the start (one of our own was refused for seconds: injector.policy.params).
    refused = [why for t, why in answered if t >= ready_mono]
    assert not refused, f"pod creates refused after the API server was ready: {refused}"
    assert 0 < before_restart < PODS, "the restart must land in the middle of the rollout"
    missing = [r for r, t in late.items() if t is None or t > RESUME_BOUND]
    assert not missing, f"watches not resumed within {RESUME_BOUND:g} s: {late}"
    twice = {n: c for n, c in patches.items() if c > 1}
    assert not twice, f"pods patched twice: {twice}"
    never = rollout - set(patches)
    assert not never, f"rollout pods never patched: {never}"
    cluster.stop_manager(manager)
