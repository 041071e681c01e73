"""E2e fixtures: the real control plane, API clients, the fake kubelet and one in-process manager,
with webhooks registered by URL, and helpers to make namespaces that are labelled for injection.

They are package-scoped: everything they start stops when the last e2e test has run, so the tiers
after this one (HTTP, node, reliability, unit) do not share the machine, nor the test process's
loop, with an idle control plane and manager."""

from __future__ import annotations

import base64
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kuberuntime import api, kubeapi, kubeconfig
from sidecarsets.spec import names
from tests.e2e.certsupport import Rig, open_rig
from tests.e2e.helpers import SS_PATH, make_sidecarset
from tests.kube import builders
from tests.kube.ci import IN_CI
from tests.kube.client import Kube, eventually
from tests.kube.cluster import install_crd
from tests.kube.controlplane import ControlPlane, ControlPlaneError, free_port
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    RunningManager,
    conversion_bundle_synced,
    conversion_crd,
    conversion_works,
    ensure_namespace,
    namespaced_crd,
    start_in_process,
    wait_ready,
    webhook_configs,
    write_cert_dir,
)


@pytest.fixture(scope="package")
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
        try:
            eventually(lambda: conversion_works(kube), timeout=20, what="v1beta1 converted through the manager")
        except api.ApiError as e:
            # 503 "apiserver is shutting down" came here while the manager's caBundle write replaced the
            # CRD's storage (apiextensions drains the old one); the client now sends such answers again as
            # their Retry-After asks. Anything else that ends here comes with the API server's own log.
            tail = control_plane.log_tail("kube-apiserver", 40)
            raise AssertionError(f"{e}\nkube-apiserver log:\n{tail}") from e
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


@pytest.fixture(scope="package")
def control_plane() -> Iterator[ControlPlane]:
    try:
        cp = ControlPlane().start()
    except ControlPlaneError as e:
        if IN_CI:
            pytest.fail(f"cannot start the test control plane: {e}")
        pytest.skip(f"no test control plane: {e}")
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="package")
def kube_client(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[kubeapi.KubeClient]:
    client = kubeapi.KubeClient(kubeconfig.load_config(str(control_plane.kubeconfig)))
    yield client
    aloop.run(client.close())


@pytest.fixture(scope="package")
def kube(aloop: BackgroundLoop, kube_client: kubeapi.KubeClient) -> Kube:
    return Kube(aloop, kube_client)


@pytest.fixture(scope="package")
def kubelet(aloop: BackgroundLoop, kube_client: kubeapi.KubeClient) -> Iterator[FakeKubelet]:
    k = FakeKubelet(kube_client)
    aloop.run(k.start())
    yield k
    aloop.run(k.stop())


@pytest.fixture(scope="package")
def manager_port() -> int:
    """The port the session's manager serves its webhooks on, known before it starts: the CRD's
    conversion webhook points there from the moment the CRD is installed."""
    return free_port()


@pytest.fixture(scope="package")
def crd(kube: Kube, manager_port: int) -> dict[str, object]:
    """The SidecarSet CRD from config/crd, installed and Established, converting through the session's
    manager (by URL). Until that manager runs, v1alpha1 (stored) works and v1beta1 fails to convert."""
    obj = conversion_crd(f"https://127.0.0.1:{manager_port}")
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    kube.apply(path, obj)

    def established() -> bool:
        got = kube.get(f"{path}/{obj['metadata']['name']}")
        conds = {c["type"]: c["status"] for c in (got.get("status") or {}).get("conditions") or []}
        return conds.get("Established") == "True"

    eventually(established, timeout=30, what="CRD Established")
    # The NamespacedSidecarSet CRD too, so the session's manager serves the kind as an install does.
    install_crd(kube, namespaced_crd())
    return obj


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: Kube, kubelet: FakeKubelet) -> Iterator[str]:
    """A fresh namespace per test, managed by the fake kubelet, deleted afterwards."""
    name = builders.namespace_name(request.node.nodeid)
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kubelet.namespaces.add(name)
    eventually(
        lambda: kube.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None,
        timeout=30,
        what=f"default ServiceAccount in {name}",
    )
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")
