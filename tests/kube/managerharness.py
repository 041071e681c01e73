"""Run the real manager against the test control plane, in process or as a `sidecarctl run` child.

The webhook configurations and the CRD's conversion webhook are the ones an install would create,
except that `clientConfig` points at a loopback URL instead of a Service (there is no cluster network
here), and caBundle starts empty: the manager's own caBundle sync has to fill it before the API server
can call the webhooks, so every e2e test exercises that path too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from certwatcher.atomicdir import write_atomic
from kuberuntime import api
from selfsigned.issuing import Issued, generate_ca, issue_leaf
from sidecarctl.manager.inprocess import Manager
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.spec import names
from tests.kube.client import Kube
from tests.kube.controlplane import REPO, ControlPlane, free_port
from tests.kube.loop import BackgroundLoop

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VWC_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MANAGER_NS = names.DEFAULT_MANAGER_NAMESPACE


def write_cert_dir(path: Path, ca: Issued | None = None) -> Issued:
    """A CA and a serving cert for 127.0.0.1 in the cert-manager file layout."""
    now = dt.datetime.now(dt.UTC)
    ca = ca or generate_ca(now=now, lifetime=dt.timedelta(days=2))
    leaf = issue_leaf(ca, now=now, dns_names=["localhost"], ip_addresses=["127.0.0.1"], lifetime=dt.timedelta(days=1))
    write_atomic(path, {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, "ca.crt": ca.cert_pem})
    return ca


def webhook_configs(url: str, *, mutating: str, validating: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two shipped configurations of config/webhook, renamed, with every webhook's Service
    reference replaced by `url` + its path (there is no cluster network here to reach a Service)."""
    out: list[dict[str, Any]] = []
    for file, name in (
        ("mutatingwebhookconfiguration.yaml", mutating),
        ("validatingwebhookconfiguration.yaml", validating),
    ):
        obj: dict[str, Any] = yaml.safe_load((REPO / "config" / "webhook" / file).read_text())
        obj["metadata"]["name"] = name
        for hook in obj["webhooks"]:
            hook["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"]}
        out.append(obj)
    return out[0], out[1]


CRD_NAME = names.CRD_NAME


def namespaced_crd() -> dict[str, Any]:
    """The NamespacedSidecarSet CRD of config/crd (one version: nothing to convert)."""
    path = REPO / "config" / "crd" / f"{names.GROUP}_{names.NAMESPACED_PLURAL}.yaml"
    found: dict[str, Any] = yaml.safe_load(path.read_text())
    return found


def conversion_crd(url: str) -> dict[str, Any]:
    """The SidecarSet CRD of config/crd with its conversion webhook's Service replaced by `url` + its path.

    Until a manager serves that URL with the CA in caBundle, only reads and writes in v1alpha1 (the
    storage version) work; anything needing v1beta1 fails with the API server's conversion error.
    """
    docs = [d for p in sorted((REPO / "config" / "crd").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    (crd,) = [
        d for d in docs if d and d.get("kind") == "CustomResourceDefinition" and d["metadata"]["name"] == CRD_NAME
    ]
    webhook = crd["spec"]["conversion"]["webhook"]
    webhook["clientConfig"] = {"url": url + webhook["clientConfig"]["service"]["path"]}
    found: dict[str, Any] = crd
    return found


def conversion_bundle_synced(kube: Kube) -> bool:
    """Whether the CRD's conversion webhook has a caBundle (the manager writes it)."""
    crd = kube.get(f"{CRD_PATH}/{names.CRD_NAME}")
    client = crd["spec"]["conversion"]["webhook"]["clientConfig"]
    return b"BEGIN CERTIFICATE" in base64.b64decode(client.get("caBundle", ""))


def conversion_works(kube: Kube) -> bool:
    """Whether the API server converts SidecarSets now: a dry-run create in v1beta1 is converted to
    v1alpha1 and back (the API server takes a moment to use a caBundle just written), and stores nothing."""
    probe = {
        "apiVersion": names.API_VERSION_V1BETA1,
        "kind": names.KIND,
        "metadata": {"name": "conversion-probe"},
        "spec": {"selector": {"matchLabels": {"conversion": "probe"}}, "containers": [{"name": "p", "image": "p"}]},
    }
    try:
        kube.create(f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/{names.PLURAL}", probe, dryRun="All")
    except api.ApiError as e:
        if "conversion webhook" in e.message:
            return False
        raise
    return True


def ensure_namespace(kube: Kube, name: str) -> None:
    with contextlib.suppress(api.Conflict):
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@dataclass
class RunningManager:
    """A manager on the test loop; `stop()` is the SIGTERM path (graceful, releases the Lease)."""

    loop: BackgroundLoop
    manager: Manager
    opts: ManagerOptions
    probe_url: str
    webhook_url: str
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _future: Any = None

    def start(self) -> RunningManager:
        self._future = self.loop.spawn(self.manager.run(self._stop))
        return self

    def ready(self) -> bool:
        return probe(self.probe_url + "/readyz") == 200

    def stop(self) -> None:
        self.loop.loop.call_soon_threadsafe(self._stop.set)
        if self._future is not None:
            self._future.result(timeout=30)


def probe(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def start_in_process(
    loop: BackgroundLoop,
    cp: ControlPlane,
    cert_dir: Path,
    *,
    identity: str,
    lease_duration: int = 15,
    webhook_port: int | None = None,
    **overrides: Any,
) -> RunningManager:
    webhook_port, probe_port = webhook_port or free_port(), free_port()
    settings: dict[str, Any] = {
        "kubeconfig": str(cp.kubeconfig),
        "namespace": MANAGER_NS,
        "webhook_bind": f"127.0.0.1:{webhook_port}",
        "probe_bind": f"127.0.0.1:{probe_port}",
        "cert_dir": str(cert_dir),
        "identity": identity,
        "lease_duration": lease_duration,
        "renew_deadline": min(10.0, lease_duration * 2 / 3),
        "retry_period": min(2.0, lease_duration / 5),
        "ca_bundle_resync": 5.0,
        "cert_poll_interval": 2.0,
    }
    opts = ManagerOptions.build(**{**settings, **overrides})

    async def build() -> Manager:
        return Manager(opts)  # the aiohttp session must belong to the test loop

    manager = loop.run(build())
    return RunningManager(
        loop, manager, opts, f"http://127.0.0.1:{probe_port}", f"https://127.0.0.1:{webhook_port}"
    ).start()


@dataclass
class ManagerProcess:
    """`sidecarctl run` as a child process, for kill -9 and restart tests."""

    proc: subprocess.Popen[bytes]
    probe_url: str
    webhook_url: str
    log_path: Path

    def ready(self) -> bool:
        return probe(self.probe_url + "/readyz") == 200

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_digest(self, lines: int = 30) -> str:
        """The log's warnings and errors and the policy sync's lines, the last `lines` of them: printed
        first when a test fails, since a CI summary keeps the head of a long captured log."""
        wanted = (" WARNING ", " ERROR ", "injector.policysync")
        kept = [
            line for line in self.log_path.read_text(errors="replace").splitlines() if any(w in line for w in wanted)
        ]
        return "\n".join(kept[-lines:])


def start_process(
    cp: ControlPlane,
    cert_dir: Path,
    *,
    identity: str,
    webhook_port: int | None = None,
    lease_duration: int = 15,
    extra: tuple[str, ...] = (),
    kubeconfig: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ManagerProcess:
    """`sidecarctl run` as a child process against `cp` (or through `kubeconfig`, say one naming a
    load balancer); `env` is added to its environment (and its children's)."""
    webhook_port = webhook_port or free_port()
    probe_port = free_port()
    log = Path(tempfile.mkstemp(prefix=f"sidecarctl-{identity}-", suffix=".log")[1])
    args = [
        sys.executable,
        "-m",
        "sidecarctl.cli.main",
        "run",
        f"--kubeconfig={kubeconfig or cp.kubeconfig}",
        f"--namespace={MANAGER_NS}",
        f"--webhook-bind=127.0.0.1:{webhook_port}",
        f"--probe-bind=127.0.0.1:{probe_port}",
        f"--cert-dir={cert_dir}",
        f"--identity={identity}",
        f"--lease-duration={lease_duration}",
        "--ca-bundle-resync=5",
        "--cert-poll-interval=2",
        *extra,
    ]
    out = open(log, "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    )
    out.close()
    return ManagerProcess(proc, f"http://127.0.0.1:{probe_port}", f"https://127.0.0.1:{webhook_port}", log)


def wait_ready(target: RunningManager | ManagerProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if target.ready():
            return
        if isinstance(target, ManagerProcess) and target.proc.poll() is not None:
            raise AssertionError(f"manager exited with {target.proc.returncode}:\n{target.log_tail()}")
        time.sleep(0.1)
    raise AssertionError(f"manager not ready within {timeout}s")
