"""Fixtures of the real-node tier: one control plane that pods can reach, one real node
(containerd + runc + kubelet + kube-scheduler) registered with it, and the manager's image.

The machine may lack what a node needs (root, Debian's containerd and runc, the kubelet build):
then every node test is skipped with the one line tests/kube/node.py gives, and under CI=true it
fails instead (tests/conftest.py turns any skip of a `node` test into a failure there too).

Tests that start a node of their own (the SIGKILL clean-up test) are marked `own_node` and run
before the others: one node per machine at a time. The tier's node lives until its last test
(package scope), and is removed before the tiers after it run.
Then come the modules in FIRST_MODULES (`helm install` and the README's quickstart, which need the
cluster without the kustomize install and remove what they installed), then the rest, which share
one install of the manager (`installed`: `kubectl
apply -k tests/node/install`, made once for the tier).
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.kube import builders
from tests.kube.adminrest import AdminRest, ApiError
from tests.kube.ci import IN_CI
from tests.kube.client import eventually
from tests.kube.controlplane import ControlPlane, ControlPlaneError
from tests.kube.managerimage import Built, ImageBuildError, manager_archive
from tests.kube.node import NodeError, NodeUnavailable, RealNode, node_cluster, unavailable_reason

TIMINGS: dict[str, str] = {}
INSTALL = Path(__file__).with_name("install")
MANAGER_NS = "sidecarctl-system"
MANAGER_DEPLOYMENT = f"/apis/apps/v1/namespaces/{MANAGER_NS}/deployments/sidecarctl"
MANAGER_SELECTOR = "app.kubernetes.io/name%3Dsidecarctl,app.kubernetes.io/component%3Dmanager"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/sidecarctl-controller"
# Modules run right after the own_node tests, before anything installs the manager with kustomize:
# they install it another way (the same cluster-scoped names) and remove it again.
FIRST_MODULES = ("test_helm_node.py", "test_quickstart_node.py")


def not_here(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"the real-node tier cannot run under CI=true: {reason}", pytrace=False)
    pytest.skip(f"no real node: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    own = [i for i in items if i.get_closest_marker("own_node") is not None]
    first = [i for i in items if i not in own and "/tests/node/" in str(i.path) and i.path.name in FIRST_MODULES]
    if own or first:
        rest = [i for i in items if i not in own and i not in first]
        first_node = next((n for n, i in enumerate(rest) if "/tests/node/" in str(i.path)), len(rest))
        items[:] = rest[:first_node] + own + first + rest[first_node:]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("real-node timings")
        for what, value in TIMINGS.items():
            terminalreporter.write_line(f"{what:<44} {value}")


def record(what: str, seconds: float) -> None:
    TIMINGS[what] = f"{seconds:.2f} s"


def record_value(what: str, value: str) -> None:
    TIMINGS[what] = value


@dataclasses.dataclass
class NodeCluster:
    """The control plane with a real node (kubelet, containerd, runc) on this machine, and a REST
    client for it: what the real-node tier runs the manager's image on."""

    cp: ControlPlane
    node: RealNode
    api: AdminRest

    @property
    def kubectl(self) -> Path:
        assert self.node.bin_dir is not None
        return self.node.bin_dir / "kubectl"


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    if reason := unavailable_reason():
        not_here(reason)
    stack = contextlib.ExitStack()
    try:
        cp, node = stack.enter_context(node_cluster(log_dir=tmp_path_factory.mktemp("node-logs")))
    except (NodeUnavailable, ControlPlaneError) as e:  # missing binaries, as the e2e tier treats them
        not_here(" ".join(str(e).split())[:300])
    except NodeError as e:
        pytest.fail(f"real node did not start: {e}", pytrace=False)
    for what, seconds in node.timings.items():
        record(f"node: {what}", seconds)
    with stack:
        yield NodeCluster(cp, node, AdminRest(cp))


@pytest.fixture(scope="package")
def manager_image(cluster: NodeCluster) -> Built:
    """The Dockerfile's image (built on the local Debian base, cached), imported into the node."""
    try:
        built = manager_archive()
    except ImageBuildError as e:
        pytest.fail(f"manager image build failed: {e}", pytrace=False)
    record("manager image build" + (" (cached)" if built.cached else ""), built.seconds)
    TIMINGS["manager image archive size"] = f"{built.size / 2**20:.0f} MiB"
    record("manager image import", cluster.node.import_image(built.archive))
    row = cluster.node.images().get(built.ref)
    size = " ".join(row[3:5]) if row else "?"
    TIMINGS["manager image size in containerd"] = size
    return built


@pytest.fixture
def namespace(request: pytest.FixtureRequest, cluster: NodeCluster) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount; deleted (with its pods) afterwards."""
    name = builders.namespace_name(request.node.nodeid)
    cluster.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    eventually(
        lambda: cluster.api.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=30,
        what=f"default ServiceAccount in {name}",
        retrying=(ApiError,),
    )
    yield name
    cluster.api.delete(f"/api/v1/namespaces/{name}")


def kubectl(cluster: NodeCluster, *args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        [str(cluster.kubectl), f"--kubeconfig={cluster.cp.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def manager_pods(cluster: NodeCluster) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{MANAGER_NS}/pods?labelSelector={MANAGER_SELECTOR}"
    pods: list[dict[str, Any]] = cluster.api.get(path)["items"]
    return pods


def wait_manager_ready(cluster: NodeCluster, *, timeout: float = 180, what: str = "2 manager replicas Ready") -> float:
    """Until the Deployment has 2 updated, ready replicas and no other pod; the seconds it took."""
    started = time.monotonic()

    def settled() -> bool:
        dep = cluster.api.get(MANAGER_DEPLOYMENT)
        status = dep.get("status") or {}
        return bool(
            status.get("observedGeneration") == dep["metadata"]["generation"]
            and status.get("readyReplicas") == 2
            and status.get("updatedReplicas") == 2
            and status.get("replicas") == 2
            and len(manager_pods(cluster)) == 2  # the old ones of a roll are gone, not just terminating
        )

    try:
        eventually(settled, timeout=timeout, interval=0.2, what=what, retrying=(ApiError,))
    except AssertionError:
        pods = kubectl(cluster, "-n", MANAGER_NS, "get", "pods,events", "-o", "wide")
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted((cluster.node.workdir / "kubelet" / "pod-logs").rglob("*.log"))
            if MANAGER_NS in str(p)
        )
        raise AssertionError(f"manager Deployment not ready ({what}):\n{pods}\n{logs}") from None
    return time.monotonic() - started


def ensure_namespace(cluster: NodeCluster, name: str) -> None:
    """Create `name` if absent, waiting out an earlier deletion of it."""

    def usable() -> bool:
        got = cluster.api.get_or_none(f"/api/v1/namespaces/{name}")
        if got is None:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            cluster.api.create("/api/v1/namespaces", body)
            return True
        return (got.get("status") or {}).get("phase") != "Terminating"

    eventually(usable, timeout=120, interval=0.2, what=f"namespace {name} usable", retrying=(ApiError,))


@dataclasses.dataclass
class Installed:
    """The manager installed by `kubectl apply -k tests/node/install` from the Dockerfile's image."""

    seconds: float


@pytest.fixture(scope="package")
def installed(cluster: NodeCluster, manager_image: Built) -> Iterator[Installed]:
    """One install for every node test that needs the manager (tests that disturb it wait until it
    has settled again: 2 ready replicas of the current revision)."""
    api = cluster.api
    ensure_namespace(cluster, MANAGER_NS)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "node-apiserver"},
        "data": {"host": cluster.node.gateway, "port": str(cluster.cp.port)},
    }
    api.create(f"/api/v1/namespaces/{MANAGER_NS}/configmaps", config_map)
    started = time.monotonic()
    kubectl(cluster, "apply", "-k", str(INSTALL))
    wait_manager_ready(cluster)
    took = time.monotonic() - started
    record("install: apply -k to 2 manager replicas Ready", took)
    yield Installed(took)
    kubectl(cluster, "delete", "-k", str(INSTALL), "--ignore-not-found", "--wait=false")
