"""Fixtures of the reliability tier: the control plane binaries, and one cluster per test module.

Every test here runs the real manager (`sidecarctl run`: supervisor, control process, two
admission workers) against a real kube-apiserver and asserts measured numbers. Each module gets a
control plane of its own, so the attacks, proxies and restarts of one module never touch another.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kube.controlplane import ControlPlaneError, binaries_dir

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """Where etcd, kube-apiserver and kube-controller-manager are (built once per machine)."""
    try:
        return binaries_dir()
    except ControlPlaneError as e:
        if IN_CI:
            pytest.fail(f"cannot provide the control plane binaries: {e}")
        pytest.skip(f"no control plane binaries: {e}")
