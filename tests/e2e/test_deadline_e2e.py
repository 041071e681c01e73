"""A rollout to an image that never runs stops itself at its progress deadline, and resumes on a fix.

Against the real API server, the session's manager and the fake kubelet (which keeps a container on
a bad image waiting in ImagePullBackOff): 5 pods, maxUnavailable 2, progressDeadlineSeconds 10. The
bad image reaches exactly 2 pods; past the deadline the SidecarSet says Progressing=False
(ProgressDeadlineExceeded) naming both pods and the kubelet's reason, an Event says it, the gauge
reads 1, and for several seconds no pod is touched (resourceVersions unchanged). Changing the image
to a good one resumes the rollout: every pod, the 2 stuck ones included, ends on it and Ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sidecarsets.spec import names
from tests.e2e.certsupport import scrape
from tests.e2e.helpers import SS_PATH, create_ready_pods, image_of, pods, ready, set_image, wait_injecting, wait_status
from tests.kube.client import Kube, eventually
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.managerharness import RunningManager

PODS = 5
DEADLINE = 10
BAD = "proxy:bad-deadline"


def _progressing(kube: Kube, name: str) -> dict[str, Any] | None:
    status = kube.get(f"{SS_PATH}/{name}").get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == names.CONDITION_PROGRESSING), None)


def _stalled_gauge(manager: RunningManager, name: str) -> float | None:
    return scrape(manager.probe_url).find("sidecarctl_rollout_stalled", sidecarset_namespace="", sidecarset=name)


def test_a_rollout_past_its_progress_deadline_stops_itself_and_resumes_when_the_image_is_fixed(
    kube: Kube,
    injected_ns: str,
    manager: RunningManager,
    kubelet: FakeKubelet,
    sidecarsets: Callable[..., dict[str, Any]],
) -> None:
    kubelet.bad_images.add(BAD)
    strategy = {"type": "RollingUpdate", "maxUnavailable": 2, "progressDeadlineSeconds": DEADLINE}
    ss = sidecarsets("deadline", initContainers=[], updateStrategy=strategy)
    name = ss["metadata"]["name"]
    wait_injecting(kube, injected_ns, "deadline", lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    create_ready_pods(kube, injected_ns, "deadline", PODS)
    wait_status(kube, name, matchedPods=PODS, updatedPods=PODS, readyPods=PODS)

    set_image(kube, name, BAD)
    patched_at = time.monotonic()
    cond = eventually(
        lambda: c if (c := _progressing(kube, name)) is not None and c["status"] == "False" else None,
        timeout=30,
        interval=0.1,
        what="the rollout stopped by its deadline",
    )
    stopped_after = time.monotonic() - patched_at
    generation = kube.get(f"{SS_PATH}/{name}")["metadata"]["generation"]
    assert cond["reason"] == names.REASON_DEADLINE_EXCEEDED and cond["observedGeneration"] == generation
    on_bad = sorted(p["metadata"]["name"] for p in pods(kube, injected_ns, "deadline") if image_of(p, "proxy") == BAD)
    assert len(on_bad) == 2, f"maxUnavailable 2: {on_bad}"
    for pod in on_bad:
        assert f"{injected_ns}/{pod} (proxy: ImagePullBackOff)" in cond["message"], cond["message"]
    assert stopped_after >= DEADLINE, f"stopped {stopped_after:.1f}s after the patch, before the deadline"
    assert stopped_after <= DEADLINE + 2 + 5, f"stopped only {stopped_after:.1f}s after the patch"
    assert _stalled_gauge(manager, name) == 1
    events = kube.get(
        "/api/v1/events", fieldSelector=f"involvedObject.name={name},reason={names.REASON_DEADLINE_EXCEEDED}"
    )
    assert [e["type"] for e in events["items"]] == ["Warning"], events["items"]

    # Stopped: no pod is touched, not even the stuck ones, whatever the time.
    before = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods(kube, injected_ns, "deadline")}
    time.sleep(5)
    after = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods(kube, injected_ns, "deadline")}
    assert after == before, "a stopped rollout touched pods"
    assert _progressing(kube, name) == cond

    # A fix (a new spec) resumes it: the stuck pods are patched again, then the rest.
    set_image(kube, name, "proxy:2")
    resumed_at = time.monotonic()

    def all_fixed() -> bool:
        got = pods(kube, injected_ns, "deadline")
        return len(got) == PODS and all(image_of(p, "proxy") == "proxy:2" and ready(p) for p in got)

    eventually(all_fixed, timeout=60, interval=0.1, what="every pod on proxy:2 and Ready")
    took = time.monotonic() - resumed_at
    wait_status(kube, name, matchedPods=PODS, updatedPods=PODS, readyPods=PODS, updatedReadyPods=PODS)
    resumed = _progressing(kube, name)
    assert resumed is not None and resumed["status"] == "True", resumed
    assert _stalled_gauge(manager, name) == 0
    print(f"\nprogress deadline {DEADLINE}s: stopped {stopped_after:.1f}s after the patch; fixed in {took:.1f}s")
