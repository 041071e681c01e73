"""A real Kubernetes node on this machine: containerd + runc + a kubelet, and kube-scheduler.

Where a fake kubelet proves too little (container restarts, image IDs, probes, the image and
install path) the node tier runs pods for real. Everything is private to one node: containerd's
root, state, socket and config; a Linux bridge with its own /24 and CNI config (bridge plugin
without gateway or masquerading, so no iptables rule and no sysctl is touched); a cgroup subtree
in every hierarchy, which the kubelet uses as its cgroupRoot and which also holds containerd and
so every shim; the kubelet's root, logs and certificates.

Leaving nothing behind is the job of tests/kube/nodereaper.py, started first in a session of its
own: this process tells it, before doing each thing, what it is about to create or change, and
the reaper undoes all of it when its input closes, that is when this process stops the node or
dies (even by SIGKILL). The node's own processes also get PR_SET_PDEATHSIG, like the control
plane's. A stop therefore always runs the same clean-up as a crash, so every run exercises it.

One node per machine at a time (a lock in the cache dir): the kubelet insists on a few fixed host
paths (/var/lib/kubelet/device-plugins, /var/log/containers, containerd's /run/containerd/s).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.kube import images
from tests.kube.controlplane import BUILD_SCRIPT, ControlPlane, free_port

REAPER = Path(__file__).with_name("nodereaper.py")
_PR_SET_PDEATHSIG = 1

# What the kubelet sets at start-up (setupKernelTunables) unless protectKernelDefaults makes it refuse
# to start: read before, restored after.
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
# Fixed host paths the kubelet, containerd and libcni use whatever they are configured with.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/opt/containerd",
    "/etc/cni",
)
# The kubelet finds no iptables here, so it installs no firewall chains; mount and nsenter it needs.
KUBELET_PATH = "/usr/bin:/bin"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NEEDED = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "ip": "iproute2",
}


class NodeUnavailable(RuntimeError):
    """This machine cannot run a real node; the message is one line saying why and what to do."""


class NodeError(RuntimeError):
    """The node was set up but did not become ready; the message carries the relevant log tail."""


def unavailable_reason() -> str | None:
    """One line naming what is missing for a real node, or None when everything is there."""
    if os.geteuid() != 0:
        return "real node needs root (containerd, the kubelet, cgroups, a bridge); not running as root"
    missing = sorted({pkg for exe, pkg in NEEDED.items() if shutil.which(exe, path=SYSTEM_PATH) is None})
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("containernetworking-plugins")
    if not images.BUSYBOX.exists():
        missing.append("busybox-static")
    if missing:
        return f"real node needs Debian packages {' '.join(missing)}: run `bash tools/setup.sh` as root"
    if not any(m.name in ("memory", "unified") for m in cgroup_mounts()):
        return "real node needs cgroups mounted under /sys/fs/cgroup"
    return None


def lock_path() -> Path:
    """Held by a node's process and its reaper until the node is gone: one node per machine."""
    return images.cache_root() / "node.lock"


def node_binaries() -> Path:
    """kubelet, kube-scheduler and helm (built beside the control plane by build-control-plane.sh --node)."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), "--node"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NodeUnavailable(" ".join((proc.stderr.strip() or f"{BUILD_SCRIPT} --node failed").split())[:300])
    return Path(proc.stdout.strip().splitlines()[-1])


def cgroup_mounts() -> list[Path]:
    found: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def _proc_start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _sysctl(name: str) -> str:
    return (Path("/proc/sys") / name.replace(".", "/")).read_text().strip()


def listing(path: str) -> list[str] | None:
    """Every entry under `path`, relative (None when it does not exist): what the reaper keeps."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return None
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(p):
        for name in [*dirnames, *filenames]:
            out.append(str((Path(dirpath) / name).relative_to(p)))
    return out


def _pick_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.244.0.0/16 that no route on this machine overlaps."""
    routes = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    used = []
    for line in routes.splitlines():
        dest = line.split()[0] if not line.startswith(("local", "broadcast")) else line.split()[1]
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(dest if dest != "default" else "0.0.0.0/32", strict=False))
    for _ in range(100):
        net = ipaddress.IPv4Network(f"10.244.{secrets.randbelow(254) + 1}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NodeError("no free /24 in 10.244.0.0/16 for the node bridge")


class RealNode:
    """One node. `prepare()` (lock, reaper, bridge) must come before the control plane is started,
    because kube-apiserver has to serve on the bridge address; then `start(control_plane)`."""

    def __init__(self, *, log_dir: Path | None = None, bin_dir: Path | None = None, name: str | None = None):
        self.name = name or f"node-{secrets.token_hex(3)}"
        self.token = secrets.token_hex(4)
        self.bin_dir = bin_dir
        self._log_dir = log_dir
        self.workdir = Path("/nonexistent")  # made by prepare(), once the reaper can remove it
        self.log_dir = log_dir or self.workdir
        self.bridge = f"scn{self.token[:8]}"
        self.cgroup_root = f"/sidecarctl-node-{self.token}"
        self.socket = self.workdir
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._reaper: subprocess.Popen[str] | None = None
        self._lock_fd: int | None = None
        self.control_plane: ControlPlane | None = None
        self.timings: dict[str, float] = {}

    # -- bookkeeping ---------------------------------------------------------------------------
    def _record(self, **record: Any) -> None:
        """Tell the reaper what is about to be created or changed (before doing it)."""
        assert self._reaper is not None and self._reaper.stdin is not None
        self._reaper.stdin.write(json.dumps(record) + "\n")
        self._reaper.stdin.flush()

    def _lock(self, timeout: float) -> None:
        path = lock_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise NodeError(f"another real node holds {path} (one node per machine) for {timeout}s") from None
                time.sleep(0.2)
        self._lock_fd = fd

    # -- set-up --------------------------------------------------------------------------------
    def prepare(self, *, lock_timeout: float = 300) -> RealNode:
        """Lock, reaper, bridge: after this, `gateway` is the address pods and the API server share."""
        if reason := unavailable_reason():
            raise NodeUnavailable(reason)
        if self.bin_dir is None:
            self.bin_dir = node_binaries()
        self._lock(lock_timeout)
        assert self._lock_fd is not None
        self.workdir = Path(tempfile.mkdtemp(prefix="sidecarctl-node-"))
        self.log_dir = self._log_dir or self.workdir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.socket = self.workdir / "containerd" / "containerd.sock"
        with (self.log_dir / "reaper.log").open("ab") as rlog:
            self._reaper = subprocess.Popen(
                [sys.executable, str(REAPER), str(self.log_dir / "reaper.log")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=rlog,
                text=True,
                start_new_session=True,
                pass_fds=(self._lock_fd,),  # held until the clean-up is over, so the next node waits for it
            )
        self._record(kind="dir", path=str(self.workdir))
        self._record(kind="mounts-under", path=str(self.workdir))
        self.subnet = _pick_subnet()
        self.gateway = str(next(self.subnet.hosts()))
        self._record(kind="bridge", name=self.bridge)
        for cmd in (
            ["ip", "link", "add", "name", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            subprocess.run(cmd, check=True, capture_output=True)
        return self

    def _cgroups(self) -> list[Path]:
        """The node's cgroup subtree in every hierarchy; returns the `runtime` leaves for our daemons."""
        self._record(kind="cgroup", path=self.cgroup_root)
        leaves = []
        for mount in cgroup_mounts():
            root = mount / self.cgroup_root.lstrip("/")
            for d in (root, root / "runtime"):
                d.mkdir(exist_ok=True)
                if (d / "cpuset.cpus").exists():  # v1 cpuset starts empty; no task may join until set
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())
            leaves.append(root / "runtime")
        return leaves

    def _spawn(self, name: str, args: list[str], *, env: dict[str, str], cgroups: list[Path]) -> None:
        procs_files = [str(c / "cgroup.procs") for c in cgroups]

        def child() -> None:  # between fork and exec: die with us, own process group, join the node's cgroups
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            os.setpgrp()
            pid = str(os.getpid()).encode()
            for f in procs_files:
                fd = os.open(f, os.O_WRONLY)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)

        with (self.log_dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, preexec_fn=child
            )
        self.procs[name] = proc
        self._record(kind="pid", pid=proc.pid, start=_proc_start_time(proc.pid))

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _wait(self, name: str, check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise NodeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if check():
                    return
            time.sleep(0.05)
        raise NodeError(f"{name} not ready after {timeout}s:\n{self.log_tail(name)}")

    def _write_containerd_config(self) -> Path:
        d = self.workdir / "containerd"
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True)
        assert self.subnet is not None
        conflist = {
            "cniVersion": "0.4.0",
            "name": "sidecarctl-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                        # No default route: a pod reaches the bridge's /24 (the host, the API server,
                        # other pods) and nothing else.
                        "ranges": [[{"subnet": str(self.subnet), "gateway": self.gateway}]],
                    },
                }
            ],
        }
        (cni_conf / "10-sidecarctl.conflist").write_text(json.dumps(conflist, indent=2))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""\
version = 2
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  sandbox_image = "{images.PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # root here lacks CAP_SYS_RESOURCE: runc could not lower a container's OOM score below its own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_tcp_service = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{shutil.which("runc", path=SYSTEM_PATH)}"
  Root = "{d / "state" / "runc"}"

[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{cni_conf}"
  max_conf_num = 1
"""
        d.mkdir(parents=True, exist_ok=True)
        path = d / "config.toml"
        path.write_text(config)
        return path

    def ctr(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def images(self) -> dict[str, list[str]]:
        """containerd's images by name: the `ctr images ls` row (name, type, digest, size, unit, ...)."""
        rows = [line.split() for line in self.ctr("images", "ls").splitlines()[1:]]
        return {row[0]: row for row in rows if row}

    def import_image(self, archive: Path) -> float:
        """Load a `docker save` archive into the node's containerd; returns the seconds it took."""
        started = time.monotonic()
        self.ctr("images", "import", str(archive), timeout=600)
        return time.monotonic() - started

    def _kubelet_config(self, cp: ControlPlane) -> Path:
        kubelet_dir = self.workdir / "kubelet"
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # The node's InternalIP (--node-ip), where the API server dials it for logs and exec;
            # on the bridge this node created, like every server of the node.
            "address": self.gateway,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "evictionHard": {
                "memory.available": "1%",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(kubelet_dir / "pod-logs"),
            "shutdownGracePeriod": "0s",
            "shutdownGracePeriodCriticalPods": "0s",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "resolvConf": "",
        }
        path = kubelet_dir / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg))
        return path

    def start(self, cp: ControlPlane, *, timeout: float = 60) -> RealNode:
        """containerd, the test images, the kubelet and kube-scheduler; returns once the node is Ready
        and schedulable."""
        assert self._reaper is not None, "prepare() first"
        assert self.bin_dir is not None
        self.control_plane = cp
        started = time.monotonic()
        cgroups = self._cgroups()
        for path in HOST_PATHS:
            self._record(kind="host-path", path=path, before=listing(path))
        self._record(kind="process-naming", needle=str(self.socket))
        env = {"PATH": KUBELET_PATH, "HOME": str(self.workdir), "LANG": "C.UTF-8"}

        config = self._write_containerd_config()
        self._spawn("containerd", ["containerd", "--config", str(config)], env=env, cgroups=cgroups)
        self._wait("containerd", lambda: self.socket.exists() and bool(self.ctr("version", timeout=5)), 30)
        self.timings["containerd"] = time.monotonic() - started

        self.timings["import test images"] = self.import_image(images.busybox_archive())

        for name in KUBELET_SYSCTLS:
            self._record(kind="sysctl", name=name, value=_sysctl(name))
        kubelet_dir = self.workdir / "kubelet"
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={self._kubelet_config(cp)}",
                f"--kubeconfig={cp.kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.gateway}",
                f"--root-dir={kubelet_dir / 'root'}",
                f"--cert-dir={kubelet_dir / 'pki'}",
                "--v=1",
            ],
            env=env,
            cgroups=cgroups,
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={cp.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--v=0",
            ],
            env=env,
            cgroups=cgroups,
        )
        self._wait("kubelet", self.schedulable, timeout)
        self.timings["node ready"] = time.monotonic() - started
        return self

    def node_object(self) -> dict[str, Any] | None:
        assert self.control_plane is not None
        status, body = self.control_plane.get(f"/api/v1/nodes/{self.name}")
        if status != 200:
            return None
        obj: dict[str, Any] = json.loads(body)
        return obj

    def schedulable(self) -> bool:
        """Ready, and without the not-ready taint the node lifecycle controller lifts."""
        node = self.node_object()
        if node is None:
            return False
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
        taints = [t["key"] for t in node.get("spec", {}).get("taints") or []]
        return conds.get("Ready") == "True" and not any(k.startswith("node.kubernetes.io/") for k in taints)

    def remove_with_node(self, path: Path) -> None:
        """Have `path` removed with the node, also when this process dies (e.g. the control plane's dir)."""
        self._record(kind="dir", path=str(path))

    # -- tear-down -----------------------------------------------------------------------------
    def stop(self, *, timeout: float = 60) -> str:
        """Stop everything and wait until the reaper has undone it all; returns the reaper's log."""
        for name in ("kube-scheduler", "kubelet"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            assert reaper.stdin is not None
            reaper.stdin.close()
            try:
                reaper.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise NodeError(f"node clean-up not done after {timeout}s:\n{self.log_tail('reaper')}") from None
            finally:
                if reaper.stdout is not None:
                    reaper.stdout.close()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        return self.log_tail("reaper", 200)


@contextlib.contextmanager
def node_cluster(*, log_dir: Path | None = None, lock_timeout: float = 300) -> Iterator[tuple[ControlPlane, RealNode]]:
    """A control plane that pods can reach, and one real node registered with it (waiting up to
    `lock_timeout` seconds for another node on this machine to go away)."""
    node = RealNode(log_dir=log_dir)
    cp: ControlPlane | None = None
    try:
        node.prepare(lock_timeout=lock_timeout)
        cp = ControlPlane(bind_address=node.gateway, aggregator_routing=True, node_lifecycle=True, term_timeout=1.0)
        node.remove_with_node(cp.workdir)
        started = time.monotonic()
        cp.start()
        node.timings["control plane"] = time.monotonic() - started
        node.start(cp)
        yield cp, node
    finally:
        if cp is not None:  # first: the reaper removes its directory too
            cp.stop()
        node.stop()


if __name__ == "__main__":  # manual use: python -m tests.kube.node [LOG_DIR]; stop with Ctrl-C
    with node_cluster(log_dir=Path(sys.argv[1]) if len(sys.argv) > 1 else None) as (plane, n):
        print(f"export KUBECONFIG={plane.kubeconfig}  # node {n.name}, timings {n.timings}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
