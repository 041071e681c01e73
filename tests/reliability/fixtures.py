"""The reliability tier's fixtures, in a module of their own so that another tier's module can use
them too (tests/e2e/test_standby_e2e.py imports them): the control plane binaries, one cluster per
test module, and a proxy in front of it.

A module shapes its cluster with two module-level names: `KUBELET_RESTART_DELAY` (seconds the fake
kubelet takes to restart a container; no fake kubelet without it) and `SIDECARSETS` (name -> the
`app` label it selects, created before the first test).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.apiproxy import ApiProxy
from tests.kube.ci import IN_CI
from tests.kube.controlplane import ControlPlaneError, binaries_dir
from tests.kube.loop import BackgroundLoop
from tests.reliability.harness import ReliabilityCluster


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """Where etcd, kube-apiserver and kube-controller-manager are (built once per machine)."""
    try:
        return binaries_dir()
    except ControlPlaneError as e:
        if IN_CI:
            pytest.fail(f"cannot provide the control plane binaries: {e}")
        pytest.skip(f"no control plane binaries: {e}")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, aloop: BackgroundLoop, k8s_bin_dir: Path) -> Iterator[ReliabilityCluster]:
    """The module's own control plane, as its `KUBELET_RESTART_DELAY` and `SIDECARSETS` ask."""
    delay: float | None = getattr(request.module, "KUBELET_RESTART_DELAY", None)
    sidecarsets: dict[str, str] = getattr(request.module, "SIDECARSETS", {})
    c = ReliabilityCluster(aloop, k8s_bin_dir, kubelet_restart_delay=delay)
    try:
        for name, app in sidecarsets.items():
            c.sidecarset(name, app)
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def proxy(aloop: BackgroundLoop, cluster: ReliabilityCluster) -> Iterator[ApiProxy]:
    """A proxy (tests.kube.apiproxy) in front of the module's own control plane (its `cluster`)."""
    p = aloop.run(ApiProxy(cluster.cp).start())
    try:
        yield p
    finally:
        aloop.run(p.stop())
