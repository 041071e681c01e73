"""Run directories: a manager's is kept while it or a child lives, and removed by the next one after."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sidecarctl.manager import rundir


def test_a_live_managers_directory_is_kept_and_a_dead_ones_removed(tmp_path: Path) -> None:
    live, live_fd = rundir.create(tmp_path)
    dead, dead_fd = rundir.create(tmp_path)
    (dead / "metrics").mkdir()
    (dead / "metrics" / "counter_1.db").write_bytes(b"x")
    os.close(dead_fd)  # what the kernel does for a process killed with SIGKILL

    mine, mine_fd = rundir.create(tmp_path)

    assert live.is_dir() and mine.is_dir()
    assert not dead.exists()
    assert sorted(tmp_path.iterdir()) == sorted([live, mine])
    for fd in (live_fd, mine_fd):
        os.close(fd)


def test_a_child_holding_the_lock_keeps_the_directory_after_its_supervisor_is_gone(tmp_path: Path) -> None:
    path, fd = rundir.create(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(fd,))
    try:
        os.close(fd)
        assert rundir.sweep(tmp_path) == []
        assert path.is_dir()
    finally:
        child.kill()
        child.wait()
    assert rundir.sweep(tmp_path) == [path]
    assert not path.exists()


def test_directories_without_a_lock_file_are_left_alone(tmp_path: Path) -> None:
    being_created = tmp_path / f"{rundir.PREFIX}abc"
    being_created.mkdir()
    (being_created / f".{rundir.LOCK}").write_bytes(b"")  # not yet renamed to its name
    other = tmp_path / "sidecarctl-certs-xyz"
    other.mkdir()

    assert rundir.sweep(tmp_path) == []
    assert being_created.is_dir() and other.is_dir()
