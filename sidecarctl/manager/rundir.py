"""The supervisor's run directory (status files, multiprocess metrics, a self-signed key), and the
removal of those that managers killed outright left behind.

A supervisor stopped by a signal removes its own directory. One killed with SIGKILL (the OOM
killer, a node agent, `kill -9` by hand) cannot, and a host that restarts the manager would collect
one directory per crash. So each directory holds a lock file, locked (`flock`) for as long as the
supervisor or any of its children has it open: the children inherit the descriptor, so the lock
outlives a supervisor whose workers are still draining. A new supervisor removes every directory
whose lock it can take, and leaves alone any it cannot, or that has no lock file (one being
created, or not a run directory).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "sidecarctl-run-"
LOCK = "supervisor.lock"


def create(parent: Path | None = None) -> tuple[Path, int]:
    """A new run directory under `parent` (the temp directory) and the descriptor that holds its
    lock, after removing the stale ones beside it. The lock file is locked before it gets its name,
    so no sweeper ever sees it unlocked."""
    base = parent or Path(tempfile.gettempdir())
    sweep(base)
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    pending = path / f".{LOCK}"
    fd = os.open(pending, os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(pending, path / LOCK)
    return path, fd


def sweep(parent: Path) -> list[Path]:
    """Remove the run directories under `parent` that no live process holds; return them."""
    removed = []
    for path in sorted(parent.glob(PREFIX + "*")):
        try:
            fd = os.open(path / LOCK, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its manager is alive
        finally:
            # Closing drops a lock just taken; a directory with no lock holder is removed next.
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
