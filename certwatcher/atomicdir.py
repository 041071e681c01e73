"""Writing a cert directory with the kubelet's atomic `..data` swap.

Self-signed mode writes its files here so that the same watcher that follows a Secret volume serves
them, and tests use it to reproduce the kubelet's update exactly. Readers never see a mix of old and
new files: the new set is written in full into a fresh `..<timestamp>` directory, then one
`rename(..data_tmp, ..data)` switches every `name -> ..data/name` link at once, then the old
directory is deleted (kubelet `AtomicWriter`, also copied by Kruise's `fs` cert writer).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from certwatcher.files import DATA_LINK

_DATA_TMP = "..data_tmp"


def _current_dir(cert_dir: Path) -> Path | None:
    try:
        target = os.readlink(cert_dir / DATA_LINK)
    except OSError:
        return None
    return cert_dir / target


def _same_content(data_dir: Path, files: Mapping[str, bytes]) -> bool:
    try:
        present = {p.name for p in data_dir.iterdir()}
    except OSError:
        return False
    if present != set(files):
        return False
    for name, content in files.items():
        try:
            if (data_dir / name).read_bytes() != content:
                return False
        except OSError:
            return False
    return True


def _check_name(name: str) -> None:
    if not name or name.startswith("..") or "/" in name or name in (".", ".."):
        raise ValueError(f"file name {name!r}: must be a plain name not starting with '..'")


def write_atomic(cert_dir: Path, files: Mapping[str, bytes], *, mode: int = 0o600) -> bool:
    """Replace the directory's file set; returns False when it already held exactly these bytes."""
    for name in files:
        _check_name(name)
    cert_dir.mkdir(parents=True, exist_ok=True)
    old_dir = _current_dir(cert_dir)
    if old_dir is not None and _same_content(old_dir, files):
        return False

    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
    new_dir = Path(tempfile.mkdtemp(prefix=f"..{stamp}.", dir=cert_dir))
    try:
        for name, content in files.items():
            fd = os.open(new_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with open(fd, "wb") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(new_dir, 0o755)
        tmp_link = cert_dir / _DATA_TMP
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_link)
        os.symlink(new_dir.name, tmp_link)
        os.rename(tmp_link, cert_dir / DATA_LINK)
    except BaseException:
        shutil.rmtree(new_dir, ignore_errors=True)
        raise

    for name in files:
        _ensure_link(cert_dir, name)
    if old_dir is not None:
        for stale in _names(old_dir) - set(files):
            link = cert_dir / stale
            if link.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(link)
        if old_dir.resolve() != new_dir.resolve():
            shutil.rmtree(old_dir, ignore_errors=True)
    return True


def _names(data_dir: Path) -> set[str]:
    try:
        return {p.name for p in data_dir.iterdir()}
    except OSError:
        return set()


def _ensure_link(cert_dir: Path, name: str) -> None:
    """Make `name -> ..data/name`, replacing a plain file of that name atomically if one is there."""
    link = cert_dir / name
    want = f"{DATA_LINK}/{name}"
    try:
        if os.readlink(link) == want:
            return
    except OSError:
        pass
    tmp = cert_dir / f"..{name}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(want, tmp)
    os.rename(tmp, link)
