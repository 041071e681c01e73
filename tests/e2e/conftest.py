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

from kuberuntime import kubeapi
from sidecarsets.spec import names
from tests.e2e.certsupport import Rig, open_rig
from tests.e2e.helpers import SS_PATH, make_sidecarset
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    RunningManager,
    conversion_bundle_synced,
    conversion_works,
    ensure_namespace,
    start_in_process,
    wait_ready,
    webhook_configs,
    write_cert_dir,
)


@pytest.fixture(scope="session")
def manager(
    aloop: BackgroundLoop,
    control_plane: ControlPlane,
    kube: Kube,
    crd: dict[str, Any],
    kubelet: FakeKubelet,
    manager_port: int,
) -> Iterator[RunningManager]:
    """The session's manager, on the port the CRD's conversion webhook already names."""
    ensure_namespace(kube, MANAGER_NS)
    cert_dir = Path(tempfile.mkdtemp(prefix="sidecarctl-e2e-certs-"))
    write_cert_dir(cert_dir)
    m = start_in_process(aloop, control_plane, cert_dir, identity="e2e-main", webhook_port=manager_port)
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
            return conversion_bundle_synced(kube)

        eventually(bundle_synced, timeout=20, what="caBundle filled by the manager")
        eventually(lambda: conversion_works(kube), timeout=20, what="v1beta1 converted through the manager")
        eventually(lambda: m.manager.leading, timeout=30, what="manager leads")
        yield m
    finally:
        m.stop()
        kube.delete(f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}")
        kube.delete(f"{VWC_PATH}/{names.VALIDATING_WEBHOOK_CONFIG}")


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


@pytest.fixture
def rig(
    aloop: BackgroundLoop, control_plane: ControlPlane, kube: Kube, kube_client: kubeapi.KubeClient, crd: Any
) -> Iterator[Rig]:
    """Per-test names, extra managers and cleanup for the cert watcher tests."""
    with open_rig(aloop, control_plane, kube, kube_client) as r:
        yield r
