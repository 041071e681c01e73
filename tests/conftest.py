"""Session fixtures: the background loop, the real control plane, API clients, the fake kubelet.

Everything under tests/e2e/ is marked `e2e`, everything under tests/node/ `node`, everything under
tests/reliability/ `reliability`. Under CI=true a test of any of these tiers that skips is reported
as a failure: those tiers must really run there.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from kuberuntime import kubeapi, kubeconfig
from tests.kube import node
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane, ControlPlaneError, free_port
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import conversion_crd

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
        if "/tests/node/" in str(item.path):
            item.add_marker(pytest.mark.node)
        if "/tests/reliability/" in str(item.path):
            item.add_marker(pytest.mark.reliability)


def pytest_report_header(config: pytest.Config) -> str:
    """The one line saying whether the real-node tier (tests/node) can run on this machine."""
    reason = node.unavailable_reason()
    if reason is None:
        return "real-node tier: this machine can run a node"
    return f"real-node tier: {'fails under CI=true' if IN_CI else 'skipped'}: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    tier = next((m for m in ("e2e", "node", "reliability") if item.get_closest_marker(m) is not None), None)
    # An expected failure (xfail) is reported as skipped too; it ran, so it stands.
    if IN_CI and report.skipped and tier is not None and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"{tier} test skipped under CI=true (not allowed): {report.longrepr}"
    return report


@pytest.fixture(scope="session")
def aloop() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def kube_client(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[kubeapi.KubeClient]:
    client = kubeapi.KubeClient(kubeconfig.load_config(str(control_plane.kubeconfig)))
    yield client
    aloop.run(client.close())


@pytest.fixture(scope="session")
def kube(aloop: BackgroundLoop, kube_client: kubeapi.KubeClient) -> Kube:
    return Kube(aloop, kube_client)


@pytest.fixture(scope="session")
def kubelet(aloop: BackgroundLoop, kube_client: kubeapi.KubeClient) -> Iterator[FakeKubelet]:
    k = FakeKubelet(kube_client)
    aloop.run(k.start())
    yield k
    aloop.run(k.stop())


@pytest.fixture(scope="session")
def manager_port() -> int:
    """The port the session's manager serves its webhooks on, known before it starts: the CRD's
    conversion webhook points there from the moment the CRD is installed."""
    return free_port()


@pytest.fixture(scope="session")
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
    return obj


def _ns_name(nodeid: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", nodeid.split("::")[-1].lower()).strip("-")[:40].strip("-")
    return f"{base or 't'}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube: Kube, kubelet: FakeKubelet) -> Iterator[str]:
    """A fresh namespace per test, managed by the fake kubelet, deleted afterwards."""
    name = _ns_name(request.node.nodeid)
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kubelet.namespaces.add(name)
    eventually(
        lambda: kube.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default") is not None,
        timeout=30,
        what=f"default ServiceAccount in {name}",
    )
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")
