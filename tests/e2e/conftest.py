"""E2e fixtures around the real manager: one in-process manager for the session, webhooks
registered by URL, and helpers to make namespaces that are labelled for injection."""

from __future__ import annotations

import base64
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecarsets import names
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    RunningManager,
    ensure_namespace,
    start_in_process,
    wait_ready,
    webhook_configs,
    write_cert_dir,
)

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"


@pytest.fixture(scope="session")
def manager(
    aloop: BackgroundLoop, control_plane: ControlPlane, kube: Kube, crd: dict[str, Any], kubelet: FakeKubelet
) -> Iterator[RunningManager]:
    ensure_namespace(kube, MANAGER_NS)
    cert_dir = Path(tempfile.mkdtemp(prefix="sidecarctl-e2e-certs-"))
    write_cert_dir(cert_dir)
    m = start_in_process(aloop, control_plane, cert_dir, identity="e2e-main")
    mwc, vwc = webhook_configs(
        m.webhook_url, mutating=names.MUTATING_WEBHOOK_CONFIG, validating=names.VALIDATING_WEBHOOK_CONFIG
    )
    kube.apply(MWC_PATH, mwc)
    kube.apply(VWC_PATH, vwc)
    try:
        wait_ready(m)

        def bundle_synced() -> bool:
            for path in (
                f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}",
                f"{VWC_PATH}/{names.VALIDATING_WEBHOOK_CONFIG}",
            ):
                got = kube.get(path)
                bundle = got["webhooks"][0]["clientConfig"].get("caBundle", "")
                if b"BEGIN CERTIFICATE" not in base64.b64decode(bundle):
                    return False
            return True

        eventually(bundle_synced, timeout=20, what="caBundle filled by the manager")
        eventually(lambda: m.manager.leading, timeout=30, what="manager leads")
        yield m
    finally:
        m.stop()
        kube.delete(f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}")
        kube.delete(f"{VWC_PATH}/{names.VALIDATING_WEBHOOK_CONFIG}")


def make_sidecarset(name: str, app: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"app": app}},
        "initContainers": [{"name": "proxy-init", "image": "proxy-init:1"}],
        "containers": [{"name": "proxy", "image": "proxy:1"}],
    }
    body.update(spec)
    return {"apiVersion": names.API_VERSION, "kind": "SidecarSet", "metadata": {"name": name}, "spec": body}


def make_pod(name: str, app: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app, **labels}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}], "terminationGracePeriodSeconds": 1},
    }


@pytest.fixture
def injected_ns(kube: Kube, namespace: str, manager: RunningManager) -> str:
    """The per-test namespace, labelled sidecar-injection=enabled."""
    kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {names.NS_INJECTION_LABEL: "enabled"}}})
    return namespace


@pytest.fixture
def sidecarsets(kube: Kube) -> Iterator[Callable[..., dict[str, Any]]]:
    """Create SidecarSets with unique names; all are deleted after the test."""
    created: list[str] = []

    def create(app: str, **spec: Any) -> dict[str, Any]:
        name = f"ss-{app}-{secrets.token_hex(3)}"
        obj = kube.create(SS_PATH, make_sidecarset(name, app, **spec))
        created.append(name)
        return obj

    yield create
    for name in created:
        kube.delete(f"{SS_PATH}/{name}")


def wait_injecting(kube: Kube, namespace: str, app: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Dry-run pod creates until the injection the test expects shows up (store and apiserver caught up)."""

    def attempt() -> dict[str, Any] | None:
        p = kube.create(f"/api/v1/namespaces/{namespace}/pods", make_pod("probe", app), dryRun="All")
        return p if check(p) else None

    return eventually(attempt, timeout=20, interval=0.05, what="the webhook injects as expected")
