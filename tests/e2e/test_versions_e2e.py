"""What the manager does on the Kubernetes minor it runs on, asserted for that minor.

These run in the e2e tier on the newest supported minor and, through the versions tier
(`tools/test.sh`, SIDECARCTL_K8S_VERSION), on every other one. Each test asserts what this minor
must give: MutatingAdmissionPolicy v1 from 1.36 (before it, the manager runs as with
`--injection=webhook` and says why), `pods/resize` on every supported minor, and on all of them a
controller that writes status and rolls an image in place whatever the optional APIs are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from sidecarctl.manager import preflight
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.spec import names
from tests.e2e.helpers import (
    container_status,
    create_ready_pods,
    image_of,
    pods,
    policy_condition,
    ready,
    set_image,
    sidecarctl,
    wait_injecting,
    wait_status,
)
from tests.e2e.test_metrics_e2e import scrape
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane, minor_of
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import MANAGER_NS, RunningManager

pytestmark = pytest.mark.versions

MAP_V1 = "admissionregistration.k8s.io/v1"


def policies_served(cp: ControlPlane) -> bool:
    """MutatingAdmissionPolicy v1 is GA, and on by default, from Kubernetes 1.36."""
    return minor_of(cp.version) >= (1, 36)


def test_the_manager_exports_what_this_api_server_serves(control_plane: ControlPlane, manager: RunningManager) -> None:
    metrics = scrape(manager)
    assert metrics.value("sidecarctl_apiserver_info", git_version=control_plane.version) == 1
    served = metrics.value("sidecarctl_api_served", group_version=MAP_V1, resource="mutatingadmissionpolicies")
    assert served == (1 if policies_served(control_plane) else 0)
    assert metrics.value("sidecarctl_api_served", group_version="v1", resource="pods/resize") == 1


def test_status_is_written_and_an_image_rolls_in_place_on_this_minor(
    control_plane: ControlPlane, kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    """The default manager (`--injection=auto`) on this minor: the SidecarSet's status is written within
    seconds, pods are injected by the path this minor offers (the condition says which, and why), and
    an image change reaches the running pods in place: same pods, the sidecar restarted once."""
    started = time.monotonic()
    ss = sidecarsets("minor", initContainers=[], updateStrategy={"type": "RollingUpdate", "maxUnavailable": "100%"})
    name = ss["metadata"]["name"]
    st = wait_status(kube, name, timeout=10, matchedPods=0)
    assert st.get("latestRevision", "").startswith(name + "-") and st["observedGeneration"] == 1
    status_took = time.monotonic() - started
    assert status_took < 10  # the 10-s wait above bounds it: the figure is for the failure message

    def path_said() -> dict[str, Any]:
        cond = policy_condition(kube, name)
        want = "True" if policies_served(control_plane) else "False"
        assert cond is not None and cond["status"] == want, f"PolicyInjection: {cond}"
        return cond

    cond = eventually(path_said, timeout=30, what="PolicyInjection says which path serves this minor")
    if policies_served(control_plane):
        assert cond["reason"] == "PolicyServed"
    else:
        assert cond["reason"] == "PolicyUnsupported"
        assert f"Kubernetes {control_plane.version}" in cond["message"] and MAP_V1 in cond["message"]

    want_path = "policy" if policies_served(control_plane) else "webhook"
    # A policy is enforced at the API server's next recompile after its write; until then the webhook,
    # kept widened meanwhile, serves those pods (make before break).
    wait_injecting(
        kube, injected_ns, "minor", lambda p: p["metadata"]["annotations"][names.ANN_INJECTED_BY] == want_path
    )
    created = create_ready_pods(kube, injected_ns, "minor", 3)
    assert [p["metadata"]["annotations"][names.ANN_INJECTED_BY] for p in created] == [want_path] * 3
    assert all(image_of(p, "proxy") == "proxy:1" for p in created)
    uids = {p["metadata"]["uid"] for p in created}
    wait_status(kube, name, matchedPods=3, updatedPods=3, readyPods=3)

    set_image(kube, name, "proxy:2")

    def rolled() -> list[dict[str, Any]] | None:
        # The kubelet's word, not the spec: the new image running (a patched spec is ready a moment
        # before its kubelet reports the restart).
        got = pods(kube, injected_ns, "minor")
        running = [p for p in got if container_status(p, "proxy").get("image") == "proxy:2" and ready(p)]
        return got if len(got) == 3 and len(running) == 3 else None

    after = eventually(rolled, timeout=60, what="the new proxy image on the 3 running pods")
    assert {p["metadata"]["uid"] for p in after} == uids, "the same pods: upgraded in place, not recreated"
    for p in after:
        restarts = {s["name"]: s["restartCount"] for s in p["status"]["containerStatuses"]}
        assert restarts == {"proxy": 1, "app": 0}, p["metadata"]["name"]
    wait_status(kube, name, matchedPods=3, updatedPods=3, readyPods=3, updatedReadyPods=3)


def test_policy_mode_starts_only_where_the_policy_api_is_served(
    aloop: BackgroundLoop, control_plane: ControlPlane, manager: RunningManager
) -> None:
    """`sidecarctl run --injection=policy`: refused in one line before anything starts on a minor without
    MutatingAdmissionPolicy v1; its preflight passes against this server otherwise."""
    if policies_served(control_plane):
        opts = ManagerOptions.build(kubeconfig=str(control_plane.kubeconfig), namespace=MANAGER_NS, injection="policy")
        assert aloop.run(preflight.policy_mode_problem(opts)) is None
        return
    run = sidecarctl(
        "run",
        f"--kubeconfig={control_plane.kubeconfig}",
        f"--namespace={MANAGER_NS}",
        "--self-signed",
        "--injection=policy",
        "--webhook-bind=127.0.0.1:0",
        "--probe-bind=127.0.0.1:0",
    )
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, run.stderr
    assert f"Kubernetes {control_plane.version}" in errors[0] and "--injection=auto" in errors[0]
