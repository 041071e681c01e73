"""A real node leaves nothing behind, even when the process that started it is SIGKILLed.

A child process starts a control plane and a node and runs a pod whose sidecar ignores SIGTERM;
the test checks that the machine really changed (bridge, cgroups, mounts, shims, files under the
kubelet's fixed paths, the kubelet's sysctls), kills the child with SIGKILL, waits for the reaper
to release the node lock, and compares the machine with a snapshot taken before the child started.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kube.controlplane import REPO
from tests.kube.hoststate import snapshot
from tests.kube.node import lock_path, unavailable_reason
from tests.node.conftest import not_here, record

pytestmark = pytest.mark.own_node


def _read_ready_line(proc: subprocess.Popen[str], log_dir: Path, timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line:
                got: dict[str, Any] = json.loads(line)
                return got
        if proc.poll() is not None:
            break
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(log_dir.glob("*.log")))
    raise AssertionError(f"the node process did not get a pod ready (exit {proc.poll()}):\n{logs}")


def _wait_lock_free(timeout: float) -> float:
    """The reaper holds the node lock until its clean-up is done."""
    started = time.monotonic()
    fd = os.open(lock_path(), os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return time.monotonic() - started
            except BlockingIOError:
                if time.monotonic() - started > timeout:
                    raise AssertionError(f"node lock still held {timeout}s after SIGKILL: clean-up hangs") from None
                time.sleep(0.05)
    finally:
        os.close(fd)


def _processes_naming(needle: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if needle in cmd:
                    found.append(f"{entry.name}: {cmd[:120]}")
    return found


def test_sigkilled_node_process_leaves_the_machine_as_it_was(tmp_path: Path) -> None:
    if reason := unavailable_reason():
        not_here(reason)
    before = snapshot()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.node.own_node", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "own_node.log").open("wb"),
        text=True,
        start_new_session=True,
    )
    try:
        made = _read_ready_line(proc, tmp_path, timeout=180)
        record("own node: start to pod Ready", time.monotonic() - started)
        during = before.differences(snapshot())
        changed = "\n".join(during)
        for expected in ("links added", "cgroups added", "mounts added", "processes added", "/var/log/containers"):
            assert expected in changed, f"the running node shows no {expected!r}: the check would prove nothing"
        if dict(before.sysctls)["vm.overcommit_memory"] != "1":
            assert "sysctl vm.overcommit_memory" in changed, "the kubelet did not change the sysctl it always sets"
        assert Path(made["node_workdir"]).exists()
        assert _processes_naming(made["socket"]), "no containerd shim found while the pod runs"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    record("clean-up after SIGKILL (lock released)", _wait_lock_free(timeout=60))

    after = snapshot()
    assert before.differences(after) == [], (tmp_path / "reaper.log").read_text()
    for key in ("node_workdir", "cp_workdir"):
        assert not Path(made[key]).exists(), f"{made[key]} left behind"
    for key in ("socket", "node_workdir", "cp_workdir"):
        assert not _processes_naming(made[key]), f"processes naming {made[key]} survive"
