"""Fixtures of the reliability tier (tests.reliability.fixtures): the control plane binaries, and
one cluster per test module.

Every test here runs the real manager (`sidecarctl run`: supervisor, control process, two
admission workers) against a real kube-apiserver and asserts measured numbers. Each module gets a
control plane of its own, so the attacks, proxies and restarts of one module never touch another.
"""

from tests.reliability.fixtures import cluster, k8s_bin_dir, proxy

__all__ = ["cluster", "k8s_bin_dir", "proxy"]
