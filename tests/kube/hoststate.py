"""What a real node can change on this machine, read in one go, so that a test can compare the
machine before a node started with the machine after it went away (tests/node/test_cleanup_node.py).

It reads the state the reaper is meant to restore, by looking rather than trusting the reaper:
processes of the node's programs, mounts, the top of every cgroup hierarchy, network interfaces,
the fixed host paths, and the sysctls the kubelet, CNI plugins or a bridge could touch.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from tests.kube.node import HOST_PATHS, KUBELET_SYSCTLS, cgroup_mounts, listing

NODE_PROGRAMS = ("containerd", "containerd-shim", "containerd-shim-runc-v2", "kubelet", "kube-scheduler", "runc")
EXTRA_SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.ipv6.conf.all.forwarding",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.ipv4.conf.all.route_localnet",
)


@dataclasses.dataclass(frozen=True)
class HostState:
    processes: frozenset[str]
    mounts: frozenset[str]
    cgroups: frozenset[str]
    links: frozenset[str]
    paths: tuple[tuple[str, tuple[str, ...] | None], ...]
    sysctls: tuple[tuple[str, str], ...]
    iptables: str

    def differences(self, later: HostState) -> list[str]:
        """Human-readable lines for everything that differs in `later`."""
        out = []
        for field in ("processes", "mounts", "cgroups", "links"):
            before, after = getattr(self, field), getattr(later, field)
            if added := sorted(after - before):
                out.append(f"{field} added: {added[:20]}")
            if removed := sorted(before - after):
                out.append(f"{field} removed: {removed[:20]}")
        for (path, before_list), (_, after_list) in zip(self.paths, later.paths, strict=True):
            if before_list != after_list:
                new = sorted(set(after_list or ()) - set(before_list or ()))
                out.append(f"{path}: existed {before_list is not None} -> {after_list is not None}, new {new[:20]}")
        for (name, value), (_, after_value) in zip(self.sysctls, later.sysctls, strict=True):
            if value != after_value:
                out.append(f"sysctl {name}: {value} -> {after_value}")
        if self.iptables != later.iptables:
            out.append("iptables rules changed")
        return out


def _processes() -> frozenset[str]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.basename(argv0) in NODE_PROGRAMS:
            found.add(f"{entry.name}:{argv0}")
    return frozenset(found)


def _mounts() -> frozenset[str]:
    return frozenset(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _cgroups() -> frozenset[str]:
    found = set()
    for mount in cgroup_mounts():
        for d in mount.iterdir():
            if d.is_dir():
                found.add(str(d))
    return frozenset(found)


def _sysctl(name: str) -> str:
    try:
        return (Path("/proc/sys") / name.replace(".", "/")).read_text().strip()
    except OSError:
        return "(absent)"


def _iptables() -> str:
    rules = []
    for tool in ("iptables-save", "ip6tables-save"):
        proc = subprocess.run([tool], capture_output=True, text=True, check=False)
        # Only the rules: counters and the timestamp comments change on their own.
        rules += [ln for ln in proc.stdout.splitlines() if ln.startswith(("-A", ":", "*")) and not ln.startswith("#")]
    return "\n".join(ln.split(" [")[0] for ln in rules)


def snapshot() -> HostState:
    listings = tuple((p, None if (got := listing(p)) is None else tuple(sorted(got))) for p in HOST_PATHS)
    return HostState(
        processes=_processes(),
        mounts=_mounts(),
        cgroups=_cgroups(),
        links=frozenset(os.listdir("/sys/class/net")),
        paths=listings,
        sysctls=tuple((n, _sysctl(n)) for n in (*KUBELET_SYSCTLS, *EXTRA_SYSCTLS)),
        iptables=_iptables(),
    )
