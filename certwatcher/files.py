"""Reading the serving-cert directory the way the kubelet and cert-manager lay it out.

A Secret volume holds `tls.crt -> ..data/tls.crt` and `..data -> ..<timestamp>/`; an update replaces
the `..data` link with one rename and then deletes the old timestamped directory. Reading the three
files one after the other can straddle that rename and pair a new certificate with an old key, so a
read is only accepted when the `..data` target is the same before and after it. inotify on such
links is unreliable (controller-runtime #1719, ingress-nginx #6386), so change detection is by polling:
a cheap `stamp` (link target, inode, size, mtime) at a short interval and a content hash at a long one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"
DATA_LINK = "..data"
SERVING_FILES = (CERT_FILE, KEY_FILE, CA_FILE)

_READ_ATTEMPTS = 3


class CertFilesError(Exception):
    """The cert directory cannot be read as a whole (missing dir or file, unreadable file)."""

    reason = "missing"


@dataclass(frozen=True)
class CertFiles:
    cert: bytes
    key: bytes
    ca: bytes
    digest: str


def content_digest(cert: bytes, key: bytes, ca: bytes) -> str:
    """sha256 over the three files, length-prefixed so that bytes moving between files still count."""
    h = hashlib.sha256()
    for part in (cert, key, ca):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _data_target(cert_dir: Path) -> str | None:
    try:
        return os.readlink(cert_dir / DATA_LINK)
    except OSError:
        return None


def read_cert_dir(cert_dir: Path) -> CertFiles:
    if not cert_dir.is_dir():
        raise CertFilesError(f"cert dir {cert_dir}: not found or not a directory")
    for _ in range(_READ_ATTEMPTS):
        before = _data_target(cert_dir)
        parts: list[bytes] = []
        for name in SERVING_FILES:
            path = cert_dir / name
            try:
                parts.append(path.read_bytes())
            except FileNotFoundError:
                parts = []
                break
            except OSError as exc:
                raise CertFilesError(f"{path}: cannot read: {exc.strerror or exc}") from None
        if before == _data_target(cert_dir):
            if not parts:
                missing = [n for n in SERVING_FILES if not (cert_dir / n).exists()]
                raise CertFilesError(f"cert dir {cert_dir}: missing {', '.join(missing) or 'files'}")
            cert, key, ca = parts
            return CertFiles(cert=cert, key=key, ca=ca, digest=content_digest(cert, key, ca))
    raise CertFilesError(f"cert dir {cert_dir}: {DATA_LINK} kept changing while reading")


Stamp = tuple[object, ...]


def dir_stamp(cert_dir: Path) -> Stamp:
    """Cheap fingerprint that changes on a `..data` swap, a rename in the dir or an in-place write."""
    parts: list[object] = [_data_target(cert_dir)]
    try:
        st = os.stat(cert_dir)
        parts.append((st.st_ino, st.st_mtime_ns))
    except OSError:
        parts.append(None)
    for name in SERVING_FILES:
        try:
            st = os.stat(cert_dir / name)
            parts.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            parts.append(None)
    return tuple(parts)
