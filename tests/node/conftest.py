"""Session fixtures of the real-node tier: one control plane that pods can reach, one real node
(containerd + runc + kubelet + kube-scheduler) registered with it, and the manager's image.

The machine may lack what a node needs (root, Debian's containerd and runc, the kubelet build):
then every node test is skipped with the one line tests/kube/node.py gives, and under CI=true it
fails instead (tests/conftest.py turns any skip of a `node` test into a failure there too).

Tests that start a node of their own (the SIGKILL clean-up test) are marked `own_node` and run
before the others: one node per machine at a time, and the session node lives until the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.kube.adminrest import AdminRest, wait_for
from tests.kube.controlplane import ControlPlane, ControlPlaneError
from tests.kube.managerimage import Built, ImageBuildError, manager_archive
from tests.kube.node import NodeError, NodeUnavailable, RealNode, node_cluster, unavailable_reason

IN_CI = os.environ.get("CI", "").lower() == "true"
TIMINGS: dict[str, str] = {}


def not_here(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"the real-node tier cannot run under CI=true: {reason}", pytrace=False)
    pytest.skip(f"no real node: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    own = [i for i in items if i.get_closest_marker("own_node") is not None]
    if own:
        rest = [i for i in items if i.get_closest_marker("own_node") is None]
        first_node = next((n for n, i in enumerate(rest) if "/tests/node/" in str(i.path)), len(rest))
        items[:] = rest[:first_node] + own + rest[first_node:]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("real-node timings")
        for what, value in TIMINGS.items():
            terminalreporter.write_line(f"{what:<44} {value}")


def record(what: str, seconds: float) -> None:
    TIMINGS[what] = f"{seconds:.2f} s"


@dataclasses.dataclass
class Cluster:
    cp: ControlPlane
    node: RealNode
    api: AdminRest

    @property
    def kubectl(self) -> Path:
        assert self.node.bin_dir is not None
        return self.node.bin_dir / "kubectl"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
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
        yield Cluster(cp, node, AdminRest(cp))


@pytest.fixture(scope="session")
def manager_image(cluster: Cluster) -> Built:
    """The Dockerfile's image (built on the local Debian base, cached), imported into the node."""
    try:
        built = manager_archive()
    except ImageBuildError as e:
        pytest.fail(f"manager image build failed: {e}", pytrace=False)
    record("manager image build" + (" (cached)" if built.cached else ""), built.seconds)
    TIMINGS["manager image archive size"] = f"{built.size / 2**20:.0f} MiB"
    record("manager image import", cluster.node.import_image(built.archive))
    return built


def _ns_name(nodeid: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", nodeid.split("::")[-1].lower()).strip("-")[:40].strip("-")
    return f"{base or 't'}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount; deleted (with its pods) afterwards."""
    name = _ns_name(request.node.nodeid)
    cluster.api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(
        lambda: cluster.api.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=30,
        what=f"default ServiceAccount in {name}",
    )
    yield name
    cluster.api.delete(f"/api/v1/namespaces/{name}")
