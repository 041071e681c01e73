"""Builders and waits shared by the e2e tests; fixtures live in conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from sidecarsets.spec import names
from tests.kube import builders
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import REPO, ControlPlane

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"


def sidecarctl(*args: str) -> subprocess.CompletedProcess[str]:
    """The `sidecarctl` command line as a user runs it (a subprocess, without $KUBECONFIG); never raises on failure."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "sidecarctl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        check=False,
    )


def kubectl(cp: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl (built with the control plane) against `cp`, as a user runs it; never raises on failure."""
    binary = cp.bin_dir / "kubectl"
    assert binary.exists(), f"no kubectl in {cp.bin_dir} (tools/build-control-plane.sh builds it)"
    return subprocess.run(
        [str(binary), f"--kubeconfig={cp.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_sidecarset(name: str, app: str, **spec: Any) -> dict[str, Any]:
    """The default SidecarSet for the `app: <app>` pods, with an init container too."""
    return builders.sidecarset(
        name, app=app, init_containers=[builders.container("proxy-init", "proxy-init:1")], **spec
    )


def make_pod(name: str, app: str, **labels: str) -> dict[str, Any]:
    """The default pod, labelled `app: <app>` (plus `labels`), that stops at once when deleted."""
    return builders.pod(name, labels={"app": app, **labels}, terminationGracePeriodSeconds=1)


def wait_injecting(kube: Kube, namespace: str, app: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Dry-run pod creates until the injection the test expects shows up (store and apiserver caught up)."""

    def attempt() -> dict[str, Any]:
        p = kube.create(f"/api/v1/namespaces/{namespace}/pods", make_pod("probe", app), dryRun="All")
        # Raised, not returned: a timeout then shows the last pod (eventually chains it).
        assert check(p), (
            f"last pod: containers {[c['name'] for c in p['spec']['containers']]}, {p['metadata'].get('annotations')}"
        )
        return p

    return eventually(attempt, timeout=20, interval=0.05, what="the webhook injects as expected")


def ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def container_status(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s["name"] == name:
            return dict(s)
    raise AssertionError(f"no status for container {name} in {pod['metadata']['name']}")


def image_of(pod: dict[str, Any], name: str) -> str:
    return str(next(c["image"] for c in pod["spec"]["containers"] if c["name"] == name))


def pods(kube: Kube, namespace: str, app: str) -> list[dict[str, Any]]:
    items = kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={app}")["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def pods_digest(kube: Kube, namespace: str) -> str:
    """One line per pod of `namespace`: when it was created, its containers, labels and annotations;
    printed when a test fails, to tell a pod admitted without sidecars from a status not written."""
    lines = []
    for p in kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        meta, spec = p["metadata"], p["spec"]
        containers = [c["name"] for c in spec.get("initContainers") or []] + ["|"]
        containers += [c["name"] for c in spec["containers"]]
        lines.append(
            f"{meta['name']} created {meta.get('creationTimestamp')} containers {containers} "
            f"labels {meta.get('labels')} annotations {meta.get('annotations')} ready {ready(p)}"
        )
    return "\n".join(lines) or f"no pods in {namespace}"


def create_ready_pods(kube: Kube, namespace: str, app: str, count: int, **labels: str) -> list[dict[str, Any]]:
    for i in range(count):
        kube.create(f"/api/v1/namespaces/{namespace}/pods", make_pod(f"{app}-{i}", app, **labels))

    def all_ready() -> list[dict[str, Any]] | None:
        got = pods(kube, namespace, app)
        return got if len(got) == count and all(ready(p) for p in got) else None

    return eventually(all_ready, timeout=30, what=f"{count} {app} pods Ready")


def status_of(kube: Kube, ss_name: str) -> dict[str, Any]:
    return dict(kube.get(f"{SS_PATH}/{ss_name}").get("status") or {})


def policy_condition(kube: Kube, name: str) -> dict[str, Any] | None:
    """The SidecarSet's PolicyInjection condition, or None while it has none."""
    return next(
        (c for c in status_of(kube, name).get("conditions") or [] if c["type"] == names.CONDITION_POLICY_INJECTION),
        None,
    )


def wait_condition(kube: Kube, name: str, status: str) -> dict[str, Any]:
    """Wait until PolicyInjection has `status`; a timeout says what the condition was."""

    def check() -> dict[str, Any]:
        c = policy_condition(kube, name)
        # Raised, not returned: a timeout then says what the condition was (eventually chains it).
        assert c is not None and c["status"] == status, f"PolicyInjection of {name} is {c}"
        return c

    return eventually(check, timeout=20, what=f"PolicyInjection of {name} is {status}")


def wait_status(kube: Kube, ss_name: str, timeout: float = 30.0, **expected: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        st = status_of(kube, ss_name)
        return st if all(st.get(k, 0) == v for k, v in expected.items()) else None

    try:
        return eventually(check, timeout=timeout, what=f"status of {ss_name} is {expected}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last status: {status_of(kube, ss_name)}") from None


def set_image(kube: Kube, ss_name: str, image: str, index: int = 0) -> None:
    kube.patch(
        f"{SS_PATH}/{ss_name}",
        [{"op": "replace", "path": f"/spec/containers/{index}/image", "value": image}],
        patch_type="json",
    )


def upgradable(pod: dict[str, Any]) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == names.POD_CONDITION_UPGRADABLE:
            return str(c.get("status"))
    return None
