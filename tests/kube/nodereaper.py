"""Undoes everything a real node did to this machine, whenever the process that started it goes away.

Started by tests/kube/node.py in a session of its own (so neither a process-group kill nor the
parent-death signal of the node's children reaches it), it reads one JSON record per line from
its stdin: each thing the node is *about* to create or change (written before it is done, so a
crash between the two leaves nothing unrecorded). End of input, which the kernel delivers as soon
as the test process exits for any reason including SIGKILL, starts the clean-up, in an order where
each step makes the next possible:

1. processes: the node's own (containerd, kubelet, scheduler) and everything in its cgroup subtree
   in every hierarchy, which holds the containerd shims and every container;
2. mounts under the node's directories (container root filesystems, volumes, the kubelet's
   self bind-mount of its root dir, network-namespace files), deepest first;
3. cgroups: the node's subtree in every v1 hierarchy and the unified one, deepest first;
4. network: the bridge and any interface still attached to it;
5. files: the node's work dir, and whatever the kubelet and containerd created under fixed host
   paths (compared with a listing taken before they started);
6. sysctls: the values read before the kubelet changed them.

Standard library only, and run as a script (`python nodereaper.py LOG`): it must not depend on the
test environment that just died. Every step keeps going after an error and reports it in LOG.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MNT_DETACH = 2


def log(msg: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"{time.strftime('%H:%M:%S')} reaper: {msg}", file=sys.stderr, flush=True)


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def cgroup_mounts() -> list[Path]:
    """Every mounted cgroup hierarchy: each v1 controller (and name=systemd) and the unified cgroup2."""
    found: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0]
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(left.split()[4]))
    return found


def _walk_bottom_up(root: Path) -> list[Path]:
    dirs = [Path(d) for d, _, _ in os.walk(root)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def kill_cgroup_tree(rel: str, deadline: float) -> None:
    """SIGKILL every process in the subtree `rel` of every hierarchy until none is left."""
    while True:
        pids: set[int] = set()
        for mount in cgroup_mounts():
            root = mount / rel.lstrip("/")
            if not root.is_dir():
                continue
            for d in _walk_bottom_up(root):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        pids.discard(os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            log(f"processes still in cgroup {rel}: {sorted(pids)}")
            return
        time.sleep(0.05)


def kill_matching(needle: str, deadline: float) -> None:
    """SIGKILL processes whose command line names `needle` (containerd shims carry its socket path)."""
    while True:
        hits = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmdline:
                hits.append(int(entry.name))
        if not hits:
            return
        for pid in hits:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            log(f"processes naming {needle} survive: {hits}")
            return
        time.sleep(0.05)


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape")


def unmount_under(prefixes: list[str]) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for _ in range(20):
        targets = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mountpoint = _unescape(line.split()[4])
            if any(mountpoint == p or mountpoint.startswith(p.rstrip("/") + "/") for p in prefixes):
                targets.append(mountpoint)
        if not targets:
            return
        for target in sorted(set(targets), key=lambda t: t.count("/"), reverse=True):
            if libc.umount2(target.encode(), MNT_DETACH) != 0:
                log(f"umount {target}: {os.strerror(ctypes.get_errno())}")
    log(f"mounts left under {prefixes}")


def remove_cgroups(rel: str) -> None:
    for mount in cgroup_mounts():
        root = mount / rel.lstrip("/")
        if not root.is_dir():
            continue
        for d in _walk_bottom_up(root):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while a killed process is still exiting
                    time.sleep(0.02)
            else:
                log(f"cgroup {d} could not be removed")


def remove_bridge(name: str) -> None:
    base = Path("/sys/class/net")
    for iface in base.iterdir() if base.exists() else []:
        master = iface / "master"
        if master.exists() and Path(os.readlink(master)).name == name:
            subprocess.run(["ip", "link", "del", iface.name], capture_output=True, check=False)
    if (base / name).exists():
        proc = subprocess.run(["ip", "link", "del", name], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log(f"ip link del {name}: {proc.stderr.strip()}")


def restore_host_path(path: str, before: list[str] | None) -> None:
    """Remove what appeared under `path`: all of it if it did not exist before, else only new entries."""
    p = Path(path)
    if before is None:
        if p.is_symlink() or p.is_file():
            p.unlink(missing_ok=True)
        elif p.exists():
            shutil.rmtree(p, ignore_errors=True)
        return
    keep = set(before)
    if not p.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(p, topdown=False):
        for name in [*filenames, *dirnames]:
            full = Path(dirpath) / name
            rel = str(full.relative_to(p))
            if rel in keep:
                continue
            if full.is_dir() and not full.is_symlink():
                with contextlib.suppress(OSError):
                    full.rmdir()  # empty once its new children are gone; old children keep it
            else:
                with contextlib.suppress(OSError):
                    full.unlink()


def restore_sysctl(name: str, value: str) -> None:
    path = Path("/proc/sys") / name.replace(".", "/")
    try:
        if path.read_text().strip() != value:
            path.write_text(value)
            log(f"sysctl {name} restored to {value}")
    except OSError as e:
        log(f"sysctl {name}: {e}")


def clean(records: list[dict[str, Any]]) -> None:
    def of(kind: str) -> list[dict[str, Any]]:
        return [r for r in records if r["kind"] == kind]

    deadline = time.monotonic() + 20
    for r in of("pid"):
        if _proc_start_time(r["pid"]) == r["start"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r["pid"], signal.SIGKILL)
    for r in of("cgroup"):
        kill_cgroup_tree(r["path"], deadline)
    for r in of("process-naming"):
        kill_matching(r["needle"], deadline)
    for r in of("cgroup"):  # anything a shim started in the meantime
        kill_cgroup_tree(r["path"], deadline)
    unmount_under([r["path"] for r in of("mounts-under")])
    for r in of("cgroup"):
        remove_cgroups(r["path"])
    for r in of("bridge"):
        remove_bridge(r["name"])
    for r in of("host-path"):
        restore_host_path(r["path"], r["before"])
    for r in of("dir"):
        shutil.rmtree(r["path"], ignore_errors=True)
    for r in of("sysctl"):
        restore_sysctl(r["name"], r["value"])


def main() -> int:
    if len(sys.argv) > 1:
        sys.stderr = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 - for the rest of the process
    # The terminal or test runner may signal our old process group; we must outlive it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    records: list[dict[str, Any]] = []
    for line in sys.stdin:
        line = line.strip()
        if line:
            records.append(json.loads(line))
    started = time.monotonic()
    log(f"input closed, cleaning up {len(records)} records")
    clean(records)
    log(f"clean-up done in {time.monotonic() - started:.2f}s")
    with contextlib.suppress(OSError):
        print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
