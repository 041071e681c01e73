"""Cert directory reading and the kubelet-style atomic writer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from certwatcher.atomicdir import write_atomic
from certwatcher.files import CertFilesError, content_digest, dir_stamp, read_cert_dir

FILES = {"tls.crt": b"cert-1", "tls.key": b"key-1", "ca.crt": b"ca-1"}


def test_layout_matches_kubelet(tmp_path: Path) -> None:
    assert write_atomic(tmp_path, FILES) is True
    data = os.readlink(tmp_path / "..data")
    assert data.startswith("..") and (tmp_path / data).is_dir()
    for name, content in FILES.items():
        assert os.readlink(tmp_path / name) == f"..data/{name}"
        assert (tmp_path / name).read_bytes() == content


def test_swap_replaces_data_link_and_removes_old_dir(tmp_path: Path) -> None:
    write_atomic(tmp_path, FILES)
    old = os.readlink(tmp_path / "..data")
    assert write_atomic(tmp_path, {**FILES, "tls.crt": b"cert-2"}) is True
    new = os.readlink(tmp_path / "..data")
    assert new != old
    assert not (tmp_path / old).exists()
    assert (tmp_path / "tls.crt").read_bytes() == b"cert-2"
    # Only the current timestamped dir and the links remain.
    hidden = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".."))
    assert hidden == sorted(["..data", new])


def test_same_content_is_a_noop(tmp_path: Path) -> None:
    write_atomic(tmp_path, FILES)
    before = os.readlink(tmp_path / "..data")
    assert write_atomic(tmp_path, dict(FILES)) is False
    assert os.readlink(tmp_path / "..data") == before


def test_removed_names_lose_their_links(tmp_path: Path) -> None:
    write_atomic(tmp_path, {**FILES, "extra": b"x"})
    write_atomic(tmp_path, FILES)
    assert not (tmp_path / "extra").exists() and not (tmp_path / "extra").is_symlink()


def test_plain_files_are_replaced_by_links(tmp_path: Path) -> None:
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(b"old " + content)
    write_atomic(tmp_path, FILES)
    assert (tmp_path / "tls.key").is_symlink()
    assert read_cert_dir(tmp_path).key == b"key-1"


@pytest.mark.parametrize("name", ["..data", "../x", "a/b", ""])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="file name"):
        write_atomic(tmp_path, {name: b"x"})


def test_read_returns_contents_and_digest(tmp_path: Path) -> None:
    write_atomic(tmp_path, FILES)
    files = read_cert_dir(tmp_path)
    assert (files.cert, files.key, files.ca) == (b"cert-1", b"key-1", b"ca-1")
    assert files.digest == content_digest(b"cert-1", b"key-1", b"ca-1")


def test_digest_sees_bytes_moving_between_files() -> None:
    assert content_digest(b"ab", b"c", b"") != content_digest(b"a", b"bc", b"")


def test_missing_dir_and_missing_file_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CertFilesError, match="not found"):
        read_cert_dir(tmp_path / "nope")
    write_atomic(tmp_path, {"tls.crt": b"c", "tls.key": b"k"})
    with pytest.raises(CertFilesError, match=r"missing ca\.crt"):
        read_cert_dir(tmp_path)


def test_stamp_changes_on_swap_and_on_in_place_write(tmp_path: Path) -> None:
    write_atomic(tmp_path, FILES)
    s1 = dir_stamp(tmp_path)
    assert dir_stamp(tmp_path) == s1
    write_atomic(tmp_path, {**FILES, "ca.crt": b"ca-2"})
    s2 = dir_stamp(tmp_path)
    assert s2 != s1
    (tmp_path / "tls.key").write_bytes(b"key-longer")
    assert dir_stamp(tmp_path) != s2


def test_stamp_of_missing_dir_is_stable(tmp_path: Path) -> None:
    assert dir_stamp(tmp_path / "nope") == dir_stamp(tmp_path / "nope")
