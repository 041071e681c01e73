"""A control plane of a test's (or a test module's) own, and the CRD checks every tier repeats.

The e2e tier shares one session control plane; a test that restarts the API server, kills the
manager, audits its requests or needs a kube-controller-manager takes a `PrivateCluster` instead:
the control plane, an API client on the session loop (`kube`), optionally the fake kubelet running
one node's pods, and a scratch directory with a serving certificate for 127.0.0.1 (`cert_dir`)
that a manager started against it can serve. `close()` undoes it all. The reliability and policy
harnesses build theirs on it.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

from kuberuntime import kubeapi, kubeconfig
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import write_cert_dir

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd_established(kube: Kube, name: str) -> bool:
    """Whether the CustomResourceDefinition `name` has the condition Established=True."""
    conditions = (kube.get(f"{CRD_PATH}/{name}").get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def install_crd(kube: Kube, crd: dict[str, Any], *, timeout: float = 30.0) -> None:
    """Apply `crd` and return once it is Established (a list of its kind is served)."""
    kube.apply(CRD_PATH, crd)
    name = crd["metadata"]["name"]
    eventually(lambda: crd_established(kube, name), timeout=timeout, what=f"CRD {name} Established")


class PrivateCluster:
    """A control plane of the caller's own, with a client and, when `kubelet_node` is named, a fake
    kubelet running that node's pods (in the namespaces added to `kubelet.namespaces`)."""

    def __init__(
        self,
        aloop: BackgroundLoop,
        *,
        bin_dir: Path | None = None,
        controller_manager: bool = True,
        kubelet_node: str | None = None,
        kubelet_restart_delay: float = 0.3,
        prefix: str = "sidecarctl-cluster-",
        apiserver_flags: tuple[str, ...] = (),
    ) -> None:
        self.aloop = aloop
        self.cp = ControlPlane(
            bin_dir=bin_dir, controller_manager=controller_manager, apiserver_flags=apiserver_flags
        ).start()
        try:
            self.client = aloop.run(self._new_client())
        except BaseException:
            self.cp.stop()
            raise
        self.kube = Kube(aloop, self.client)
        self.kubelet: FakeKubelet | None = None
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
            self.cert_dir = self.workdir / "certs"
            write_cert_dir(self.cert_dir)
            if kubelet_node is not None:
                self.kubelet = FakeKubelet(self.client, node=kubelet_node, restart_delay=kubelet_restart_delay)
                aloop.run(self.kubelet.start())
        except BaseException:
            self.close()
            raise

    async def _new_client(self) -> kubeapi.KubeClient:
        return kubeapi.KubeClient(kubeconfig.load_config(str(self.cp.kubeconfig)))

    def close(self) -> None:
        if self.kubelet is not None:
            with contextlib.suppress(Exception):
                self.aloop.run(self.kubelet.stop())
        with contextlib.suppress(Exception):
            self.aloop.run(self.client.close())
        self.cp.stop()
