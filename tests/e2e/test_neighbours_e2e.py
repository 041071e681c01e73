"""Living beside other admission steps: a digest-pinning webhook and a second injector.

Real HTTPS webhooks in MutatingWebhookConfigurations of their own (tests/kube/neighbours.py),
called by the API server before sidecarctl's (`aa-...`) or after it (`zz-...`):

- digest pinning on CREATE and UPDATE: every pod injected once, its sidecar images pinned, the
  status counting them all updated and ready and staying so; an image change rolls in place with at
  most one patch per pod by the manager (the API server's audit log), although the pinner rewrites
  the image the patch writes; no pod marked not upgradable. A policy-served SidecarSet's pods too.
- a second injector (init container at index 0, container at the end, reinvocation IfNeeded):
  every container of both injectors once, the app container untouched, sidecarctl's BeforeApp
  sidecar first and AfterApp last of what the pod had when sidecarctl saw it, and the foreign
  containers byte-identical after an in-place upgrade.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import pytest

from sidecarsets.spec import names
from tests.e2e.helpers import (
    container_status,
    create_ready_pods,
    make_pod,
    pods,
    set_image,
    status_of,
    upgradable,
    wait_condition,
    wait_injecting,
    wait_status,
)
from tests.kube import builders
from tests.kube.audit import pod_patches
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import RunningManager
from tests.kube.neighbours import (
    FOREIGN_INIT,
    FOREIGN_SIDECAR,
    digest_pinning_app,
    neighbour,
    pinned,
    second_injector_app,
)

ORDERS = {"before": "aa-neighbour", "after": "zz-neighbour"}
PODS = 10


def probe(kube: Kube, namespace: str) -> Callable[[], dict[str, Any]]:
    return functools.partial(
        kube.create, f"/api/v1/namespaces/{namespace}/pods", make_pod("probe", "nobody"), dryRun="All"
    )


def names_of(pod: dict[str, Any], key: str = "containers") -> list[str]:
    return [c["name"] for c in pod["spec"].get(key) or []]


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_a_digest_pinning_webhook_gets_one_injection_and_one_patch_per_pod(
    order: str,
    aloop: BackgroundLoop,
    kube: Kube,
    control_plane: ControlPlane,
    injected_ns: str,
    sidecarsets: Callable[..., dict[str, Any]],
    manager: RunningManager,
) -> None:
    calls: list[tuple[str, str]] = []
    with neighbour(
        aloop,
        kube,
        digest_pinning_app(calls=calls),
        config_name=f"{ORDERS[order]}-digest-{injected_ns[-6:]}",
        namespace=injected_ns,
        operations=("CREATE", "UPDATE"),
        probe=probe(kube, injected_ns),
        called=lambda p: "@sha256:" in p["spec"]["containers"][0]["image"],
    ):
        ss = sidecarsets("pin", metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}})
        name = ss["metadata"]["name"]
        wait_injecting(kube, injected_ns, "pin", lambda p: "proxy" in names_of(p))
        created = create_ready_pods(kube, injected_ns, "pin", PODS)
        for pod in created:
            assert names_of(pod) == ["proxy", "app"] and names_of(pod, "initContainers") == ["proxy-init"]
            assert [c["image"] for c in pod["spec"]["containers"]] == [pinned("proxy:1"), pinned("app:1")]
        wait_status(kube, name, matchedPods=PODS, updatedPods=PODS, readyPods=PODS, updatedReadyPods=PODS)
        for _ in range(10):  # and it stays so: nothing rewrites the pods behind the status's back
            time.sleep(0.5)
            st = status_of(kube, name)
            assert (st["updatedPods"], st["updatedReadyPods"]) == (PODS, PODS), st
        start = control_plane.audit_log.stat().st_size
        t0 = time.monotonic()
        set_image(kube, name, "proxy:2")

        def landed() -> bool:
            got = pods(kube, injected_ns, "pin")
            return all(container_status(p, "proxy").get("image") == pinned("proxy:2") for p in got)

        eventually(landed, timeout=60, interval=0.2, what="every pod running proxy:2, pinned")
        wait_status(kube, name, timeout=60, updatedPods=PODS, updatedReadyPods=PODS)
        took = time.monotonic() - t0
        patches = pod_patches(control_plane, start, injected_ns)
        assert len(patches) == PODS and max(patches.values()) == 1, patches
        assert "UPDATE" in {op for op, _ in calls}, "the pinner saw the in-place upgrade"
        assert [upgradable(p) for p in pods(kube, injected_ns, "pin")] == [None] * PODS
        print(f"\ndigest pinning {order} sidecarctl: rolled in {took:.1f}s, {sum(patches.values())} patches")


def test_a_policy_served_sidecarset_beside_a_digest_pinning_webhook(
    aloop: BackgroundLoop,
    kube: Kube,
    injected_ns: str,
    sidecarsets: Callable[..., dict[str, Any]],
    manager: RunningManager,
) -> None:
    with neighbour(
        aloop,
        kube,
        digest_pinning_app(),
        config_name=f"zz-neighbour-policy-{injected_ns[-6:]}",
        namespace=injected_ns,
        operations=("CREATE", "UPDATE"),
        probe=probe(kube, injected_ns),
        called=lambda p: "@sha256:" in p["spec"]["containers"][0]["image"],
    ):
        ss = sidecarsets("polpin")
        name = ss["metadata"]["name"]

        wait_condition(kube, name, "True")
        wait_injecting(
            kube, injected_ns, "polpin", lambda p: p["metadata"]["annotations"].get(names.ANN_INJECTED_BY) == "policy"
        )
        created = create_ready_pods(kube, injected_ns, "polpin", 4)
        for pod in created:
            assert names_of(pod) == ["proxy", "app"], names_of(pod)
            assert pod["spec"]["containers"][0]["image"] == pinned("proxy:1")
        wait_status(kube, name, matchedPods=4, updatedPods=4, readyPods=4, updatedReadyPods=4)


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_a_second_injector_keeps_its_containers_and_sidecarctl_its_order(
    order: str,
    aloop: BackgroundLoop,
    kube: Kube,
    control_plane: ControlPlane,
    injected_ns: str,
    sidecarsets: Callable[..., dict[str, Any]],
    manager: RunningManager,
) -> None:
    with neighbour(
        aloop,
        kube,
        second_injector_app(),
        config_name=f"{ORDERS[order]}-injector-{injected_ns[-6:]}",
        namespace=injected_ns,
        operations=("CREATE",),
        probe=probe(kube, injected_ns),
        called=lambda p: FOREIGN_SIDECAR in names_of(p),
    ):
        logs = builders.container("log-agent", "log:1", podInjectPolicy="AfterAppContainer")
        ss = sidecarsets(
            "two",
            containers=[builders.container("proxy", "proxy:1"), logs],
            metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}},
        )
        name = ss["metadata"]["name"]
        wait_injecting(kube, injected_ns, "two", lambda p: "log-agent" in names_of(p))
        created = create_ready_pods(kube, injected_ns, "two", 3)
        for pod in created:
            containers = names_of(pod)
            # Each container once; sidecarctl's BeforeApp sidecar first, its AfterApp one last of the
            # containers the pod had when sidecarctl saw it (the other injector's, if it came first).
            assert sorted(containers) == sorted(["proxy", "app", "log-agent", FOREIGN_SIDECAR]), containers
            if order == "before":
                assert containers == ["proxy", "app", FOREIGN_SIDECAR, "log-agent"], containers
            else:
                assert containers == ["proxy", "app", "log-agent", FOREIGN_SIDECAR], containers
            inits = names_of(pod, "initContainers")
            assert sorted(inits) == sorted([FOREIGN_INIT, "proxy-init"]) and inits[0] in (FOREIGN_INIT, "proxy-init")
            app = next(c for c in pod["spec"]["containers"] if c["name"] == "app")
            assert app["image"] == "app:1" and not any(e["name"] == "IS_INJECTED" for e in app.get("env") or [])
        foreign = {
            p["metadata"]["name"]: [
                c
                for c in p["spec"]["containers"] + p["spec"]["initContainers"]
                if c["name"] in (FOREIGN_SIDECAR, FOREIGN_INIT)
            ]
            for p in created
        }
        wait_status(kube, name, updatedReadyPods=3)
        set_image(kube, name, "proxy:2")
        wait_status(kube, name, timeout=60, updatedPods=3, updatedReadyPods=3)
        eventually(
            lambda: all(container_status(p, "proxy").get("image") == "proxy:2" for p in pods(kube, injected_ns, "two")),
            timeout=60,
            what="every pod on proxy:2",
        )
        for pod in pods(kube, injected_ns, "two"):
            mine = [
                c
                for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]
                if c["name"] in (FOREIGN_SIDECAR, FOREIGN_INIT)
            ]
            assert mine == foreign[pod["metadata"]["name"]], "the other injector's containers are untouched"
            assert container_status(pod, FOREIGN_SIDECAR)["restartCount"] == 0
