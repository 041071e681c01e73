"""A real etcd + kube-apiserver (+ kube-controller-manager) on 127.0.0.1, for end-to-end tests.

The envtest pattern, in Python: binaries built once per machine from Go modules
(tools/build-control-plane.sh) or taken from $KUBEBUILDER_ASSETS; random loopback ports;
throwaway certificates; an admin kubeconfig. Every child gets PR_SET_PDEATHSIG so that a test
run that is killed (even with SIGKILL) takes its control plane with it, and each run works in
its own temp dir with its own ports, so two runs on one machine do not collide.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.certutil import make_ca, make_leaf

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "build-control-plane.sh"
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The control plane could not be provisioned or started; the message says why and what to do."""


def binaries_dir(version: str | None = None) -> Path:
    """Directory with etcd and kube-apiserver of `version` (a supported minor such as "1.34", or its
    exact version): by default the one SIDECARCTL_K8S_VERSION names, else $KUBEBUILDER_ASSETS, else the
    newest supported version; built into the per-machine cache the first time."""
    args = ["bash", str(BUILD_SCRIPT), *(["--version", version] if version else [])]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(proc.stderr.strip() or f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    return Path(proc.stdout.strip().splitlines()[-1])


def supported_versions() -> list[str]:
    """The Kubernetes versions the project supports and tests, oldest first (`build-control-plane.sh --list`)."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--list"], capture_output=True, text=True, check=True)
    return proc.stdout.split()


def binary_version(bin_dir: Path) -> str:
    """The gitVersion kube-apiserver in `bin_dir` was built as ("v1.34.4")."""
    out = subprocess.run([str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def minor_of(version: str) -> tuple[int, int]:
    """(1, 34) of "v1.34.4" or "1.34"."""
    major, minor = version.lstrip("v").split(".")[:2]
    return int(major), int(minor)


_HANDED_OUT: set[int] = set()
_HANDING_OUT = threading.Lock()


def free_port() -> int:
    """A port free now and never handed out before in this process.

    The kernel gives a port just released to the next bind: a port reserved by number for later (the
    session manager's, which the CRD's conversion webhook names before the manager starts) could go
    to a private control plane started meanwhile, and the API server's kept-alive connections to that
    port then reach the wrong server (seen: "apiserver is shutting down" from a stopped one).
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        with _HANDING_OUT:  # control planes may be started side by side, from threads
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGKILL it when the test process dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgrp()


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  userGroups: ["system:nodes"]
- level: Metadata
"""


class ControlPlane:
    """etcd, kube-apiserver and (when built) kube-controller-manager, started and stopped together."""

    def __init__(
        self,
        *,
        bin_dir: Path | None = None,
        workdir: Path | None = None,
        controller_manager: bool = True,
        bind_address: str = "127.0.0.1",
        aggregator_routing: bool = False,
        node_lifecycle: bool = False,
        term_timeout: float = 10.0,
        apiserver_flags: tuple[str, ...] = (),
    ):
        """The defaults serve the tiers without nodes. A real node (tests/kube/node.py) needs more:

        - `bind_address`: the address kube-apiserver serves on, advertises and names in its serving
          certificate; pods reach a node's bridge IP, never the host's loopback.
        - `aggregator_routing`: the API server dials a Service-backed webhook at the endpoint
          (pod) IPs of the Service, so webhooks work without kube-proxy.
        - `node_lifecycle`: the controller-manager runs the node lifecycle controllers, which a
          real kubelet's heartbeats keep happy; without them a new node keeps its `not-ready`
          taint and the scheduler never places a pod on it.
        - `term_timeout`: how long each process may take after SIGTERM before SIGKILL. After serving a
          real kubelet, kube-apiserver 1.37 takes the whole 10 s to exit; nothing of it is kept.
        - `apiserver_flags`: more kube-apiserver flags (a feature gate, a runtime-config), after ours.
        """
        self.bin_dir = bin_dir or binaries_dir()
        self.version = binary_version(self.bin_dir)  # "v1.34.4"
        self.apiserver_flags = apiserver_flags
        self.etcd_url = ""
        self.peers: dict[int, str] = {}  # more kube-apiservers on the same etcd (`add_apiserver`): port -> version
        self.bind_address = bind_address
        self.aggregator_routing = aggregator_routing
        self.node_lifecycle = node_lifecycle
        self.term_timeout = term_timeout
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="sidecarctl-cp-"))
        self.want_kcm = controller_manager and (self.bin_dir / "kube-controller-manager").exists()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = 0
        self.url = ""
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit_log = self.workdir / "audit.log"
        self._apiserver_args: list[str] = []

    # -- certificates -------------------------------------------------------------------------
    def _pki(self) -> None:
        d = self.workdir / "pki"
        d.mkdir(exist_ok=True)
        week = dt.timedelta(days=7)
        serving_ca = make_ca("sidecarctl-test-serving-ca", lifetime=week)
        client_ca = make_ca("sidecarctl-test-client-ca", lifetime=week)
        serving = make_leaf(
            serving_ca,
            dns=("localhost", "kubernetes"),
            ips=tuple(dict.fromkeys(("127.0.0.1", self.bind_address))),
            lifetime=week,
            cn="kube-apiserver",
        )
        admin = make_leaf(
            client_ca, dns=(), ips=(), lifetime=week, cn="admin", client=True, organizations=("system:masters",)
        )
        signer = make_ca("service-account-signer", lifetime=week)
        for name, data in {
            "apiserver.crt": serving.cert_pem,
            "apiserver.key": serving.key_pem,
            "serving-ca.crt": serving_ca.cert_pem,
            "client-ca.crt": client_ca.cert_pem,
            "admin.crt": admin.cert_pem,
            "admin.key": admin.key_pem,
            "sa.key": signer.key_pem,
            "sa.crt": signer.cert_pem,
        }.items():
            (d / name).write_bytes(data)
            (d / name).chmod(0o600)
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)

    def _write_kubeconfig(self) -> None:
        pki = self.workdir / "pki"
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "test", "cluster": {"server": self.url, "certificate-authority": str(pki / "serving-ca.crt")}}
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")},
                }
            ],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))

    def token_kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        cfg["users"] = [{"name": "admin", "user": {"token": token}}]
        path.write_text(yaml.safe_dump(cfg))
        return path

    # -- processes ----------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], *, append: bool = False) -> None:
        log = open(self.workdir / f"{name}.log", "ab" if append else "wb")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        log.close()

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _wait(self, name: str, probe: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                if probe():
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise ControlPlaneError(f"{name} not ready after {timeout}s:\n{self.log_tail(name)}")

    def _admin_ssl(self) -> ssl.SSLContext:
        pki = self.workdir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "serving-ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def get(self, path: str) -> tuple[int, bytes]:
        """GET `path` as the admin user: (status, body), also for 4xx/5xx answers."""
        return self._get(path)

    def _get(self, path: str, *, base: str = "") -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen((base or self.url) + path, context=self._admin_ssl(), timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def start(self, *, attempts: int = 3) -> ControlPlane:
        self._pki()
        last: Exception | None = None
        for _ in range(attempts):
            try:
                self._start_once()
                return self
            except ControlPlaneError as e:  # most often a port taken between probe and bind
                last = e
                self._kill_all()
        raise ControlPlaneError(f"control plane failed to start {attempts} times; last error: {last}")

    def _start_once(self) -> None:
        pki = self.workdir / "pki"
        etcd_port, peer_port = free_port(), free_port()
        etcd_url = self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        data = self.workdir / f"etcd-{etcd_port}"
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                f"--data-dir={data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

        def etcd_ok() -> bool:
            with urllib.request.urlopen(etcd_url + "/health", timeout=2) as r:
                return bool(r.status == 200)

        self._wait("etcd", etcd_ok, 30)

        self.port = free_port()
        self.url = f"https://{self.bind_address}:{self.port}"
        self._apiserver_args = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--etcd-prefix=/registry-{etcd_port}",
            f"--secure-port={self.port}",
            f"--bind-address={self.bind_address}",
            f"--advertise-address={self.bind_address}",
            *(["--enable-aggregator-routing=true"] if self.aggregator_routing else []),
            # The default endpoint reconciler refuses loopback addresses.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'client-ca.crt'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--authorization-mode=RBAC",
            f"--service-account-issuer=https://127.0.0.1:{self.port}/",
            f"--service-account-key-file={pki / 'sa.crt'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
            "--max-requests-inflight=2000",
            "--max-mutating-requests-inflight=1000",
            # A node's name resolves nowhere here: logs, exec and port-forward go to its InternalIP.
            "--kubelet-preferred-address-types=InternalIP",
            "--v=0",
            *self.apiserver_flags,
        ]
        self._spawn("kube-apiserver", self._apiserver_args)
        self._wait("kube-apiserver", lambda: self._get("/readyz")[0] == 200, 60)
        self._write_kubeconfig()
        if self.want_kcm:
            self._spawn(
                "kube-controller-manager",
                [
                    str(self.bin_dir / "kube-controller-manager"),
                    f"--kubeconfig={self.kubeconfig}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    "--secure-port=0",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'serving-ca.crt'}",
                    "--use-service-account-credentials=false",
                    *self._kcm_controllers(),
                    "--concurrent-gc-syncs=5",
                    "--v=0",
                ],
            )

            def sa_ready() -> bool:
                return self._get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200

            self._wait("kube-controller-manager", sa_ready, 60)

    def add_apiserver(self, bin_dir: Path, *, timeout: float = 60.0) -> str:
        """Start one more kube-apiserver (of the version in `bin_dir`) on the same etcd, certificates,
        service-account keys and flags, on a port of its own, as an HA control plane has; returns its URL.

        It is stopped with the rest. `kubeconfig_for(url)` gives a kubeconfig that talks to it."""
        port = free_port()
        args = [str(bin_dir / "kube-apiserver"), *self._apiserver_args[1:]]
        args = [f"--secure-port={port}" if a.startswith("--secure-port=") else a for a in args]
        args = [a for a in args if not a.startswith("--audit-log-path=")] + [
            f"--audit-log-path={self.workdir / f'audit-{port}.log'}"
        ]
        name = f"kube-apiserver-{port}"
        self._spawn(name, args)
        url = f"https://{self.bind_address}:{port}"
        self._wait(name, lambda: self._get("/readyz", base=url)[0] == 200, timeout)
        self.peers[port] = binary_version(bin_dir)
        return url

    def remove_apiserver(self, port: int, *, graceful: bool = True) -> None:
        """Stop the kube-apiserver `add_apiserver` started on `port`: SIGTERM, as a rolling upgrade does,
        or SIGKILL (`graceful=False`: a server with watches open takes the whole `term_timeout` to
        exit, and a test about what comes after need not wait for it)."""
        self._stop_one(self.procs.pop(f"kube-apiserver-{port}"), graceful=graceful)
        self.peers.pop(port)

    def kubeconfig_for(self, url: str) -> Path:
        """A copy of the admin kubeconfig that talks to the kube-apiserver at `url`."""
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        cfg["clusters"][0]["cluster"]["server"] = url
        path = self.workdir / f"admin-{url.rsplit(':', 1)[-1]}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def restart_apiserver(
        self, *, down: float = 0.0, timeout: float = 60.0, bin_dir: Path | None = None, graceful: bool = True
    ) -> tuple[float, float]:
        """Stop kube-apiserver (SIGTERM, as a rolling update does), wait `down` seconds, start it again
        with the same flags, port, certificates and etcd, and wait until it is ready. With `bin_dir`,
        the one started is that version's: the control plane upgraded (or rolled back) in place.
        `graceful=False` stops it with SIGKILL (see `remove_apiserver`).

        Returns the monotonic times at which it had stopped and was ready again. Its log and the audit
        log are appended to, so a test reads both lives of the API server in one file each.
        """
        if bin_dir is not None:
            self._apiserver_args[0] = str(bin_dir / "kube-apiserver")
            self.version = binary_version(bin_dir)
        self._stop_one(self.procs.pop("kube-apiserver"), graceful=graceful)
        stopped = time.monotonic()
        if down > 0:
            time.sleep(down)
        deadline = time.monotonic() + timeout
        while True:  # the port may still be held for a moment by the old process's sockets
            self._spawn("kube-apiserver", self._apiserver_args, append=True)
            try:
                self._wait(
                    "kube-apiserver", lambda: self._get("/readyz")[0] == 200, max(1.0, deadline - time.monotonic())
                )
                return stopped, time.monotonic()
            except ControlPlaneError:
                proc = self.procs.pop("kube-apiserver")
                self._stop_one(proc)
                if time.monotonic() >= deadline:
                    raise

    def _kcm_controllers(self) -> list[str]:
        if self.node_lifecycle:
            # Real kubelets post heartbeats; a short monitor period lifts a new node's taint quickly.
            return ["--controllers=*,-node-ipam-controller", "--node-monitor-period=1s"]
        # No kubelet heartbeats here: node lifecycle would taint fake nodes and evict pods.
        return ["--controllers=*,-node-lifecycle-controller,-node-ipam-controller,-taint-eviction-controller"]

    def _stop_one(self, proc: subprocess.Popen[bytes], *, graceful: bool = True) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
                proc.wait(timeout=self.term_timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _kill_all(self) -> None:
        # Reverse start order: controller-manager and apiserver first, so nothing writes to a dying etcd.
        for name in reversed(list(self.procs)):
            self._stop_one(self.procs.pop(name))

    def stop(self) -> None:
        self._kill_all()
        if self._own_workdir and not os.environ.get("SIDECARCTL_KEEP_CP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # manual use: python -m tests.kube.controlplane
    cp = ControlPlane().start()
    print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cp.stop()
        sys.exit(0)
